//! The hub Application as the pull model sees it: the label and annotations that opt it in,
//! the cluster and spoke namespace it targets, the ApplicationSet that generated it, and the
//! conditions the pull model owns in its status.
//!
//! Owns the read-modify-write of those conditions. Argo CD's Application CRD has no status
//! subresource, so status is merge-patched on the object itself, guarded by `resourceVersion`
//! (a concurrent writer makes the patch fail with 409 and the caller retries).

use std::fmt;

pub use argocd_agent_kube::argocd::{Application, ApplicationCondition, ApplicationSet};
pub use argocd_agent_kube::resources::application as application_resource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use argocd_agent_proto::event::names::is_dns1123_label;

/// Label that opts an Application into the pull model (value parsed like Go's `ParseBool`).
pub const PULL_LABEL: &str = "apps.open-cluster-management.io/pull-to-ocm-managed-cluster";
/// Annotation naming the ManagedCluster an Application is pulled to.
pub const CLUSTER_ANNOTATION: &str = "apps.open-cluster-management.io/ocm-managed-cluster";
/// Annotation naming the namespace of the Application on the spoke.
pub const APP_NAMESPACE_ANNOTATION: &str =
    "apps.open-cluster-management.io/ocm-managed-cluster-app-namespace";
/// Annotation overriding the payload's `spec.destination.name` (e.g. `in-cluster`); with either
/// destination annotation set, the destination is exactly what the annotations say.
pub const DESTINATION_NAME_ANNOTATION: &str = "apps.open-cluster-management.io/destination-name";
/// Annotation overriding the payload's `spec.destination.server` (default
/// `https://kubernetes.default.svc`).
pub const DESTINATION_SERVER_ANNOTATION: &str =
    "apps.open-cluster-management.io/destination-server";
/// Argo CD annotation that keeps the hub's application controller away from a pulled Application.
pub const SKIP_RECONCILE_ANNOTATION: &str = "argocd.argoproj.io/skip-reconcile";
/// Annotation (`<namespace>/<name>`) naming the ApplicationSet behind an Application or ManifestWork.
pub const HOSTING_APPSET_ANNOTATION: &str =
    "apps.open-cluster-management.io/hosting-applicationset";
/// Label marking Applications and ManifestWorks generated from an ApplicationSet.
pub const APPSET_LABEL: &str = "apps.open-cluster-management.io/application-set";
/// Spoke namespace used when neither the annotation nor the hub namespace gives one.
pub const DEFAULT_SPOKE_NAMESPACE: &str = "argocd";
/// Argo CD's finalizers that cascade resource deletion; on a pulled hub Application they are
/// honoured by deleting the ManifestWork (the spoke's Argo CD then deletes the resources).
pub const RESOURCES_FINALIZERS: [&str; 3] = [
    "resources-finalizer.argocd.argoproj.io",
    "resources-finalizer.argocd.argoproj.io/foreground",
    "resources-finalizer.argocd.argoproj.io/background",
];
/// Condition type for an Application whose pull request cannot be honoured (bad annotations,
/// unknown cluster). Owned by the propagation controller.
pub const SPEC_ERROR_CONDITION: &str = "PullModelSpecError";
/// Condition type for a ManifestWork that the spoke did not apply or whose feedback is malformed.
/// Owned by the status controller.
pub const WORK_ERROR_CONDITION: &str = "ManifestWorkError";

/// OCM's cluster-scoped ManagedCluster.
pub fn managed_cluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1", "ManagedCluster"),
        "managedclusters",
    )
}

/// Where a pulled Application goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullTarget {
    /// The ManagedCluster (and the hub namespace that holds its ManifestWorks).
    pub cluster: String,
    /// Namespace of the Application on the spoke.
    pub spoke_namespace: String,
}

/// Why an Application that asks to be pulled cannot be.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPull {
    /// Labelled for the pull model but no cluster named.
    #[error("label {PULL_LABEL} is set but annotation {CLUSTER_ANNOTATION} is missing or empty; nothing is propagated")]
    MissingCluster,
    /// The cluster annotation cannot name a cluster (or its namespace).
    #[error("annotation {CLUSTER_ANNOTATION}={0:?} is not a valid ManagedCluster name (DNS-1123 label); nothing is propagated")]
    InvalidCluster(String),
    /// The spoke namespace annotation cannot name a namespace.
    #[error("annotation {APP_NAMESPACE_ANNOTATION}={0:?} is not a valid namespace name (DNS-1123 label); nothing is propagated")]
    InvalidSpokeNamespace(String),
}

/// What an Application asks of the pull model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullIntent {
    /// Not a pull-model Application.
    NotPulled,
    /// Labelled for the pull model, but unusable.
    Invalid(InvalidPull),
    /// Pull it to this target.
    Pulled(PullTarget),
}

