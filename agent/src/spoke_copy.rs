//! The spoke copy of a hub object: what a managed agent writes locally for an Application or
//! AppProject the principal sent, and the views of a live object the sync logic compares.
//!
//! Owns: [`SyncedKind`] (the kinds a managed agent keeps: Application, AppProject and repository
//! Secrets, with their API coordinates and event
//! targets), [`spoke_copy`] (hub JSON → spoke JSON, a pure function), [`replacement_body`] (the PUT
//! body that replaces everything but the live status and operation), and the comparison views
//! [`managed_view`] (what drift revert protects) and [`reported_view`] (what status reporting
//! watches). It does not talk to Kubernetes.

use std::fmt;

use argocd_agent_proto::event::{Target, SOURCE_UID_ANNOTATION};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Map, Value};

/// Annotation `kubectl apply` leaves behind; never copied and never a reason to revert.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// Annotation that asks Argo CD for a refresh; the spoke's application controller removes it once
/// done, which must not count as drift (or the agent would re-add it and refresh forever).
pub const REFRESH_ANNOTATION: &str = "argocd.argoproj.io/refresh";
/// Annotation that asks Argo CD to hydrate (argocd-server sets it with every refresh); the spoke's
/// controller may drop it, which is no drift either.
pub const HYDRATE_ANNOTATION: &str = "argocd.argoproj.io/hydrate";
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
}

