//! Typed Argo CD objects (`argoproj.io/v1alpha1`), lossless for the fields not modelled.
//!
//! Owns the Rust types of the Argo CD kinds this project reads — [`AppProject`],
//! [`Application`] and [`ApplicationSet`] — with the fields its decisions use typed, and every other field (at each
//! level) kept in an `other` map, so an object read, changed and written back loses nothing, also
//! fields of Argo CD versions newer than this code. Each kind implements [`kube::Resource`], so it
//! can be watched by an informer and written with `Api<T>` directly. [`ObjectMetaExt`] reads the
//! metadata any object has (name, uid, annotations, ...) without cloning it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::resources::{ARGOPROJ_GROUP, ARGOPROJ_VERSION};

/// Fields of an object not modelled here, kept as read.
pub type Other = BTreeMap<String, Value>;

macro_rules! argoproj_resource {
    ($ty:ident, $kind:literal, $plural:literal) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }

            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(ARGOPROJ_GROUP)
            }

            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(ARGOPROJ_VERSION)
            }

            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }

            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// An Argo CD AppProject.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AppProject {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the project allows.
    #[serde(default)]
    pub spec: AppProjectSpec,
    /// What Argo CD recorded (JWT tokens by role), not read here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// Everything else (`apiVersion`, `kind`, ...).
    #[serde(flatten)]
    pub other: Other,
}

argoproj_resource!(AppProject, "AppProject", "appprojects");

/// `AppProject.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppProjectSpec {
    /// Where the project's Applications may deploy (name and server are patterns: globs, `!`
    /// denies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destinations: Vec<ApplicationDestination>,
    /// Namespaces whose Applications may use the project (globs, `!` denies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_namespaces: Vec<String>,
    /// The project's roles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<Vec<ProjectRole>>,
    /// Everything else (`sourceRepos`, whitelists, ...).
    #[serde(flatten)]
    pub other: Other,
}

/// An entry of `AppProject.spec.roles`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProjectRole {
    /// Casbin policy lines (`p, proj:<project>:<role>, <resource>, <action>, <object>, <effect>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<String>>,
    /// Everything else (`name`, `groups`, `jwtTokens`, ...).
    #[serde(flatten)]
    pub other: Other,
}

/// An Argo CD Application.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Application {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What to deploy where.
    #[serde(default)]
    pub spec: ApplicationSpec,
    /// A requested operation (sync), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Value>,
    /// What Argo CD observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ApplicationStatus>,
    /// Everything else (`apiVersion`, `kind`, ...).
    #[serde(flatten)]
    pub other: Other,
}

argoproj_resource!(Application, "Application", "applications");

/// `Application.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ApplicationSpec {
    /// The AppProject (Go writes `""` too, so absent and empty are kept apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Where to deploy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<ApplicationDestination>,
    /// Everything else (`source`, `sources`, `syncPolicy`, ...).
    #[serde(flatten)]
    pub other: Other,
}

/// `Application.spec.destination`, and an entry of `AppProject.spec.destinations` (one type in
/// Argo CD too).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ApplicationDestination {
    /// Cluster by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Cluster by server URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Target namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub other: Other,
}

/// `Application.status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationStatus {
    /// The last or running operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_state: Option<OperationState>,
    /// Whether the live state matches the desired one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<StatusOf>,
    /// The aggregated health of the Application's resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<StatusOf>,
    /// Conditions (errors and warnings) Argo CD or this project report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<ApplicationCondition>>,
    /// The resources the Application manages, as Argo CD last compared them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<ResourceStatus>>,
    /// When Argo CD last compared the Application with its sources (RFC 3339, seconds): a
    /// refresh moves it on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciled_at: Option<String>,
    /// Everything else (`summary`, `history`, ...).
    #[serde(flatten)]
    pub other: Other,
}

/// An entry of `Application.status.resources`: one resource the Application manages (Argo CD
/// omits every empty field).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceStatus {
    /// API group (absent for the core group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// API version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Namespace (absent for cluster-scoped resources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `Synced`, `OutOfSync`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// The resource's health, for kinds Argo CD assesses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<StatusOf>,
    /// Everything else (`hook`, `requiresPruning`, `syncWave`, ...).
    #[serde(flatten)]
    pub other: Other,
}

impl ResourceStatus {
    /// `<group>/<version>`, or the version alone for the core group.
    pub fn api_version(&self) -> String {
        let version = self.version.as_deref().unwrap_or_default();
        match self.group.as_deref().filter(|g| !g.is_empty()) {
            Some(group) => format!("{group}/{version}"),
            None => version.to_owned(),
        }
    }
}

