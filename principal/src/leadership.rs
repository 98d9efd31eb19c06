//! High availability of the principal (`--ha-enabled`): several replicas behind one Service, one
//! of them active.
//!
//! Owns the HA flags ([`HaArgs`] → [`HaConfig`]), the replica's role ([`Leadership`]: active or
//! standby, decided by a coordination.k8s.io/v1 Lease through the shared election code,
//! `argocd_agent_kube::lease`), what the role gates, and the HA metrics
//! ([`HaMetrics`]).
//!
//! Active/standby, not active/active: every hub writer of the principal (status and operation
//! writes, autonomous mirrors and their protection, the embedded operator and pull model) runs in
//! the active replica only, so two replicas never write for one agent. The standby keeps its hub
//! watches warm, answers `/readyz` 503 (`standby: ...`) so the Service sends it no traffic, and
//! refuses `EventStream` calls with UNAVAILABLE so an agent that reaches it anyway retries. When
//! the active replica's Lease expires (it died or lost the API server), the standby takes over;
//! agents reconnect to it and get their full state (managed) or checksum resync (autonomous), the
//! same path as after a principal restart. A replica that loses the Lease while running exits
//! (as Kubernetes' own controllers do) instead of serving on with sessions another replica now
//! owns; it comes back as a standby.

use std::time::Duration;

use argocd_agent_kube::lease::{self, LeaseConfig, LeaseStatus};
use argocd_agent_kube::CancellationToken;
use argocd_agent_runtime::binary_config::{non_empty, ConfigError, FlagEnv};
use argocd_agent_runtime::flags;
use argocd_agent_runtime::telemetry::{HealthState, MetricsRegistry};
use clap::builder::BoolishValueParser;
use clap::ArgAction;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tonic::{Request, Status};

use crate::config::ENV_PREFIX;

/// Default name of the principal's HA Lease.
pub const DEFAULT_LEASE_NAME: &str = "argocd-agent-principal";

const FLAGS: FlagEnv = FlagEnv::new(ENV_PREFIX);

/// The HA flags (flattened into the principal's).
#[derive(Debug, Clone, clap::Args)]
pub struct HaArgs {
    /// Run as one of several replicas: the holder of the HA Lease serves agents and runs the
    /// operator; the others stand by (not ready) and take over when its Lease expires.
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_ENABLED", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub ha_enabled: bool,

    /// Name of the coordination.k8s.io Lease that elects the active replica.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_HA_LEASE_NAME",
        default_value = DEFAULT_LEASE_NAME,
        value_name = "NAME"
    )]
    pub ha_lease_name: String,

    /// Namespace of the HA Lease [default: --namespace].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_HA_LEASE_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    pub ha_lease_namespace: Option<String>,

    /// How long the Lease stays valid without renewal: a dead active replica is replaced after
    /// at most this plus one renew interval.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_HA_LEASE_DURATION",
        default_value = "10s",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub ha_lease_duration: Duration,

    /// How often the active replica renews the Lease and standbys try to take it.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_HA_RENEW_INTERVAL",
        default_value = "2s",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub ha_renew_interval: Duration,

    /// This replica's name in the Lease [default: $HOSTNAME (the pod name) with a random suffix].
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA_IDENTITY", value_name = "NAME")]
    pub ha_identity: Option<String>,
}

/// Validated HA settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaConfig {
    /// The Lease that elects the active replica.
    pub lease_name: String,
    /// Its namespace.
    pub lease_namespace: String,
    /// This replica's identity in it.
    pub identity: String,
    /// Lease validity without renewal.
    pub lease_duration: Duration,
    /// Renewal / take-over attempt interval.
    pub renew_interval: Duration,
}

