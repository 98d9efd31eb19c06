//! The spoke copy of a hub object: what a managed agent writes locally for an Application or
//! AppProject the principal sent, and the views of a live object the sync logic compares.
//!
//! Owns: [`SyncedKind`] (the kinds a managed agent keeps: Application, AppProject, repository
//! Secrets and the hub's GPG keys ConfigMap, with their API coordinates, event targets and resync
//! kind names), [`SpokeObject`] (an object of any of
//! those kinds as read, written and sent: metadata typed, each kind's parts whole),
//! [`spoke_copy`] (hub object → spoke object, a pure function), [`replacement_body`] (the PUT
//! body that replaces everything but the live status and operation), [`with_requested_operation`]
//! (a spoke Application with the hub's operation), and the comparison views [`managed_view`]
//! (what drift revert protects) and [`reported_view`] (what status reporting watches), and
//! [`PackedObject`] (a spoke object kept as its JSON). It does not talk to Kubernetes.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use argocd_agent_kube::argocd::{
    type_meta, AppProject, Application, ApplicationDestination, ApplicationSpec, ObjectMetaExt,
    Other,
};
use argocd_agent_kube::packed::{JsonDigest, Packed};
use argocd_agent_proto::event::{
    Target, GPG_KEYS_CONFIGMAP, GPG_KEY_RESYNC_KIND, REPOSITORY_RESYNC_KIND, SOURCE_UID_ANNOTATION,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{ApiResource, DynamicResourceScope, GroupVersionKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use argocd_agent_proto::event::{
    HYDRATE_ANNOTATION, LAST_APPLIED_ANNOTATION, REFRESH_ANNOTATION,
};
/// Destination cluster name every spoke Application points at: the spoke's own cluster.
pub const IN_CLUSTER: &str = "in-cluster";

/// The kinds a managed agent keeps in sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SyncedKind {
    /// `argoproj.io/v1alpha1` Application.
    Application,
    /// `argoproj.io/v1alpha1` AppProject.
    AppProject,
    /// `v1` Secret labelled `argocd.argoproj.io/secret-type: repository` or `repo-creds`.
    Repository,
    /// `v1` ConfigMap `argocd-gpg-keys-cm`: the hub's GPG keys.
    GpgKey,
}

impl SyncedKind {
    /// The Kubernetes kind.
    pub fn kind(self) -> &'static str {
        match self {
            SyncedKind::Application => "Application",
            SyncedKind::AppProject => "AppProject",
            SyncedKind::Repository => "Secret",
            SyncedKind::GpgKey => "ConfigMap",
        }
    }

    /// The `kind` of this kind's `request-update`s and resource keys in the resync: the
    /// Kubernetes kind, except upstream's `Repository` for repository Secrets and `GPGKey` for
    /// the GPG keys ConfigMap.
    pub fn resync_kind(self) -> &'static str {
        match self {
            SyncedKind::Repository => REPOSITORY_RESYNC_KIND,
            SyncedKind::GpgKey => GPG_KEY_RESYNC_KIND,
            other => other.kind(),
        }
    }

    /// The kind a resync `kind` names, if it is one a managed agent keeps (`Secret` too: our
    /// principals before upstream's `Repository` named repository Secrets so).
    pub fn from_resync_kind(kind: &str) -> Option<SyncedKind> {
        if kind == "Secret" {
            return Some(SyncedKind::Repository);
        }
        [
            SyncedKind::Application,
            SyncedKind::AppProject,
            SyncedKind::Repository,
            SyncedKind::GpgKey,
        ]
        .into_iter()
        .find(|k| k.resync_kind() == kind)
    }

    /// The field selector narrowing the watch of this kind to the one object it is about, if any.
    pub fn field_selector(self) -> Option<String> {
        match self {
            SyncedKind::GpgKey => Some(format!("metadata.name={GPG_KEYS_CONFIGMAP}")),
            _ => None,
        }
    }

    /// Whether this kind is `data` (a Secret's or ConfigMap's) rather than `spec`.
    pub fn is_data(self) -> bool {
        matches!(self, SyncedKind::Repository | SyncedKind::GpgKey)
    }

    /// The resource plural.
    pub fn plural(self) -> &'static str {
        match self {
            SyncedKind::Application => "applications",
            SyncedKind::AppProject => "appprojects",
            SyncedKind::Repository => "secrets",
            SyncedKind::GpgKey => "configmaps",
        }
    }

    /// The `apiVersion` of this kind.
    pub fn api_version(self) -> &'static str {
        match self {
            SyncedKind::Repository | SyncedKind::GpgKey => "v1",
            _ => "argoproj.io/v1alpha1",
        }
    }

    /// `apiVersion` and `kind` of this kind, for the `other` map of an object built here.
    pub fn type_meta(self) -> Other {
        match self {
            SyncedKind::Application => type_meta::<Application>(),
            SyncedKind::AppProject => type_meta::<AppProject>(),
            SyncedKind::Repository => type_meta::<k8s_openapi::api::core::v1::Secret>(),
            SyncedKind::GpgKey => type_meta::<k8s_openapi::api::core::v1::ConfigMap>(),
        }
    }

    /// API coordinates for a dynamic client.
    pub fn api_resource(self) -> ApiResource {
        let gvk = match self {
            SyncedKind::Repository | SyncedKind::GpgKey => {
                GroupVersionKind::gvk("", "v1", self.kind())
            }
            _ => GroupVersionKind::gvk("argoproj.io", "v1alpha1", self.kind()),
        };
        ApiResource::from_gvk_with_plural(&gvk, self.plural())
    }

    /// The event target (`dataschema`) of this kind.
    pub fn target(self) -> Target {
        match self {
            SyncedKind::Application => Target::Application,
            SyncedKind::AppProject => Target::AppProject,
            SyncedKind::Repository => Target::Repository,
            SyncedKind::GpgKey => Target::GpgKey,
        }
    }

    /// The kind an event target is about, if it is one a managed agent keeps.
    pub fn from_target(target: &Target) -> Option<SyncedKind> {
        match target {
            Target::Application => Some(SyncedKind::Application),
            Target::AppProject => Some(SyncedKind::AppProject),
            Target::Repository => Some(SyncedKind::Repository),
            Target::GpgKey => Some(SyncedKind::GpgKey),
            _ => None,
        }
    }
}