/// `Application.status.sync` and `Application.status.health`: a `status` word and details.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusOf {
    /// `Synced`/`OutOfSync`/`Unknown`, or `Healthy`/`Progressing`/`Degraded`/...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Everything else (`revision`, `comparedTo`, `message`, ...).
    #[serde(flatten)]
    pub other: Other,
}

/// An entry of `Application.status.conditions`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationCondition {
    /// The condition type (`ComparisonError`, `AgentError`, ...).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// What happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When it was last set (RFC 3339, kept as written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub other: Other,
}

/// `Application.status.operationState`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationState {
    /// `Running`, `Terminating`, `Succeeded`, `Failed`, `Error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The operation it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Value>,
    /// When it started (RFC 3339, kept as written); the pull model's status feedback compares it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// What it said last; the pull model's status feedback compares it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub other: Other,
}

/// An Argo CD ApplicationSet. Its metadata (the pull model's report is named after it and owned
/// by it) and where a progressive sync is with each Application are read here; the rest is kept
/// as read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ApplicationSet {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the ApplicationSet controller observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ApplicationSetStatus>,
    /// Everything else (`apiVersion`, `kind`, `spec`, ...).
    #[serde(flatten)]
    pub other: Other,
}

/// `ApplicationSet.status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationSetStatus {
    /// Per generated Application, where a progressive sync (`RollingSync`) is with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub application_status: Vec<ApplicationSetApplicationStatus>,
    /// Everything else (`conditions`, `resources`, ...).
    #[serde(flatten)]
    pub other: Other,
}

/// An entry of `ApplicationSet.status.applicationStatus`, written by the ApplicationSet controller
/// when progressive syncs are enabled.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationSetApplicationStatus {
    /// The Application's name.
    #[serde(default)]
    pub application: String,
    /// `Waiting`, `Pending` (the controller asked for a sync), `Progressing`, `Healthy`.
    #[serde(default)]
    pub status: String,
    /// Why it is in that status.
    #[serde(default)]
    pub message: String,
    /// The RollingSync step (1-based) that selects it, `-1` for none.
    #[serde(default)]
    pub step: String,
    /// When it entered that status (RFC 3339, kept as written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The Application's revisions when it entered `Waiting` (a change sets it back there).
    #[serde(default)]
    pub target_revisions: Vec<String>,
    /// Everything else.
    #[serde(flatten)]
    pub other: Other,
}

impl ApplicationSet {
    /// The progressive-sync entry of Application `name`, if the controller wrote one.
    pub fn application_status(&self, name: &str) -> Option<&ApplicationSetApplicationStatus> {
        self.status
            .as_ref()?
            .application_status
            .iter()
            .find(|s| s.application == name)
    }
}

argoproj_resource!(ApplicationSet, "ApplicationSet", "applicationsets");

impl Application {
    /// The requested operation, if any.
    pub fn operation(&self) -> Option<&Value> {
        self.operation.as_ref()
    }

    /// The operation the last or running operation state ran (what the controller copied from
    /// `operation` when it started it).
    pub fn started_operation(&self) -> Option<&Value> {
        self.status
            .as_ref()?
            .operation_state
            .as_ref()?
            .operation
            .as_ref()
    }

    /// Whether the requested operation is the one the last or running operation state ran: the
    /// controller started it (see [`same_operation`]).
    pub fn operation_started(&self) -> bool {
        match (self.operation(), self.started_operation()) {
            (Some(requested), Some(started)) => same_operation(requested, started),
            _ => false,
        }
    }

    /// The phase of the last or running operation.
    pub fn operation_phase(&self) -> Option<&str> {
        self.status
            .as_ref()?
            .operation_state
            .as_ref()?
            .phase
            .as_deref()
    }
}