impl PullIntent {
    /// The target, if the Application is validly pulled.
    pub fn target(&self) -> Option<&PullTarget> {
        match self {
            PullIntent::Pulled(t) => Some(t),
            _ => None,
        }
    }
}

/// Go's `strconv.ParseBool` truth values, which upstream uses for the pull label.
fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// True for a label map that carries the pull label with a true value.
pub fn has_pull_label(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(PULL_LABEL))
        .and_then(|v| parse_go_bool(v))
        .unwrap_or(false)
}

/// Reads what the Application's label and annotations ask for.
pub fn pull_intent(meta: &ObjectMeta) -> PullIntent {
    if !has_pull_label(meta) {
        return PullIntent::NotPulled;
    }
    let annotation = |key: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(|v| v.trim().to_string())
    };
    let cluster = match annotation(CLUSTER_ANNOTATION) {
        Some(c) if !c.is_empty() => c,
        _ => return PullIntent::Invalid(InvalidPull::MissingCluster),
    };
    if !is_dns1123_label(&cluster) {
        return PullIntent::Invalid(InvalidPull::InvalidCluster(cluster));
    }
    let spoke_namespace = match annotation(APP_NAMESPACE_ANNOTATION) {
        Some(ns) if !ns.is_empty() => ns,
        _ => meta
            .namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| DEFAULT_SPOKE_NAMESPACE.to_string()),
    };
    if !is_dns1123_label(&spoke_namespace) {
        return PullIntent::Invalid(InvalidPull::InvalidSpokeNamespace(spoke_namespace));
    }
    PullIntent::Pulled(PullTarget {
        cluster,
        spoke_namespace,
    })
}

/// An ApplicationSet by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AppSetKey {
    /// Namespace of the ApplicationSet.
    pub namespace: String,
    /// Name of the ApplicationSet.
    pub name: String,
}