impl fmt::Display for SyncedKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())
    }
}

/// Why a hub object cannot be turned into a spoke copy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyError {
    /// A required metadata field is missing or empty.
    #[error("the {kind} payload has no metadata.{field}")]
    MissingField {
        /// The kind expected.
        kind: SyncedKind,
        /// The missing field (`name` or `uid`).
        field: &'static str,
    },
    /// `spec` is missing or not an object.
    #[error("{kind} {name:?} has no spec object")]
    MissingSpec {
        /// The kind expected.
        kind: SyncedKind,
        /// The object's name.
        name: String,
    },
    /// `spec` is not what Argo CD's type of the kind allows.
    #[error("{kind} {name:?} has an invalid spec: {reason}")]
    InvalidSpec {
        /// The kind expected.
        kind: SyncedKind,
        /// The object's name.
        name: String,
        /// What the decoder said.
        reason: String,
    },
}

/// An object of any [`SyncedKind`] as the agent reads, writes and sends it: metadata typed, and
/// each kind's parts whole, since the managed agent copies and compares them without looking
/// inside (what it reads of an Application, it reads through
/// [`argocd_agent_kube::argocd::Application`]). Every other field (`apiVersion`, `kind`, ...) is
/// kept as read, so nothing is lost between the apiserver and the principal.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SpokeObject {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// An Application's or AppProject's desired state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Value>,
    /// What the spoke's Argo CD observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// An Application's requested operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Value>,
    /// A Secret's type.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// A Secret's data (base64 values) or a ConfigMap's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<BTreeMap<String, Value>>,
    /// A ConfigMap's binary data (base64 values).
    #[serde(
        rename = "binaryData",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub binary_data: Option<BTreeMap<String, Value>>,
    /// Everything else (`apiVersion`, `kind`, ...).
    #[serde(flatten)]
    pub other: Other,
}

impl kube::Resource for SpokeObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl SpokeObject {
    /// The source-uid annotation, if the object carries one (i.e. a hub object created it).
    pub fn source_uid(&self) -> Option<&str> {
        self.annotation(SOURCE_UID_ANNOTATION)
            .filter(|s| !s.is_empty())
    }

    /// The object as read, without `managedFields` (bulky, and nothing the principal uses).
    pub fn without_managed_fields(mut self) -> Self {
        self.metadata.managed_fields = None;
        self
    }

