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
//! An ApplicationSet's progressive sync (`RollingSync`) requests the sync of each Application of
//! a step this way. Argo CD's controller marks the Application `Pending` in the ApplicationSet's
//! `status.applicationStatus`, requests the sync at every reconciliation while the mark stays,
//! moves on only when the Application's `operationState.startedAt` is later than the mark (both
//! kept to the second), and marks it anew when the Application's revision changes. So for an
//! Application its ApplicationSet marks Pending, the operation reaches the spoke only once the
//! mark is for the revision the spoke compared against and no earlier than the second after it
//! ([`delivery_hold`]: the pull model can deliver within the same second, and such a sync would
//! not count); the controller's operation of an Application it has set back to Waiting (it stays
//! on the hub Application) waits for the next mark; and once it has run it is cleared only after
//! the ApplicationSet has taken the run (the mark gone, [`clear_awaits_rollout`]), so that the
//! controller does not request it again.
//! Argo CD's own application controller clears `.operation` when the sync ends, whatever the
//! ApplicationSet shows, and can run such a sync twice. (The controller also requires the
//! Application's `status.reconciledAt`, if set, to be later than the mark; the hub's Argo CD
//! skips pulled Applications and nothing here writes it, so it stays unset.)
//!
//! Owns the baseline annotation (the spoke's `operationState.startedAt` when the request was
//! delivered, so "a new operation has run" needs no clock comparison across clusters) and the
//! pure decisions [`operation_ran`], [`delivery_hold`] and [`clear_awaits_rollout`].

use std::time::Duration;

