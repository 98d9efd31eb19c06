//! The principal's Prometheus metrics, declared in one place and registered once; names follow
//! upstream argocd-agent where they mean the same thing.

use argocd_agent_proto::telemetry::MetricsRegistry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

type Labels = Vec<(String, String)>;

/// Handles to every principal metric.
#[derive(Debug, Default)]
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
    /// `argocd_principal_event_errors_total{reason}`.
    pub event_errors: Family<Labels, Counter>,
    /// `argocd_principal_outbox_resources{agent_name}`: resources with undelivered events.
    pub outbox_resources: Family<Labels, Gauge>,
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
        m
    }

    /// Counts a refused connection or call.
    pub fn auth_failure(&self, reason: &str) {
        self.auth_failures
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }

    /// Counts an event by type in `family`.
    pub fn count_event(family: &Family<Labels, Counter>, event_type: &str) {
        family
            .get_or_create(&vec![("event_type".into(), event_type.into())])
            .inc();
    }
}
