//! Placement resolution: a GitOpsCluster's `placementRef` → the Placement's PlacementDecisions
//! (label `cluster.open-cluster-management.io/placement`) → the set of selected clusters, and the
//! deterministic assignment of each cluster to exactly one GitOpsCluster when several select it
//! (the oldest wins; the others report the conflict).
//!
//! Also keeps sites that go briefly offline selected: OCM taints an unreachable cluster and the
//! placement controller then drops it from the decisions, which would offboard it (agent
//! ManifestWork and cluster secret deleted). Like upstream argocd-pull-integration, the referenced
//! Placement is given tolerations for the `unreachable` and `unavailable` taints
//! ([`ensure_tolerations`]); a cluster removed from the placement on purpose is still offboarded.
//!
//! Owns the OCM resource descriptions it reads (Placement, PlacementDecision) and the functions
//! over them; the objects come from the operator's stores of both kinds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::reflector::{ObjectRef, Store};

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

/// Taints OCM sets on a cluster that stopped reporting (`unreachable`) or reports unavailable.
pub const OFFLINE_TAINTS: [&str; 2] = [
    "cluster.open-cluster-management.io/unreachable",
    "cluster.open-cluster-management.io/unavailable",
];

/// The Placement's `spec.tolerations` with an `Exists` toleration (no `tolerationSeconds`) added
/// for each of [`OFFLINE_TAINTS`] it lacks, or `None` when it has them all (same key and
/// operator, as upstream compares).
pub fn tolerations_with_offline(placement: &DynamicObject) -> Option<Vec<serde_json::Value>> {
    let mut tolerations = placement
        .data
        .pointer("/spec/tolerations")
        .and_then(|v| v.as_array())
        .cloned()
        .unwrap_or_default();
    let mut changed = false;
    for key in OFFLINE_TAINTS {
        let present = tolerations.iter().any(|t| {
            t.get("key").and_then(|k| k.as_str()) == Some(key)
                && t.get("operator").and_then(|o| o.as_str()) == Some("Exists")
        });
        if !present {
            tolerations.push(serde_json::json!({"key": key, "operator": "Exists"}));
            changed = true;
        }
    }
    changed.then_some(tolerations)
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

/// The clusters `goc`'s Placement selects, read from the operator's stores of Placements and
/// PlacementDecisions (a change of either triggers the GitOpsClusters naming the Placement, so a
/// store that lags is read again at once). With `add_tolerations`, the Placement is given the
/// offline tolerations it lacks (a write to the hub; another principal's Placement is read only).
pub async fn resolve(
    client: &kube::Client,
    placements: &Store<DynamicObject>,
    decisions: &Store<DynamicObject>,
    goc: &GitOpsCluster,
    add_tolerations: bool,
) -> Result<BTreeSet<String>, PlacementError> {
    let (placement, selected) = selected_in(placements, decisions, goc)?;
    if add_tolerations {
        let (namespace, name) = placement_key(goc)?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &namespace, &placement_resource());
        ensure_tolerations(&api, &placement)
            .await
            .map_err(|e| PlacementError::Api {
                namespace,
                name,
                message: e.to_string(),
            })?;
    }
    Ok(selected)
}

/// `goc`'s Placement in `placements` and the clusters its decisions in `decisions` select.
pub fn selected_in(
    placements: &Store<DynamicObject>,
    decisions: &Store<DynamicObject>,
    goc: &GitOpsCluster,
) -> Result<(Arc<DynamicObject>, BTreeSet<String>), PlacementError> {
    let (namespace, name) = placement_key(goc)?;
    let key = ObjectRef::new_with(&name, placement_resource()).within(&namespace);
    let Some(placement) = placements.get(&key) else {
        return Err(PlacementError::NotFound { namespace, name });
    };
    let decided = decisions.state();
    let selected = decided_clusters(
        decided
            .iter()
            .filter(|d| {
                d.metadata.namespace.as_deref() == Some(namespace.as_str())
                    && d.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(PLACEMENT_LABEL))
                        == Some(&name)
            })
            .map(|d| d.as_ref()),
    );
    Ok((placement, selected))
}

