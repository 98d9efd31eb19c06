//! The wire contract shared by `argocd-principal` and `argocd-agent`.
//!
//! Owns: the protobuf/gRPC definitions (upstream-compatible packages, services and field numbers),
//! the typed CloudEvent model over the `io.cloudevents.v1.CloudEvent` envelope, the protocol version
//! and its compatibility rule, agent identity parsed from certificates, and the rustls configuration
//! builders both ends use. It does not talk to Kubernetes.

pub mod event;
pub mod identity;
pub mod payload;
pub mod pb;
pub mod sync;
pub mod telemetry;
pub mod tls;
pub mod version;
