//! The metrics each end keeps about the events it handles, with upstream argocd-agent v0.9.0's
//! labels: a processing-time histogram `{status, <peer>, resource_type}` (the principal's peer
//! label is `agent_name`, the agent's `agent_mode`) and an error counter `{resource_type}`
//! (`principal_errors` / `agent_errors`), both fed by [`super::Instrumented`].
//!
//! `status` takes upstream's values: `success`; `failure` (also counted as an error, whether the
//! peer will resend or the event was refused); and, for an event the receiver never takes from a
//! peer in its mode ([`HandleError::NotAllowed`]), `not-allowed` on the principal and `discarded`
//! on the agent, as upstream names them, not counted as an error. `resource_type` is the event's
//! target from a bounded set ([`Target::metric_label`]), never the peer's text.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::lanes::{processing_time_histogram, HandleError};
use crate::event::Target;

type Labels = Vec<(String, String)>;

/// A processing-time histogram family (one histogram per label set, same buckets).
pub type ProcessingTime = Family<Labels, Histogram, fn() -> Histogram>;

/// One end's handling metrics (cheap to clone: shared families). See the module docs.
#[derive(Debug, Clone)]
pub struct HandlingMetrics {
    seconds: ProcessingTime,
    errors: Family<Labels, Counter>,
    not_allowed_status: &'static str,
}

impl HandlingMetrics {
    /// The principal's: `principal_event_processing_time{status,agent_name,resource_type}`, with
    /// `not-allowed` for events a peer's mode does not allow, and `principal_errors`.
    pub fn principal() -> Self {
        Self::new("not-allowed")
    }

    /// The agent's: `agent_event_processing_time{status,agent_mode,resource_type}`, with
    /// `discarded` for events its mode does not take, and `agent_errors`.
    pub fn agent() -> Self {
        Self::new("discarded")
    }

    fn new(not_allowed_status: &'static str) -> Self {
        Self {
            seconds: Family::new_with_constructor(processing_time_histogram),
            errors: Family::default(),
            not_allowed_status,
        }
    }

    /// The processing-time family, to register.
    pub fn processing_time(&self) -> ProcessingTime {
        self.seconds.clone()
    }

    /// The error counter family, to register.
    pub fn errors(&self) -> Family<Labels, Counter> {
        self.errors.clone()
    }

    /// These metrics for the events of one peer, labelled `label`=`value` (`agent_name` and the
    /// agent's authenticated name on the principal, `agent_mode` and its mode on the agent).
    pub fn for_peer(&self, label: &'static str, value: &str) -> PeerHandling {
        PeerHandling {
            metrics: self.clone(),
            peer: (label, value.to_string()),
        }
    }
}

/// [`HandlingMetrics`] bound to one peer's label.
#[derive(Debug, Clone)]
pub struct PeerHandling {
    metrics: HandlingMetrics,
    peer: (&'static str, String),
}

impl PeerHandling {
    /// Records one handled event of target `target` that took `elapsed` and ended in `result`.
    pub fn observe(&self, target: &Target, result: &Result<(), HandleError>, elapsed: Duration) {
        let resource_type = target.metric_label();
        let status = match result {
            Ok(()) => "success",
            Err(HandleError::NotAllowed(_)) => self.metrics.not_allowed_status,
            Err(HandleError::Retryable(_) | HandleError::Rejected(_)) => {
                self.metrics
                    .errors
                    .get_or_create(&vec![("resource_type".into(), resource_type.into())])
                    .inc();
                "failure"
            }
        };
        self.metrics
            .seconds
            .get_or_create(&vec![
                ("status".into(), status.into()),
                (self.peer.0.into(), self.peer.1.clone()),
                ("resource_type".into(), resource_type.into()),
            ])
            .observe(elapsed.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(metrics: &HandlingMetrics) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("seconds", "", metrics.processing_time());
        registry.register("errors", "", metrics.errors());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn statuses_and_errors_follow_upstreams_labels() {
        let metrics = HandlingMetrics::principal();
        let peer = metrics.for_peer("agent_name", "agent-a");
        let ms = Duration::from_millis(2);
        peer.observe(&Target::Application, &Ok(()), ms);
        peer.observe(
            &Target::Application,
            &Err(HandleError::Rejected("bad".into())),
            ms,
        );
        peer.observe(
            &Target::AppProject,
            &Err(HandleError::Retryable("later".into())),
            ms,
        );
        peer.observe(
            &Target::Application,
            &Err(HandleError::NotAllowed(
                "create from a managed agent".into(),
            )),
            ms,
        );
        peer.observe(
            &Target::Unknown("peer-chosen".into()),
            &Err(HandleError::Rejected("?".into())),
            ms,
        );
        let text = encode(&metrics);
        for line in [
            "seconds_count{status=\"success\",agent_name=\"agent-a\",resource_type=\"application\"} 1",
            "seconds_count{status=\"failure\",agent_name=\"agent-a\",resource_type=\"application\"} 1",
            "seconds_count{status=\"failure\",agent_name=\"agent-a\",resource_type=\"appproject\"} 1",
            "seconds_count{status=\"not-allowed\",agent_name=\"agent-a\",resource_type=\"application\"} 1",
            "errors_total{resource_type=\"application\"} 1",
            "errors_total{resource_type=\"appproject\"} 1",
            "errors_total{resource_type=\"unknown\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        assert!(!text.contains("peer-chosen"), "{text}");
        // The agent names the same outcome as upstream's agent does.
        let agent = HandlingMetrics::agent();
        agent.for_peer("agent_mode", "managed").observe(
            &Target::Application,
            &Err(HandleError::NotAllowed("x".into())),
            ms,
        );
        let text = encode(&agent);
        assert!(
            text.contains(
                "seconds_count{status=\"discarded\",agent_mode=\"managed\",resource_type=\"application\"} 1"
            ),
            "{text}"
        );
        assert!(!text.contains("errors_total{"), "{text}");
    }
}
