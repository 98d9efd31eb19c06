//! The Kubernetes-facing layer shared by `argocd-principal`, `argocd-agent` and the operator.
//!
//! Owns how this project talks to Kubernetes, once: typed Argo CD objects ([`argocd`]), building a
//! client from flags ([`client`]), the entries of Argo CD's Redis cache this project reads and
//! writes ([`argocd_cache`]),
//! the one rule for which failed requests are retried and which rejected ([`errors`]), the server
//! side of the exec stream's WebSocket channel framing ([`exec_channels`]), informers
//! that keep one store per watched kind and call add/update/delete handlers ([`informer`]), an
//! informer's changes handed on as watcher events to `Controller`s of the same process
//! ([`fanout`]), a handler narrowed to part of a shared informer ([`narrowed`]), the
//! Argo CD resource kinds ([`resources`]), Argo CD's repository Secrets typed ([`repository`]),
//! objects kept as their JSON, and views kept as digests, for the per-object copies a process
//! holds ([`packed`]),
//! Lease-based leader election ([`lease`]) and TLS material
//! read from Secrets into files ([`secret_files`]). Stopping is
//! a `tokio_util::sync::CancellationToken` throughout.

pub mod argocd;
pub mod argocd_cache;
pub mod client;
pub mod errors;
pub mod exec_channels;
pub mod fanout;
pub mod informer;
pub mod lease;
pub mod narrowed;
pub mod packed;
pub mod repository;
pub mod resources;
pub mod secret_files;
pub mod skip_sync;

pub use tokio_util::sync::CancellationToken;