impl HaArgs {
    /// The HA settings (`None` without `--ha-enabled`); `namespace` is the principal's.
    pub fn validate(self, namespace: &str) -> Result<Option<HaConfig>, ConfigError> {
        if !self.ha_enabled {
            return Ok(None);
        }
        if self.ha_lease_name.trim().is_empty() {
            return Err(FLAGS.invalid("ha-lease-name", "is empty; name the HA Lease"));
        }
        // Unset, the Lease lives in the principal's --namespace, validated with the other flags.
        let lease_namespace = FLAGS
            .optional_namespace("ha-lease-namespace", self.ha_lease_namespace)?
            .unwrap_or_else(|| namespace.to_string());
        FLAGS.min_duration(
            "ha-renew-interval",
            self.ha_renew_interval,
            Duration::ZERO,
            "default 2s",
        )?;
        if self.ha_lease_duration < self.ha_renew_interval * 2 {
            return Err(FLAGS.conflict(
                "ha-lease-duration",
                "ha-renew-interval",
                format!(
                    "the Lease ({}) must last at least two renew intervals ({}), or the active \
                     replica steps down between renewals",
                    flags::format_duration(self.ha_lease_duration),
                    flags::format_duration(self.ha_renew_interval)
                ),
            ));
        }
        let identity = non_empty(self.ha_identity).unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "argocd-principal".into());
            format!("{host}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
        });
        Ok(Some(HaConfig {
            lease_name: self.ha_lease_name,
            lease_namespace,
            identity,
            lease_duration: self.ha_lease_duration,
            renew_interval: self.ha_renew_interval,
        }))
    }
}

/// The role of this replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HaState {
    /// HA disabled: the only replica, always serving.
    Single,
    /// Holds the HA Lease: serves agents and runs the hub writers.
    Active,
    /// Does not hold the Lease; `holder` names the replica that does, if any.
    Standby {
        /// The Lease holder.
        holder: Option<String>,
    },
    /// Held the Lease and lost it: stops serving and exits.
    Lost,
}

impl HaState {
    /// The `state` label and `X-HA-State`-style name.
    pub fn name(&self) -> &'static str {
        match self {
            HaState::Single | HaState::Active => "active",
            HaState::Standby { .. } => "standby",
            HaState::Lost => "lost",
        }
    }

    fn serves(&self) -> bool {
        matches!(self, HaState::Single | HaState::Active)
    }
}

type Labels = Vec<(String, String)>;

/// The HA metrics, named as upstream's (`pkg/ha/metrics.go`).
#[derive(Debug, Default, Clone)]
pub struct HaMetrics {
    /// `argocd_agent_ha_state{state}`: 1 for the current state, 0 for the others.
    pub state: Family<Labels, Gauge>,
    /// `argocd_agent_ha_failovers_total`: times this replica took over from another holder.
    pub failovers: Counter,
}

impl HaMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &MetricsRegistry) -> HaMetrics {
        let m = HaMetrics::default();
        registry.register(
            "argocd_agent_ha_state",
            "Current HA state: 1 for the current state, 0 for the others",
            m.state.clone(),
        );
        registry.register(
            "argocd_agent_ha_failovers",
            "Times this replica became active after another replica held the HA Lease",
            m.failovers.clone(),
        );
        m
    }

    fn set_state(&self, state: &HaState) {
        for name in ["active", "standby"] {
            self.state
                .get_or_create(&vec![("state".into(), name.into())])
                .set(i64::from(state.name() == name));
        }
    }
}

/// This replica's role, shared by everything it gates; cheap to clone.
#[derive(Clone, Debug)]
pub struct Leadership {
    state: watch::Receiver<HaState>,
}

impl Leadership {
    /// Without HA: always serving.
    pub fn single() -> Leadership {
        Leadership {
            state: watch::channel(HaState::Single).1,
        }
    }