    /// The object as JSON, for the checksums of the wire contract.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The copy of `self` an upsert writes: the metadata it keeps (name, `namespace`, labels,
    /// annotations minus `kubectl.kubernetes.io/last-applied-configuration`, finalizers) and
    /// `kind`'s parts (spec; type and data for a Secret; data and binary data for a ConfigMap) as
    /// they are.
    pub fn kept_parts(&self, kind: SyncedKind, namespace: Option<String>) -> SpokeObject {
        let meta = &self.metadata;
        let mut annotations = meta.annotations.clone().unwrap_or_default();
        annotations.remove(LAST_APPLIED_ANNOTATION);
        let metadata = ObjectMeta {
            name: Some(self.name_str().to_string()),
            namespace,
            labels: meta.labels.clone().filter(|l| !l.is_empty()),
            annotations: Some(annotations),
            finalizers: meta.finalizers.clone().filter(|f| !f.is_empty()),
            ..ObjectMeta::default()
        };
        let mut copy = SpokeObject {
            metadata,
            other: kind.type_meta(),
            ..SpokeObject::default()
        };
        match kind {
            SyncedKind::Repository => {
                copy.type_ = self.type_.clone();
                copy.data = self.data.clone();
            }
            SyncedKind::GpgKey => {
                copy.data = self.data.clone();
                copy.binary_data = self.binary_data.clone();
            }
            _ => copy.spec = self.spec.clone(),
        }
        copy
    }
}

/// The spoke copy of hub object `hub`, kept in `namespace` under the same name.
///
/// Metadata keeps only name, labels, annotations (minus `kubectl.kubernetes.io/last-applied-configuration`,
/// plus `argocd.argoproj.io/source-uid` = the hub uid) and finalizers. The spec is the hub's; for an
/// Application its destination becomes `{"name": "in-cluster", "namespace": <hub destination namespace>}`
/// (an AppProject arrives already rewritten by the principal). Status and operation are never copied.
pub fn spoke_copy(
    kind: SyncedKind,
    hub: &SpokeObject,
    namespace: &str,
) -> Result<SpokeObject, CopyError> {
    let name = hub.name_str();
    if name.is_empty() {
        return Err(CopyError::MissingField {
            kind,
            field: "name",
        });
    }
    let uid = hub.uid_str();
    if uid.is_empty() {
        return Err(CopyError::MissingField { kind, field: "uid" });
    }
    if !kind.is_data() && !matches!(hub.spec, Some(Value::Object(_))) {
        return Err(CopyError::MissingSpec {
            kind,
            name: name.to_string(),
        });
    }
    let mut copy = hub.kept_parts(kind, Some(namespace.to_string()));
    copy.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(SOURCE_UID_ANNOTATION.to_string(), uid.to_string());
    if kind == SyncedKind::Application {
        let invalid = |e: serde_json::Error| CopyError::InvalidSpec {
            kind,
            name: name.to_string(),
            reason: e.to_string(),
        };
        let mut spec: ApplicationSpec =
            serde_json::from_value(copy.spec.take().unwrap_or_default()).map_err(invalid)?;
        spec.destination = Some(ApplicationDestination {
            name: Some(IN_CLUSTER.to_string()),
            namespace: spec.destination.and_then(|d| d.namespace),
            ..ApplicationDestination::default()
        });
        copy.spec = Some(serde_json::to_value(spec).map_err(invalid)?);
    }
    Ok(copy)
}

/// The body of a PUT that makes `live` look like `desired` while keeping what the spoke owns: the
/// live `status` and `operation`, and the live `resourceVersion` (so a concurrent write conflicts).
pub fn replacement_body(live: &SpokeObject, desired: &SpokeObject) -> SpokeObject {
    let mut body = desired.clone();
    if let Some(rv) = &live.metadata.resource_version {
        body.metadata.resource_version = Some(rv.clone());
    }
    body.status = live.status.clone();
    body.operation = live.operation.clone();
    body
}

/// What drift revert protects of an object (see [`managed_view`]), kept as the SHA-256 of its
/// canonical JSON: the agent keeps one per object and only ever compares them, so a digest
/// serves where a copy of the spec, labels and annotations would cost kilobytes per object.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ManagedView(JsonDigest);

/// The parts of an object [`managed_view`] digests, borrowed. Absent and empty maps serialise
/// alike (`None`), so they compare equal.
#[derive(Serialize)]
struct ManagedParts<'a> {
    spec: Option<&'a Value>,
    data: Option<&'a BTreeMap<String, Value>>,
    binary_data: Option<&'a BTreeMap<String, Value>>,
    labels: Option<&'a BTreeMap<String, String>>,
    annotations: BTreeMap<&'a str, &'a str>,
}

