//! The principal (hub) of argocd-agent: accepts agents over mutual-TLS gRPC, authenticates them,
//! streams Application/AppProject events to them and writes their status back on the hub.
//!
//! The connection path, composed in [`app::run`]: [`listener`] (TLS accept, certificate identity;
//! HTTP/1.1 connections to gRPC over WebSocket, [`websocket`], with `--enable-websocket`) →
//! [`auth`] (Authenticate/RefreshToken, token ↔ certificate check, the agent's pinned mode:
//! [`mode_pin`]) → [`eventstream`] (one stream
//! per agent over its [`sessions`] outbox) → [`hub`] / [`inbound`] (hub watches and writes), with
//! the pure routing rules in [`routing`]. Agents' connection state and cache counts reach the hub
//! Argo CD's cluster list through [`cluster_info`]. Which calls get gzip answers: [`compression`].

pub mod app;
pub mod auth;
pub mod blocklist;
pub mod cluster_info;
pub mod compression;
pub mod config;
pub mod eventstream;
pub mod hub;
pub mod identity;
pub mod inbound;
pub mod leadership;
pub mod listener;
pub mod live;
pub mod log_stream;
pub mod metrics;
pub mod mode_pin;
pub mod redis_proxy;
pub mod resource_proxy;
pub mod routing;
pub mod self_registration;
pub mod sessions;
pub mod startup_secrets;
pub mod terminal;
pub mod tokens;
pub mod websocket;
pub mod write_limit;
