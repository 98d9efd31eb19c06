//! OCM's ManifestWork (work.open-cluster-management.io/v1) as far as the pull model uses it, and
//! the pure builder that wraps a hub Application into one.
//!
//! Owns the ManifestWork name of an Application (upstream's `<app name>-<first 5 chars of the
//! UID>`, so a controller taking over from argocd-pull-integration finds the same objects), the
//! cleaning of the payload Application (hub-only metadata and OCM opt-in keys dropped,
//! destination forced to the spoke's own API server, namespace from the annotation), the
//! status feedback rules that bring the spoke Application's health, sync and operation back (and
//! the annotations that show a refresh request consumed), and the fields the work agent leaves to
//! the spoke once changed there (`ignoreFields`).

use std::collections::BTreeMap;

use argocd_agent_kube::argocd::Application;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::application::{
    hosting_appset, PullTarget, APPSET_LABEL, APP_NAMESPACE_ANNOTATION, CLUSTER_ANNOTATION,
    DESTINATION_NAME_ANNOTATION, DESTINATION_SERVER_ANNOTATION, HOSTING_APPSET_ANNOTATION,
    PULL_LABEL, SKIP_RECONCILE_ANNOTATION,
};
use super::refresh::{DELIVERY_ANNOTATION, REQUEST_ANNOTATIONS};
use argocd_agent_proto::event::{HYDRATE_ANNOTATION, REFRESH_ANNOTATION};

/// ManifestWork annotation naming the hub Application's namespace.
pub const HUB_APP_NAMESPACE_ANNOTATION: &str =
    "apps.open-cluster-management.io/hub-application-namespace";
/// ManifestWork annotation naming the hub Application.
pub const HUB_APP_NAME_ANNOTATION: &str = "apps.open-cluster-management.io/hub-application-name";
/// Address of a cluster's own API server from inside it: the payload's destination.
pub const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";
/// Feedback value carrying the spoke Application's `status.health.status`.
pub const FEEDBACK_HEALTH: &str = "healthStatus";
/// Feedback value carrying the spoke Application's `status.sync.status`.
pub const FEEDBACK_SYNC: &str = "syncStatus";
/// Feedback value carrying the spoke Application's `status.operationState.phase` (upstream's name).
pub const FEEDBACK_OPERATION_PHASE: &str = "operationStatePhase";
/// Feedback value carrying the spoke Application's `status.operationState.startedAt` (upstream's
/// name).
pub const FEEDBACK_OPERATION_STARTED_AT: &str = "operationStateStartedAt";
/// Feedback value carrying the spoke Application's `status.sync.revision` (upstream's name).
pub const FEEDBACK_SYNC_REVISION: &str = "syncRevision";
/// Feedback value carrying the spoke Application's `status.operationState.message` (ours: upstream
/// does not bring the message back, so a failed sync on the hub says nothing about why).
pub const FEEDBACK_OPERATION_MESSAGE: &str = "operationStateMessage";
/// Feedback value carrying the spoke Application's `status.resources` as raw JSON (ours, asked for
/// with [`Feedback::StatusAndResources`]: upstream's report lists resources from ACM's search
/// add-on, which OCM alone does not have). The work agent returns a list only with its
/// `RawFeedbackJsonString` feature gate and within 1,024 characters (its `--max-json-raw-length`
/// default, and the ManifestWork CRD's `maxLength` for `jsonRaw`, so raising the flag does not
/// help: about eight resources); otherwise it reports the value unsynced.
pub const FEEDBACK_RESOURCES: &str = "resources";
/// Feedback value carrying the spoke Application's [`DELIVERY_ANNOTATION`] (ours: which refresh
/// request the snapshot was taken after, [`super::refresh`]).
pub const FEEDBACK_REFRESH_DELIVERY: &str = "refreshDelivery";
/// Feedback value carrying the spoke Application's `argocd.argoproj.io/refresh` annotation (ours;
/// absent once Argo CD has consumed the request).
pub const FEEDBACK_REFRESH_REQUESTED: &str = "refreshRequested";
/// Feedback value carrying the spoke Application's `argocd.argoproj.io/hydrate` annotation (ours).
pub const FEEDBACK_HYDRATE_REQUESTED: &str = "hydrateRequested";
/// The payload field the work agent must not write again once the spoke changed it: Argo CD on
/// the spoke removes `.operation` when the sync it asks for has run (and the refresh request
/// annotations once it refreshed, [`annotation_path`]).
pub const OPERATION_PATH: &str = ".operation";
/// Longest Kubernetes object name.
const MAX_NAME_LEN: usize = 253;

