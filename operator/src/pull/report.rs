//! The ApplicationSet report: for every ApplicationSet whose Applications use the pull model (basic:
//! the pull label; agent: the Application lives in a ManagedCluster's namespace), a
//! `MulticlusterApplicationSetReport` (apps.open-cluster-management.io/v1alpha1, field-compatible
//! with open-cluster-management-io/multicloud-integrations) in the ApplicationSet's namespace with
//! the same name: per-cluster sync/health and error conditions, and summary counts.
//!
//! Owns the report type (its CRD YAML is generated from it: [`report_crd_yaml`]), the pure
//! aggregation from Applications ([`report_statuses`]) and the event-driven controller that keeps
//! reports current: an Application change re-computes only its ApplicationSet's report, a burst
//! of changes is coalesced, and a report is written only when its content changes. Reports of
//! deleted ApplicationSets (or ones without pulled Applications) are deleted explicitly.

use argocd_agent_kube::CancellationToken;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures::Stream;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;
use kube::Resource;
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::application::{hosting_appset, pull_intent, AppSetKey, ApplicationSet};
use super::manifestwork::manifest_work_name_of;
use super::watches::{controller_config, run_controller, touched, triggers, Subscription};
use super::{PullModelError, PullModelOptions, REPORT_MANAGER};
use argocd_agent_kube::argocd::{Application, StatusOf};

/// Label on a report naming its ApplicationSet as `<namespace>.<name>` (at most 63 characters).
pub const REPORT_APPSET_LABEL: &str = "apps.open-cluster-management.io/hosting-applicationset";
/// No debounce: kube's debounce restarts on every trigger, and an ApplicationSet whose
/// Applications change more often than it (a fleet rollout) would have its report held back for as
/// long as they do. The controller still coalesces the triggers that arrive while one of its
/// reconciles is queued or running into one more write.
const DEBOUNCE: std::time::Duration = std::time::Duration::ZERO;

/// MulticlusterApplicationSetReport provides a report of the status of an application from all the
/// managed clusters where the application is deployed on.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "apps.open-cluster-management.io",
    version = "v1alpha1",
    kind = "MulticlusterApplicationSetReport",
    plural = "multiclusterapplicationsetreports",
    namespaced,
    no_spec,
    shortname = "appsetreport",
    shortname = "appsetreports",
    doc = "MulticlusterApplicationSetReport provides a report of the status of an application from all the managed clusters where the application is deployed on."
)]
#[schemars(transform = without_schema_defaults)]
pub struct ReportFields {
    /// AppConditions defines all the error/warning conditions in all clusters per application.
    #[serde(default)]
    pub statuses: AppConditions,
}

/// All the error/warning conditions in all clusters where the ApplicationSet's applications run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = without_schema_defaults)]
pub struct AppConditions {
    /// Resources deployed by the applications.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ResourceRef>,
    /// One entry per application (and so per cluster).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_conditions: Vec<ClusterCondition>,
    /// Summary provides a summary of results.
    #[serde(default)]
    pub summary: ReportSummary,
}