impl SyncedKind {
    /// The Kubernetes kind.
    pub fn kind(self) -> &'static str {
        match self {
            SyncedKind::Application => "Application",
            SyncedKind::AppProject => "AppProject",
            SyncedKind::Repository => "Secret",
        }
    }

    /// The resource plural.
    pub fn plural(self) -> &'static str {
        match self {
            SyncedKind::Application => "applications",
            SyncedKind::AppProject => "appprojects",
            SyncedKind::Repository => "secrets",
        }
    }

    /// The `apiVersion` of this kind.
    pub fn api_version(self) -> &'static str {
        match self {
            SyncedKind::Repository => "v1",
            _ => "argoproj.io/v1alpha1",
        }
    }

    /// API coordinates for a dynamic client.
    pub fn api_resource(self) -> ApiResource {
        let gvk = match self {
            SyncedKind::Repository => GroupVersionKind::gvk("", "v1", self.kind()),
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
        }
    }

    /// The kind an event target is about, if it is one a managed agent keeps.
    pub fn from_target(target: &Target) -> Option<SyncedKind> {
        match target {
            Target::Application => Some(SyncedKind::Application),
            Target::AppProject => Some(SyncedKind::AppProject),
            Target::Repository => Some(SyncedKind::Repository),
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
    /// The payload is not a JSON object.
    #[error("the {kind} payload is not a JSON object")]
    NotAnObject {
        /// The kind expected.
        kind: SyncedKind,
    },
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
}

/// `metadata.name` of an object ("" when absent).
pub fn object_name(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata.uid` of an object ("" when absent).
pub fn object_uid(obj: &Value) -> &str {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The source-uid annotation of a spoke object, if it carries one (i.e. a hub object created it).
pub fn source_uid(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(SOURCE_UID_ANNOTATION))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Whether the object is being deleted (`metadata.deletionTimestamp` is set).
pub fn is_terminating(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// The spoke copy of hub object `hub`, kept in `namespace` under the same name.
///
/// Metadata keeps only name, labels, annotations (minus `kubectl.kubernetes.io/last-applied-configuration`,
/// plus `argocd.argoproj.io/source-uid` = the hub uid) and finalizers. The spec is the hub's; for an
/// Application its destination becomes `{"name": "in-cluster", "namespace": <hub destination namespace>}`
/// (an AppProject arrives already rewritten by the principal). Status and operation are never copied.
pub fn spoke_copy(kind: SyncedKind, hub: &Value, namespace: &str) -> Result<Value, CopyError> {
    let Value::Object(_) = hub else {
        return Err(CopyError::NotAnObject { kind });
    };
    let name = object_name(hub);
    if name.is_empty() {
        return Err(CopyError::MissingField {
            kind,
            field: "name",
        });
    }
    let uid = object_uid(hub);
    if uid.is_empty() {
        return Err(CopyError::MissingField { kind, field: "uid" });
    }
    let hub_spec = match (kind, hub.get("spec")) {
        (SyncedKind::Repository, _) => None,
        (_, Some(Value::Object(spec))) => Some(spec),
        _ => {
            return Err(CopyError::MissingSpec {
                kind,
                name: name.to_string(),
            })
        }
    };

    let mut annotations = match hub.pointer("/metadata/annotations") {
        Some(Value::Object(a)) => a.clone(),
        _ => Map::new(),
    };
    annotations.remove(LAST_APPLIED_ANNOTATION);
    annotations.insert(SOURCE_UID_ANNOTATION.to_string(), json!(uid));

    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(name));
    metadata.insert("namespace".into(), json!(namespace));
    if let Some(Value::Object(labels)) = hub.pointer("/metadata/labels") {
        if !labels.is_empty() {
            metadata.insert("labels".into(), Value::Object(labels.clone()));
        }
    }
    metadata.insert("annotations".into(), Value::Object(annotations));
    if let Some(Value::Array(finalizers)) = hub.pointer("/metadata/finalizers") {
        if !finalizers.is_empty() {
            metadata.insert("finalizers".into(), Value::Array(finalizers.clone()));
        }
    }

    let Some(hub_spec) = hub_spec else {
        // A repository Secret: its type and data, nothing else.
        let mut copy = json!({
            "apiVersion": kind.api_version(),
            "kind": kind.kind(),
            "metadata": Value::Object(metadata),
        });
        for field in ["type", "data"] {
            if let Some(v) = hub.get(field).filter(|v| !v.is_null()) {
                copy[field] = v.clone();
            }
        }
        return Ok(copy);
    };
    let mut spec = hub_spec.clone();
    if kind == SyncedKind::Application {
        let mut destination = Map::new();
        destination.insert("name".into(), json!(IN_CLUSTER));
        if let Some(ns) = hub_spec
            .get("destination")
            .and_then(|d| d.get("namespace"))
            .filter(|v| !v.is_null())
        {
            destination.insert("namespace".into(), ns.clone());
        }
        spec.insert("destination".into(), Value::Object(destination));
    }

    Ok(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": kind.kind(),
        "metadata": Value::Object(metadata),
        "spec": Value::Object(spec),
    }))
}

/// The body of a PUT that makes `live` look like `desired` while keeping what the spoke owns: the
/// live `status` and `operation`, and the live `resourceVersion` (so a concurrent write conflicts).
pub fn replacement_body(live: &Value, desired: &Value) -> Value {
    let mut body = desired.clone();
    if let Some(rv) = live.pointer("/metadata/resourceVersion") {
        body["metadata"]["resourceVersion"] = rv.clone();
    }
    for field in ["status", "operation"] {
        match live.get(field) {
            Some(v) if !v.is_null() => body[field] = v.clone(),
            _ => {
                if let Value::Object(map) = &mut body {
                    map.remove(field);
                }
            }
        }
    }
    body
}

/// What drift revert protects: spec (data for a Secret), labels and annotations (minus the ones the
/// spoke may change on its own: last-applied-configuration and refresh). Absent
/// labels/annotations/data equal empty ones.
pub fn managed_view(obj: &Value) -> Value {
    let map_or_empty = |ptr: &str| match obj.pointer(ptr) {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    let mut annotations = map_or_empty("/metadata/annotations");
    annotations.remove(LAST_APPLIED_ANNOTATION);
    annotations.remove(REFRESH_ANNOTATION);
    annotations.remove(HYDRATE_ANNOTATION);
    json!({
        "spec": obj.get("spec").cloned().unwrap_or(Value::Null),
        "data": Value::Object(map_or_empty("/data")),
        "labels": Value::Object(map_or_empty("/metadata/labels")),
        "annotations": Value::Object(annotations),
    })
}

/// Whether `live` already matches `desired` in everything an upsert writes (managed view and
/// finalizers), so no write is needed.
pub fn matches_desired(live: &Value, desired: &Value) -> bool {
    let finalizers = |o: &Value| match o.pointer("/metadata/finalizers") {
        Some(Value::Array(a)) => a.clone(),
        _ => Vec::new(),
    };
    // The refresh annotation is excluded from the drift view, but a hub request for a refresh
    // must still reach the spoke.
    let refresh = |o: &Value| {
        o.pointer("/metadata/annotations")
            .and_then(|a| a.get(REFRESH_ANNOTATION))
            .cloned()
    };
    managed_view(live) == managed_view(desired)
        && finalizers(live) == finalizers(desired)
        && (refresh(desired).is_none() || refresh(live) == refresh(desired))
}

/// Spoke Application `live` with `operation` requested, as argocd-server's `SetAppOperation`
/// writes it: the operation replaced whole (a merge would mix the hub's request into a pending one
/// of the spoke's own) and the last `status.operationState` cleared (Argo CD's controller merges
/// the new state into the old one, so a leftover automated sync's fields would show up in the
/// state of the hub's sync, and the hub could not tell that its operation ran).
pub fn with_requested_operation(live: &Value, operation: &Value) -> Value {
    let mut out = live.clone();
    out["operation"] = operation.clone();
    if let Some(status) = out.get_mut("status").and_then(Value::as_object_mut) {
        status.remove("operationState");
    }
    out
}

/// What status reporting watches on a spoke Application: its `status` and `operation`.
pub fn reported_view(obj: &Value) -> Value {
    json!({
        "status": obj.get("status").cloned().unwrap_or(Value::Null),
        "operation": obj.get("operation").cloned().unwrap_or(Value::Null),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub_app() -> Value {
        json!({
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
        })
    }

    #[test]
    fn hub_application_becomes_an_in_cluster_spoke_copy_with_source_uid() {
        let copy = spoke_copy(SyncedKind::Application, &hub_app(), "argocd").unwrap();
        assert_eq!(
            copy,
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
        let hub = json!({
            "metadata": {"name": "a", "uid": "u"},
            "spec": {"destination": {"name": "agent-a"}}
        });
        let copy = spoke_copy(SyncedKind::Application, &hub, "argocd").unwrap();
        assert_eq!(copy["spec"]["destination"], json!({"name": "in-cluster"}));
        assert_eq!(
            copy["metadata"],
            json!({"name": "a", "namespace": "argocd",
                   "annotations": {"argocd.argoproj.io/source-uid": "u"}})
        );
    }

    #[test]
    fn appproject_spec_is_kept_as_the_principal_sent_it() {
        let hub = json!({
            "metadata": {"name": "default", "namespace": "argocd", "uid": "p1"},
            "spec": {"destinations": [{"name": "in-cluster", "namespace": "*", "server": "*"}]}
        });
        let copy = spoke_copy(SyncedKind::AppProject, &hub, "argocd").unwrap();
        assert_eq!(copy["kind"], "AppProject");
        assert_eq!(copy["spec"], hub["spec"]);
        assert_eq!(source_uid(&copy), Some("p1"));
    }

    #[test]
    fn repository_secret_keeps_type_data_and_labels_only() {
        let hub = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "repo-1", "namespace": "argocd", "uid": "s1",
                         "resourceVersion": "3",
                         "labels": {"argocd.argoproj.io/secret-type": "repository"}},
            "type": "Opaque",
            "data": {"url": "aHR0cHM6Ly9leGFtcGxlLmNvbQ==", "project": "dGVhbS1h"}
        });
        let copy = spoke_copy(SyncedKind::Repository, &hub, "spoke-ns").unwrap();
        assert_eq!(
            copy,
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "repo-1", "namespace": "spoke-ns",
                             "labels": {"argocd.argoproj.io/secret-type": "repository"},
                             "annotations": {"argocd.argoproj.io/source-uid": "s1"}},
                "type": "Opaque",
                "data": hub["data"]
            })
        );
        let mut edited = copy.clone();
        edited["data"]["url"] = json!("ZXZpbA==");
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
        assert_eq!(
            spoke_copy(k, &json!([]), "argocd"),
            Err(CopyError::NotAnObject { kind: k })
        );
        assert_eq!(
            spoke_copy(k, &json!({"metadata": {"uid": "u"}, "spec": {}}), "argocd"),
            Err(CopyError::MissingField {
                kind: k,
                field: "name"
            })
        );
        assert_eq!(
            spoke_copy(k, &json!({"metadata": {"name": "a"}, "spec": {}}), "argocd"),
            Err(CopyError::MissingField {
                kind: k,
                field: "uid"
            })
        );
        assert!(matches!(
            spoke_copy(k, &json!({"metadata": {"name": "a", "uid": "u"}}), "argocd"),
            Err(CopyError::MissingSpec { .. })
        ));
    }

    #[test]
    fn replacement_keeps_live_status_operation_and_resource_version() {
        let desired = spoke_copy(SyncedKind::Application, &hub_app(), "argocd").unwrap();
        let live = json!({
            "metadata": {"name": "guestbook", "resourceVersion": "7"},
            "spec": {"project": "old"},
            "status": {"health": {"status": "Healthy"}},
            "operation": {"sync": {}}
        });
        let body = replacement_body(&live, &desired);
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["status"], live["status"]);
        assert_eq!(body["operation"], live["operation"]);
        assert_eq!(body["spec"], desired["spec"]);

        let mut with_op = desired.clone();
        with_op["operation"] = json!({"sync": {}});
        let body = replacement_body(&json!({"metadata": {"resourceVersion": "8"}}), &with_op);
        assert!(
            body.get("operation").is_none(),
            "no live operation: none written"
        );
    }

    #[test]
    fn managed_view_ignores_status_and_spoke_owned_annotations() {
        let desired = spoke_copy(SyncedKind::Application, &hub_app(), "argocd").unwrap();
        let mut live = desired.clone();
        live["status"] = json!({"health": {"status": "Degraded"}});
        live["metadata"]["resourceVersion"] = json!("9");
        live["metadata"]["annotations"][LAST_APPLIED_ANNOTATION] = json!("{}");
        assert!(matches_desired(&live, &desired));
        live["spec"]["project"] = json!("other");
        assert!(!matches_desired(&live, &desired));
    }

    #[test]
    fn the_hubs_operation_replaces_a_pending_one_and_clears_the_last_state() {
        let live = json!({"metadata": {"name": "a", "resourceVersion": "7"},
            "operation": {"initiatedBy": {"automated": true}, "retry": {"limit": 5},
                          "sync": {"prune": true}},
            "status": {"sync": {"status": "Synced"},
                       "operationState": {"phase": "Succeeded",
                                          "operation": {"initiatedBy": {"automated": true}}}}});
        let hub_op = json!({"initiatedBy": {"username": "admin"}, "sync": {"revision": "abc"}});
        let out = with_requested_operation(&live, &hub_op);
        assert_eq!(out["operation"], hub_op);
        assert!(out.pointer("/status/operationState").is_none());
        assert_eq!(out["status"]["sync"], live["status"]["sync"]);
        assert_eq!(
            out["metadata"], live["metadata"],
            "an update of what was read"
        );
        let fresh = with_requested_operation(&json!({"metadata": {"name": "a"}}), &hub_op);
        assert_eq!(fresh["operation"], hub_op);
    }

    #[test]
    fn a_dropped_hydrate_request_is_not_drift() {
        let mut hub = hub_app();
        hub["metadata"]["annotations"][HYDRATE_ANNOTATION] = json!("normal");
        let desired = spoke_copy(SyncedKind::Application, &hub, "argocd").unwrap();
        let mut live = desired.clone();
        live["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(HYDRATE_ANNOTATION);
        assert_eq!(managed_view(&live), managed_view(&desired));
    }

    #[test]
    fn refresh_request_from_the_hub_is_written_but_its_removal_is_not_drift() {
        let mut hub = hub_app();
        hub["metadata"]["annotations"][REFRESH_ANNOTATION] = json!("normal");
        let desired = spoke_copy(SyncedKind::Application, &hub, "argocd").unwrap();
        let mut live = desired.clone();
        live["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(REFRESH_ANNOTATION);
        assert_eq!(managed_view(&live), managed_view(&desired));
        assert!(
            !matches_desired(&live, &desired),
            "the refresh must be written"
        );
    }
}