/// The ManifestWork spec (fields the pull model writes or reads).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "work.open-cluster-management.io",
    version = "v1",
    kind = "ManifestWork",
    namespaced,
    status = "ManifestWorkStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ManifestWorkSpec {
    /// The objects to apply on the managed cluster.
    #[serde(default)]
    pub workload: ManifestsTemplate,
    /// Per-resource apply and feedback configuration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub manifest_configs: Vec<ManifestConfigOption>,
    /// What the work agent deletes on the managed cluster when the work goes (unset: everything,
    /// `Foreground`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_option: Option<DeleteOption>,
}

/// `spec.deleteOption`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeleteOption {
    /// `Foreground`, `Orphan` or `SelectivelyOrphan`.
    pub propagation_policy: String,
    /// The resources left behind under `SelectivelyOrphan`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selectively_orphans: Option<SelectivelyOrphan>,
}

/// `deleteOption.selectivelyOrphans`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SelectivelyOrphan {
    /// One rule per payload resource to orphan (same fields as a resource identifier).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orphaning_rules: Vec<ResourceIdentifier>,
}

/// `spec.workload`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ManifestsTemplate {
    /// Raw Kubernetes objects.
    #[serde(default)]
    pub manifests: Vec<Value>,
}

/// `spec.manifestConfigs[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ManifestConfigOption {
    /// Which payload resource this configures.
    pub resource_identifier: ResourceIdentifier,
    /// Status fields reported back in `status.resourceStatus.manifests[].statusFeedback`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feedback_rules: Vec<FeedbackRule>,
    /// How the work agent writes the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
}

/// `resourceIdentifier`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ResourceIdentifier {
    /// API group (empty for core).
    #[serde(default)]
    pub group: String,
    /// Plural resource name.
    pub resource: String,
    /// Object name.
    pub name: String,
    /// Object namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

/// `feedbackRules[]` (type `JSONPaths` or `WellKnownStatus`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FeedbackRule {
    /// `JSONPaths` or `WellKnownStatus`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The paths for `JSONPaths`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub json_paths: Vec<JsonPath>,
}

/// One named JSON path into the applied resource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct JsonPath {
    /// Name of the feedback value.
    pub name: String,
    /// Path such as `.status.health.status`.
    pub path: String,
}

/// `updateStrategy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStrategy {
    /// `Update`, `CreateOnly`, `ServerSideApply` or `ReadOnly`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Options for `ServerSideApply`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_side_apply: Option<ServerSideApplyConfig>,
}

/// `updateStrategy.serverSideApply`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServerSideApplyConfig {
    /// Take over fields owned by other managers on the spoke.
    #[serde(default)]
    pub force: bool,
    /// Fields the work agent leaves alone under a condition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore_fields: Vec<IgnoreField>,
}

/// `serverSideApply.ignoreFields[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IgnoreField {
    /// `OnSpokeChange` (applied again only when the payload changes) or `OnSpokePresent`
    /// (never written once present on the spoke).
    pub condition: String,
    /// Paths such as `.operation`.
    #[serde(rename = "jsonPaths")]
    pub json_paths: Vec<String>,
}

/// ManifestWork status, written by the work agent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ManifestWorkStatus {
    /// Work-level conditions (`Applied`, `Available`, `Degraded`, ...).
    #[serde(default)]
    pub conditions: Vec<WorkCondition>,
    /// Per-manifest status.
    #[serde(default)]
    pub resource_status: ManifestResourceStatus,
}

/// A metav1.Condition, leniently typed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct WorkCondition {
    /// Condition type.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// Machine-readable reason.
    #[serde(default)]
    pub reason: String,
    /// Human-readable message.
    #[serde(default)]
    pub message: String,
    /// The work's `metadata.generation` the condition describes.
    #[serde(
        default,
        rename = "observedGeneration",
        skip_serializing_if = "Option::is_none"
    )]
    pub observed_generation: Option<i64>,
}

