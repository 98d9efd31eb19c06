//! The agent (workload cluster side) of argocd-agent: dials the principal, authenticates, and keeps
//! the spoke's Applications/AppProjects in sync in managed or autonomous mode.
