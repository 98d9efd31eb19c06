//! The agent (workload cluster side) of argocd-agent: dials the principal, authenticates, and keeps
//! the spoke's Applications/AppProjects in sync in managed or autonomous mode.

pub mod app;
pub mod autonomous;
pub mod cluster_info;
pub mod config;
pub mod connection;
pub mod drift;
pub mod live;
pub mod managed;
pub mod metrics;
pub mod placement;
pub mod reported;
pub mod spoke_copy;
pub mod spoke_watch;
