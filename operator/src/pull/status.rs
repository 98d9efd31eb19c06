//! The status controller: a pulled Application's spoke state, reported by the OCM work agent as
//! ManifestWork status feedback, written into the hub Application's status.
//!
//! Owns the parsing of feedback values (malformed ones are reported, never trusted; the raw JSON
//! of `status.resources` bounded by [`MAX_RESOURCES_FEEDBACK`]), the translation into a merge
//! patch of the hub Application (`status.health.status`, `status.sync.status` and `.revision`,
//! `status.operationState`, `status.resources`), and the `ManifestWorkError` condition that says
//! why a cluster did not apply the work or did not report all of its status. It never touches
//! the spec or the ManifestWork.
//!
//! As upstream (argocd-pull-integration) writes it, for Argo CD's ApplicationSet controller
//! (progressive syncs read the generated Applications' status): the spoke state is written only
//! once the feedback carries both health and sync; an operation state always has a `startedAt`;
//! and an Application that becomes Healthy is first written Progressing ([`progressing_first`]).

use argocd_agent_kube::CancellationToken;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_kube::argocd::{
    Application, ApplicationStatus, OperationState, ResourceStatus, StatusOf,
};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::ResourceExt;
use serde_json::{json, Value};

use super::application::{
    conditions, now_rfc3339, pull_intent, with_condition, WORK_ERROR_CONDITION,
};
use super::manifestwork::{
    hub_application_of, manifest_work_name_of, FeedbackValue, ManifestCondition, ManifestWork,
    FEEDBACK_HEALTH, FEEDBACK_HYDRATE_REQUESTED, FEEDBACK_OPERATION_MESSAGE,
    FEEDBACK_OPERATION_PHASE, FEEDBACK_OPERATION_STARTED_AT, FEEDBACK_REFRESH_DELIVERY,
    FEEDBACK_REFRESH_REQUESTED, FEEDBACK_RESOURCES, FEEDBACK_SYNC, FEEDBACK_SYNC_REVISION,
};
use super::watches::{controller_config, run_controller, touched, Subscription};
use super::{PullModelError, PullModelOptions, STATUS_MANAGER};

/// The manifest condition the work agent sets False when it could not read a feedback value.
pub const FEEDBACK_SYNCED_CONDITION: &str = "StatusFeedbackSynced";

/// The spoke Application's state as far as the feedback carried it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpokeStatus {
    /// `status.health.status`.
    pub health: Option<String>,
    /// `status.sync.status`.
    pub sync: Option<String>,
    /// `status.sync.revision`: the revision the spoke compared against.
    pub sync_revision: Option<String>,
    /// `status.operationState.phase`.
    pub operation_phase: Option<String>,
    /// `status.operationState.startedAt` (RFC 3339).
    pub operation_started_at: Option<String>,
    /// `status.operationState.message`.
    pub operation_message: Option<String>,
    /// `status.resources`, when the work agent reports it ([`FEEDBACK_RESOURCES`]).
    pub resources: Option<Vec<ResourceStatus>>,
    /// The refresh delivery token on the spoke Application ([`super::refresh`]).
    pub refresh_delivery: Option<String>,
    /// Its `argocd.argoproj.io/refresh` annotation (a refresh not consumed yet).
    pub refresh_requested: Option<String>,
    /// Its `argocd.argoproj.io/hydrate` annotation.
    pub hydrate_requested: Option<String>,
}

/// Largest `status.resources` feedback value read (raw JSON). The ManifestWork CRD already caps
/// a raw value at 1,024 characters (`jsonRaw`'s `maxLength`, the work agent's
/// `--max-json-raw-length` default); this bound holds on its own, for a hub whose CRD was edited,
/// and keeps what a spoke can make the hub parse and write back small.
pub const MAX_RESOURCES_FEEDBACK: usize = 256 * 1024;

