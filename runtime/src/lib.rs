//! The process runtime shared by `argocd-principal`, `argocd-agent` and the operator binaries.
//!
//! Owns what a long-running process needs around the wire contract ([`argocd_agent_proto`]):
//! TLS configuration builders, certificate reloading and expiry ([`tls`]); the accept loop of every
//! listener with its TLS handshake deadline ([`accept`]) and the TLS and gRPC client dial
//! ([`dial`]), gRPC over WebSocket for HTTP/1.1-only links ([`grpc_websocket`]); command-line and environment parsing ([`flags`], the flags every binary shares in
//! [`process_args`], with the validation machinery of whole configurations in [`binary_config`]
//! Redis credentials in [`redis_credentials`], connections to Redis in [`redis_client`] and those
//! kept open between commands in [`redis_pool`]); and telemetry — logging,
//! trace export, the metrics registry, health state and the ops HTTP server ([`telemetry`]).
//! It holds no protocol logic and no state of a particular subsystem.

pub mod accept;
pub mod binary_config;
pub mod dial;
pub mod flags;
pub mod grpc_websocket;
pub mod label_selector;
pub mod process_args;
pub mod redis_client;
pub mod redis_credentials;
pub mod redis_pool;
pub mod telemetry;
pub mod tls;