/// A resource deployed by the application.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = without_schema_defaults)]
pub struct ResourceRef {
    /// API version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// Kind.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

/// The state and error/warning conditions of the application on one cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = without_schema_defaults)]
pub struct ClusterCondition {
    /// The ManagedCluster.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// Sync status of the application on that cluster.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sync_status: String,
    /// Health status of the application on that cluster.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health_status: String,
    /// The hub Application and its ManifestWork (`<namespace>/<name>/<cluster>/<work>`, upstream's form).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub app: String,
    /// Phase of the last or running operation on that cluster.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operation_state_phase: String,
    /// When that operation started (RFC 3339).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operation_state_started_at: String,
    /// The revision the application on that cluster is compared against.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sync_revision: String,
    /// Error and warning conditions of the application.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A type of error/warning.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[schemars(transform = without_schema_defaults)]
pub struct Condition {
    /// Type identifies if the condition is a warning or an error.
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub type_: String,
    /// Message is the warning/error message associated with this condition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Counts of clusters by state (strings, as upstream).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = without_schema_defaults)]
pub struct ReportSummary {
    /// Synced provides the count of synced applications.
    #[serde(default)]
    pub synced: String,
    /// NotSynced provides the count of the out of sync applications.
    #[serde(default)]
    pub not_synced: String,
    /// Healthy provides the count of healthy applications.
    #[serde(default)]
    pub healthy: String,
    /// NotHealthy provides the count of non-healthy applications.
    #[serde(default)]
    pub not_healthy: String,
    /// InProgress provides the count of applications that are in the process of being deployed.
    #[serde(default)]
    pub in_progress: String,
    /// Clusters provides the count of all managed clusters the application is deployed to.
    #[serde(default)]
    pub clusters: String,
}

/// Drops `default` from a schema: `#[serde(default)]` is for reading old objects, not an API
/// default, and kube-apiserver 1.20 rejects `default: ""` on strings.
fn without_schema_defaults(schema: &mut schemars::Schema) {
    fn strip(node: &mut Value) {
        match node {
            Value::Object(map) => {
                map.remove("default");
                for (key, child) in map.iter_mut() {
                    if key == "properties" {
                        // Keys here are property names, values are schemas.
                        child
                            .as_object_mut()
                            .into_iter()
                            .flat_map(|p| p.values_mut())
                            .for_each(strip);
                    } else {
                        strip(child);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    if let Some(map) = schema.as_object_mut() {
        let mut node = Value::Object(std::mem::take(map));
        strip(&mut node);
        if let Value::Object(stripped) = node {
            *map = stripped;
        }
    }
}

/// The report's CustomResourceDefinition as YAML (checked in under
/// `charts/argocd-agent-principal/crds/`).
pub fn report_crd_yaml() -> String {
    let yaml = serde_norway::to_string(&MulticlusterApplicationSetReport::crd())
        .expect("a CRD serialises");
    format!("# Generated from argocd_agent_operator::pull::report::ReportFields; do not edit.\n---\n{yaml}")
}

/// The cluster an Application is pulled to: the pull annotation (basic model), else the
/// ManagedCluster whose namespace holds it (argocd-agent managed mode). `None`: not pulled.
pub fn pull_cluster(app: &Application, managed_clusters: &BTreeSet<String>) -> Option<String> {
    if let Some(target) = pull_intent(&app.metadata).target() {
        return Some(target.cluster.clone());
    }
    app.namespace().filter(|ns| managed_clusters.contains(ns))
}

/// A `status.sync` or `status.health` word, `Unknown` when absent or empty.
fn status_word(of: Option<&StatusOf>) -> String {
    of.and_then(|o| o.status.as_deref())
        .filter(|s| !s.is_empty())
        .unwrap_or("Unknown")
        .to_string()
}

/// The Application's error and warning conditions (Argo CD types end in `Error` or `Warning`).
fn problem_conditions(app: &Application) -> Vec<Condition> {
    super::application::conditions(app)
        .iter()
        .filter_map(|c| {
            let type_ = c.type_.as_deref()?;
            (type_.ends_with("Error") || type_.ends_with("Warning")).then(|| Condition {
                type_: type_.to_string(),
                message: c.message.clone().unwrap_or_default(),
            })
        })
        .collect()
}

/// The resources the Application deploys (`status.resources`: Argo CD's on the spoke, brought
/// to a basic-pull Application by the work agent's feedback when the pull model asks for it,
/// [`super::manifestwork::Feedback::StatusAndResources`]).
fn deployed_resources(app: &Application) -> Vec<ResourceRef> {
    app.status
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .into_iter()
        .flatten()
        .map(|r| ResourceRef {
            api_version: r.api_version(),
            kind: r.kind.clone().unwrap_or_default(),
            name: r.name.clone().unwrap_or_default(),
            namespace: r.namespace.clone().unwrap_or_default(),
        })
        .collect()
}

/// The per-cluster operation fields: `(phase, startedAt, sync revision)`.
fn operation_fields(app: &Application) -> (String, String, String) {
    let status = app.status.as_ref();
    let state = status.and_then(|s| s.operation_state.as_ref());
    let revision = status
        .and_then(|s| s.sync.as_ref())
        .and_then(|s| s.other.get("revision"))
        .and_then(Value::as_str);
    (
        state.and_then(|o| o.phase.clone()).unwrap_or_default(),
        state.and_then(|o| o.started_at.clone()).unwrap_or_default(),
        revision.unwrap_or_default().to_string(),
    )
}

/// A report entry's `app`: `<namespace>/<name>/<cluster>/<ManifestWork>` as upstream's aggregator
/// writes it (its readers take the Application from the first two parts and the ManifestWork from
/// the last two); `<namespace>/<name>` for an Application without a UID yet.
fn report_app(cluster: &str, app: &Application) -> String {
    let hub = format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any());
    match manifest_work_name_of(app) {
        Some(work) => format!("{hub}/{cluster}/{work}"),
        None => hub,
    }
}

/// Aggregates an ApplicationSet's pulled Applications (each with its cluster) into the report
/// content. A cluster counts as synced/healthy when all its applications are; `Progressing`
/// counts as in progress and not healthy (upstream's rule).
pub fn report_statuses(apps: &[(String, &Application)]) -> AppConditions {
    let mut conditions: Vec<ClusterCondition> = apps
        .iter()
        .map(|(cluster, app)| {
            let (phase, started_at, revision) = operation_fields(app);
            ClusterCondition {
                cluster: cluster.clone(),
                sync_status: status_word(app.status.as_ref().and_then(|s| s.sync.as_ref())),
                health_status: status_word(app.status.as_ref().and_then(|s| s.health.as_ref())),
                app: report_app(cluster, app),
                operation_state_phase: phase,
                operation_state_started_at: started_at,
                sync_revision: revision,
                conditions: problem_conditions(app),
            }
        })
        .collect();
    conditions.sort_by(|a, b| (&a.cluster, &a.app).cmp(&(&b.cluster, &b.app)));

    let mut per_cluster: BTreeMap<&str, Vec<&ClusterCondition>> = BTreeMap::new();
    for c in &conditions {
        per_cluster.entry(&c.cluster).or_default().push(c);
    }
    let (mut synced, mut healthy, mut in_progress) = (0, 0, 0);
    for entries in per_cluster.values() {
        if entries.iter().all(|c| c.sync_status == "Synced") {
            synced += 1;
        }
        if entries.iter().all(|c| c.health_status == "Healthy") {
            healthy += 1;
        } else if entries.iter().any(|c| c.health_status == "Progressing") {
            in_progress += 1;
        }
    }
    let clusters = per_cluster.len();
    // One entry per distinct resource: the same manifests deployed to every cluster.
    let resources: BTreeSet<(String, String, String, String)> = apps
        .iter()
        .flat_map(|(_, app)| deployed_resources(app))
        .map(|r| (r.api_version, r.kind, r.namespace, r.name))
        .collect();
    AppConditions {
        resources: resources
            .into_iter()
            .map(|(api_version, kind, namespace, name)| ResourceRef {
                api_version,
                kind,
                name,
                namespace,
            })
            .collect(),
        summary: ReportSummary {
            synced: synced.to_string(),
            not_synced: (clusters - synced).to_string(),
            healthy: healthy.to_string(),
            not_healthy: (clusters - healthy).to_string(),
            in_progress: in_progress.to_string(),
            clusters: clusters.to_string(),
        },
        cluster_conditions: conditions,
    }
}

/// The report label value: `<namespace>.<name>`, cut to a valid label value.
pub fn report_label_value(appset: &AppSetKey) -> String {
    let mut value: String = format!("{}.{}", appset.namespace, appset.name)
        .chars()
        .take(63)
        .collect();
    while value.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        value.pop();
    }
    value
}

/// The report object for an ApplicationSet (owned by it, so a garbage collector also removes it).
pub fn build_report(
    appset: &ApplicationSet,
    statuses: AppConditions,
) -> MulticlusterApplicationSetReport {
    let key = AppSetKey {
        namespace: appset.namespace().unwrap_or_default(),
        name: appset.name_any(),
    };
    let owner = appset.metadata.uid.as_ref().map(|uid| OwnerReference {
        api_version: ApplicationSet::api_version(&()).into(),
        kind: ApplicationSet::kind(&()).into(),
        name: key.name.clone(),
        uid: uid.clone(),
        ..Default::default()
    });
    MulticlusterApplicationSetReport {
        metadata: ObjectMeta {
            name: Some(key.name.clone()),
            namespace: Some(key.namespace.clone()),
            labels: Some(BTreeMap::from([(
                REPORT_APPSET_LABEL.to_string(),
                report_label_value(&key),
            )])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: ReportFields { statuses },
    }
}

type AppKey = (String, String);

/// Which ApplicationSet each Application belongs to, and the reverse.
#[derive(Default)]
struct Membership {
    app_appset: HashMap<AppKey, AppSetKey>,
    members: HashMap<AppSetKey, BTreeSet<AppKey>>,
}

impl Membership {
    /// Records the Application's (new) ApplicationSet; returns the old and new ones.
    fn track_app(&mut self, app: &Application, deleted: bool) -> Vec<AppSetKey> {
        let key = (app.namespace().unwrap_or_default(), app.name_any());
        let now = if deleted {
            None
        } else {
            hosting_appset(&app.metadata)
        };
        let before = match &now {
            Some(s) => self.app_appset.insert(key.clone(), s.clone()),
            None => self.app_appset.remove(&key),
        };
        let mut touched = Vec::new();
        if let Some(old) = before {
            if now.as_ref() != Some(&old) {
                if let Some(m) = self.members.get_mut(&old) {
                    m.remove(&key);
                }
            }
            touched.push(old);
        }
        if let Some(new) = now {
            self.members.entry(new.clone()).or_default().insert(key);
            touched.push(new);
        }
        touched
    }

    /// ApplicationSets with Applications in the namespace of cluster `name`.
    fn in_cluster_namespace(&self, name: &str) -> BTreeSet<AppSetKey> {
        self.app_appset
            .iter()
            .filter(|((ns, _), _)| ns == name)
            .map(|(_, s)| s.clone())
            .collect()
    }
}

struct Context {
    client: kube::Client,
    opts: PullModelOptions,
    apps: Store<Application>,
    appsets: Store<ApplicationSet>,
    clusters: Store<DynamicObject>,
    reports: Store<MulticlusterApplicationSetReport>,
    membership: Mutex<Membership>,
}

impl Context {
    fn membership(&self) -> std::sync::MutexGuard<'_, Membership> {
        self.membership.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn appset_ref(&self, key: &AppSetKey) -> ObjectRef<ApplicationSet> {
        ObjectRef::new(&key.name).within(&key.namespace)
    }

    fn desired(&self, key: &AppSetKey) -> Option<MulticlusterApplicationSetReport> {
        let appset = self.appsets.get(&self.appset_ref(key))?;
        if appset.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let cluster_names: BTreeSet<String> =
            self.clusters.state().iter().map(|c| c.name_any()).collect();
        let members: Vec<AppKey> = self
            .membership()
            .members
            .get(key)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        let apps: Vec<_> = members
            .iter()
            .filter_map(|(ns, name)| self.apps.get(&ObjectRef::new(name).within(ns)))
            .collect();
        let pulled: Vec<(String, &Application)> = apps
            .iter()
            .filter_map(|a| pull_cluster(a, &cluster_names).map(|c| (c, a.as_ref())))
            .collect();
        (!pulled.is_empty()).then(|| build_report(&appset, report_statuses(&pulled)))
    }

    /// Writes, or deletes, the report of `key`; `prune_only` leaves a wanted report alone.
    async fn reconcile(&self, key: &AppSetKey, prune_only: bool) -> Result<Action, ReportError> {
        if !self.opts.handles(&key.namespace) {
            // Another pull model's ApplicationSet.
            return Ok(Action::await_change());
        }
        let existing = self
            .reports
            .get(&ObjectRef::new(&key.name).within(&key.namespace));
        let api: Api<MulticlusterApplicationSetReport> =
            Api::namespaced(self.client.clone(), &key.namespace);
        let failed = |source| ReportError {
            appset: key.clone(),
            source,
        };
        match self.desired(key) {
            Some(_) if prune_only => {}
            Some(report) => {
                let current = existing.as_deref().is_some_and(|e| {
                    e.spec == report.spec
                        && e.labels().get(REPORT_APPSET_LABEL)
                            == report.labels().get(REPORT_APPSET_LABEL)
                });
                if !current {
                    api.patch(
                        &key.name,
                        &PatchParams::apply(REPORT_MANAGER).force(),
                        &Patch::Apply(&report),
                    )
                    .await
                    .map_err(failed)?;
                    let s = &report.spec.statuses.summary;
                    tracing::info!(appset = %key, clusters = %s.clusters, synced = %s.synced, healthy = %s.healthy, "ApplicationSet report updated");
                }
            }
            None if existing.is_some() => {
                match api.delete(&key.name, &DeleteParams::default()).await {
                    Ok(_) => tracing::info!(appset = %key, "ApplicationSet report deleted"),
                    Err(kube::Error::Api(s)) if s.is_not_found() => {}
                    Err(e) => return Err(failed(e)),
                }
            }
            None => {}
        }
        Ok(Action::await_change())
    }
}

/// A failed write of one ApplicationSet's report (retried).
#[derive(Debug, thiserror::Error)]
#[error("ApplicationSet report {appset}: {source}")]
pub struct ReportError {
    /// The ApplicationSet.
    appset: AppSetKey,
    /// The API error.
    source: kube::Error,
}

fn key_of(object: &impl ResourceExt) -> AppSetKey {
    AppSetKey {
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
    }
}

async fn reconcile_appset(
    appset: Arc<ApplicationSet>,
    ctx: Arc<Context>,
) -> Result<Action, ReportError> {
    ctx.reconcile(&key_of(appset.as_ref()), false).await
}

/// Deletes the report of an ApplicationSet that is gone.
async fn reconcile_report(
    report: Arc<MulticlusterApplicationSetReport>,
    ctx: Arc<Context>,
) -> Result<Action, ReportError> {
    ctx.reconcile(&key_of(report.as_ref()), true).await
}

fn retry<K>(_object: Arc<K>, error: &ReportError, ctx: Arc<Context>) -> Action {
    let appset = &error.appset;
    tracing::warn!(%appset, error = %error.source, "ApplicationSet report failed; retrying");
    Action::requeue(ctx.opts.retry_after)
}

/// The ApplicationSets an event of another kind concerns (every one after a relist).
fn appsets_touched<K>(
    ctx: &Arc<Context>,
    events: impl Stream<Item = Event<K>> + Send + 'static,
    concerns: impl Fn(&Context, Event<K>) -> Vec<AppSetKey> + Send + 'static,
) -> impl Stream<Item = ObjectRef<ApplicationSet>> + Send + 'static
where
    K: Send + 'static,
{
    let ctx = ctx.clone();
    triggers(events, move |event| -> Vec<_> {
        match event {
            Event::InitDone => ctx
                .appsets
                .state()
                .iter()
                .map(|a| ObjectRef::from_obj(a.as_ref()))
                .collect(),
            event => concerns(&ctx, event)
                .iter()
                .map(|k| ctx.appset_ref(k))
                .collect(),
        }
    })
}

/// Runs the report controllers until `shutdown`: one per ApplicationSet, one that removes the
/// reports of ApplicationSets that are gone.
pub async fn run(
    client: kube::Client,
    opts: PullModelOptions,
    apps: Subscription<Application>,
    appsets: [Subscription<ApplicationSet>; 2],
    clusters: Subscription<DynamicObject>,
    reports: [Subscription<MulticlusterApplicationSetReport>; 2],
    shutdown: CancellationToken,
) -> Result<(), PullModelError> {
    let [appsets, appsets_too] = appsets;
    let [reports, reports_too] = reports;
    let ctx = Arc::new(Context {
        client,
        opts,
        apps: apps.store,
        appsets: appsets.store.clone(),
        clusters: clusters.store,
        reports: reports.store.clone(),
        membership: Mutex::default(),
    });
    let config = controller_config(1, DEBOUNCE);
    let reads = [
        apps.ready.clone(),
        appsets.ready.clone(),
        clusters.ready.clone(),
        reports.ready.clone(),
    ];
    let appset_controller = Controller::for_stream(touched(appsets.events), appsets.store)
        .reconcile_on(appsets_touched(
            &ctx,
            apps.events,
            |ctx, event| match event {
                Event::Apply(app) | Event::InitApply(app) => {
                    ctx.membership().track_app(&app, false)
                }
                Event::Delete(app) => ctx.membership().track_app(&app, true),
                Event::Init | Event::InitDone => Vec::new(),
            },
        ))
        // Agent-mode membership depends on which namespaces are clusters.
        .reconcile_on(appsets_touched(
            &ctx,
            clusters.events,
            |ctx, event| match event {
                Event::Apply(c) | Event::Delete(c) => ctx
                    .membership()
                    .in_cluster_namespace(&c.name_any())
                    .into_iter()
                    .collect(),
                _ => Vec::new(),
            },
        ))
        // Our own writes come back here too; re-computing finds nothing to do.
        .reconcile_on(appsets_touched(
            &ctx,
            reports_too.events,
            |_, event| match event {
                Event::Apply(r) | Event::Delete(r) => vec![key_of(&r)],
                _ => Vec::new(),
            },
        ));
    // A deleted ApplicationSet's report goes; after a relist, every report is checked.
    let reports_of = {
        let ctx = ctx.clone();
        move |event: Event<ApplicationSet>| match event {
            Event::Apply(a) | Event::InitApply(a) | Event::Delete(a) => {
                vec![ObjectRef::new(&a.name_any()).within(&a.namespace().unwrap_or_default())]
            }
            Event::InitDone => ctx
                .reports
                .state()
                .iter()
                .map(|r| ObjectRef::from_obj(r.as_ref()))
                .collect(),
            Event::Init => Vec::new(),
        }
    };
    let report_controller = Controller::for_stream(touched(reports.events), reports.store)
        .reconcile_on(triggers(appsets_too.events, reports_of));
    tokio::join!(
        run_controller(
            "report",
            reads.clone(),
            appset_controller,
            config.clone(),
            reconcile_appset,
            retry,
            ctx.clone(),
            shutdown.clone()
        ),
        run_controller(
            "report removal",
            reads,
            report_controller,
            config,
            reconcile_report,
            retry,
            ctx,
            shutdown
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pull::application::{CLUSTER_ANNOTATION, PULL_LABEL};
    use serde_json::json;

    fn app(name: &str, cluster: &str, sync: &str, health: &str, conditions: Value) -> Application {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": name, "namespace": "apps", "labels": {PULL_LABEL: "true"},
                         "uid": "0a1b2c3d-0000-4000-8000-000000000000",
                         "annotations": {CLUSTER_ANNOTATION: cluster}},
            "spec": {},
            "status": {"sync": {"status": sync}, "health": {"status": health}, "conditions": conditions}
        }))
        .unwrap()
    }

    #[test]
    fn three_clusters_with_one_failing_are_counted() {
        let a = app("set-c1", "c1", "Synced", "Healthy", json!([]));
        let b = app("set-c2", "c2", "Synced", "Healthy", json!([]));
        let c = app(
            "set-c3",
            "c3",
            "OutOfSync",
            "Degraded",
            json!([{"type": "ManifestWorkError", "message": "boom"}, {"type": "Info", "message": "x"}]),
        );
        let clusters = BTreeSet::new();
        let pulled: Vec<(String, &Application)> = [&c, &a, &b]
            .iter()
            .map(|x| (pull_cluster(x, &clusters).expect("pulled"), *x))
            .collect();
        let statuses = report_statuses(&pulled);
        let s = &statuses.summary;
        assert_eq!(
            (
                &*s.clusters,
                &*s.synced,
                &*s.not_synced,
                &*s.healthy,
                &*s.not_healthy,
                &*s.in_progress
            ),
            ("3", "2", "1", "2", "1", "0")
        );
        let names: Vec<&str> = statuses
            .cluster_conditions
            .iter()
            .map(|c| c.cluster.as_str())
            .collect();
        assert_eq!(names, ["c1", "c2", "c3"], "sorted by cluster");
        let failing = &statuses.cluster_conditions[2];
        // Upstream's form: the hub Application, then the cluster and its ManifestWork.
        assert_eq!(failing.app, "apps/set-c3/c3/set-c3-0a1b2");
        let mut unsaved = c.clone();
        unsaved.metadata.uid = None;
        assert_eq!(report_app("c3", &unsaved), "apps/set-c3");
        assert_eq!(
            failing.conditions,
            vec![Condition {
                type_: "ManifestWorkError".into(),
                message: "boom".into()
            }]
        );
    }

    #[test]
    fn progressing_is_in_progress_and_not_healthy_and_missing_status_is_unknown() {
        let a = app("a", "c1", "Synced", "Progressing", json!([]));
        let mut b = app("b", "c2", "Synced", "Healthy", json!([]));
        b.status = None;
        let statuses = report_statuses(&[("c1".into(), &a), ("c2".into(), &b)]);
        assert_eq!(statuses.summary.in_progress, "1");
        assert_eq!(statuses.summary.not_healthy, "2");
        assert_eq!(statuses.summary.synced, "1");
        assert_eq!(statuses.cluster_conditions[1].health_status, "Unknown");
    }

    #[test]
    fn report_lists_deployed_resources_once_and_each_clusters_operation() {
        let with = |name: &str, cluster: &str, phase: &str, revision: &str| {
            let mut a = app(name, cluster, "Synced", "Healthy", json!([]));
            let status = a.status.as_mut().unwrap();
            status.operation_state = serde_json::from_value(
                json!({"phase": phase, "startedAt": "2024-05-01T10:00:00Z", "operation": {}}),
            )
            .unwrap();
            status.sync.as_mut().unwrap().other =
                serde_json::from_value(json!({"revision": revision})).unwrap();
            status.resources = serde_json::from_value(json!([
                {"version": "v1", "kind": "ConfigMap", "namespace": "demo", "name": "demo-config", "status": "Synced"},
                {"group": "apps", "version": "v1", "kind": "Deployment", "namespace": "demo", "name": "web"}
            ]))
            .unwrap();
            a
        };
        let a = with("set-c1", "c1", "Succeeded", "4f1c2d");
        let b = with("set-c2", "c2", "Running", "9e8d7c");
        let statuses = report_statuses(&[("c1".into(), &a), ("c2".into(), &b)]);
        assert_eq!(
            statuses.resources,
            vec![
                ResourceRef {
                    api_version: "apps/v1".into(),
                    kind: "Deployment".into(),
                    name: "web".into(),
                    namespace: "demo".into()
                },
                ResourceRef {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name: "demo-config".into(),
                    namespace: "demo".into()
                },
            ],
            "the same resources on two clusters are listed once"
        );
        let c2 = &statuses.cluster_conditions[1];
        assert_eq!(
            (
                &*c2.operation_state_phase,
                &*c2.operation_state_started_at,
                &*c2.sync_revision
            ),
            ("Running", "2024-05-01T10:00:00Z", "9e8d7c")
        );
        let wire = serde_json::to_value(&statuses).unwrap();
        let first = &wire["clusterConditions"][0];
        assert_eq!(first["operationStatePhase"], "Succeeded");
        assert_eq!(first["operationStateStartedAt"], "2024-05-01T10:00:00Z");
        assert_eq!(first["syncRevision"], "4f1c2d");
        assert_eq!(wire["resources"][1]["apiVersion"], "v1");
    }

    #[test]
    fn agent_mode_applications_are_pulled_to_their_namespace_cluster() {
        let mut a = app("a", "", "Synced", "Healthy", json!([]));
        a.metadata.labels = None;
        a.metadata.namespace = Some("agent-1".into());
        assert_eq!(pull_cluster(&a, &BTreeSet::new()), None);
        assert_eq!(
            pull_cluster(&a, &BTreeSet::from(["agent-1".to_string()])).as_deref(),
            Some("agent-1")
        );
    }

    #[test]
    fn report_wire_form_matches_upstream_field_names() {
        let appset: ApplicationSet = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
            "metadata": {"name": "guestbook", "namespace": "apps", "uid": "u-1"}, "spec": {}
        }))
        .unwrap();
        let a = app("set-c1", "c1", "Synced", "Healthy", json!([]));
        let report = build_report(&appset, report_statuses(&[("c1".into(), &a)]));
        let wire = serde_json::to_value(&report).unwrap();
        assert_eq!(
            wire["apiVersion"],
            "apps.open-cluster-management.io/v1alpha1"
        );
        assert_eq!(wire["kind"], "MulticlusterApplicationSetReport");
        assert!(wire.get("spec").is_none(), "upstream has no spec: {wire}");
        assert_eq!(wire["statuses"]["summary"]["notSynced"], "0");
        assert_eq!(
            wire["statuses"]["clusterConditions"][0]["healthStatus"],
            "Healthy"
        );
        assert_eq!(
            wire["metadata"]["labels"][REPORT_APPSET_LABEL],
            "apps.guestbook"
        );
        assert_eq!(wire["metadata"]["ownerReferences"][0]["uid"], "u-1");
        let back: MulticlusterApplicationSetReport = serde_json::from_value(wire).unwrap();
        assert_eq!(back.spec, report.spec);
    }

    #[test]
    fn label_value_is_cut_to_a_valid_label() {
        let key = AppSetKey {
            namespace: "n".repeat(40),
            name: format!("{}-x", "a".repeat(21)),
        };
        let v = report_label_value(&key);
        assert!(v.len() <= 63 && v.ends_with('a'), "{v}");
    }

    #[test]
    fn checked_in_crd_matches_the_type() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../charts/argocd-agent-principal/crds/multiclusterapplicationsetreports.yaml");
        let generated = report_crd_yaml();
        if std::env::var_os("UPDATE_CRDS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &generated).unwrap();
        }
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == generated,
            "{} is out of date with pull::report::ReportFields; regenerate with \
             UPDATE_CRDS=1 cargo test -p argocd-agent-operator checked_in_crd_matches_the_type",
            path.display()
        );
    }
}