/// A feedback value that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FeedbackError {
    /// The value is not a string, or claims to be one without carrying it.
    #[error("feedback value {name} has type {type_:?} but a String was expected")]
    NotAString {
        /// The feedback name.
        name: String,
        /// The declared type.
        type_: String,
    },
    /// The value is empty.
    #[error("feedback value {name} is an empty string")]
    Empty {
        /// The feedback name.
        name: String,
    },
    /// A timestamp that is not RFC 3339.
    #[error("feedback value {name}={value:?} is not an RFC 3339 time")]
    NotATime {
        /// The feedback name.
        name: String,
        /// The value.
        value: String,
    },
    /// A value that should be raw JSON (`JsonRaw`) is not.
    #[error("feedback value {name} has type {type_:?} but JsonRaw was expected")]
    NotJson {
        /// The feedback name.
        name: String,
        /// The declared type.
        type_: String,
    },
    /// Raw JSON longer than [`MAX_RESOURCES_FEEDBACK`].
    #[error("feedback value {name} is {len} bytes of JSON, more than the {max} read")]
    TooLarge {
        /// The feedback name.
        name: String,
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// Raw JSON that is not what Argo CD writes there.
    #[error("feedback value {name} is not a list of Argo CD resource statuses: {reason}")]
    NotResources {
        /// The feedback name.
        name: String,
        /// The parser's complaint.
        reason: String,
    },
}

/// The manifest status entry of the wrapped Application (the first manifest if none matches).
pub fn application_manifest(work: &ManifestWork) -> Option<&ManifestCondition> {
    let manifests = &work.status.as_ref()?.resource_status.manifests;
    manifests
        .iter()
        .find(|m| {
            let meta = &m.resource_meta;
            meta.group == "argoproj.io"
                && (meta.kind == "Application" || meta.resource == "applications")
        })
        .or_else(|| manifests.first())
}

/// Reads the feedback values: the usable ones, and what was wrong with the others. Unknown names
/// are ignored (other rules may exist).
pub fn read_feedback(work: &ManifestWork) -> (SpokeStatus, Vec<FeedbackError>) {
    let mut status = SpokeStatus::default();
    let mut problems = Vec::new();
    let Some(manifest) = application_manifest(work) else {
        return (status, problems);
    };
    for value in &manifest.status_feedback.values {
        if value.name == FEEDBACK_RESOURCES {
            match read_resources(value) {
                Ok(resources) => status.resources = Some(resources),
                Err(e) => problems.push(e),
            }
            continue;
        }
        let slot = match value.name.as_str() {
            FEEDBACK_HEALTH => &mut status.health,
            FEEDBACK_SYNC => &mut status.sync,
            FEEDBACK_SYNC_REVISION => &mut status.sync_revision,
            FEEDBACK_OPERATION_PHASE => &mut status.operation_phase,
            FEEDBACK_OPERATION_STARTED_AT => &mut status.operation_started_at,
            FEEDBACK_OPERATION_MESSAGE => &mut status.operation_message,
            FEEDBACK_REFRESH_DELIVERY => &mut status.refresh_delivery,
            FEEDBACK_REFRESH_REQUESTED => &mut status.refresh_requested,
            FEEDBACK_HYDRATE_REQUESTED => &mut status.hydrate_requested,
            _ => continue,
        };
        let field = &value.field_value;
        let text = match (field.type_.as_str(), &field.string) {
            ("String", Some(s)) => s.clone(),
            _ => {
                problems.push(FeedbackError::NotAString {
                    name: value.name.clone(),
                    type_: field.type_.clone(),
                });
                continue;
            }
        };
        // A message, or an annotation, may be empty.
        let may_be_empty = [
            FEEDBACK_OPERATION_MESSAGE,
            FEEDBACK_REFRESH_DELIVERY,
            FEEDBACK_REFRESH_REQUESTED,
            FEEDBACK_HYDRATE_REQUESTED,
        ];
        if text.is_empty() && !may_be_empty.contains(&value.name.as_str()) {
            problems.push(FeedbackError::Empty {
                name: value.name.clone(),
            });
            continue;
        }
        if value.name == FEEDBACK_OPERATION_STARTED_AT
            && chrono::DateTime::parse_from_rfc3339(&text).is_err()
        {
            problems.push(FeedbackError::NotATime {
                name: value.name.clone(),
                value: text,
            });
            continue;
        }
        *slot = Some(text);
    }
    (status, problems)
}

/// The spoke Application's `status.resources` from its raw JSON feedback value.
fn read_resources(value: &FeedbackValue) -> Result<Vec<ResourceStatus>, FeedbackError> {
    let name = value.name.clone();
    let field = &value.field_value;
    let raw = match (field.type_.as_str(), &field.json_raw) {
        ("JsonRaw", Some(raw)) => raw,
        _ => {
            return Err(FeedbackError::NotJson {
                name,
                type_: field.type_.clone(),
            })
        }
    };
    if raw.len() > MAX_RESOURCES_FEEDBACK {
        return Err(FeedbackError::TooLarge {
            name,
            len: raw.len(),
            max: MAX_RESOURCES_FEEDBACK,
        });
    }
    serde_json::from_str(raw).map_err(|e| FeedbackError::NotResources {
        name,
        reason: e.to_string(),
    })
}