    /// Starts the election when `config` is set (else [`Leadership::single`]); stops it, and
    /// releases a held Lease, when `shutdown` fires.
    pub fn start(
        client: kube::Client,
        config: Option<HaConfig>,
        metrics: HaMetrics,
        shutdown: CancellationToken,
    ) -> Leadership {
        let Some(config) = config else {
            return Leadership::single();
        };
        let initial = HaState::Standby { holder: None };
        metrics.set_state(&initial);
        let (state_tx, state) = watch::channel(initial);
        let (status_tx, mut status) = watch::channel(LeaseStatus::default());
        tracing::info!(
            lease = %config.lease_name,
            namespace = %config.lease_namespace,
            identity = %config.identity,
            "HA enabled: standing by until this replica holds the Lease"
        );
        let stopping = shutdown.clone();
        tokio::spawn(lease::run_election(
            client,
            LeaseConfig {
                name: config.lease_name,
                namespace: config.lease_namespace,
                identity: config.identity,
                duration: config.lease_duration,
                retry: config.renew_interval,
            },
            status_tx,
            shutdown,
        ));
        tokio::spawn(async move {
            let mut saw_other_holder = false;
            while status.changed().await.is_ok() {
                let observed = status.borrow_and_update().clone();
                let current = state_tx.borrow().clone();
                let next = match (&current, observed.held) {
                    (HaState::Lost, _) => break,
                    // Stepping down on shutdown is not a loss.
                    (HaState::Active, false) if stopping.is_cancelled() => break,
                    (HaState::Active, false) => HaState::Lost,
                    (_, true) => HaState::Active,
                    (_, false) => {
                        saw_other_holder |= observed.holder.is_some();
                        HaState::Standby {
                            holder: observed.holder,
                        }
                    }
                };
                if next == current {
                    continue;
                }
                match &next {
                    HaState::Active if saw_other_holder => {
                        metrics.failovers.inc();
                        tracing::info!("took over the HA Lease: this replica is now active");
                    }
                    HaState::Active => tracing::info!("holds the HA Lease: this replica is active"),
                    HaState::Standby { holder } => {
                        tracing::info!(holder = holder.as_deref().unwrap_or("none"), "standing by")
                    }
                    HaState::Lost => {
                        tracing::error!("lost the HA Lease while active; stopping to serve")
                    }
                    HaState::Single => {}
                }
                metrics.set_state(&next);
                state_tx.send_replace(next);
            }
        });
        Leadership { state }
    }

    /// The current role.
    pub fn state(&self) -> HaState {
        self.state.borrow().clone()
    }

    /// Whether this replica serves agents and runs the hub writers now.
    pub fn is_active(&self) -> bool {
        self.state.borrow().serves()
    }