use argocd_agent_kube::argocd::{Application, ApplicationSet};
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::manifestwork::{applied_at_current_generation, ManifestWork};
use super::status::{read_feedback, SpokeStatus};

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
pub fn carried(work: &ManifestWork) -> Option<&Value> {
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

/// The progressive-sync status of an Application whose sync the ApplicationSet requested and
/// has not yet seen start.
const PENDING: &str = "Pending";
/// The progressive-sync status of an Application whose sync the ApplicationSet has yet to
/// request (again).
const WAITING: &str = "Waiting";
/// Who Argo CD's ApplicationSet controller says requested the syncs of its progressive sync
/// (`operation.initiatedBy.username`).
const APPSET_CONTROLLER: &str = "applicationset-controller";

fn parse_time(written: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(written)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// An ApplicationSet's progressive-sync mark of an Application as Pending: the controller
/// requested its sync at `since`, for the revisions the Application showed then.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingMark {
    /// When it marked the Application Pending (to the second).
    pub since: DateTime<Utc>,
    /// The Application's revisions when it did (`status.applicationStatus[].targetRevisions`).
    pub target_revisions: Vec<String>,
}

/// Where an ApplicationSet's progressive sync is with an Application, as far as delivering and
/// clearing its sync goes.
#[derive(Clone, Debug, PartialEq)]
pub enum Rollout {
    /// Waiting: the controller marks it Pending (anew) before a sync it requests counts; the
    /// sync it requested under an earlier mark (still on the hub Application) would not.
    Waiting,
    /// Pending: the controller requested its sync.
    Pending(PendingMark),
}

impl Rollout {
    /// The Pending mark, if that is where the rollout is.
    pub fn pending(&self) -> Option<&PendingMark> {
        match self {
            Rollout::Pending(mark) => Some(mark),
            Rollout::Waiting => None,
        }
    }
}

/// Where `appset` (the ApplicationSet that generated `app`) has `app` in its progressive sync, if
/// Waiting or Pending.
pub fn rollout_of(app: &Application, appset: Option<&ApplicationSet>) -> Option<Rollout> {
    let entry = appset?.application_status(app.metadata.name.as_deref()?)?;
    match entry.status.as_str() {
        WAITING => Some(Rollout::Waiting),
        PENDING => Some(Rollout::Pending(PendingMark {
            since: parse_time(entry.last_transition_time.as_deref()?)?,
            target_revisions: entry.target_revisions.clone(),
        })),
        _ => None,
    }
}

/// Whether `operation` is one Argo CD's ApplicationSet controller requested.
fn by_appset_controller(operation: &Value) -> bool {
    operation
        .pointer("/initiatedBy/username")
        .and_then(Value::as_str)
        == Some(APPSET_CONTROLLER)
}

/// The revisions an Application shows, as Argo CD's ApplicationSet controller reads them
/// (`status.sync.revisions` of a multi-source one, else `status.sync.revision`).
fn revisions(app: &Application) -> Vec<String> {
    let sync = app.status.as_ref().and_then(|s| s.sync.as_ref());
    let field = |name: &str| sync.and_then(|s| s.other.get(name));
    let listed: Vec<String> = field("revisions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str().map(str::to_owned))
        .collect();
    if !listed.is_empty() {
        return listed;
    }
    field("revision")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
        .map(|r| vec![r.to_owned()])
        .unwrap_or_default()
}

/// Whether the spoke compared `app` against the revision its hub copy shows: its sync status is
/// a comparison's result (not `Unknown`, as while Argo CD cannot reach the repository), and the
/// revision it reports is the hub's; one is reported unless `app` has several sources (Argo CD
/// lists theirs in `status.sync.revisions`, which the feedback does not carry). A sync delivered
/// before the revision is known would be taken, once it is, for a sync of an older revision.
fn compared_at_hub_revision(app: &Application, spoke: &SpokeStatus) -> bool {
    let multi_source = app
        .spec
        .other
        .get("sources")
        .and_then(Value::as_array)
        .is_some_and(|s| !s.is_empty());
    matches!(spoke.sync.as_deref(), Some("Synced" | "OutOfSync"))
        && (multi_source || spoke.sync_revision.is_some())
        && spoke.sync_revision.iter().eq(revisions(app).iter())
}

/// Why the operation an Application in a rollout requests is not delivered yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// The spoke has not compared the Application yet, or the revision it compared against is
    /// not the one the ApplicationSet marked (or not yet on the hub Application): the controller
    /// sets an Application whose revision changed back to Waiting and marks it Pending anew, and
    /// a sync that started before the new mark would not count.
    Revision,
    /// Until the second after the mark.
    For(Duration),
    /// The controller's sync of an Application it shows Waiting: until it marks it Pending (it
    /// requested the sync under an earlier mark, then found the Application's revision changed).
    Waiting,
}

/// Whether the operation `app` requests is held back from its `work`, given where the
/// ApplicationSet's progressive sync is with it: while Pending, until the mark is for the
/// revision the spoke compared against and the hub Application shows, and then until the second
/// after the mark; while Waiting, the controller's own sync until it is Pending. An operation the
/// work already carries is not held, nor a user's sync of a Waiting Application.
pub fn delivery_hold(
    app: &Application,
    work: Option<&ManifestWork>,
    rollout: Option<&Rollout>,
    now: DateTime<Utc>,
) -> Option<Hold> {
    let operation = requested(app)?;
    let rollout = rollout?;
    if work.and_then(carried) == Some(operation) {
        return None;
    }
    let Rollout::Pending(mark) = rollout else {
        return by_appset_controller(operation).then_some(Hold::Waiting);
    };
    let spoke = work.map(|w| read_feedback(w).0).unwrap_or_default();
    if !compared_at_hub_revision(app, &spoke) || mark.target_revisions != revisions(app) {
        return Some(Hold::Revision);
    }
    let not_before = mark.since + chrono::Duration::seconds(1);
    (not_before - now)
        .to_std()
        .ok()
        .filter(|d| !d.is_zero())
        .map(Hold::For)
}

/// Whether clearing the operation that ran (as `work`'s feedback shows) waits for the
/// ApplicationSet: it still marks the Application Pending, and the run started after the mark,
/// so the controller takes it for the sync it requested once it reads the Application's status.
/// A run that started no later than the mark never counts: it is cleared, and the controller
/// requests the sync that will.
pub fn clear_awaits_rollout(work: &ManifestWork, mark: Option<&PendingMark>) -> bool {
    let Some(mark) = mark else {
        return false;
    };
    read_feedback(work)
        .0
        .operation_started_at
        .as_deref()
        .and_then(parse_time)
        .is_some_and(|started| started > mark.since)
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

    fn appset(entries: Value) -> ApplicationSet {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
            "metadata": {"name": "fleet", "namespace": "apps"},
            "status": {"applicationStatus": entries}
        }))
        .unwrap()
    }

    fn entry(app: &str, status: &str, since: &str) -> Value {
        json!({"application": app, "status": status, "step": "1", "message": "",
               "lastTransitionTime": since, "targetRevisions": ["4f1c2d"]})
    }

    fn at(written: &str) -> DateTime<Utc> {
        parse_time(written).unwrap()
    }

    const MARKED: &str = "2024-05-01T10:00:00Z";

    fn mark(revisions: &[&str]) -> PendingMark {
        PendingMark {
            since: at(MARKED),
            target_revisions: revisions.iter().map(|r| r.to_string()).collect(),
        }
    }

    #[test]
    fn an_application_is_pending_or_waiting_in_its_rollout_as_its_applicationset_marks_it() {
        let hub = app(json!({"sync": {}}));
        let pending = appset(json!([entry("guestbook", "Pending", MARKED)]));
        assert_eq!(
            rollout_of(&hub, Some(&pending)),
            Some(Rollout::Pending(mark(&["4f1c2d"])))
        );
        let waiting = appset(json!([entry("guestbook", "Waiting", MARKED)]));
        assert_eq!(rollout_of(&hub, Some(&waiting)), Some(Rollout::Waiting));
        for other in [
            appset(json!([entry("guestbook", "Progressing", MARKED)])),
            appset(json!([entry("guestbook", "Healthy", MARKED)])),
            appset(json!([entry("other", "Pending", MARKED)])),
            appset(json!([])),
        ] {
            assert_eq!(rollout_of(&hub, Some(&other)), None, "{other:?}");
        }
        assert_eq!(rollout_of(&hub, None), None);
    }

    /// The hub Application requesting `op`, showing `revision` (as the status controller wrote it).
    fn requesting(op: &Value, revision: Option<&str>) -> Application {
        let mut hub = app(op.clone());
        hub.status =
            serde_json::from_value(json!({"sync": {"status": "OutOfSync", "revision": revision}}))
                .unwrap();
        hub
    }

    /// A work not carrying the operation yet whose feedback says the spoke compared against `revision`.
    fn compared(revision: Option<&str>) -> ManifestWork {
        compared_as("OutOfSync", revision)
    }

    /// A work not carrying the operation yet whose feedback shows sync status `sync` at `revision`.
    fn compared_as(sync: &str, revision: Option<&str>) -> ManifestWork {
        let mut values =
            vec![json!({"name": "syncStatus", "fieldValue": {"type": "String", "string": sync}})];
        if let Some(r) = revision {
            values.push(
                json!({"name": "syncRevision", "fieldValue": {"type": "String", "string": r}}),
            );
        }
        work(json!(null), None, 2, json!(values))
    }

    #[test]
    fn a_rollouts_sync_reaches_the_spoke_for_the_marked_revision_in_the_second_after_the_mark() {
        let op = json!({"sync": {}});
        let hub = requesting(&op, Some("4f1c2d"));
        let marked = Rollout::Pending(mark(&["4f1c2d"]));
        let now = at("2024-05-01T10:00:00.300Z");
        let ready = compared(Some("4f1c2d"));
        assert_eq!(
            delivery_hold(&hub, Some(&ready), Some(&marked), now),
            Some(Hold::For(Duration::from_millis(700)))
        );
        let next_second = at("2024-05-01T10:00:01Z");
        assert_eq!(
            delivery_hold(&hub, Some(&ready), Some(&marked), next_second),
            None
        );
        assert_eq!(
            delivery_hold(&hub, Some(&ready), None, now),
            None,
            "not in a rollout"
        );

        // The ApplicationSet will mark the Application anew: a sync now would not count.
        for (why, hub, work, mark) in [
            ("no work yet", hub.clone(), None, marked.clone()),
            (
                "the spoke has not compared",
                hub.clone(),
                Some(work(json!(null), None, 2, json!([]))),
                marked.clone(),
            ),
            (
                "the spoke compared another revision",
                hub.clone(),
                Some(compared(Some("9e8d7c"))),
                marked.clone(),
            ),
            (
                "not yet on the hub Application",
                requesting(&op, None),
                Some(ready.clone()),
                marked.clone(),
            ),
            (
                "the spoke could not compare",
                hub.clone(),
                Some(compared_as("Unknown", Some("4f1c2d"))),
                marked.clone(),
            ),
            (
                "the spoke reports no revision yet (and the hub none, as the mark)",
                requesting(&op, None),
                Some(compared(None)),
                Rollout::Pending(mark(&[])),
            ),
            (
                "marked for an older revision",
                hub.clone(),
                Some(ready.clone()),
                Rollout::Pending(mark(&[])),
            ),
        ] {
            assert_eq!(
                delivery_hold(&hub, work.as_ref(), Some(&mark), next_second),
                Some(Hold::Revision),
                "{why}"
            );
        }
        // A multi-source Application reports no single revision: the mark has none either.
        let mut multi = requesting(&op, None);
        multi.spec.other.insert(
            "sources".into(),
            json!([{"repoURL": "r"}, {"repoURL": "s"}]),
        );
        assert_eq!(
            delivery_hold(
                &multi,
                Some(&compared(None)),
                Some(&Rollout::Pending(mark(&[]))),
                next_second
            ),
            None
        );

        let carrying = work(op, Some(""), 2, json!([]));
        assert_eq!(
            delivery_hold(&hub, Some(&carrying), Some(&marked), now),
            None,
            "already delivered"
        );
        let mut nothing = hub.clone();
        nothing.operation = None;
        assert_eq!(
            delivery_hold(&nothing, Some(&ready), Some(&marked), now),
            None
        );
    }

    #[test]
    fn the_controllers_sync_of_an_application_set_back_to_waiting_waits_for_its_next_mark() {
        let by_controller = json!({"initiatedBy": {"username": "applicationset-controller",
                                                   "automated": true}, "sync": {}});
        let hub = requesting(&by_controller, Some("4f1c2d"));
        let ready = compared(Some("4f1c2d"));
        let later = at("2024-05-01T10:00:05Z");
        assert_eq!(
            delivery_hold(&hub, Some(&ready), Some(&Rollout::Waiting), later),
            Some(Hold::Waiting)
        );
        let by_user = json!({"initiatedBy": {"username": "admin"}, "sync": {}});
        assert_eq!(
            delivery_hold(
                &requesting(&by_user, Some("4f1c2d")),
                Some(&ready),
                Some(&Rollout::Waiting),
                later
            ),
            None,
            "a user's sync is not the rollout's"
        );
        let carrying = work(by_controller, Some(""), 2, json!([]));
        assert_eq!(
            delivery_hold(&hub, Some(&carrying), Some(&Rollout::Waiting), later),
            None,
            "already delivered"
        );
    }

    #[test]
    fn a_run_is_cleared_once_its_rollout_took_it_or_never_can() {
        let op = json!({"sync": {}});
        let marked = Some(mark(&["4f1c2d"]));
        let ran = |started: &str| work(op.clone(), Some(""), 2, feedback("Succeeded", started));
        assert!(
            clear_awaits_rollout(&ran("2024-05-01T10:00:01Z"), marked.as_ref()),
            "the ApplicationSet will take it once it reads the status"
        );
        assert!(
            !clear_awaits_rollout(&ran(MARKED), marked.as_ref()),
            "started within the second of the mark: never counts"
        );
        assert!(!clear_awaits_rollout(&ran("2024-05-01T10:00:01Z"), None));
    }
}