/// Annotations the spoke may change on its own, outside what drift revert protects.
const SPOKE_OWNED_ANNOTATIONS: [&str; 3] = [
    LAST_APPLIED_ANNOTATION,
    REFRESH_ANNOTATION,
    HYDRATE_ANNOTATION,
];

/// What drift revert protects: spec (data for a Secret; data and binary data for a ConfigMap), labels and annotations (minus the ones the
/// spoke may change on its own: last-applied-configuration and refresh). Absent
/// labels/annotations/data equal empty ones.
pub fn managed_view(obj: &SpokeObject) -> ManagedView {
    let annotations = obj
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !SPOKE_OWNED_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    ManagedView(JsonDigest::of(&ManagedParts {
        spec: obj.spec.as_ref(),
        data: obj.data.as_ref().filter(|m| !m.is_empty()),
        binary_data: obj.binary_data.as_ref().filter(|m| !m.is_empty()),
        labels: obj.metadata.labels.as_ref().filter(|m| !m.is_empty()),
        annotations,
    }))
}

impl fmt::Debug for ManagedView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ManagedView({:?})", self.0)
    }
}

/// A spoke object kept as its JSON: for the copy the agent holds of every object but reads only
/// on rare paths (drift revert, recreation, resync). Parsed, an object's `serde_json::Value`
/// trees take about three times its JSON, and a managed agent holds one copy per object.
pub type PackedObject = Packed<SpokeObject>;

/// Whether `live` already matches `desired` in everything an upsert writes (managed view and
/// finalizers), so no write is needed.
pub fn matches_desired(live: &SpokeObject, desired: &SpokeObject) -> bool {
    let finalizers = |o: &SpokeObject| o.metadata.finalizers.clone().unwrap_or_default();
    // The refresh annotation is excluded from the drift view, but a hub request for a refresh
    // must still reach the spoke.
    let refresh = desired.annotation(REFRESH_ANNOTATION);
    managed_view(live) == managed_view(desired)
        && finalizers(live) == finalizers(desired)
        && (refresh.is_none() || live.annotation(REFRESH_ANNOTATION) == refresh)
}

/// Spoke Application `live` with `operation` requested, as argocd-server's `SetAppOperation`
/// writes it: the operation replaced whole (a merge would mix the hub's request into a pending one
/// of the spoke's own) and the last `status.operationState` cleared (Argo CD's controller merges
/// the new state into the old one, so a leftover automated sync's fields would show up in the
/// state of the hub's sync, and the hub could not tell that its operation ran).
pub fn with_requested_operation(mut live: Application, operation: &Value) -> Application {
    live.operation = Some(operation.clone());
    if let Some(status) = live.status.as_mut() {
        status.operation_state = None;
    }
    live
}

/// What status reporting watches on a spoke Application (see [`reported_view`]): a digest of its
/// `status` and `operation`, and whether it has neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportedView {
    digest: JsonDigest,
    empty: bool,
}

impl ReportedView {
    /// The Application has neither a `status` nor an `operation`.
    pub fn is_empty(&self) -> bool {
        self.empty
    }
}