/// Why the cluster did not (fully) apply the work, as one message; `None` when all is well.
pub fn work_problem(work: &ManifestWork, feedback: &[FeedbackError]) -> Option<String> {
    let cluster = work.namespace().unwrap_or_default();
    let work_name = work.name_any();
    let mut parts = Vec::new();
    let status = work.status.clone().unwrap_or_default();
    let failed =
        |c: &&super::manifestwork::WorkCondition| c.type_ == "Applied" && c.status == "False";
    if let Some(c) = status.conditions.iter().find(failed) {
        parts.push(format!(
            "not applied on cluster {cluster}: {}: {}",
            c.reason, c.message
        ));
    } else if let Some(c) =
        application_manifest(work).and_then(|m| m.conditions.iter().find(failed))
    {
        parts.push(format!(
            "Application not applied on cluster {cluster}: {}: {}",
            c.reason, c.message
        ));
    }
    // The work agent could not read all the values asked for (e.g. `status.resources` without
    // its RawFeedbackJsonString feature gate, or longer than its --max-json-raw-length).
    let unsynced = |c: &&super::manifestwork::WorkCondition| {
        c.type_ == FEEDBACK_SYNCED_CONDITION && c.status == "False"
    };
    if let Some(c) = application_manifest(work).and_then(|m| m.conditions.iter().find(unsynced)) {
        parts.push(format!(
            "status feedback incomplete on cluster {cluster}: {}",
            c.message
        ));
    }
    if !feedback.is_empty() {
        let list: Vec<String> = feedback.iter().map(ToString::to_string).collect();
        parts.push(format!("malformed status feedback: {}", list.join("; ")));
    }
    (!parts.is_empty()).then(|| format!("ManifestWork {cluster}/{work_name}: {}", parts.join("; ")))
}

fn word(of: Option<&StatusOf>) -> Option<&str> {
    of.and_then(|o| o.status.as_deref())
}

/// The hub Application's `status.health.status`.
fn hub_health(app: &Application) -> Option<&str> {
    word(app.status.as_ref().and_then(|s| s.health.as_ref()))
}

/// The health Argo CD reports while an Application's resources are still coming up.
const PROGRESSING: &str = "Progressing";
const HEALTHY: &str = "Healthy";

/// What to write first when the spoke reports Healthy and the hub Application shows another
/// health than Healthy or Progressing: the same, but Progressing (upstream writes it before
/// Healthy, so the ApplicationSet controller sees the Application progress before it is Healthy;
/// Healthy follows in a second write). `None` when no such step is due.
pub fn progressing_first(app: &Application, spoke: &SpokeStatus) -> Option<SpokeStatus> {
    let due = spoke.health.as_deref() == Some(HEALTHY)
        && spoke.sync.is_some()
        && !matches!(hub_health(app), Some(HEALTHY | PROGRESSING));
    due.then(|| SpokeStatus {
        health: Some(PROGRESSING.to_string()),
        ..spoke.clone()
    })
}

/// The merge patch that brings the hub Application up to date with the spoke, or `None` if it
/// already is. Includes the `resourceVersion` read, so a concurrent change makes it fail (409).
/// The spoke state is written only when the feedback carries both health and sync (as upstream:
/// an Application with one of them missing is half reported); the condition always is. An
/// operation phase reported without a start time keeps the hub's, or gets `now` (Argo CD's schema
/// requires `startedAt`, and its ApplicationSet controller reads it).
pub fn status_patch(
    app: &Application,
    spoke: &SpokeStatus,
    problem: Option<&str>,
    now: &str,
) -> Option<Value> {
    let mut status = ApplicationStatus {
        conditions: with_condition(conditions(app), WORK_ERROR_CONDITION, problem, now),
        ..ApplicationStatus::default()
    };
    if spoke.health.is_some() && spoke.sync.is_some() {
        spoke_state(app, spoke, now, &mut status);
    }
    if status == ApplicationStatus::default() {
        return None;
    }
    Some(json!({"metadata": {"resourceVersion": app.metadata.resource_version}, "status": status}))
}

