//! The wire contract shared by `argocd-principal` and `argocd-agent`, and the sync engine both run.
//!
//! Owns: the protobuf/gRPC definitions (upstream-compatible packages, services and field numbers),
//! the typed CloudEvent model over the `io.cloudevents.v1.CloudEvent` envelope, the agent modes,
//! the protocol version and its compatibility rule, agent identity parsed from certificates, the
//! trace context events carry, bounded handling of peer-chosen text, Argo CD's name patterns
//! ([`glob`]: namespaces and agent names, matched as upstream matches them on both sides), and the
//! sync engine (outbox, lanes, stream pump, resync). It does not talk to Kubernetes and holds none of the process
//! runtime (TLS set-up, flags, ops server, telemetry export: `argocd-agent-runtime`).

pub mod event;
pub mod glob;
pub mod identity;
pub mod mode;
pub mod payload;
pub mod pb;
pub mod peer_input;
pub mod sync;
pub mod trace_context;
pub mod version;
