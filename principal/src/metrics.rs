//! The principal's Prometheus metrics, declared in one place and registered once; names follow
//! upstream argocd-agent where they mean the same thing, and where ours came first under another
//! name the same handle is registered a second time under upstream v0.9.0's name (see
//! [`PrincipalMetrics::register`]), so upstream's dashboards and alerts keep working.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_agent_proto::event::EventType;
use argocd_agent_proto::sync::HandlingMetrics;
use argocd_agent_runtime::telemetry::MetricsRegistry;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;

type Labels = Vec<(String, String)>;

/// Handles to every principal metric.
#[derive(Debug)]
pub struct PrincipalMetrics {
    /// `argocd_principal_connected_agents`.
    pub connected_agents: Gauge,
    /// `argocd_principal_agent_connections_total`.
    pub connections: Counter,
    /// `argocd_principal_auth_failures_total{reason}`.
    pub auth_failures: Family<Labels, Counter>,
    /// `principal_events_received_total{event_type}`.
    pub events_received: Family<Labels, Counter>,
    /// `principal_events_sent_total{event_type}`.
    pub events_sent: Family<Labels, Counter>,
    /// `argocd_principal_event_errors_total{reason}`: agents' events that failed (`retryable`: no
    /// ACK, the agent resends; `rejected`: ACKed with the error), counted by the stream's
    /// [`argocd_agent_proto::sync::Instrumented`] handler.
    pub event_errors: Family<Labels, Counter>,
    /// `argocd_principal_outbox_resources{agent_name}`: resources with undelivered events.
    pub outbox_resources: Family<Labels, Gauge>,
    /// `argocd_principal_agent_connected{agent_name,agent_mode}`: 1 while the agent's stream is up.
    pub agent_connected: Family<Labels, Gauge>,
    /// `principal_agent_avg_connection_time` (upstream's): average minutes the connected agents'
    /// streams have been up.
    pub connection_time: AverageConnectionTime,
    /// `argocd_principal_agent_last_event_timestamp_seconds{agent_name}`: last event received.
    pub agent_last_event: Family<Labels, Gauge>,
    /// Upstream's `principal_event_processing_time{status,agent_name,resource_type}` (seconds to
    /// handle one event from an agent) and `principal_errors{resource_type}` (events that failed).
    pub handling: HandlingMetrics,
    /// `argocd_principal_event_resends_total`: events sent again for want of an ACK.
    pub event_resends: Counter,
    /// `argocd_principal_resource_proxy_{requests,errors}_total{agent_name,code}` and the latency
    /// histogram.
    pub resource_proxy: ProxyMetrics,
    /// `argocd_principal_redis_proxy_{requests,errors}_total{agent_name,command}` and the latency
    /// histogram.
    pub redis_proxy: ProxyMetrics,
    /// `argocd_principal_mirror_collisions_total{agent_name}` (updated by the hub).
    pub mirror_collisions: crate::hub::MirrorCollisions,
    /// Upstream's `principal_{applications,app_projects,repositories,gpg_keys}_{created,updated,deleted}`
    /// (updated by the hub).
    pub hub_changes: crate::hub::HubChanges,
    /// `argocd_principal_terminal_sessions_open{agent_name}` and
    /// `argocd_principal_terminal_sessions_total{agent_name,outcome}`.
    pub terminal: TerminalMetrics,
}

/// Web terminal sessions (pods/exec through the resource proxy): how many are open per agent, and
/// how each ended or why it was refused (`outcome`, from a fixed set: see
/// [`crate::terminal::SessionEnd::outcome`], [`crate::terminal::REFUSED_LIMIT`] and
/// [`crate::terminal::UNAVAILABLE`]).
#[derive(Debug, Clone, Default)]
pub struct TerminalMetrics {
    open: Family<Labels, Gauge>,
    sessions: Family<Labels, Counter>,
}

impl TerminalMetrics {
    fn register(&self, registry: &MetricsRegistry) {
        registry.register(
            "argocd_principal_terminal_sessions_open",
            "Web terminal sessions open, by agent",
            self.open.clone(),
        );
        registry.register(
            "argocd_principal_terminal_sessions",
            "Web terminal sessions by agent and outcome (how they ended, or refused_limit)",
            self.sessions.clone(),
        );
    }