impl fmt::Display for AppSetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl AppSetKey {
    /// Parses `<namespace>/<name>`.
    pub fn parse(value: &str) -> Option<AppSetKey> {
        let (namespace, name) = value.trim().split_once('/')?;
        (!namespace.is_empty() && !name.is_empty() && !name.contains('/')).then(|| AppSetKey {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

/// The ApplicationSet that generated this Application: its `ApplicationSet` ownerReference (same
/// namespace), else the hosting-applicationset annotation (which can cross namespaces).
pub fn hosting_appset(meta: &ObjectMeta) -> Option<AppSetKey> {
    let owner = meta.owner_references.iter().flatten().find(|o| {
        o.api_version.eq_ignore_ascii_case("argoproj.io/v1alpha1")
            && o.kind.eq_ignore_ascii_case("ApplicationSet")
    });
    if let (Some(owner), Some(ns)) = (owner, meta.namespace.as_ref()) {
        return Some(AppSetKey {
            namespace: ns.clone(),
            name: owner.name.clone(),
        });
    }
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(HOSTING_APPSET_ANNOTATION))
        .and_then(|v| AppSetKey::parse(v))
}

/// The Application's `status.conditions` (empty when absent).
pub fn conditions(app: &Application) -> &[ApplicationCondition] {
    app.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

/// The conditions list after setting (`Some(message)`) or clearing (`None`) the condition of
/// `type_`; `None` when nothing changes (same message already there, or nothing to clear).
/// Conditions of other types are kept as they are.
pub fn with_condition(
    current: &[ApplicationCondition],
    type_: &str,
    message: Option<&str>,
    now: &str,
) -> Option<Vec<ApplicationCondition>> {
    let is_ours = |c: &ApplicationCondition| c.type_.as_deref() == Some(type_);
    let existing = current.iter().find(|c| is_ours(c));
    match (existing, message) {
        (None, None) => None,
        (Some(c), Some(m)) if c.message.as_deref() == Some(m) => None,
        (_, message) => {
            let mut next: Vec<_> = current.iter().filter(|c| !is_ours(c)).cloned().collect();
            next.extend(message.map(|m| ApplicationCondition {
                type_: Some(type_.to_string()),
                message: Some(m.to_string()),
                last_transition_time: Some(now.to_string()),
                ..Default::default()
            }));
            Some(next)
        }
    }
}

/// Current time as Kubernetes writes it (RFC 3339, seconds).
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Sets or clears the pull model's condition of `type_` on the hub Application. Returns whether
/// a write happened. Fails with 409 if the Application changed since `app` was read.
pub async fn set_condition(
    api: &Api<Application>,
    app: &Application,
    type_: &str,
    message: Option<&str>,
    manager: &str,
) -> Result<bool, kube::Error> {
    let Some(next) = with_condition(conditions(app), type_, message, &now_rfc3339()) else {
        return Ok(false);
    };
    let patch = json!({
        "metadata": {"resourceVersion": app.metadata.resource_version},
        "status": {"conditions": next},
    });
    let name = app.metadata.name.as_deref().unwrap_or_default();
    api.patch(
        name,
        &PatchParams {
            field_manager: Some(manager.to_string()),
            ..Default::default()
        },
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        ObjectMeta {
            name: Some("guestbook".into()),
            namespace: Some("apps".into()),
            labels: map(labels),
            annotations: map(annotations),
            ..Default::default()
        }
    }

    #[test]
    fn unlabelled_or_false_label_is_not_pulled() {
        assert_eq!(
            pull_intent(&meta(&[], &[(CLUSTER_ANNOTATION, "c1")])),
            PullIntent::NotPulled
        );
        assert_eq!(
            pull_intent(&meta(
                &[(PULL_LABEL, "false")],
                &[(CLUSTER_ANNOTATION, "c1")]
            )),
            PullIntent::NotPulled
        );
        assert_eq!(
            pull_intent(&meta(&[(PULL_LABEL, "yes")], &[(CLUSTER_ANNOTATION, "c1")])),
            PullIntent::NotPulled
        );
    }

    #[test]
    fn labelled_app_targets_the_annotated_cluster_and_namespace() {
        let m = meta(
            &[(PULL_LABEL, "True")],
            &[
                (CLUSTER_ANNOTATION, "cluster1"),
                (APP_NAMESPACE_ANNOTATION, "argocd"),
            ],
        );
        assert_eq!(
            pull_intent(&m),
            PullIntent::Pulled(PullTarget {
                cluster: "cluster1".into(),
                spoke_namespace: "argocd".into()
            })
        );
        // Without the namespace annotation the hub namespace is kept.
        let m = meta(&[(PULL_LABEL, "true")], &[(CLUSTER_ANNOTATION, "cluster1")]);
        assert_eq!(
            pull_intent(&m).target().map(|t| t.spoke_namespace.as_str()),
            Some("apps")
        );
    }

    #[test]
    fn labelled_app_without_cluster_annotation_is_invalid() {
        assert_eq!(
            pull_intent(&meta(&[(PULL_LABEL, "true")], &[])),
            PullIntent::Invalid(InvalidPull::MissingCluster)
        );
        assert_eq!(
            pull_intent(&meta(
                &[(PULL_LABEL, "true")],
                &[(CLUSTER_ANNOTATION, "  ")]
            )),
            PullIntent::Invalid(InvalidPull::MissingCluster)
        );
        let bad = pull_intent(&meta(
            &[(PULL_LABEL, "true")],
            &[(CLUSTER_ANNOTATION, "Cluster_1")],
        ));
        assert_eq!(
            bad,
            PullIntent::Invalid(InvalidPull::InvalidCluster("Cluster_1".into()))
        );
        let msg = InvalidPull::MissingCluster.to_string();
        assert!(
            msg.contains(CLUSTER_ANNOTATION) && msg.contains("nothing is propagated"),
            "{msg}"
        );
    }

    #[test]
    fn hosting_appset_comes_from_owner_reference_or_annotation() {
        let mut m = meta(&[], &[]);
        m.owner_references = Some(vec![OwnerReference {
            api_version: "argoproj.io/v1alpha1".into(),
            kind: "ApplicationSet".into(),
            name: "guestbook-set".into(),
            uid: "u".into(),
            ..Default::default()
        }]);
        assert_eq!(
            hosting_appset(&m),
            Some(AppSetKey {
                namespace: "apps".into(),
                name: "guestbook-set".into()
            })
        );
        let m = meta(&[], &[(HOSTING_APPSET_ANNOTATION, "argocd/fleet")]);
        assert_eq!(
            hosting_appset(&m).map(|k| k.to_string()).as_deref(),
            Some("argocd/fleet")
        );
        assert_eq!(
            hosting_appset(&meta(&[], &[(HOSTING_APPSET_ANNOTATION, "nonsense")])),
            None
        );
    }

    #[test]
    fn conditions_are_set_replaced_and_cleared_by_type_only() {
        let other: ApplicationCondition =
            serde_json::from_value(json!({"type": "SyncError", "message": "argo's own"})).unwrap();
        let current = vec![other.clone()];
        let set = with_condition(&current, SPEC_ERROR_CONDITION, Some("bad"), "t1").expect("added");
        assert_eq!(set.len(), 2);
        assert_eq!(
            with_condition(&set, SPEC_ERROR_CONDITION, Some("bad"), "t2"),
            None,
            "same message is no change"
        );
        let replaced =
            with_condition(&set, SPEC_ERROR_CONDITION, Some("worse"), "t3").expect("replaced");
        assert_eq!(replaced[1].message.as_deref(), Some("worse"));
        assert_eq!(replaced[1].last_transition_time.as_deref(), Some("t3"));
        let cleared = with_condition(&replaced, SPEC_ERROR_CONDITION, None, "t4").expect("cleared");
        assert_eq!(cleared, vec![other]);
        assert_eq!(
            with_condition(&cleared, SPEC_ERROR_CONDITION, None, "t5"),
            None
        );
    }
}
