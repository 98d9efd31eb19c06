//! The GitOpsCluster operator and the fleet PKI: CA and certificate issuance, Argo CD cluster
//! secrets, ManifestWork builders. Also the library behind the `argocd-agentctl` CLI.

pub mod cli;
pub mod gitops;
pub mod pki;
pub mod pull;
pub mod registration;
pub mod wrap;