/// `status.resourceStatus`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ManifestResourceStatus {
    /// One entry per applied manifest.
    #[serde(default)]
    pub manifests: Vec<ManifestCondition>,
}

/// `status.resourceStatus.manifests[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ManifestCondition {
    /// Which manifest.
    #[serde(default)]
    pub resource_meta: ManifestResourceMeta,
    /// Values scraped by the feedback rules.
    #[serde(default)]
    pub status_feedback: StatusFeedbackResult,
    /// Per-manifest conditions.
    #[serde(default)]
    pub conditions: Vec<WorkCondition>,
}

/// `resourceMeta`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ManifestResourceMeta {
    /// Index in `spec.workload.manifests`.
    #[serde(default)]
    pub ordinal: i64,
    /// API group.
    #[serde(default)]
    pub group: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
    /// Plural resource.
    #[serde(default)]
    pub resource: String,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
}

/// `statusFeedback`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct StatusFeedbackResult {
    /// Named values.
    #[serde(default)]
    pub values: Vec<FeedbackValue>,
}

/// `statusFeedback.values[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FeedbackValue {
    /// The feedback rule's name.
    #[serde(default)]
    pub name: String,
    /// The value.
    #[serde(default)]
    pub field_value: FieldValue,
}

/// `fieldValue`: a typed union (`type` says which member is set).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FieldValue {
    /// `Integer`, `String`, `Boolean` or `JsonRaw`.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// Set for `String`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// Set for `Integer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integer: Option<i64>,
    /// Set for `Boolean`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boolean: Option<bool>,
    /// Set for `JsonRaw`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_raw: Option<String>,
}

/// Why an Application cannot be wrapped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The object lacks a field the ManifestWork is derived from.
    #[error("Application {namespace}/{name} has no metadata.{field}")]
    MissingField {
        /// Namespace of the Application.
        namespace: String,
        /// Name of the Application.
        name: String,
        /// The missing field.
        field: &'static str,
    },
}

/// The ManifestWork name for an Application: `<name>-<first 5 characters of its UID>` (upstream's
/// scheme), with the name shortened if the result would exceed 253 characters.
pub fn manifest_work_name(app_name: &str, uid: &str) -> String {
    let suffix: String = uid.chars().take(5).collect();
    let keep = MAX_NAME_LEN.saturating_sub(suffix.len() + 1);
    let mut base: String = app_name.chars().take(keep).collect();
    while base.ends_with(['-', '.']) {
        base.pop();
    }
    format!("{base}-{suffix}")
}

/// The ManifestWork name for this Application, if it has a name and UID.
pub fn manifest_work_name_of(app: &Application) -> Option<String> {
    Some(manifest_work_name(
        app.metadata.name.as_deref()?,
        app.metadata.uid.as_deref()?,
    ))
}

fn hub_only_label(key: &str) -> bool {
    key == PULL_LABEL
}

fn hub_only_annotation(key: &str) -> bool {
    matches!(
        key,
        CLUSTER_ANNOTATION
            | APP_NAMESPACE_ANNOTATION
            | SKIP_RECONCILE_ANNOTATION
            | DESTINATION_NAME_ANNOTATION
            | DESTINATION_SERVER_ANNOTATION
            | "kubectl.kubernetes.io/last-applied-configuration"
    )
}

/// The Application as it is created on the spoke: fresh metadata (name, spoke namespace,
/// finalizers, labels and annotations minus the OCM opt-in keys and hub-only bookkeeping), the
/// hub `spec` with the destination set to the spoke's own API server, and `operation` if the hub
/// asked for one. No status, UID, resourceVersion, ownerReferences or managedFields.
pub fn payload_application(app: &Application, target: &PullTarget) -> Value {
    let meta = &app.metadata;
    let mut labels: BTreeMap<String, String> = meta
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !hub_only_label(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut annotations: BTreeMap<String, String> = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !hub_only_annotation(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(appset) = hosting_appset(meta) {
        labels.insert(APPSET_LABEL.to_string(), "true".to_string());
        annotations.insert(HOSTING_APPSET_ANNOTATION.to_string(), appset.to_string());
    }
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(meta.name.clone().unwrap_or_default()));
    metadata.insert("namespace".into(), json!(target.spoke_namespace));
    if !labels.is_empty() {
        metadata.insert("labels".into(), json!(labels));
    }
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), json!(annotations));
    }
    if let Some(finalizers) = meta.finalizers.as_ref().filter(|f| !f.is_empty()) {
        metadata.insert("finalizers".into(), json!(finalizers));
    }

    let mut spec = app.spec.clone();
    let (name, server) = payload_destination(meta);
    let destination = spec.destination.get_or_insert_with(Default::default);
    destination.name = name;
    destination.server = server;
    let mut payload = Map::new();
    payload.insert("apiVersion".into(), json!("argoproj.io/v1alpha1"));
    payload.insert("kind".into(), json!("Application"));
    payload.insert("metadata".into(), Value::Object(metadata));
    payload.insert("spec".into(), json!(spec));
    if let Some(operation) = app.operation.as_ref().filter(|o| o.is_object()) {
        payload.insert("operation".into(), operation.clone());
    }
    Value::Object(payload)
}