/// What status reporting watches on a spoke Application: its `status` and `operation`.
pub fn reported_view(obj: &SpokeObject) -> ReportedView {
    ReportedView {
        digest: JsonDigest::of(&(&obj.status, &obj.operation)),
        empty: obj.status.is_none() && obj.operation.is_none(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn views_do_not_depend_on_the_order_maps_were_built_in_and_absent_maps_equal_empty_ones() {
        // Guards the canonical JSON behind the digests: with serde_json's `preserve_order`
        // (a feature any dependency could switch on) these maps would serialise differently.
        let a: SpokeObject = serde_json::from_value(json!({
            "metadata": {"name": "a", "labels": {"x": "1", "y": "2"}},
            "spec": {"project": "default", "source": {"path": "p", "repoURL": "r"}},
            "status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}
        }))
        .unwrap();
        let b: SpokeObject = serde_json::from_value(json!({
            "metadata": {"name": "a", "labels": {"y": "2", "x": "1"}, "annotations": {}},
            "spec": {"source": {"repoURL": "r", "path": "p"}, "project": "default"},
            "status": {"health": {"status": "Healthy"}, "sync": {"status": "Synced"}}
        }))
        .unwrap();
        assert_eq!(managed_view(&a), managed_view(&b));
        assert_eq!(reported_view(&a), reported_view(&b));
        let mut c = b.clone();
        c.spec.as_mut().unwrap()["project"] = json!("other");
        assert_ne!(managed_view(&a), managed_view(&c));
        c.status.as_mut().unwrap()["sync"]["status"] = json!("OutOfSync");
        assert_ne!(reported_view(&a), reported_view(&c));
        assert!(!reported_view(&a).is_empty());
        let mut d = SpokeObject::clone(&a);
        d.status = None;
        assert!(reported_view(&d).is_empty());
        d.operation = Some(json!({"sync": {}}));
        assert!(!reported_view(&d).is_empty());
    }

    #[test]
    fn a_packed_spoke_object_unpacks_to_itself() {
        // (How packs compare: `argocd_agent_kube::packed`'s tests.)
        let app = hub_app();
        let packed = PackedObject::pack(&app);
        assert_eq!(packed.unpack(), app);
        assert_eq!(PackedObject::pack(&packed.unpack()), packed);
    }

    /// `v` (JSON) as the agent would read it.
    fn object(v: Value) -> SpokeObject {
        serde_json::from_value(v).expect("a Kubernetes object")
    }

    fn hub_app() -> SpokeObject {
        object(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {
                "name": "guestbook",
                "namespace": "agent-a",
                "uid": "hub-uid-1",
                "resourceVersion": "42",
                "generation": 3,
                "creationTimestamp": "2024-01-01T00:00:00Z",
                "labels": {"team": "blue"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                    "note": "kept"
                },
                "finalizers": ["resources-finalizer.argocd.argoproj.io"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "u"}],
                "managedFields": [{"manager": "kubectl"}]
            },
            "spec": {
                "project": "default",
                "source": {"repoURL": "https://example.com/repo.git", "path": "guestbook"},
                "destination": {"server": "https://agent-a.example.com", "namespace": "guestbook"}
            },
            "status": {"sync": {"status": "Synced"}},
            "operation": {"sync": {"revision": "abc"}}
        }))
    }

    fn annotate(obj: &mut SpokeObject, key: &str, value: &str) {
        obj.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
    }

    #[test]
    fn hub_application_becomes_an_in_cluster_spoke_copy_with_source_uid() {
        let copy = spoke_copy(SyncedKind::Application, &hub_app(), "argocd").unwrap();
        assert_eq!(
            copy.to_json(),
            json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Application",
                "metadata": {
                    "name": "guestbook",
                    "namespace": "argocd",
                    "labels": {"team": "blue"},
                    "annotations": {
                        "note": "kept",
                        "argocd.argoproj.io/source-uid": "hub-uid-1"
                    },
                    "finalizers": ["resources-finalizer.argocd.argoproj.io"]
                },
                "spec": {
                    "project": "default",
                    "source": {"repoURL": "https://example.com/repo.git", "path": "guestbook"},
                    "destination": {"name": "in-cluster", "namespace": "guestbook"}
                }
            })
        );
    }

    #[test]
    fn destination_without_namespace_and_minimal_metadata() {
        let hub = object(json!({
            "metadata": {"name": "a", "uid": "u"},
            "spec": {"destination": {"name": "agent-a"}}
        }));
        let copy = spoke_copy(SyncedKind::Application, &hub, "argocd").unwrap();
        assert_eq!(
            copy.to_json(),
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                   "metadata": {"name": "a", "namespace": "argocd",
                                "annotations": {"argocd.argoproj.io/source-uid": "u"}},
                   "spec": {"destination": {"name": "in-cluster"}}})
        );
    }

    #[test]
    fn appproject_spec_is_kept_as_the_principal_sent_it() {
        let hub = object(json!({
            "metadata": {"name": "default", "namespace": "argocd", "uid": "p1"},
            "spec": {"destinations": [{"name": "in-cluster", "namespace": "*", "server": "*"}]}
        }));
        let copy = spoke_copy(SyncedKind::AppProject, &hub, "argocd").unwrap();
        assert_eq!(copy.other, SyncedKind::AppProject.type_meta());
        assert_eq!(copy.spec, hub.spec);
        assert_eq!(copy.source_uid(), Some("p1"));
    }

    #[test]
    fn gpg_keys_config_map_keeps_its_data_and_resyncs_as_upstream_names_it() {
        let hub = object(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "argocd-gpg-keys-cm", "namespace": "argocd", "uid": "g1",
                         "resourceVersion": "7"},
            "data": {"4AEE18F83AFDEB23": "-----BEGIN PGP PUBLIC KEY BLOCK-----"},
            "binaryData": {"raw": "AAE="}
        }));
        let copy = spoke_copy(SyncedKind::GpgKey, &hub, "spoke-ns").unwrap();
        assert_eq!(
            copy.to_json(),
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "argocd-gpg-keys-cm", "namespace": "spoke-ns",
                             "annotations": {"argocd.argoproj.io/source-uid": "g1"}},
                "data": {"4AEE18F83AFDEB23": "-----BEGIN PGP PUBLIC KEY BLOCK-----"},
                "binaryData": {"raw": "AAE="}
            })
        );
        let mut edited = copy.clone();
        edited.binary_data = None;
        assert_ne!(managed_view(&edited), managed_view(&copy));
        assert_eq!(SyncedKind::GpgKey.resync_kind(), "GPGKey");
        // Repository Secrets by upstream's resync kind; ours before it said `Secret`.
        assert_eq!(SyncedKind::Repository.resync_kind(), "Repository");
        for kind in ["Repository", "Secret"] {
            assert_eq!(
                SyncedKind::from_resync_kind(kind),
                Some(SyncedKind::Repository)
            );
        }
        assert_eq!(
            SyncedKind::from_resync_kind("GPGKey"),
            Some(SyncedKind::GpgKey)
        );
        assert_eq!(
            SyncedKind::from_target(&Target::GpgKey),
            Some(SyncedKind::GpgKey)
        );
        assert_eq!(
            SyncedKind::GpgKey.field_selector().as_deref(),
            Some("metadata.name=argocd-gpg-keys-cm")
        );
    }

    #[test]
    fn repository_secret_keeps_type_data_and_labels_only() {
        let hub = object(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "repo-1", "namespace": "argocd", "uid": "s1",
                         "resourceVersion": "3",
                         "labels": {"argocd.argoproj.io/secret-type": "repository"}},
            "type": "Opaque",
            "data": {"url": "aHR0cHM6Ly9leGFtcGxlLmNvbQ==", "project": "dGVhbS1h"}
        }));
        let copy = spoke_copy(SyncedKind::Repository, &hub, "spoke-ns").unwrap();
        assert_eq!(
            copy.to_json(),
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "repo-1", "namespace": "spoke-ns",
                             "labels": {"argocd.argoproj.io/secret-type": "repository"},
                             "annotations": {"argocd.argoproj.io/source-uid": "s1"}},
                "type": "Opaque",
                "data": {"url": "aHR0cHM6Ly9leGFtcGxlLmNvbQ==", "project": "dGVhbS1h"}
            })
        );
        let mut edited = copy.clone();
        edited
            .data
            .get_or_insert_with(BTreeMap::new)
            .insert("url".into(), json!("ZXZpbA=="));
        assert!(!matches_desired(&edited, &copy), "a data edit is drift");
        assert_eq!(SyncedKind::Repository.api_resource().group, "");
        assert_eq!(
            SyncedKind::from_target(&Target::Repository),
            Some(SyncedKind::Repository)
        );
    }

    #[test]
    fn payload_without_name_uid_or_spec_is_refused() {
        let k = SyncedKind::Application;
        assert!(serde_json::from_value::<SpokeObject>(json!([])).is_err());
        assert_eq!(
            spoke_copy(
                k,
                &object(json!({"metadata": {"uid": "u"}, "spec": {}})),
                "argocd"
            ),
            Err(CopyError::MissingField {
                kind: k,
                field: "name"
            })
        );
        assert_eq!(
            spoke_copy(
                k,
                &object(json!({"metadata": {"name": "a"}, "spec": {}})),
                "argocd"
            ),
            Err(CopyError::MissingField {
                kind: k,
                field: "uid"
            })
        );
        assert!(matches!(
            spoke_copy(
                k,
                &object(json!({"metadata": {"name": "a", "uid": "u"}})),
                "argocd"
            ),
            Err(CopyError::MissingSpec { .. })
        ));
        assert!(matches!(
            spoke_copy(
                k,
                &object(json!({"metadata": {"name": "a", "uid": "u"},
                               "spec": {"destination": {"namespace": 7}}})),
                "argocd"
            ),
            Err(CopyError::InvalidSpec { .. })
        ));
    }

    #[test]
    fn replacement_keeps_live_status_operation_and_resource_version() {
        let desired = spoke_copy(SyncedKind::Application, &hub_app(), "argocd").unwrap();
        let live = object(json!({
            "metadata": {"name": "guestbook", "resourceVersion": "7"},
            "spec": {"project": "old"},
            "status": {"health": {"status": "Healthy"}},
            "operation": {"sync": {}}
        }));
        let body = replacement_body(&live, &desired);
        assert_eq!(body.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(body.status, live.status);
        assert_eq!(body.operation, live.operation);
        assert_eq!(body.spec, desired.spec);

        let mut with_op = desired.clone();
        with_op.operation = Some(json!({"sync": {}}));
        let body = replacement_body(
            &object(json!({"metadata": {"resourceVersion": "8"}})),
            &with_op,
        );
        assert!(body.operation.is_none(), "no live operation: none written");
    }

    #[test]
    fn managed_view_ignores_status_and_spoke_owned_annotations() {
        let desired = spoke_copy(SyncedKind::Application, &hub_app(), "argocd").unwrap();
        let mut live = desired.clone();
        live.status = Some(json!({"health": {"status": "Degraded"}}));
        live.metadata.resource_version = Some("9".into());
        annotate(&mut live, LAST_APPLIED_ANNOTATION, "{}");
        assert!(matches_desired(&live, &desired));
        live.spec = Some(json!({"project": "other"}));
        assert!(!matches_desired(&live, &desired));
    }

    #[test]
    fn the_hubs_operation_replaces_a_pending_one_and_clears_the_last_state() {
        let live: Application = serde_json::from_value(json!({
            "metadata": {"name": "a", "resourceVersion": "7"},
            "operation": {"initiatedBy": {"automated": true}, "retry": {"limit": 5},
                          "sync": {"prune": true}},
            "status": {"sync": {"status": "Synced"},
                       "operationState": {"phase": "Succeeded",
                                          "operation": {"initiatedBy": {"automated": true}}}}}))
        .unwrap();
        let hub_op = json!({"initiatedBy": {"username": "admin"}, "sync": {"revision": "abc"}});
        let out = with_requested_operation(live.clone(), &hub_op);
        assert_eq!(out.operation(), Some(&hub_op));
        let status = out.status.as_ref().unwrap();
        assert!(status.operation_state.is_none());
        assert_eq!(status.sync, live.status.as_ref().unwrap().sync);
        assert_eq!(out.metadata, live.metadata, "an update of what was read");
        let fresh = with_requested_operation(Application::default(), &hub_op);
        assert_eq!(fresh.operation(), Some(&hub_op));
        assert!(fresh.status.is_none());
    }

    #[test]
    fn a_dropped_hydrate_request_is_not_drift() {
        let mut hub = hub_app();
        annotate(&mut hub, HYDRATE_ANNOTATION, "normal");
        let desired = spoke_copy(SyncedKind::Application, &hub, "argocd").unwrap();
        let mut live = desired.clone();
        live.metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(HYDRATE_ANNOTATION);
        assert_eq!(managed_view(&live), managed_view(&desired));
    }

    #[test]
    fn refresh_request_from_the_hub_is_written_but_its_removal_is_not_drift() {
        let mut hub = hub_app();
        annotate(&mut hub, REFRESH_ANNOTATION, "normal");
        let desired = spoke_copy(SyncedKind::Application, &hub, "argocd").unwrap();
        let mut live = desired.clone();
        live.metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(REFRESH_ANNOTATION);
        assert_eq!(managed_view(&live), managed_view(&desired));
        assert!(
            !matches_desired(&live, &desired),
            "the refresh must be written"
        );
    }

    #[test]
    fn spoke_objects_keep_what_they_do_not_model() {
        let app = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "a", "namespace": "n", "uid": "u", "labels": {},
                         "finalizers": []},
            "spec": {"project": "", "sources": [{"repoURL": "r"}]},
            "status": {"health": {"status": "Healthy"}}, "operation": {"sync": {}},
            "future": {"field": [1, 2.5]}});
        assert_eq!(object(app.clone()).to_json(), app);
        let typed: Application = serde_json::from_value(object(app.clone()).to_json()).unwrap();
        assert_eq!(serde_json::to_value(typed).unwrap(), app);
    }
}