/// Adds the [`OFFLINE_TAINTS`] tolerations to `placement` when it lacks them (a merge patch of
/// `spec.tolerations` guarded by the resourceVersion read, so a concurrent edit is not lost).
pub async fn ensure_tolerations(
    placements: &Api<DynamicObject>,
    placement: &DynamicObject,
) -> Result<(), kube::Error> {
    let Some(tolerations) = tolerations_with_offline(placement) else {
        return Ok(());
    };
    let name = placement.metadata.name.as_deref().unwrap_or_default();
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": placement.metadata.resource_version},
        "spec": {"tolerations": tolerations},
    });
    match placements
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {}
        // Read from a store that lags behind: the Placement's change triggers another pass,
        // which reads it anew.
        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
        Err(e) => return Err(e),
    }
    tracing::info!(
        placement = name,
        "added tolerations for the unreachable/unavailable taints, so offline sites stay onboarded"
    );
    Ok(())
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

    fn placement(tolerations: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"tolerations": tolerations}
        }))
        .unwrap()
    }

    #[test]
    fn offline_taints_are_tolerated_once_and_other_tolerations_kept() {
        let own = json!({"key": "gpu", "operator": "Equal", "value": "no"});
        let added = tolerations_with_offline(&placement(json!([own]))).expect("tolerations added");
        assert_eq!(added.len(), 3);
        assert_eq!(added[0], own);
        for key in OFFLINE_TAINTS {
            assert!(
                added.contains(&json!({"key": key, "operator": "Exists"})),
                "{key} not tolerated: {added:?}"
            );
        }
        // Already tolerated (with or without tolerationSeconds): nothing to change.
        let tolerated = json!([
            {"key": OFFLINE_TAINTS[0], "operator": "Exists", "tolerationSeconds": 600},
            {"key": OFFLINE_TAINTS[1], "operator": "Exists"},
        ]);
        assert_eq!(tolerations_with_offline(&placement(tolerated)), None);
        // An Equal toleration of the same key is not the same toleration: upstream adds Exists.
        let equal = json!([{"key": OFFLINE_TAINTS[0], "operator": "Equal", "value": ""}]);
        assert_eq!(
            tolerations_with_offline(&placement(equal)).unwrap().len(),
            3
        );
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

    fn store(objects: Vec<serde_json::Value>, ar: ApiResource) -> Store<DynamicObject> {
        let mut writer = kube::runtime::reflector::store::Writer::new(ar);
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
        for o in objects {
            let o: DynamicObject = serde_json::from_value(o).unwrap();
            writer.apply_watcher_event(&kube::runtime::watcher::Event::InitApply(o));
        }
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        writer.as_reader()
    }

    #[test]
    fn the_selection_is_read_from_the_stores_decisions_of_that_placement_only() {
        let placements = store(
            vec![
                json!({"apiVersion": "cluster.open-cluster-management.io/v1beta1",
                        "kind": "Placement", "metadata": {"name": "p", "namespace": "ns"}}),
            ],
            placement_resource(),
        );
        let decision = |ns: &str, placement: &str, clusters: &[&str]| {
            json!({"apiVersion": "cluster.open-cluster-management.io/v1beta1",
                   "kind": "PlacementDecision",
                   "metadata": {"name": format!("{placement}-{}", clusters.join("-")),
                                "namespace": ns, "labels": {PLACEMENT_LABEL: placement}},
                   "status": {"decisions": clusters.iter()
                       .map(|c| json!({"clusterName": c, "reason": ""})).collect::<Vec<_>>()}})
        };
        let decisions = store(
            vec![
                decision("ns", "p", &["a", "b"]),
                decision("ns", "p", &["c"]),
                decision("ns", "q", &["other"]),
                decision("elsewhere", "p", &["stranger"]),
            ],
            placement_decision_resource(),
        );
        let (_, selected) =
            selected_in(&placements, &decisions, &goc(json!({"name": "p"}))).unwrap();
        assert_eq!(selected.into_iter().collect::<Vec<_>>(), ["a", "b", "c"]);
        let missing = selected_in(&placements, &decisions, &goc(json!({"name": "q"})));
        assert_eq!(missing.unwrap_err().reason(), "PlacementNotFound");
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