/// The payload's destination `(name, server)`: the cluster's own API server, unless a destination
/// annotation says otherwise, in which case exactly the annotated fields are set (as upstream).
fn payload_destination(meta: &ObjectMeta) -> (Option<String>, Option<String>) {
    let annotation = |key| meta.annotations.as_ref().and_then(|a| a.get(key)).cloned();
    let name = annotation(DESTINATION_NAME_ANNOTATION);
    let server = annotation(DESTINATION_SERVER_ANNOTATION);
    if name.is_none() && server.is_none() {
        return (None, Some(IN_CLUSTER_SERVER.to_string()));
    }
    let non_empty = |v: Option<String>| v.filter(|v| !v.is_empty());
    (non_empty(name), non_empty(server))
}

/// Which of the spoke Application's status the work agent is asked to bring back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Feedback {
    /// Health, sync status and revision, the last operation's phase and start (upstream's
    /// values) and its message.
    #[default]
    Status,
    /// Those and `status.resources` ([`FEEDBACK_RESOURCES`]): the hub Application and the
    /// ApplicationSet report then list what it deployed. Needs the work agents'
    /// `RawFeedbackJsonString` feature gate (OCM's default: off).
    StatusAndResources,
}

/// The JSONPath of annotation `key` in the syntax the work agent parses (client-go's, as
/// `kubectl -o jsonpath`): every dot of the key escaped. Client-go takes no double-quoted key
/// (upstream's `.metadata.annotations["argocd.argoproj.io/refresh"]`) and splits a single-quoted
/// one at its dots.
pub fn annotation_path(key: &str) -> String {
    format!(".metadata.annotations.{}", key.replace('.', "\\."))
}

/// The feedback rules that bring the spoke Application's state back: its status, and the
/// annotations that tell whether it consumed a refresh request ([`super::refresh`]).
pub fn application_feedback_rules(feedback: Feedback) -> Vec<FeedbackRule> {
    let mut paths = vec![
        (FEEDBACK_HEALTH, ".status.health.status".to_string()),
        (FEEDBACK_SYNC, ".status.sync.status".to_string()),
        (
            FEEDBACK_OPERATION_STARTED_AT,
            ".status.operationState.startedAt".to_string(),
        ),
        (
            FEEDBACK_OPERATION_PHASE,
            ".status.operationState.phase".to_string(),
        ),
        (FEEDBACK_SYNC_REVISION, ".status.sync.revision".to_string()),
        (
            FEEDBACK_OPERATION_MESSAGE,
            ".status.operationState.message".to_string(),
        ),
        (
            FEEDBACK_REFRESH_DELIVERY,
            annotation_path(DELIVERY_ANNOTATION),
        ),
        (
            FEEDBACK_REFRESH_REQUESTED,
            annotation_path(REFRESH_ANNOTATION),
        ),
        (
            FEEDBACK_HYDRATE_REQUESTED,
            annotation_path(HYDRATE_ANNOTATION),
        ),
    ];
    if feedback == Feedback::StatusAndResources {
        paths.push((FEEDBACK_RESOURCES, ".status.resources".to_string()));
    }
    // One rule per value, like upstream: the work agent skips a whole rule whose path is absent.
    paths
        .into_iter()
        .map(|(name, path)| FeedbackRule {
            type_: "JSONPaths".into(),
            json_paths: vec![JsonPath {
                name: name.to_string(),
                path,
            }],
        })
        .collect()
}

