//! Placement resolution: a GitOpsCluster's `placementRef` → the Placement's PlacementDecisions
//! (label `cluster.open-cluster-management.io/placement`) → the set of selected clusters, and the
//! deterministic assignment of each cluster to exactly one GitOpsCluster when several select it
//! (the oldest wins; the others report the conflict).
//!
//! Owns the OCM resource descriptions it reads (Placement, PlacementDecision) and the pure
//! functions over them; the controller does the listing.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};

use super::crd::GitOpsCluster;

/// Label on a PlacementDecision naming its Placement.
pub const PLACEMENT_LABEL: &str = "cluster.open-cluster-management.io/placement";

/// `cluster.open-cluster-management.io/v1beta1` Placement.
pub fn placement_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1beta1", "Placement"),
        "placements",
    )
}

/// `cluster.open-cluster-management.io/v1beta1` PlacementDecision.
pub fn placement_decision_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "cluster.open-cluster-management.io",
            "v1beta1",
            "PlacementDecision",
        ),
        "placementdecisions",
    )
}

/// Why a placement could not be resolved; the message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// `spec.placementRef` lacks a name or names another kind.
    #[error("spec.placementRef is invalid: {0}")]
    InvalidRef(String),
    /// The Placement does not exist.
    #[error("Placement {namespace}/{name} not found: create it or fix spec.placementRef")]
    NotFound {
        /// Namespace looked in.
        namespace: String,
        /// Placement name.
        name: String,
    },
    /// The apiserver could not be asked.
    #[error("reading Placement {namespace}/{name}: {message}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Placement name.
        name: String,
        /// Client error text.
        message: String,
    },
}

impl PlacementError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidRef(_) => "InvalidPlacementRef",
            Self::NotFound { .. } => "PlacementNotFound",
            Self::Api { .. } => "PlacementUnreadable",
        }
    }
}

/// `(namespace, name)` of the Placement a GitOpsCluster refers to, validated.
pub fn placement_key(goc: &GitOpsCluster) -> Result<(String, String), PlacementError> {
    let r = &goc.spec.placement_ref;
    if let Some(kind) = r.kind.as_deref().filter(|k| !k.is_empty()) {
        if kind != "Placement" {
            return Err(PlacementError::InvalidRef(format!(
                "kind is {kind:?}; only Placement is supported"
            )));
        }
    }
    let name = r
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| PlacementError::InvalidRef("name is empty".into()))?;
    let namespace = r
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| goc.metadata.namespace.clone())
        .unwrap_or_default();
    Ok((namespace, name))
}

/// The cluster names in PlacementDecisions' `status.decisions[].clusterName`, sorted, deduplicated.
pub fn decided_clusters<'a>(
    decisions: impl IntoIterator<Item = &'a DynamicObject>,
) -> BTreeSet<String> {
    decisions
        .into_iter()
        .flat_map(|d| {
            d.data
                .pointer("/status/decisions")
                .and_then(|v| v.as_array())
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|d| d.get("clusterName")?.as_str().map(str::to_owned))
        .filter(|c| !c.is_empty())
        .collect()
}

/// Reads the Placement and its decisions from the hub.
pub async fn resolve(
    client: &kube::Client,
    goc: &GitOpsCluster,
) -> Result<BTreeSet<String>, PlacementError> {
    let (namespace, name) = placement_key(goc)?;
    let api_err = |e: kube::Error| PlacementError::Api {
        namespace: namespace.clone(),
        name: name.clone(),
        message: e.to_string(),
    };
    let placements: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &placement_resource());
    if placements.get_opt(&name).await.map_err(api_err)?.is_none() {
        return Err(PlacementError::NotFound { namespace, name });
    }
    let decisions: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &placement_decision_resource());
    let list = decisions
        .list(&ListParams::default().labels(&format!("{PLACEMENT_LABEL}={name}")))
        .await
        .map_err(api_err)?;
    Ok(decided_clusters(&list.items))
}

/// Identity of a GitOpsCluster: `namespace/name`.
pub fn goc_key(goc: &GitOpsCluster) -> String {
    format!(
        "{}/{}",
        goc.metadata.namespace.as_deref().unwrap_or_default(),
        goc.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Assigns every selected cluster to one GitOpsCluster: the oldest (creation time, then
/// `namespace/name`) wins. `selections` is `(goc key, creation time RFC 3339, clusters)`.
/// Returns winner per cluster.
pub fn assign_clusters(
    selections: &[(String, String, BTreeSet<String>)],
) -> BTreeMap<String, String> {
    let mut ordered: Vec<&(String, String, BTreeSet<String>)> = selections.iter().collect();
    ordered.sort_by(|a, b| (&a.1, &a.0).cmp(&(&b.1, &b.0)));
    let mut owner = BTreeMap::new();
    for (key, _, clusters) in ordered {
        for c in clusters {
            owner.entry(c.clone()).or_insert_with(|| key.clone());
        }
    }
    owner
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn goc(value: serde_json::Value) -> GitOpsCluster {
        serde_json::from_value(json!({
            "apiVersion": "apps.open-cluster-management.io/v1alpha1", "kind": "GitOpsCluster",
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"placementRef": value, "argoCDAgentAddon": {}}
        }))
        .unwrap()
    }

    #[test]
    fn placement_ref_defaults_namespace_and_refuses_other_kinds() {
        assert_eq!(
            placement_key(&goc(json!({"kind": "Placement", "name": "p"}))).unwrap(),
            ("ns".to_string(), "p".to_string())
        );
        let err = placement_key(&goc(json!({"kind": "PlacementRule", "name": "p"}))).unwrap_err();
        assert_eq!(err.reason(), "InvalidPlacementRef");
        assert!(err.to_string().contains("PlacementRule"), "{err}");
        assert!(placement_key(&goc(json!({"kind": "Placement"}))).is_err());
    }

    #[test]
    fn decisions_from_several_objects_are_merged() {
        let d = |clusters: &[&str]| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "PlacementDecision",
                "metadata": {"name": "x"},
                "status": {"decisions": clusters.iter().map(|c| json!({"clusterName": c, "reason": ""})).collect::<Vec<_>>()}
            }))
            .unwrap()
        };
        let got = decided_clusters(&[d(&["b", "a"]), d(&["a", "c", ""])]);
        assert_eq!(got.into_iter().collect::<Vec<_>>(), ["a", "b", "c"]);
    }

    #[test]
    fn conflicting_selections_go_to_the_oldest_then_by_name() {
        let set = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let owners = assign_clusters(&[
            (
                "ns/young".into(),
                "2024-02-01T00:00:00Z".into(),
                set(&["a", "b"]),
            ),
            ("ns/old".into(), "2024-01-01T00:00:00Z".into(), set(&["b"])),
            ("ns/aaa".into(), "2024-02-01T00:00:00Z".into(), set(&["a"])),
        ]);
        assert_eq!(owners["b"], "ns/old");
        assert_eq!(owners["a"], "ns/aaa");
    }
}
