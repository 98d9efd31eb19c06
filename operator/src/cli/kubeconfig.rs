//! `argocd-agentctl`'s Kubernetes clients from `--kubeconfig`/`--context` flags.
//!
//! Owns turning the shared client builder's failures ([`argocd_agent_kube::client`], which owns
//! the lookup order) into the CLI's usage errors (exit 2) and runtime errors.

use std::path::Path;

use super::CliError;

/// A client for the cluster selected by `kubeconfig` and `context`.
pub async fn client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Client, CliError> {
    client_for("--kubeconfig", "--context", kubeconfig, context).await
}

/// Like [`client`], naming other flags in errors (e.g. `--agent-kubeconfig`).
pub async fn client_for(
    kubeconfig_flag: &str,
    context_flag: &str,
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Client, CliError> {
    let flags = argocd_agent_kube::client::ClientFlags {
        kubeconfig: kubeconfig_flag,
        context: context_flag,
    };
    argocd_agent_kube::client::client(kubeconfig, context, flags)
        .await
        .map_err(|e| match e {
            argocd_agent_kube::client::ClientError::Config(msg) => CliError::usage(msg),
            argocd_agent_kube::client::ClientError::Build(msg) => CliError::runtime(msg),
        })
}