/// Wraps the hub Application into the ManifestWork for `target`: named by
/// [`manifest_work_name`], in the cluster's namespace, labelled for the pull model, annotated
/// with the hub Application (and its ApplicationSet), applied on the spoke with server-side apply
/// so the spoke Argo CD's status writes are never overwritten, and with `.operation` and the
/// refresh request annotations ignored on spoke change: the work agent writes a requested
/// operation or refresh once, and re-applying the same work (resync, restart) never puts back
/// what Argo CD removed after acting on it.
///
/// The work agent (OCM v1.2.1, and OCM's main branch still) reads no path of an `OnSpokeChange`
/// entry: with any `ignoreFields` it stamps a hash of the whole payload on the spoke object and
/// skips the apply while that hash is unchanged, so a field the spoke changed is written again
/// only with a changed payload. The paths say which fields that is meant for, in the syntax its
/// JSONPath library parses ([`annotation_path`]); as `OnSpokePresent` paths (cut at every dot
/// there) no annotation key with a dot could be addressed at all. The API allows one entry per
/// condition.
pub fn build_manifest_work(
    app: &Application,
    target: &PullTarget,
    feedback: Feedback,
) -> Result<ManifestWork, BuildError> {
    let meta = &app.metadata;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let missing = |field| BuildError::MissingField {
        namespace: namespace.clone(),
        name: meta.name.clone().unwrap_or_default(),
        field,
    };
    let name = meta
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| missing("name"))?;
    if namespace.is_empty() {
        return Err(missing("namespace"));
    }
    let uid = meta
        .uid
        .clone()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| missing("uid"))?;

    let mut labels = BTreeMap::from([(PULL_LABEL.to_string(), "true".to_string())]);
    let mut annotations = BTreeMap::from([
        (HUB_APP_NAMESPACE_ANNOTATION.to_string(), namespace.clone()),
        (HUB_APP_NAME_ANNOTATION.to_string(), name.clone()),
    ]);
    if let Some(appset) = hosting_appset(meta) {
        labels.insert(APPSET_LABEL.to_string(), "true".to_string());
        annotations.insert(HOSTING_APPSET_ANNOTATION.to_string(), appset.to_string());
    }
    let spec = ManifestWorkSpec {
        workload: ManifestsTemplate {
            manifests: vec![payload_application(app, target)],
        },
        manifest_configs: vec![ManifestConfigOption {
            resource_identifier: ResourceIdentifier {
                group: "argoproj.io".into(),
                resource: "applications".into(),
                name: name.clone(),
                namespace: target.spoke_namespace.clone(),
            },
            feedback_rules: application_feedback_rules(feedback),
            update_strategy: Some(UpdateStrategy {
                type_: "ServerSideApply".into(),
                server_side_apply: Some(ServerSideApplyConfig {
                    force: true,
                    ignore_fields: vec![IgnoreField {
                        condition: "OnSpokeChange".into(),
                        json_paths: std::iter::once(OPERATION_PATH.to_string())
                            .chain(REQUEST_ANNOTATIONS.map(annotation_path))
                            .collect(),
                    }],
                }),
            }),
        }],
        delete_option: None,
    };
    Ok(ManifestWork {
        metadata: ObjectMeta {
            name: Some(manifest_work_name(&name, &uid)),
            namespace: Some(target.cluster.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec,
        status: None,
    })
}

/// The hub Application a ManifestWork was made for, from its annotations.
pub fn hub_application_of(work: &ManifestWork) -> Option<(String, String)> {
    let annotations = work.metadata.annotations.as_ref()?;
    let namespace = annotations
        .get(HUB_APP_NAMESPACE_ANNOTATION)
        .filter(|v| !v.is_empty())?;
    let name = annotations
        .get(HUB_APP_NAME_ANNOTATION)
        .filter(|v| !v.is_empty())?;
    Some((namespace.clone(), name.clone()))
}

/// True when `existing` already carries everything `desired` asks for: the same payload (exactly,
/// so removed fields are noticed), configs and metadata at least as desired (the apiserver adds
/// defaults, other writers may add labels).
pub fn work_is_current(existing: &ManifestWork, desired: &ManifestWork) -> bool {
    let map_contains = |have: &Option<BTreeMap<String, String>>,
                        want: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    existing.spec.workload == desired.spec.workload
        && existing.spec.delete_option == desired.spec.delete_option
        && json_contains(
            &serde_json::to_value(&existing.spec.manifest_configs).unwrap_or_default(),
            &serde_json::to_value(&desired.spec.manifest_configs).unwrap_or_default(),
        )
        && map_contains(&existing.metadata.labels, &desired.metadata.labels)
        && map_contains(
            &existing.metadata.annotations,
            &desired.metadata.annotations,
        )
}

/// True when the work agent has applied this very generation of the work (its `Applied`
/// condition is `True` for `metadata.generation`), so whatever the payload asked for is on the
/// spoke.
pub fn applied_at_current_generation(work: &ManifestWork) -> bool {
    let Some(generation) = work.metadata.generation else {
        return false;
    };
    work.status.iter().flat_map(|s| &s.conditions).any(|c| {
        c.type_ == "Applied"
            && c.status == "True"
            && c.observed_generation.is_some_and(|g| g >= generation)
    })
}

/// `have` contains `want`: objects by key (extra keys allowed), arrays element-wise with the
/// same length, scalars equal.
fn json_contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| h.get(k).is_some_and(|hv| json_contains(hv, wv))),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(hv, wv)| json_contains(hv, wv))
        }
        _ => have == want,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pull::application::{pull_intent, PullIntent};
    use argocd_agent_kube::argocd::ObjectMetaExt;

    fn hub_app() -> Application {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {
                "name": "guestbook",
                "namespace": "apps",
                "uid": "3f2a9c1e-0000-4000-8000-000000000000",
                "resourceVersion": "42",
                "generation": 3,
                "creationTimestamp": "2024-01-01T00:00:00Z",
                "finalizers": ["resources-finalizer.argocd.argoproj.io"],
                "labels": {PULL_LABEL: "true", "team": "web"},
                "annotations": {
                    CLUSTER_ANNOTATION: "cluster1",
                    APP_NAMESPACE_ANNOTATION: "argocd",
                    SKIP_RECONCILE_ANNOTATION: "true",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                    REFRESH_ANNOTATION: "hard",
                    "notes": "kept"
                },
                "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet", "name": "fleet", "uid": "u1"}],
                "managedFields": [{"manager": "kubectl"}]
            },
            "spec": {
                "project": "default",
                "source": {"repoURL": "https://example.com/repo.git", "path": "guestbook", "targetRevision": "HEAD"},
                "destination": {"name": "cluster1", "namespace": "guestbook"}
            },
            "operation": {"sync": {"revision": "HEAD"}},
            "status": {"health": {"status": "Unknown"}}
        }))
        .expect("valid app")
    }

    fn target(app: &Application) -> PullTarget {
        match pull_intent(&app.metadata) {
            PullIntent::Pulled(t) => t,
            other => panic!("expected a pull target, got {other:?}"),
        }
    }

    #[test]
    fn work_name_is_app_name_plus_uid_prefix() {
        assert_eq!(
            manifest_work_name("guestbook", "3f2a9c1e-0000"),
            "guestbook-3f2a9"
        );
        let long = "a".repeat(260);
        let name = manifest_work_name(&long, "abcdef");
        assert_eq!(name.len(), 253);
        assert!(name.ends_with("-abcde"));
    }

    #[test]
    fn payload_is_cleaned_of_hub_only_fields_and_points_in_cluster() {
        let app = hub_app();
        let payload: Application =
            serde_json::from_value(payload_application(&app, &target(&app))).unwrap();
        let meta = &payload.metadata;
        assert_eq!(meta.name.as_deref(), Some("guestbook"));
        assert_eq!(
            meta.namespace.as_deref(),
            Some("argocd"),
            "namespace comes from the app-namespace annotation"
        );
        assert!(
            meta.uid.is_none()
                && meta.resource_version.is_none()
                && meta.generation.is_none()
                && meta.creation_timestamp.is_none()
                && meta.owner_references.is_none()
                && meta.managed_fields.is_none(),
            "hub-only metadata must not reach the spoke: {meta:?}"
        );
        let labels = meta.labels.clone().unwrap_or_default();
        assert!(!labels.contains_key(PULL_LABEL));
        assert_eq!(labels["team"], "web");
        assert_eq!(labels[APPSET_LABEL], "true");
        for gone in [
            CLUSTER_ANNOTATION,
            APP_NAMESPACE_ANNOTATION,
            SKIP_RECONCILE_ANNOTATION,
            "kubectl.kubernetes.io/last-applied-configuration",
        ] {
            assert!(
                payload.annotation(gone).is_none(),
                "{gone} must not reach the spoke"
            );
        }
        assert_eq!(payload.annotation("notes"), Some("kept"));
        assert_eq!(
            payload.annotation(REFRESH_ANNOTATION),
            Some("hard"),
            "a refresh request reaches the spoke's Argo CD"
        );
        assert_eq!(
            payload.annotation(HOSTING_APPSET_ANNOTATION),
            Some("apps/fleet")
        );
        assert_eq!(
            meta.finalizers,
            Some(vec!["resources-finalizer.argocd.argoproj.io".to_string()])
        );
        assert_eq!(
            serde_json::to_value(&payload.spec.destination).unwrap(),
            json!({"server": IN_CLUSTER_SERVER, "namespace": "guestbook"})
        );
        assert_eq!(
            payload.spec.other, app.spec.other,
            "the source and the rest of the spec as on the hub"
        );
        assert_eq!(
            payload.operation(),
            Some(&json!({"sync": {"revision": "HEAD"}}))
        );
        assert!(payload.status.is_none());
    }

    #[test]
    fn manifest_work_carries_payload_feedback_rules_and_hub_references() {
        let app = hub_app();
        let work = build_manifest_work(&app, &target(&app), Feedback::Status).expect("built");
        assert_eq!(work.metadata.name.as_deref(), Some("guestbook-3f2a9"));
        assert_eq!(work.metadata.namespace.as_deref(), Some("cluster1"));
        assert_eq!(work.metadata.labels.as_ref().unwrap()[PULL_LABEL], "true");
        assert_eq!(
            hub_application_of(&work),
            Some(("apps".into(), "guestbook".into()))
        );
        assert_eq!(
            work.metadata.annotations.as_ref().unwrap()[HOSTING_APPSET_ANNOTATION],
            "apps/fleet"
        );
        let config = &work.spec.manifest_configs[0];
        assert_eq!(config.resource_identifier.resource, "applications");
        assert_eq!(config.resource_identifier.namespace, "argocd");
        let paths: Vec<(String, String)> = config
            .feedback_rules
            .iter()
            .flat_map(|r| {
                r.json_paths
                    .iter()
                    .map(|p| (p.name.clone(), p.path.clone()))
            })
            .collect();
        assert!(paths.contains(&("healthStatus".into(), ".status.health.status".into())));
        assert!(paths.contains(&("syncStatus".into(), ".status.sync.status".into())));
        // Upstream's feedback names, then ours.
        let names: Vec<&str> = paths.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "healthStatus",
                "syncStatus",
                "operationStateStartedAt",
                "operationStatePhase",
                "syncRevision",
                "operationStateMessage",
                "refreshDelivery",
                "refreshRequested",
                "hydrateRequested"
            ]
        );
        assert!(paths.contains(&(
            "refreshRequested".into(),
            r".metadata.annotations.argocd\.argoproj\.io/refresh".into()
        )));
        assert!(paths.contains(&("syncRevision".into(), ".status.sync.revision".into())));
        assert!(config.feedback_rules.iter().all(|r| r.type_ == "JSONPaths"));
        // Asked for, the resources too, as one more rule of their own.
        let with_resources = application_feedback_rules(Feedback::StatusAndResources);
        assert_eq!(with_resources.len(), config.feedback_rules.len() + 1);
        assert_eq!(
            serde_json::to_value(with_resources.last().unwrap()).unwrap(),
            json!({"type": "JSONPaths", "jsonPaths": [{"name": "resources", "path": ".status.resources"}]})
        );
        // The wire form uses upstream's field names.
        let wire = serde_json::to_value(&work).unwrap();
        assert_eq!(wire["apiVersion"], "work.open-cluster-management.io/v1");
        assert!(wire["spec"]["manifestConfigs"][0]["feedbackRules"][0]["jsonPaths"].is_array());
        assert_eq!(
            wire["spec"]["manifestConfigs"][0]["updateStrategy"],
            json!({"type": "ServerSideApply", "serverSideApply": {
                "force": true,
                "ignoreFields": [{"condition": "OnSpokeChange", "jsonPaths": [
                    ".operation",
                    r".metadata.annotations.argocd\.argoproj\.io/refresh",
                    r".metadata.annotations.argocd\.argoproj\.io/hydrate"
                ]}]
            }})
        );
    }

    #[test]
    fn destination_annotations_override_the_payload_destination_as_upstream() {
        let with = |annotations: &[(&str, &str)]| {
            let mut app = hub_app();
            let a = app
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            for (k, v) in annotations {
                a.insert(k.to_string(), v.to_string());
            }
            let payload = payload_application(&app, &target(&app));
            for key in [DESTINATION_NAME_ANNOTATION, DESTINATION_SERVER_ANNOTATION] {
                assert!(
                    payload["metadata"]["annotations"].get(key).is_none(),
                    "{key} must not reach the spoke"
                );
            }
            payload["spec"]["destination"].clone()
        };
        assert_eq!(
            with(&[]),
            json!({"server": IN_CLUSTER_SERVER, "namespace": "guestbook"})
        );
        assert_eq!(
            with(&[(DESTINATION_NAME_ANNOTATION, "in-cluster")]),
            json!({"name": "in-cluster", "namespace": "guestbook"}),
            "only the annotated field is set"
        );
        assert_eq!(
            with(&[(DESTINATION_SERVER_ANNOTATION, "https://10.0.0.1:6443")]),
            json!({"server": "https://10.0.0.1:6443", "namespace": "guestbook"})
        );
        assert_eq!(
            with(&[
                (DESTINATION_NAME_ANNOTATION, "in-cluster"),
                (
                    DESTINATION_SERVER_ANNOTATION,
                    "https://kubernetes.default.svc"
                )
            ]),
            json!({"name": "in-cluster", "server": IN_CLUSTER_SERVER, "namespace": "guestbook"})
        );
    }

    #[test]
    fn work_counts_as_applied_only_at_its_current_generation() {
        let app = hub_app();
        let mut work = build_manifest_work(&app, &target(&app), Feedback::Status).unwrap();
        assert!(!applied_at_current_generation(&work), "no status yet");
        work.metadata.generation = Some(3);
        let applied = |status: &str, generation: i64| ManifestWorkStatus {
            conditions: vec![WorkCondition {
                type_: "Applied".into(),
                status: status.into(),
                observed_generation: Some(generation),
                ..Default::default()
            }],
            ..Default::default()
        };
        work.status = Some(applied("True", 2));
        assert!(
            !applied_at_current_generation(&work),
            "an older generation was applied"
        );
        work.status = Some(applied("False", 3));
        assert!(!applied_at_current_generation(&work), "apply failed");
        work.status = Some(applied("True", 3));
        assert!(applied_at_current_generation(&work));
    }

    #[test]
    fn app_without_uid_cannot_be_wrapped() {
        let mut app = hub_app();
        app.metadata.uid = None;
        let err = build_manifest_work(&app, &target(&hub_app()), Feedback::Status).unwrap_err();
        assert!(
            err.to_string()
                .contains("apps/guestbook has no metadata.uid"),
            "{err}"
        );
    }

    #[test]
    fn current_work_ignores_server_defaults_but_not_payload_changes() {
        let app = hub_app();
        let desired = build_manifest_work(&app, &target(&app), Feedback::Status).unwrap();
        let mut existing: ManifestWork = serde_json::from_value({
            let mut v = serde_json::to_value(&desired).unwrap();
            v["spec"]["manifestConfigs"][0]["feedbackScrapeType"] = json!("Poll");
            v["spec"]["manifestConfigs"][0]["updateStrategy"]["serverSideApply"]["fieldManager"] =
                json!("work-agent");
            v["metadata"]["labels"]["extra"] = json!("x");
            v
        })
        .unwrap();
        assert!(work_is_current(&existing, &desired));
        existing.spec.workload.manifests[0]["spec"]["source"]["helm"] = json!({"releaseName": "x"});
        assert!(
            !work_is_current(&existing, &desired),
            "a field only on the spoke copy must be removed"
        );
    }
}