/// Whether two operations (`.operation`, `status.operationState.operation`) are the same as Argo
/// CD's Go types read them: the controller copies a requested operation through those types, which
/// write empty structs (`"retry": {}`, `"initiatedBy": {}`) a request may not have and leave out
/// the `omitempty` fields a request may spell out (`"prune": false`, `"revision": ""`); so both
/// sides are compared without empty and zero values.
pub fn same_operation(a: &Value, b: &Value) -> bool {
    fn without_empty(v: &Value) -> Option<Value> {
        match v {
            Value::Null | Value::Bool(false) => None,
            Value::String(s) if s.is_empty() => None,
            Value::Number(n) if n.as_f64() == Some(0.0) => None,
            Value::Array(items) if items.is_empty() => None,
            Value::Array(items) => Some(Value::Array(
                items
                    .iter()
                    .map(|i| without_empty(i).unwrap_or(Value::Null))
                    .collect(),
            )),
            Value::Object(fields) => {
                let kept: serde_json::Map<String, Value> = fields
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), without_empty(v)?)))
                    .collect();
                (!kept.is_empty()).then_some(Value::Object(kept))
            }
            other => Some(other.clone()),
        }
    }
    without_empty(a) == without_empty(b)
}

/// `apiVersion` and `kind` of Argo CD kind `K`, for the `other` map of an object built here.
pub fn type_meta<K: kube::Resource<DynamicType = ()>>() -> Other {
    Other::from([
        ("apiVersion".to_string(), Value::from(K::api_version(&()))),
        ("kind".to_string(), Value::from(K::kind(&()))),
    ])
}

/// Borrowing reads of the metadata every object kind has (`kube::ResourceExt` clones).
pub trait ObjectMetaExt: kube::Resource {
    /// `metadata.name`, `""` when unset.
    fn name_str(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }

    /// `metadata.namespace`, `""` when unset.
    fn namespace_str(&self) -> &str {
        self.meta().namespace.as_deref().unwrap_or_default()
    }

    /// `metadata.uid`, `""` when unset.
    fn uid_str(&self) -> &str {
        self.meta().uid.as_deref().unwrap_or_default()
    }

    /// The annotation `key`, if set.
    fn annotation(&self, key: &str) -> Option<&str> {
        self.meta()
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }

    /// Whether the object is being deleted.
    fn is_terminating(&self) -> bool {
        self.meta().deletion_timestamp.is_some()
    }
}