    /// Resolves once this replica is active (at once without HA); never if it is lost first.
    pub async fn active(&self) {
        let mut rx = self.state.clone();
        let _ = rx.wait_for(|s| s.serves() || *s == HaState::Lost).await;
        if *rx.borrow() == HaState::Lost {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves when this replica lost the Lease it held (never without HA).
    pub async fn lost(&self) {
        let mut rx = self.state.clone();
        if rx.wait_for(|s| *s == HaState::Lost).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// gRPC interceptor for the agent-facing services: UNAVAILABLE unless active, so an agent
    /// retries (and reaches the active replica) instead of giving up.
    pub fn admit(&self, req: Request<()>) -> Result<Request<()>, Status> {
        match &*self.state.borrow() {
            s if s.serves() => Ok(req),
            HaState::Standby { holder } => Err(Status::unavailable(format!(
                "this principal replica is on standby (HA); the active one is {}",
                holder.as_deref().unwrap_or("not elected yet")
            ))),
            _ => Err(Status::unavailable(
                "this principal replica lost the HA Lease and is stopping",
            )),
        }
    }

    /// Keeps `/readyz` in step with the role once the hub watches are synced: ready while
    /// active, 503 with `standby: ...` otherwise. Runs until the role can change no more.
    pub async fn publish_readiness(&self, health: &HealthState) {
        let mut rx = self.state.clone();
        loop {
            let state = rx.borrow_and_update().clone();
            if !matches!(state, HaState::Single) {
                health.set_role(state.name());
            }
            match &state {
                HaState::Single | HaState::Active => health.set_ready(true, "serving"),
                HaState::Standby { holder } => health.set_ready(
                    false,
                    format!(
                        "standby: HA Lease held by {}",
                        holder.as_deref().unwrap_or("nobody yet")
                    ),
                ),
                HaState::Lost => health.set_ready(false, "lost the HA Lease; stopping"),
            }
            if matches!(state, HaState::Single | HaState::Lost) || rx.changed().await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        ha: HaArgs,
    }

    fn parse(args: &[&str]) -> Result<Option<HaConfig>, ConfigError> {
        let mut argv = vec!["p"];
        argv.extend_from_slice(args);
        Flags::try_parse_from(argv).unwrap().ha.validate("argocd")
    }

    #[test]
    fn ha_is_off_unless_enabled_and_defaults_follow_the_principal_namespace() {
        assert_eq!(parse(&[]).unwrap(), None);
        let cfg = parse(&["--ha-enabled", "--ha-identity=p-0"])
            .unwrap()
            .unwrap();
        assert_eq!(cfg.lease_name, DEFAULT_LEASE_NAME);
        assert_eq!(cfg.lease_namespace, "argocd");
        assert_eq!(cfg.identity, "p-0");
        assert_eq!(cfg.lease_duration, Duration::from_secs(10));
        assert_eq!(cfg.renew_interval, Duration::from_secs(2));
        let generated = parse(&["--ha-enabled"]).unwrap().unwrap();
        assert!(!generated.identity.is_empty());
    }

    #[test]
    fn a_lease_shorter_than_two_renewals_is_refused_naming_both_flags() {
        let err = parse(&[
            "--ha-enabled",
            "--ha-lease-duration=3s",
            "--ha-renew-interval=2s",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--ha-lease-duration") && err.contains("--ha-renew-interval"),
            "{err}"
        );
        let err = parse(&["--ha-enabled", "--ha-renew-interval=0s"]).unwrap_err();
        assert_eq!(err.flag(), "ha-renew-interval");
        let err = parse(&["--ha-enabled", "--ha-lease-namespace=Not_A_Namespace"]).unwrap_err();
        assert_eq!(err.flag(), "ha-lease-namespace");
        let cfg = parse(&["--ha-enabled", "--ha-lease-namespace=leases"]);
        assert_eq!(cfg.unwrap().unwrap().lease_namespace, "leases");
    }

    #[tokio::test]
    async fn a_standby_refuses_agents_with_unavailable_and_is_not_ready() {
        let (tx, state) = watch::channel(HaState::Standby {
            holder: Some("p-0".into()),
        });
        let leadership = Leadership { state };
        let refused = leadership.admit(Request::new(())).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        assert!(refused.message().contains("p-0"));
        let health = HealthState::new();
        let publisher = {
            let (l, h) = (leadership.clone(), health.clone());
            tokio::spawn(async move { l.publish_readiness(&h).await })
        };
        let wait_for = |want: Result<(), String>| {
            let health = health.clone();
            async move {
                while health.readiness() != want {
                    tokio::task::yield_now().await;
                }
            }
        };
        let standby = Err("standby: HA Lease held by p-0".to_string());
        tokio::time::timeout(Duration::from_secs(5), wait_for(standby))
            .await
            .unwrap();
        assert_eq!(health.role().as_deref(), Some("standby"), "X-HA-State");
        tx.send_replace(HaState::Active);
        tokio::time::timeout(Duration::from_secs(5), wait_for(Ok(())))
            .await
            .unwrap();
        assert!(leadership.admit(Request::new(())).is_ok());
        tx.send_replace(HaState::Lost);
        tokio::time::timeout(Duration::from_secs(5), leadership.lost())
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), publisher)
            .await
            .unwrap()
            .unwrap();
        assert!(leadership.admit(Request::new(())).is_err());
    }

    #[test]
    fn the_state_gauge_marks_exactly_the_current_state() {
        let m = HaMetrics::default();
        m.set_state(&HaState::Standby { holder: None });
        let get = |s: &str| {
            m.state
                .get_or_create(&vec![("state".into(), s.into())])
                .get()
        };
        assert_eq!((get("active"), get("standby")), (0, 1));
        m.set_state(&HaState::Active);
        assert_eq!((get("active"), get("standby")), (1, 0));
    }
}