/// Fills `status` with what of `spoke` the hub Application does not show yet.
fn spoke_state(app: &Application, spoke: &SpokeStatus, now: &str, status: &mut ApplicationStatus) {
    let current = app.status.as_ref();
    let status_of = |word: &str| StatusOf {
        status: Some(word.to_string()),
        ..StatusOf::default()
    };
    if let Some(h) = spoke
        .health
        .as_deref()
        .filter(|h| hub_health(app) != Some(h))
    {
        status.health = Some(status_of(h));
    }
    let current_sync = current.and_then(|c| c.sync.as_ref());
    let mut sync = StatusOf::default();
    if let Some(s) = spoke
        .sync
        .as_deref()
        .filter(|s| word(current_sync) != Some(s))
    {
        sync.status = Some(s.to_string());
    }
    let current_revision = current_sync.and_then(|s| s.other.get("revision"));
    if let Some(r) = spoke
        .sync_revision
        .as_deref()
        .filter(|r| current_revision.and_then(Value::as_str) != Some(r))
    {
        sync.other.insert("revision".into(), json!(r));
    }
    if sync != StatusOf::default() {
        status.sync = Some(sync);
    }
    if let Some(phase) = &spoke.operation_phase {
        let state = current.and_then(|c| c.operation_state.as_ref());
        let started = spoke
            .operation_started_at
            .as_ref()
            .or_else(|| state.and_then(|o| o.started_at.as_ref()))
            .map_or(now, String::as_str);
        let changed = state.and_then(|o| o.phase.as_ref()) != Some(phase)
            || state.and_then(|o| o.started_at.as_deref()) != Some(started)
            || (spoke.operation_message.is_some()
                && state.and_then(|o| o.message.as_ref()) != spoke.operation_message.as_ref());
        if changed {
            status.operation_state = Some(OperationState {
                // Argo CD's schema requires `operation`; an empty object merges into an
                // existing one.
                operation: Some(json!({})),
                phase: Some(phase.clone()),
                started_at: Some(started.to_string()),
                message: spoke.operation_message.clone(),
                ..OperationState::default()
            });
        }
    }
    if let Some(resources) = spoke
        .resources
        .as_ref()
        .filter(|r| current.and_then(|c| c.resources.as_ref()) != Some(*r))
    {
        status.resources = Some(resources.clone());
    }
}

/// Errors of one status reconciliation (retried).
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// Reading or patching the hub Application failed.
    #[error("updating hub Application {namespace}/{name} from ManifestWork {work}: {source}")]
    Kube {
        /// Application namespace.
        namespace: String,
        /// Application name.
        name: String,
        /// The ManifestWork (`cluster/name`).
        work: String,
        /// The API error.
        source: kube::Error,
    },
}

struct Context {
    client: kube::Client,
    opts: PullModelOptions,
}

async fn reconcile(work: Arc<ManifestWork>, ctx: Arc<Context>) -> Result<Action, StatusError> {
    if work.metadata.deletion_timestamp.is_some() || !ctx.opts.handles_work(&work) {
        return Ok(Action::await_change());
    }
    let Some((namespace, name)) = hub_application_of(&work) else {
        return Ok(Action::await_change());
    };
    let err = |source| StatusError::Kube {
        namespace: namespace.clone(),
        name: name.clone(),
        work: format!(
            "{}/{}",
            work.namespace().unwrap_or_default(),
            work.name_any()
        ),
        source,
    };
    let apps: Api<Application> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(app) = apps.get_opt(&name).await.map_err(err)? else {
        return Ok(Action::await_change());
    };
    // A leftover work of an earlier incarnation or target of this Application is cleanup's
    // business; its feedback says nothing about the current one.
    let current_target = pull_intent(&app.metadata)
        .target()
        .map(|t| t.cluster.clone());
    if manifest_work_name_of(&app) != Some(work.name_any()) || current_target != work.namespace() {
        return Ok(Action::await_change());
    }
    let (spoke, problems) = read_feedback(&work);
    for p in &problems {
        tracing::warn!(work = %work.name_any(), cluster = ?work.namespace(), "{p}");
    }
    let problem = work_problem(&work, &problems);
    let params = PatchParams {
        field_manager: Some(STATUS_MANAGER.to_string()),
        ..Default::default()
    };
    let mut app = app;
    // Progressing first when due, then the spoke's state as reported.
    for spoke in progressing_first(&app, &spoke).iter().chain([&spoke]) {
        if let Some(patch) = status_patch(&app, spoke, problem.as_deref(), &now_rfc3339()) {
            app = apps
                .patch(&name, &params, &Patch::Merge(&patch))
                .await
                .map_err(err)?;
            tracing::debug!(app = %format!("{namespace}/{name}"), ?spoke, "hub Application status updated from feedback");
        }
    }
    Ok(Action::await_change())
}