impl<K: kube::Resource> ObjectMetaExt for K {}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn objects_round_trip_without_losing_unmodelled_fields() {
        let project = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": {"name": "p", "namespace": "argocd", "labels": {"a": "b"}},
            "spec": {"sourceRepos": ["*"], "destinations": [{"name": "team-*", "namespace": "*", "futureField": 1}],
                     "sourceNamespaces": ["team-a"], "roles": [{"name": "r"}]},
            "status": {"jwtTokensByRole": {}}
        });
        let typed: AppProject = serde_json::from_value(project.clone()).unwrap();
        assert_eq!(typed.spec.destinations[0].name.as_deref(), Some("team-*"));
        assert_eq!(typed.spec.source_namespaces, vec!["team-a"]);
        assert_eq!(serde_json::to_value(&typed).unwrap(), project);

        let app = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "guestbook", "namespace": "team-a"},
            "spec": {"project": "default", "source": {"repoURL": "https://git", "path": "guestbook"},
                     "destination": {"server": "https://kubernetes.default.svc", "namespace": "guestbook"},
                     "syncPolicy": {"automated": {}}},
            "operation": {"sync": {"revision": "HEAD"}},
            "status": {"sync": {"status": "Synced", "revision": "abc"}, "health": {"status": "Healthy"},
                       "conditions": [{"type": "SyncError", "message": "m", "lastTransitionTime": "t", "x": 1}],
                       "operationState": {"phase": "Running", "startedAt": "2026-11-24T00:00:00Z",
                                          "message": "syncing", "operation": {"sync": {}}}}
        });
        let typed: Application = serde_json::from_value(app.clone()).unwrap();
        assert_eq!(typed.operation_phase(), Some("Running"));
        let status = typed.status.as_ref().unwrap();
        assert_eq!(
            status.conditions.as_ref().unwrap()[0].type_.as_deref(),
            Some("SyncError")
        );
        let state = status.operation_state.as_ref().unwrap();
        assert_eq!(state.started_at.as_deref(), Some("2026-11-24T00:00:00Z"));
        assert_eq!(state.message.as_deref(), Some("syncing"));
        assert_eq!(typed.spec.project.as_deref(), Some("default"));
        assert_eq!(serde_json::to_value(&typed).unwrap(), app);
    }

    #[test]
    fn applications_keep_empty_and_unknown_fields_as_read() {
        // What a Go peer writes: empty strings it does not omit, fields newer than this code,
        // and the parts of status this project types.
        let app = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "a", "namespace": "n", "uid": "u", "resourceVersion": "7",
                         "labels": {}, "annotations": {"x": "y"}, "finalizers": [],
                         "deletionTimestamp": "2026-01-01T00:00:00Z",
                         "managedFields": [{"manager": "m", "operation": "Update",
                                            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"project": "", "destination": {"server": "", "namespace": "n", "new": true},
                     "sources": [{"repoURL": "r"}]},
            "status": {"sync": {"status": "Synced", "revision": "abc"},
                       "health": {"status": "Healthy"},
                       "conditions": [{"type": "AgentError", "message": "m",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z", "extra": 1}],
                       "resources": [{"kind": "Deployment", "group": "", "syncWave": -1,
                                      "health": {"status": "Healthy"}}],
                       "reconciledAt": "2026-01-01T00:00:00Z",
                       "summary": {}, "operationState": {"phase": "Succeeded",
                                                         "operation": {"sync": {"revision": "r"}}}},
            "future": {"field": [1, 2.5, null]}
        });
        let typed: Application = serde_json::from_value(app.clone()).unwrap();
        assert_eq!(typed.spec.project.as_deref(), Some(""));
        let status = typed.status.as_ref().unwrap();
        assert_eq!(
            status.sync.as_ref().unwrap().status.as_deref(),
            Some("Synced")
        );
        assert_eq!(
            status.conditions.as_ref().unwrap()[0].type_.as_deref(),
            Some("AgentError")
        );
        let resource = &status.resources.as_ref().unwrap()[0];
        assert_eq!(resource.kind.as_deref(), Some("Deployment"));
        assert_eq!(resource.api_version(), "", "no version, empty group");
        assert_eq!(resource.other["syncWave"], json!(-1));
        assert_eq!(
            typed.started_operation(),
            Some(&json!({"sync": {"revision": "r"}}))
        );
        assert!(typed.is_terminating());
        assert_eq!(
            (typed.name_str(), typed.namespace_str(), typed.uid_str()),
            ("a", "n", "u")
        );
        assert_eq!(typed.annotation("x"), Some("y"));
        assert_eq!(serde_json::to_value(&typed).unwrap(), app);
    }

    #[test]
    fn an_operation_is_the_same_as_the_controllers_copy_with_go_defaults() {
        let requested = json!({"sync": {"revision": "r", "prune": false}, "initiatedBy": {"username": "admin"}});
        let started =
            json!({"sync": {"revision": "r"}, "initiatedBy": {"username": "admin"}, "retry": {}});
        assert!(same_operation(&requested, &started));
        let other =
            json!({"sync": {"revision": "r2"}, "initiatedBy": {"username": "admin"}, "retry": {}});
        assert!(!same_operation(&requested, &other));
        let pruning = json!({"sync": {"revision": "r", "prune": true}, "retry": {}});
        assert!(!same_operation(&requested, &pruning));

        let mut app: Application = serde_json::from_value(json!({
            "metadata": {"name": "a"},
            "operation": requested,
            "status": {"operationState": {"operation": started, "phase": "Running"}},
        }))
        .unwrap();
        assert!(app.operation_started());
        app.operation = Some(json!({"sync": {"revision": "r3"}}));
        assert!(!app.operation_started());
    }

    #[test]
    fn the_kinds_are_argo_cds() {
        use kube::Resource;
        assert_eq!(
            serde_json::to_value(type_meta::<Application>()).unwrap(),
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application"})
        );
        assert_eq!(AppProject::api_version(&()), "argoproj.io/v1alpha1");
        assert_eq!(AppProject::plural(&()), "appprojects");
        assert_eq!(Application::kind(&()), "Application");
        assert_eq!(Application::plural(&()), "applications");
        assert_eq!(ApplicationSet::kind(&()), "ApplicationSet");
        assert_eq!(ApplicationSet::plural(&()), "applicationsets");
    }

    #[test]
    fn application_sets_keep_what_is_not_modelled() {
        let appset = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
            "metadata": {"name": "fleet", "namespace": "apps", "uid": "u"},
            "spec": {"generators": [{"clusterDecisionResource": {"configMapRef": "ocm"}}],
                     "template": {"metadata": {"name": "{{name}}"}, "spec": {"project": "default"}}},
            "status": {"conditions": []}
        });
        let typed: ApplicationSet = serde_json::from_value(appset.clone()).unwrap();
        assert_eq!((typed.name_str(), typed.uid_str()), ("fleet", "u"));
        assert_eq!(serde_json::to_value(&typed).unwrap(), appset);
    }
}
