//! A sync (or other operation) requested on a hub Application, from the request to the moment it
//! has run on the spoke and is cleared from the hub.
//!
//! Upstream argocd-pull-integration copies `.operation` into the ManifestWork and clears it on the
//! hub right after writing the work; the next work then lacks it, and the work agent's
//! server-side apply removes `.operation` from the spoke Application — withdrawing the operation
//! if the spoke's Argo CD has not run it yet (or is still running it). Here the operation stays
//! in the payload until the spoke reports, through the status feedback, that an operation started
//! after the request was delivered has completed; only then is it cleared on the hub. Meanwhile
//! the work agent does not put it back when it re-applies the work (`ignoreFields` on spoke
//! change, [`super::manifestwork`]), so it runs once.
//!
//! Owns the baseline annotation (the spoke's `operationState.startedAt` when the request was
//! delivered, so "a new operation has run" needs no clock comparison across clusters) and the
//! pure decision [`operation_ran`].

use argocd_agent_kube::argocd::Application;
use serde_json::Value;

use super::manifestwork::{applied_at_current_generation, ManifestWork};
use super::status::read_feedback;

/// ManifestWork annotation: the spoke Application's `status.operationState.startedAt` (empty when
/// it had none) at the time the work first carried the hub's operation.
pub const OPERATION_BASELINE_ANNOTATION: &str =
    "argocd-agent.argoproj-labs.io/operation-baseline-started-at";

/// Operation phases after which Argo CD has removed `.operation` (it is no longer running).
const COMPLETED_PHASES: [&str; 3] = ["Succeeded", "Failed", "Error"];

/// The operation a hub Application requests (an object under `.operation`).
pub fn requested(app: &Application) -> Option<&Value> {
    app.operation.as_ref().filter(|o| o.is_object())
}

/// The operation the work's payload carries.
fn carried(work: &ManifestWork) -> Option<&Value> {
    work.spec.workload.manifests.first()?.get("operation")
}

/// The baseline to record for `operation`: kept from `existing` while it already carries this
/// operation, else the spoke's current `operationState.startedAt` from its feedback.
pub fn baseline_for(operation: &Value, existing: Option<&ManifestWork>) -> String {
    let Some(work) = existing else {
        return String::new();
    };
    let recorded = work
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OPERATION_BASELINE_ANNOTATION));
    match recorded {
        Some(baseline) if carried(work) == Some(operation) => baseline.clone(),
        _ => read_feedback(work)
            .0
            .operation_started_at
            .unwrap_or_default(),
    }
}

/// True when the operation `app` requests has run on the spoke: `work` carries it, was applied at
/// its current generation, and its feedback shows an operation that started after the baseline
/// and completed.
pub fn operation_ran(app: &Application, work: Option<&ManifestWork>) -> bool {
    let (Some(operation), Some(work)) = (requested(app), work) else {
        return false;
    };
    let Some(baseline) = work
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OPERATION_BASELINE_ANNOTATION))
    else {
        return false;
    };
    if carried(work) != Some(operation) || !applied_at_current_generation(work) {
        return false;
    }
    let spoke = read_feedback(work).0;
    let started_after = spoke
        .operation_started_at
        .as_deref()
        .is_some_and(|s| s != baseline);
    let completed = spoke
        .operation_phase
        .as_deref()
        .is_some_and(|p| COMPLETED_PHASES.contains(&p));
    started_after && completed
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app(operation: Value) -> Application {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "guestbook", "namespace": "apps"},
            "spec": {}, "operation": operation
        }))
        .unwrap()
    }

    fn work(
        operation: Value,
        baseline: Option<&str>,
        generation: i64,
        feedback: Value,
    ) -> ManifestWork {
        let annotations = baseline.map(|b| json!({OPERATION_BASELINE_ANNOTATION: b}));
        serde_json::from_value(json!({
            "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": {"name": "guestbook-3f2a9", "namespace": "cluster1", "generation": 2,
                         "annotations": annotations.unwrap_or(json!({}))},
            "spec": {"workload": {"manifests": [{"kind": "Application", "operation": operation}]}},
            "status": {
                "conditions": [{"type": "Applied", "status": "True", "observedGeneration": generation}],
                "resourceStatus": {"manifests": [{
                    "resourceMeta": {"group": "argoproj.io", "kind": "Application", "resource": "applications"},
                    "statusFeedback": {"values": feedback}
                }]}
            }
        }))
        .unwrap()
    }

    fn feedback(phase: &str, started_at: &str) -> Value {
        json!([
            {"name": "operationStatePhase", "fieldValue": {"type": "String", "string": phase}},
            {"name": "operationStateStartedAt", "fieldValue": {"type": "String", "string": started_at}}
        ])
    }

    #[test]
    fn an_operation_has_run_once_a_newer_one_completed_on_the_spoke() {
        let op = json!({"sync": {"revision": "main"}});
        let hub = app(op.clone());
        let earlier = feedback("Succeeded", "2024-05-01T10:00:00Z");
        let with = |baseline: Option<&str>, generation, fb: &Value| {
            work(op.clone(), baseline, generation, fb.clone())
        };
        let base = Some("2024-05-01T10:00:00Z");
        assert!(!operation_ran(&hub, None));
        assert!(
            !operation_ran(&hub, Some(&with(base, 2, &earlier))),
            "the spoke still shows the operation before the request"
        );
        let running = feedback("Running", "2024-05-01T11:00:00Z");
        assert!(
            !operation_ran(&hub, Some(&with(base, 2, &running))),
            "still running"
        );
        let done = feedback("Succeeded", "2024-05-01T11:00:00Z");
        assert!(operation_ran(&hub, Some(&with(base, 2, &done))));
        let failed = feedback("Failed", "2024-05-01T11:00:00Z");
        assert!(
            operation_ran(&hub, Some(&with(base, 2, &failed))),
            "a failed sync has run too"
        );
        assert!(
            !operation_ran(&hub, Some(&with(base, 1, &done))),
            "the generation carrying it is not applied yet"
        );
        assert!(
            !operation_ran(&hub, Some(&with(None, 2, &done))),
            "no baseline recorded"
        );
        let other = work(json!({"sync": {"revision": "v2"}}), base, 2, done.clone());
        assert!(
            !operation_ran(&hub, Some(&other)),
            "the work carries another operation"
        );
        let mut cleared = hub.clone();
        cleared.operation = None;
        assert!(!operation_ran(&cleared, Some(&with(base, 2, &done))));
    }

    #[test]
    fn baseline_is_the_spokes_last_start_when_the_request_is_first_carried() {
        let op = json!({"sync": {"revision": "main"}});
        assert_eq!(baseline_for(&op, None), "");
        let before = work(
            json!(null),
            None,
            2,
            feedback("Succeeded", "2024-05-01T10:00:00Z"),
        );
        assert_eq!(baseline_for(&op, Some(&before)), "2024-05-01T10:00:00Z");
        let carrying = work(
            op.clone(),
            Some("2024-05-01T10:00:00Z"),
            2,
            feedback("Running", "2024-05-01T11:00:00Z"),
        );
        assert_eq!(
            baseline_for(&op, Some(&carrying)),
            "2024-05-01T10:00:00Z",
            "kept while the work carries the same operation"
        );
    }
}