    fn agent(agent: &str) -> Labels {
        vec![("agent_name".into(), agent.into())]
    }

    /// One more session of `agent`'s is open.
    pub fn opened(&self, agent: &str) {
        self.open.get_or_create(&Self::agent(agent)).inc();
    }

    /// One session of `agent`'s fewer is open.
    pub fn closed(&self, agent: &str) {
        self.open.get_or_create(&Self::agent(agent)).dec();
    }

    /// Counts a session of `agent`'s that ended (or was refused) with `outcome`.
    pub fn ended(&self, agent: &str, outcome: &'static str) {
        let mut labels = Self::agent(agent);
        labels.push(("outcome".into(), outcome.into()));
        self.sessions.get_or_create(&labels).inc();
    }
}

/// Requests, errors and latency of one proxy: `requests_total{agent_name,<what>}`,
/// `errors_total{agent_name,<what>,reason}` and an unlabelled `request_duration_seconds`
/// histogram, where `<what>` is `code` (HTTP status, resource proxy) or `command` (Redis proxy).
/// Upstream argocd-agent labels its counters with `agent_name` (and `reason` / `command`): ours
/// carry those and one more, so upstream's queries keep working.
#[derive(Debug, Clone)]
pub struct ProxyMetrics {
    what: &'static str,
    requests: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    seconds: Histogram,
}

impl ProxyMetrics {
    /// Metrics whose second label is named `what` (`code` or `command`).
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            requests: Family::default(),
            errors: Family::default(),
            // 1 ms .. ~33 s
            seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
        }
    }

    fn register(&self, registry: &MetricsRegistry, proxy: &str) {
        registry.register(
            format!("argocd_principal_{proxy}_requests"),
            format!(
                "Requests answered by the {proxy}, by agent and {}",
                self.what
            ),
            self.requests.clone(),
        );
        registry.register(
            format!("argocd_principal_{proxy}_errors"),
            format!(
                "Requests the {proxy} answered itself instead of the agent (refused, agent away, timeout), by agent, {} and reason",
                self.what
            ),
            self.errors.clone(),
        );
        registry.register(
            format!("argocd_principal_{proxy}_request_duration_seconds"),
            format!("Seconds from a request to the start of its answer in the {proxy}"),
            self.seconds.clone(),
        );
    }

    /// Records one answered request: `agent` is who it was for (empty when unknown, e.g.
    /// unauthenticated, or for the hub's own Redis), `what` its status code or command name (from
    /// a bounded set: callers never pass client-chosen text), `failure` why the proxy answered it
    /// itself, if it did.
    pub fn observe(&self, agent: &str, what: &str, failure: Option<&str>, elapsed: Duration) {
        let mut labels = vec![
            ("agent_name".to_string(), agent.to_string()),
            (self.what.to_string(), what.to_string()),
        ];
        self.requests.get_or_create(&labels).inc();
        if let Some(reason) = failure {
            labels.push(("reason".to_string(), reason.to_string()));
            self.errors.get_or_create(&labels).inc();
        }
        self.seconds.observe(elapsed.as_secs_f64());
    }
}

/// Upstream's `principal_agent_avg_connection_time` gauge: the mean of how long each connected
/// agent's stream has been up, each rounded to the minute, in whole minutes (0 with no agent).
/// Upstream recomputes it every three minutes; this computes it when scraped.
#[derive(Debug, Clone, Default)]
pub struct AverageConnectionTime {
    since: Arc<Mutex<HashMap<String, Instant>>>,
}

impl AverageConnectionTime {
    /// Records that `agent`'s stream came up at `since`, or went down (`None`).
    pub fn set(&self, agent: &str, since: Option<Instant>) {
        let mut map = self.since.lock().unwrap_or_else(|p| p.into_inner());
        match since {
            Some(at) => map.insert(agent.to_string(), at),
            None => map.remove(agent),
        };
    }

    /// The gauge's value now.
    pub fn minutes(&self) -> i64 {
        let map = self.since.lock().unwrap_or_else(|p| p.into_inner());
        if map.is_empty() {
            return 0;
        }
        let total: u64 = map
            .values()
            .map(|at| (at.elapsed().as_secs() + 30) / 60)
            .sum();
        (total / map.len() as u64) as i64
    }
}

