//! Either implementation in a part: which side (ours or upstream argocd-agent) plays the principal
//! or the agent, how the agent runs (managed or autonomous), and handles that start and hold
//! whichever side was chosen. The interop matrix (`tests/real_peers.rs`) and `bench-compare` put
//! their pairs together through these, so both start each side the same way.

use std::path::Path;

use crate::argocd::ArgoCd;
use crate::control_plane::ControlPlane;
use crate::gateway::{Agent, Pki, Principal};
use crate::process::ManagedProcess;
use crate::upstream::{UpstreamAgent, UpstreamPrincipal};

/// Which implementation plays a part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// This project's binaries.
    Ours,
    /// Upstream argocd-agent's Go binary (`hack/peers.sh`).
    Upstream,
}

impl Side {
    /// `ours` or `upstream`, for names and reports.
    pub fn label(self) -> &'static str {
        match self {
            Side::Ours => "ours",
            Side::Upstream => "upstream",
        }
    }
}

/// How the agent runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The hub is the source of truth; the agent applies the hub's Applications on its spoke.
    Managed,
    /// The spoke is the source of truth; the hub mirrors it.
    Autonomous,
}

impl Mode {
    /// The value both implementations take for their mode flag.
    pub fn flag(self) -> &'static str {
        match self {
            Mode::Managed => "managed",
            Mode::Autonomous => "autonomous",
        }
    }
}

/// Whichever principal runs, kept alive while held.
pub enum AnyPrincipal {
    /// Ours.
    Ours(Principal),
    /// Upstream's.
    Upstream(UpstreamPrincipal),
}

impl AnyPrincipal {
    /// Starts a `side` principal named `name` on `hub` in `namespace` (created if needed), with
    /// `extra` flags last, and waits until it is ready.
    pub async fn start(
        side: Side,
        name: &str,
        dir: &Path,
        hub: &ControlPlane,
        pki: &Pki,
        namespace: &str,
        extra: &[&str],
    ) -> anyhow::Result<AnyPrincipal> {
        Ok(match side {
            Side::Ours => {
                AnyPrincipal::Ours(Principal::start(name, dir, hub, pki, namespace, extra).await?)
            }
            Side::Upstream => AnyPrincipal::Upstream(
                UpstreamPrincipal::start(name, dir, hub, pki, namespace, None, extra).await?,
            ),
        })
    }

    /// `127.0.0.1:<grpc port>`.
    pub fn address(&self) -> String {
        match self {
            AnyPrincipal::Ours(p) => p.address(),
            AnyPrincipal::Upstream(p) => p.address(),
        }
    }

    /// The principal's process.
    pub fn process(&self) -> &ManagedProcess {
        match self {
            AnyPrincipal::Ours(p) => &p.process,
            AnyPrincipal::Upstream(p) => &p.process,
        }
    }

    /// The principal's process, to stop or restart.
    pub fn process_mut(&mut self) -> &mut ManagedProcess {
        match self {
            AnyPrincipal::Ours(p) => &mut p.process,
            AnyPrincipal::Upstream(p) => &mut p.process,
        }
    }

    /// Restarts the principal (same flags and ports) and waits until it is ready again.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.process_mut().restart()?;
        match self {
            AnyPrincipal::Ours(p) => p.wait_ready().await,
            AnyPrincipal::Upstream(p) => p.wait_ready().await,
        }
    }
}

/// Whichever agent runs, kept alive while held (its process can be killed and started again).
pub enum AnyAgent {
    /// Ours.
    Ours(Agent),
    /// Upstream's.
    Upstream(UpstreamAgent),
}

impl AnyAgent {
    /// Starts agent `name` of `side` on `spoke` in `mode` against `principal` (`host:port`),
    /// keeping its Applications in `spoke_ns` beside `argocd` (whose Redis an upstream agent
    /// needs), with `extra` flags; logs go to `dir`.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        side: Side,
        name: &str,
        dir: &Path,
        spoke: &ControlPlane,
        pki: &Pki,
        principal: &str,
        mode: Mode,
        spoke_ns: &str,
        argocd: Option<&ArgoCd>,
        extra: &[&str],
    ) -> anyhow::Result<AnyAgent> {
        Ok(match side {
            Side::Ours => {
                let mode = format!("--mode={}", mode.flag());
                let args: Vec<&str> = std::iter::once(mode.as_str())
                    .chain(extra.iter().copied())
                    .collect();
                AnyAgent::Ours(
                    Agent::start(name, dir, spoke, pki, principal, spoke_ns, &args).await?,
                )
            }
            Side::Upstream => {
                let redis = argocd.and_then(ArgoCd::redis_endpoint);
                AnyAgent::Upstream(
                    UpstreamAgent::start(
                        name,
                        dir,
                        spoke,
                        pki,
                        principal,
                        mode.flag(),
                        spoke_ns,
                        redis
                            .as_ref()
                            .map(|r| (r.address.as_str(), r.password.as_deref())),
                        extra,
                    )
                    .await?,
                )
            }
        })
    }

    /// The agent's process.
    pub fn process(&self) -> &ManagedProcess {
        match self {
            AnyAgent::Ours(a) => &a.process,
            AnyAgent::Upstream(a) => &a.process,
        }
    }

    /// The agent's process, to kill or start again.
    pub fn process_mut(&mut self) -> &mut ManagedProcess {
        match self {
            AnyAgent::Ours(a) => &mut a.process,
            AnyAgent::Upstream(a) => &mut a.process,
        }
    }
}
