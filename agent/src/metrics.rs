//! The agent's Prometheus metrics, named as upstream's where they mean the same thing.
//!
//! Owns: [`AgentMetrics`] — connection state (`argocd_agent_connection_status`,
//! `argocd_agent_connections_total`, `argocd_agent_auth_failures_total`), event traffic
//! (`agent_events_received_total`, `agent_events_sent_total`, by event type and resource type),
//! `agent_event_propagation_latency_seconds{resource_type}` (from the `sentat` extension of
//! received events, labelled like upstream's), how each inbound event's handling went
//! (`agent_event_processing_time{status,agent_mode,resource_type}`, `agent_errors{resource_type}`:
//! [`HandlingMetrics`]) and the outbound queue size `argocd_agent_outbox_resources`. Registered once into the process's
//! [`MetricsRegistry`]; the connection loop updates them.

use argocd_agent_proto::event::{stream_event_labels, Event};
use argocd_agent_proto::pb::eventstreamapi::Event as WireEvent;
use argocd_agent_proto::sync::HandlingMetrics;
use argocd_agent_runtime::telemetry::MetricsRegistry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

type Labels = Vec<(String, String)>;

/// Handles to every agent metric (cheap to clone: shared atomics).
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    /// 1 while the event stream to the principal is up, else 0.
    pub connection_status: Gauge,
    /// Event streams established.
    pub connections: Counter,
    /// Authenticate/RefreshToken calls the principal refused.
    pub auth_failures: Counter,
    events_received: Family<Labels, Counter>,
    events_sent: Family<Labels, Counter>,
    propagation_latency: Family<Labels, Histogram, fn() -> Histogram>,
    /// Distinct resources with events waiting for delivery or an ACK.
    pub outbox_resources: Gauge,
    /// Upstream's `agent_event_processing_time{status,agent_mode,resource_type}` (seconds to
    /// handle one inbound event) and `agent_errors{resource_type}` (inbound events that failed).
    pub handling: HandlingMetrics,
    /// Resends of un-ACKed events (the outbox counts into it).
    pub event_resends: Counter,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        AgentMetrics {
            connection_status: Gauge::default(),
            connections: Counter::default(),
            auth_failures: Counter::default(),
            events_received: Family::default(),
            events_sent: Family::default(),
            // 5 ms .. ~82 s
            propagation_latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 15))
            }),
            outbox_resources: Gauge::default(),
            handling: HandlingMetrics::agent(),
            event_resends: Counter::default(),
        }
    }
}

fn labels(event_type: &str, resource_type: &str) -> Labels {
    vec![
        ("event_type".to_string(), event_type.to_string()),
        ("resource_type".to_string(), resource_type.to_string()),
    ]
}

impl AgentMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &MetricsRegistry) -> Self {
        let m = AgentMetrics::default();
        registry.register(
            "argocd_agent_connection_status",
            "Whether the event stream to the principal is up (1) or not (0)",
            m.connection_status.clone(),
        );
        registry.register(
            "argocd_agent_connections",
            "Event streams established with the principal",
            m.connections.clone(),
        );
        registry.register(
            "argocd_agent_auth_failures",
            "Authentication or token refresh attempts the principal refused",
            m.auth_failures.clone(),
        );
        registry.register(
            "agent_events_received",
            "Events received from the principal",
            m.events_received.clone(),
        );
        registry.register(
            "agent_events_sent",
            "Events sent to the principal (resends included)",
            m.events_sent.clone(),
        );
        registry.register(
            "agent_event_propagation_latency_seconds",
            "Time from an event's first send by the principal (sentat) to its arrival here",
            m.propagation_latency.clone(),
        );
        registry.register(
            "argocd_agent_outbox_resources",
            "Resources with events queued for the principal or awaiting its ACK",
            m.outbox_resources.clone(),
        );
        registry.register(
            "agent_event_processing_time",
            "Seconds taken to handle one event received from the principal, by outcome (success, failure, discarded), agent mode and resource type",
            m.handling.processing_time(),
        );
        registry.register(
            "agent_errors",
            "Events received from the principal whose handling failed (retryable or refused), by resource type",
            m.handling.errors(),
        );
        registry.register(
            "argocd_agent_event_resends",
            "Events sent again because the principal had not ACKed them in time",
            m.event_resends.clone(),
        );
        m
    }

    /// Counts an event received from the principal and, for non-ACKs, its propagation latency.
    pub fn observe_received(&self, ev: &Event) {
        self.events_received
            .get_or_create(&labels(
                ev.event_type.metric_label(),
                ev.target.metric_label(),
            ))
            .inc();
        if ev.is_ack() {
            return;
        }
        if let Some(sent_at) = ev.sent_at {
            let latency = chrono::Utc::now().signed_duration_since(sent_at);
            // Clocks of two machines: a negative latency is skew, not information.
            let seconds = latency.num_microseconds().unwrap_or(0).max(0) as f64 / 1e6;
            self.propagation_latency
                .get_or_create(&vec![(
                    "resource_type".to_string(),
                    ev.target.metric_label().to_string(),
                )])
                .observe(seconds);
        }
    }

    /// Counts an event sent on the stream.
    pub fn observe_sent(&self, wire: &WireEvent) {
        let (event_type, target) = stream_event_labels(wire);
        self.events_sent
            .get_or_create(&labels(
                event_type.metric_label(),
                argocd_agent_proto::event::Target::from_wire(target).metric_label(),
            ))
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_proto::event::{EventType, Target};

    #[test]
    fn events_and_latency_are_exposed_under_upstream_names() {
        let registry = MetricsRegistry::empty();
        let m = AgentMetrics::register(&registry);
        let mut ev = Event::new(EventType::SpecUpdate, Target::Application, "p");
        ev.sent_at = Some(chrono::Utc::now() - chrono::Duration::milliseconds(30));
        m.observe_received(&ev);
        m.observe_sent(&ev.ack().into_stream_event());
        m.connection_status.set(1);
        let text = registry.encode().unwrap();
        assert!(
            text.contains(
                "agent_events_received_total{event_type=\"spec-update\",resource_type=\"application\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "agent_events_sent_total{event_type=\"processed\",resource_type=\"eventProcessed\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "agent_event_propagation_latency_seconds_count{resource_type=\"application\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("argocd_agent_connection_status 1"), "{text}");
        assert!(text.contains("argocd_agent_connections_total 0"), "{text}");
    }
}