fn error_policy(_work: Arc<ManifestWork>, error: &StatusError, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "status reconciliation failed; retrying");
    Action::requeue(ctx.opts.retry_after)
}

/// Runs the status controller until `shutdown`.
pub async fn run(
    client: kube::Client,
    opts: PullModelOptions,
    works: Subscription<ManifestWork>,
    shutdown: CancellationToken,
) -> Result<(), PullModelError> {
    let config = controller_config(opts.concurrency, Duration::ZERO);
    let ctx = Arc::new(Context { client, opts });
    let controller = Controller::for_stream(touched(works.events), works.store);
    run_controller(
        "status",
        [works.ready],
        controller,
        config,
        reconcile,
        error_policy,
        ctx,
        shutdown,
    )
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work_with_feedback(values: Value, conditions: Value) -> ManifestWork {
        serde_json::from_value(json!({
            "apiVersion": "work.open-cluster-management.io/v1",
            "kind": "ManifestWork",
            "metadata": {"name": "guestbook-3f2a9", "namespace": "cluster1"},
            "spec": {"workload": {"manifests": []}},
            "status": {
                "conditions": conditions,
                "resourceStatus": {"manifests": [{
                    "resourceMeta": {"ordinal": 0, "group": "argoproj.io", "kind": "Application", "resource": "applications", "name": "guestbook", "namespace": "argocd", "version": "v1alpha1"},
                    "statusFeedback": {"values": values},
                    "conditions": []
                }]}
            }
        }))
        .expect("valid work")
    }

    fn string(name: &str, value: &str) -> Value {
        json!({"name": name, "fieldValue": {"type": "String", "string": value}})
    }

    fn app(status: Value) -> Application {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "guestbook", "namespace": "apps", "resourceVersion": "7"},
            "spec": {}, "status": status
        }))
        .unwrap()
    }

    #[test]
    fn feedback_values_become_a_status_patch() {
        let work = work_with_feedback(
            json!([
                string("healthStatus", "Healthy"),
                string("syncStatus", "Synced"),
                string("operationStatePhase", "Succeeded"),
                string("operationStateStartedAt", "2024-05-01T10:00:00Z"),
                string("syncRevision", "4f1c2d"),
                string("somethingElse", "ignored")
            ]),
            json!([]),
        );
        let (spoke, problems) = read_feedback(&work);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(spoke.health.as_deref(), Some("Healthy"));
        assert_eq!(spoke.sync.as_deref(), Some("Synced"));
        let patch = status_patch(&app(json!({})), &spoke, None, "now").expect("a change");
        assert_eq!(
            patch,
            json!({"metadata": {"resourceVersion": "7"},
                   "status": {"health": {"status": "Healthy"},
                              "sync": {"status": "Synced", "revision": "4f1c2d"},
                              "operationState": {"operation": {}, "phase": "Succeeded",
                                                 "startedAt": "2024-05-01T10:00:00Z"}}})
        );
        // Already up to date: nothing to write.
        let current = app(json!({
            "health": {"status": "Healthy"}, "sync": {"status": "Synced", "revision": "4f1c2d"},
            "operationState": {"operation": {"sync": {}}, "phase": "Succeeded", "startedAt": "2024-05-01T10:00:00Z"}
        }));
        assert_eq!(status_patch(&current, &spoke, None, "now"), None);
    }

    fn spoke(health: Option<&str>, sync: Option<&str>) -> SpokeStatus {
        SpokeStatus {
            health: health.map(str::to_string),
            sync: sync.map(str::to_string),
            sync_revision: Some("4f1c2d".into()),
            ..SpokeStatus::default()
        }
    }

    #[test]
    fn the_spoke_state_is_written_only_once_both_health_and_sync_are_reported() {
        for half in [spoke(Some("Healthy"), None), spoke(None, Some("OutOfSync"))] {
            assert_eq!(
                status_patch(&app(json!({})), &half, None, "now"),
                None,
                "{half:?}"
            );
        }
        let problem = "ManifestWork cluster1/guestbook-3f2a9: not applied";
        let patch = status_patch(
            &app(json!({})),
            &spoke(Some("Healthy"), None),
            Some(problem),
            "now",
        )
        .expect("the condition");
        assert_eq!(patch["status"].get("health"), None, "{patch}");
        assert_eq!(patch["status"]["conditions"][0]["message"], problem);
        let patch = status_patch(
            &app(json!({})),
            &spoke(Some("Missing"), Some("OutOfSync")),
            None,
            "now",
        )
        .expect("both reported");
        assert_eq!(
            patch["status"],
            json!({"health": {"status": "Missing"},
                   "sync": {"status": "OutOfSync", "revision": "4f1c2d"}})
        );
    }

    #[test]
    fn an_operation_state_always_has_a_start_time() {
        let mut running = spoke(Some("Progressing"), Some("OutOfSync"));
        running.operation_phase = Some("Running".into());
        let patch = status_patch(&app(json!({})), &running, None, "2024-05-01T10:00:07Z")
            .expect("a change");
        assert_eq!(
            patch["status"]["operationState"],
            json!({"operation": {}, "phase": "Running", "startedAt": "2024-05-01T10:00:07Z"})
        );
        // The hub's start time is kept while the phase changes without one.
        let shown = app(json!({"health": {"status": "Progressing"},
                               "sync": {"status": "OutOfSync", "revision": "4f1c2d"},
                               "operationState": {"operation": {}, "phase": "Running",
                                                  "startedAt": "2024-05-01T10:00:07Z"}}));
        assert_eq!(status_patch(&shown, &running, None, "later"), None);
        running.operation_phase = Some("Succeeded".into());
        let patch = status_patch(&shown, &running, None, "later").expect("phase");
        assert_eq!(
            patch["status"]["operationState"]["startedAt"],
            "2024-05-01T10:00:07Z"
        );
    }

    #[test]
    fn an_application_becoming_healthy_is_written_progressing_first() {
        let healthy = spoke(Some("Healthy"), Some("Synced"));
        for before in [
            json!({}),
            json!({"health": {"status": "Missing"}, "sync": {"status": "OutOfSync"}}),
            json!({"health": {"status": "Degraded"}, "sync": {"status": "Synced"}}),
        ] {
            let first = progressing_first(&app(before.clone()), &healthy).expect("due");
            assert_eq!(first.health.as_deref(), Some("Progressing"), "{before}");
            assert_eq!(first.sync, healthy.sync);
            let patch = status_patch(&app(before), &first, None, "now").expect("a change");
            assert_eq!(patch["status"]["health"]["status"], "Progressing");
        }
        for before in [
            json!({"health": {"status": "Progressing"}}),
            json!({"health": {"status": "Healthy"}}),
        ] {
            assert_eq!(
                progressing_first(&app(before.clone()), &healthy),
                None,
                "{before}"
            );
        }
        for not_healthy in [
            spoke(Some("Degraded"), Some("Synced")),
            spoke(Some("Healthy"), None),
        ] {
            assert_eq!(progressing_first(&app(json!({})), &not_healthy), None);
        }
    }

    #[test]
    fn malformed_feedback_values_are_reported_not_written() {
        let work = work_with_feedback(
            json!([
                {"name": "healthStatus", "fieldValue": {"type": "Integer", "integer": 3}},
                {"name": "syncStatus", "fieldValue": {"type": "String"}},
                string("operationStatePhase", "Running"),
                string("operationStateStartedAt", "yesterday")
            ]),
            json!([]),
        );
        let (spoke, problems) = read_feedback(&work);
        assert_eq!(spoke.health, None);
        assert_eq!(spoke.sync, None);
        assert_eq!(problems.len(), 3, "{problems:?}");
        let problem = work_problem(&work, &problems).expect("reported");
        assert!(problem.contains("cluster1/guestbook-3f2a9"), "{problem}");
        assert!(
            problem.contains("healthStatus has type \"Integer\""),
            "{problem}"
        );
        assert!(
            problem.contains("operationStateStartedAt=\"yesterday\""),
            "{problem}"
        );
        // Neither health nor sync readable: only the condition is written.
        let patch =
            status_patch(&app(json!({})), &spoke, Some(&problem), "now").expect("condition");
        assert_eq!(
            patch,
            json!({"metadata": {"resourceVersion": "7"},
                   "status": {"conditions": [{"type": WORK_ERROR_CONDITION, "message": problem,
                                              "lastTransitionTime": "now"}]}})
        );
    }

    fn raw(name: &str, json: &str) -> Value {
        json!({"name": name, "fieldValue": {"type": "JsonRaw", "jsonRaw": json}})
    }

    #[test]
    fn resources_feedback_becomes_the_hub_applications_resources() {
        let listed = r#"[{"version":"v1","kind":"ConfigMap","namespace":"demo","name":"demo-config","status":"Synced"},{"group":"apps","version":"v1","kind":"Deployment","namespace":"demo","name":"web","status":"Synced","health":{"status":"Healthy"}}]"#;
        let work = work_with_feedback(
            json!([
                string("healthStatus", "Healthy"),
                string("syncStatus", "Synced"),
                raw("resources", listed)
            ]),
            json!([]),
        );
        let (spoke, problems) = read_feedback(&work);
        assert!(problems.is_empty(), "{problems:?}");
        let resources = spoke.resources.clone().expect("read");
        assert_eq!(resources[1].api_version(), "apps/v1");
        let patch = status_patch(&app(json!({})), &spoke, None, "now").expect("a change");
        assert_eq!(
            patch["status"]["resources"],
            serde_json::from_str::<Value>(listed).unwrap()
        );
        let current = app(
            json!({"health": {"status": "Healthy"}, "sync": {"status": "Synced"},
                                 "resources": serde_json::from_str::<Value>(listed).unwrap()}),
        );
        assert_eq!(
            status_patch(&current, &spoke, None, "now"),
            None,
            "unchanged"
        );
    }

    #[test]
    fn bad_resources_feedback_is_reported_and_bounded() {
        let huge = format!("[{}]", vec!["{}"; MAX_RESOURCES_FEEDBACK / 2].join(","));
        for (value, expected) in [
            (string("resources", "[]"), "has type \"String\" but JsonRaw"),
            (
                raw("resources", r#"{"kind":"ConfigMap"}"#),
                "not a list of Argo CD resource statuses",
            ),
            (raw("resources", &huge), "bytes of JSON, more than the"),
        ] {
            let work = work_with_feedback(json!([value]), json!([]));
            let (spoke, problems) = read_feedback(&work);
            assert_eq!(spoke.resources, None);
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(
                problems[0].to_string().contains(expected),
                "{}",
                problems[0]
            );
        }
    }

    #[test]
    fn feedback_the_work_agent_could_not_read_is_reported() {
        let mut work = work_with_feedback(json!([string("healthStatus", "Healthy")]), json!([]));
        let message = "Sync status feedback failed with error the length of returned json raw string for name resources is larger than the maximum length 1024";
        work.status.as_mut().unwrap().resource_status.manifests[0].conditions = vec![
            serde_json::from_value(json!({"type": "StatusFeedbackSynced", "status": "False",
                                          "reason": "StatusFeedbackSyncFailed", "message": message}))
            .unwrap(),
        ];
        let problem = work_problem(&work, &[]).expect("reported");
        assert!(
            problem.contains("status feedback incomplete on cluster cluster1"),
            "{problem}"
        );
        assert!(problem.contains("maximum length 1024"), "{problem}");
    }

    #[test]
    fn failed_apply_becomes_a_condition_and_clears_when_applied() {
        let failed = work_with_feedback(
            json!([]),
            json!([{"type": "Applied", "status": "False", "reason": "AppliedManifestFailed", "message": "namespace argocd not found", "lastTransitionTime": "2024-05-01T10:00:00Z"}]),
        );
        let problem = work_problem(&failed, &[]).expect("problem");
        assert!(
            problem.contains("not applied on cluster cluster1")
                && problem.contains("namespace argocd not found"),
            "{problem}"
        );
        let with_condition =
            app(json!({"conditions": [{"type": WORK_ERROR_CONDITION, "message": problem}]}));
        assert_eq!(
            status_patch(
                &with_condition,
                &SpokeStatus::default(),
                Some(&problem),
                "now"
            ),
            None
        );
        let cleared =
            status_patch(&with_condition, &SpokeStatus::default(), None, "now").expect("cleared");
        assert_eq!(
            cleared,
            json!({"metadata": {"resourceVersion": "7"}, "status": {"conditions": []}})
        );
    }
}