impl EncodeMetric for AverageConnectionTime {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.minutes())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

impl Default for PrincipalMetrics {
    fn default() -> Self {
        Self {
            connected_agents: Gauge::default(),
            connections: Counter::default(),
            auth_failures: Family::default(),
            events_received: Family::default(),
            events_sent: Family::default(),
            event_errors: Family::default(),
            outbox_resources: Family::default(),
            agent_connected: Family::default(),
            connection_time: AverageConnectionTime::default(),
            agent_last_event: Family::default(),
            handling: HandlingMetrics::principal(),
            event_resends: Counter::default(),
            resource_proxy: ProxyMetrics::new("code"),
            redis_proxy: ProxyMetrics::new("command"),
            mirror_collisions: Default::default(),
            hub_changes: Default::default(),
            terminal: TerminalMetrics::default(),
        }
    }
}

impl PrincipalMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &MetricsRegistry) -> PrincipalMetrics {
        let m = PrincipalMetrics::default();
        registry.register(
            "argocd_principal_connected_agents",
            "Agents with an open event stream",
            m.connected_agents.clone(),
        );
        // Upstream v0.9.0's name for the same gauge.
        registry.register(
            "agent_connected_with_principal",
            "Agents with an open event stream (upstream argocd-agent's name for argocd_principal_connected_agents)",
            m.connected_agents.clone(),
        );
        registry.register(
            "principal_agent_avg_connection_time",
            "Average time the connected agents' event streams have been up, in whole minutes (0 with none)",
            m.connection_time.clone(),
        );
        registry.register(
            "argocd_principal_agent_connections",
            "Event streams opened by agents",
            m.connections.clone(),
        );
        registry.register(
            "argocd_principal_auth_failures",
            "Refused agent connections and calls by reason",
            m.auth_failures.clone(),
        );
        registry.register(
            "principal_events_received",
            "Events received from agents by type",
            m.events_received.clone(),
        );
        registry.register(
            "principal_events_sent",
            "Events sent to agents by type",
            m.events_sent.clone(),
        );
        registry.register(
            "argocd_principal_event_errors",
            "Inbound events that failed by reason",
            m.event_errors.clone(),
        );
        registry.register(
            "argocd_principal_outbox_resources",
            "Resources with undelivered events per agent",
            m.outbox_resources.clone(),
        );
        registry.register(
            "argocd_principal_agent_connected",
            "Whether each known agent's event stream is up (1) or not (0)",
            m.agent_connected.clone(),
        );
        registry.register(
            "argocd_principal_agent_last_event_timestamp_seconds",
            "Unix time of the last event received from each agent",
            m.agent_last_event.clone(),
        );
        registry.register(
            "principal_event_processing_time",
            "Seconds taken to handle one event received from an agent, by outcome (success, failure, not-allowed), agent and resource type",
            m.handling.processing_time(),
        );
        registry.register(
            "principal_errors",
            "Events received from agents whose handling failed (retryable or refused), by resource type",
            m.handling.errors(),
        );
        registry.register(
            "argocd_principal_event_resends",
            "Events sent again because the agent had not ACKed them in time",
            m.event_resends.clone(),
        );
        m.resource_proxy.register(registry, "resource_proxy");
        m.redis_proxy.register(registry, "redis_proxy");
        m.mirror_collisions.register(registry);
        m.hub_changes.register(registry);
        m.terminal.register(registry);
        m
    }

    /// Marks `agent`'s stream up or down.
    pub fn agent_connection(&self, agent: &str, mode: &str, up: bool) {
        self.connection_time.set(agent, up.then(Instant::now));
        self.agent_connected
            .get_or_create(&vec![
                ("agent_name".into(), agent.into()),
                ("agent_mode".into(), mode.into()),
            ])
            .set(i64::from(up));
    }

    /// Records that an event from `agent` arrived now.
    pub fn agent_event(&self, agent: &str) {
        self.agent_last_event
            .get_or_create(&vec![("agent_name".into(), agent.into())])
            .set(chrono::Utc::now().timestamp());
    }

    /// Counts a refused connection or call.
    pub fn auth_failure(&self, reason: &str) {
        self.auth_failures
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }

    /// Counts an event by type in `family`; unrecognised types (peer-chosen strings) share the
    /// one label value `unknown`, so a peer cannot grow the series without bound.
    pub fn count_event(family: &Family<Labels, Counter>, event_type: &EventType) {
        family
            .get_or_create(&vec![(
                "event_type".into(),
                event_type.metric_label().into(),
            )])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_requests_and_failures_are_counted_by_agent_and_outcome() {
        let registry = MetricsRegistry::empty();
        let metrics = PrincipalMetrics::register(&registry);
        let rp = &metrics.resource_proxy;
        rp.observe("agent-a", "200", None, Duration::from_millis(3));
        rp.observe("agent-a", "504", Some("Timeout"), Duration::from_secs(30));
        metrics
            .redis_proxy
            .observe("agent-a", "GET", None, Duration::from_millis(1));
        let text = registry.encode().unwrap();
        for line in [
            "argocd_principal_resource_proxy_requests_total{agent_name=\"agent-a\",code=\"200\"} 1",
            "argocd_principal_resource_proxy_requests_total{agent_name=\"agent-a\",code=\"504\"} 1",
            "argocd_principal_resource_proxy_errors_total{agent_name=\"agent-a\",code=\"504\",reason=\"Timeout\"} 1",
            "argocd_principal_resource_proxy_request_duration_seconds_count 2",
            "argocd_principal_redis_proxy_requests_total{agent_name=\"agent-a\",command=\"GET\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        assert!(!text.contains("redis_proxy_errors_total{"), "{text}");
    }

    #[test]
    fn terminal_sessions_are_gauged_while_open_and_counted_by_outcome() {
        let registry = MetricsRegistry::empty();
        let metrics = PrincipalMetrics::register(&registry);
        let t = &metrics.terminal;
        t.opened("agent-a");
        t.opened("agent-a");
        t.closed("agent-a");
        t.ended("agent-a", "finished");
        t.ended("agent-a", "refused_limit");
        let text = registry.encode().unwrap();
        for line in [
            "argocd_principal_terminal_sessions_open{agent_name=\"agent-a\"} 1",
            "argocd_principal_terminal_sessions_total{agent_name=\"agent-a\",outcome=\"finished\"} 1",
            "argocd_principal_terminal_sessions_total{agent_name=\"agent-a\",outcome=\"refused_limit\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }

    #[test]
    fn upstream_connection_names_follow_the_connected_agents() {
        let registry = MetricsRegistry::empty();
        let metrics = PrincipalMetrics::register(&registry);
        metrics.connected_agents.inc();
        metrics.connected_agents.inc();
        let now = Instant::now();
        let ago = |mins: u64| now.checked_sub(Duration::from_secs(mins * 60)).unwrap();
        metrics.connection_time.set("a", Some(ago(10)));
        metrics.connection_time.set("b", Some(ago(4)));
        let text = registry.encode().unwrap();
        for line in [
            "agent_connected_with_principal 2",
            "argocd_principal_connected_agents 2",
            "principal_agent_avg_connection_time 7",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        metrics.connection_time.set("a", None);
        metrics.connection_time.set("b", None);
        assert_eq!(metrics.connection_time.minutes(), 0);
    }

    #[test]
    fn unknown_event_types_fold_into_one_series() {
        let registry = MetricsRegistry::empty();
        let metrics = PrincipalMetrics::register(&registry);
        for i in 0..1000 {
            let t = EventType::from_wire(&format!("io.example.hostile-{i}"));
            PrincipalMetrics::count_event(&metrics.events_received, &t);
        }
        PrincipalMetrics::count_event(&metrics.events_received, &EventType::StatusUpdate);
        let text = registry.encode().unwrap();
        // The encoder's series order is not fixed: compare as a sorted list.
        let mut series: Vec<_> = text
            .lines()
            .filter(|l| l.starts_with("principal_events_received_total{"))
            .collect();
        series.sort_unstable();
        assert_eq!(
            series,
            [
                "principal_events_received_total{event_type=\"status-update\"} 1",
                "principal_events_received_total{event_type=\"unknown\"} 1000",
            ]
        );
    }
}
