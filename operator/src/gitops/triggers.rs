//! Which GitOpsClusters a change of another object concerns: the mappers of the GitOpsCluster
//! controller's triggers.
//!
//! Owns the rules, each over the GitOpsClusters in the controller's store: a Placement or
//! PlacementDecision concerns the GitOpsClusters naming that Placement; one of the operator's
//! ManifestWorks or cluster Secrets concerns the GitOpsCluster that created it (its owner
//! annotation) and those whose status lists its cluster; an add-on CSR concerns those whose
//! status lists its cluster (one naming no cluster, which is denied, concerns all); a
//! GitOpsCluster's change concerns the others whose status lists one of its clusters (the
//! assignment of a cluster selected by two depends on both). The CA Secret concerns all
//! (`reconcile_all_on`, in [`super::run_operator`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::DynamicObject;
use kube::runtime::reflector::ObjectRef;

use super::crd::GitOpsCluster;
use super::csr::{ADDON_SIGNER, CSR_CLUSTER_LABEL};
use super::placement::{goc_key, placement_key, PLACEMENT_LABEL};

type Refs = Vec<ObjectRef<GitOpsCluster>>;

fn refs<'a>(gocs: impl Iterator<Item = &'a Arc<GitOpsCluster>>) -> Refs {
    gocs.map(|g| ObjectRef::from_obj(g.as_ref())).collect()
}

/// The clusters `goc`'s status lists (selected, onboarded or in conflict).
fn listed(goc: &GitOpsCluster) -> impl Iterator<Item = &str> {
    goc.status
        .iter()
        .flat_map(|s| s.clusters.iter().map(|c| c.name.as_str()))
}

/// The GitOpsClusters naming Placement `namespace/name`.
fn naming_placement(gocs: &[Arc<GitOpsCluster>], namespace: &str, name: &str) -> Refs {
    refs(
        gocs.iter()
            .filter(|g| placement_key(g).is_ok_and(|(ns, n)| ns == namespace && n == name)),
    )
}

/// A Placement concerns the GitOpsClusters naming it.
pub fn of_placement(gocs: &[Arc<GitOpsCluster>], placement: &DynamicObject) -> Refs {
    let meta = &placement.metadata;
    naming_placement(
        gocs,
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// A PlacementDecision concerns the GitOpsClusters naming its Placement (its placement label).
pub fn of_placement_decision(gocs: &[Arc<GitOpsCluster>], decision: &DynamicObject) -> Refs {
    let meta = &decision.metadata;
    let Some(placement) = meta.labels.as_ref().and_then(|l| l.get(PLACEMENT_LABEL)) else {
        return Vec::new();
    };
    naming_placement(
        gocs,
        meta.namespace.as_deref().unwrap_or_default(),
        placement,
    )
}

/// An object the operator made for `cluster`, created by the GitOpsCluster `owner`, concerns
/// that one and every one whose status lists `cluster`.
pub fn of_cluster_object(
    gocs: &[Arc<GitOpsCluster>],
    cluster: &str,
    owner: Option<&String>,
) -> Refs {
    refs(
        gocs.iter()
            .filter(|g| owner.is_some_and(|o| *o == goc_key(g)) || listed(g).any(|c| c == cluster)),
    )
}

/// An add-on CSR concerns the GitOpsClusters whose status lists its cluster; one naming no
/// cluster concerns all (it is denied); other signers' concern none.
pub fn of_csr(gocs: &[Arc<GitOpsCluster>], csr: &CertificateSigningRequest) -> Refs {
    if csr.spec.signer_name != ADDON_SIGNER {
        return Vec::new();
    }
    match csr
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(CSR_CLUSTER_LABEL))
        .filter(|c| !c.is_empty())
    {
        Some(cluster) => of_cluster_object(gocs, cluster, None),
        None => refs(gocs.iter()),
    }
}

/// A GitOpsCluster's change concerns the other GitOpsClusters whose status lists one of the
/// clusters its status lists.
pub fn of_gitopscluster(gocs: &[Arc<GitOpsCluster>], changed: &GitOpsCluster) -> Refs {
    let key = goc_key(changed);
    let clusters: BTreeSet<&str> = listed(changed).collect();
    if clusters.is_empty() {
        return Vec::new();
    }
    refs(
        gocs.iter()
            .filter(|g| goc_key(g) != key && listed(g).any(|c| clusters.contains(c))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn goc(name: &str, placement: &str, clusters: &[&str]) -> Arc<GitOpsCluster> {
        let clusters: Vec<_> = clusters
            .iter()
            .map(|c| json!({"name": c, "phase": "Onboarded"}))
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "apps.open-cluster-management.io/v1alpha1",
                "kind": "GitOpsCluster",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"placementRef": {"name": placement}, "argoCDAgentAddon": {}},
                "status": {"clusters": clusters},
            }))
            .expect("a GitOpsCluster"),
        )
    }

    fn names(refs: Refs) -> Vec<String> {
        refs.into_iter().map(|r| r.name).collect()
    }

    fn object(namespace: &str, name: &str, labels: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta1",
            "kind": "PlacementDecision",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
        }))
        .expect("an object")
    }

    fn fleet() -> Vec<Arc<GitOpsCluster>> {
        vec![
            goc("a", "p", &["c1", "c2"]),
            goc("b", "q", &["c2"]),
            goc("c", "p", &[]),
        ]
    }

    #[test]
    fn placements_and_their_decisions_concern_the_gitopsclusters_naming_them() {
        let gocs = fleet();
        assert_eq!(
            names(of_placement(&gocs, &object("ns", "p", json!({})))),
            ["a", "c"]
        );
        assert!(of_placement(&gocs, &object("other", "p", json!({}))).is_empty());
        let decision = object("ns", "p-decision-1", json!({ PLACEMENT_LABEL: "q" }));
        assert_eq!(names(of_placement_decision(&gocs, &decision)), ["b"]);
        let unlabelled = object("ns", "p-decision-1", json!({}));
        assert!(of_placement_decision(&gocs, &unlabelled).is_empty());
    }

    #[test]
    fn the_operators_objects_concern_their_owner_and_whoever_lists_their_cluster() {
        let gocs = fleet();
        assert_eq!(names(of_cluster_object(&gocs, "c2", None)), ["a", "b"]);
        let owner = "ns/c".to_string();
        assert_eq!(
            names(of_cluster_object(&gocs, "c1", Some(&owner))),
            ["a", "c"]
        );
        assert!(of_cluster_object(&gocs, "c9", None).is_empty());
    }

    #[test]
    fn a_csr_concerns_the_gitopsclusters_of_its_cluster_and_an_unnamed_one_all() {
        let gocs = fleet();
        let csr = |signer: &str, cluster: Option<&str>| -> CertificateSigningRequest {
            let labels = cluster.map_or(json!({}), |c| json!({ CSR_CLUSTER_LABEL: c }));
            serde_json::from_value(json!({
                "metadata": {"name": "x", "labels": labels},
                "spec": {"signerName": signer, "request": ""},
            }))
            .expect("a CSR")
        };
        assert_eq!(names(of_csr(&gocs, &csr(ADDON_SIGNER, Some("c1")))), ["a"]);
        assert_eq!(
            names(of_csr(&gocs, &csr(ADDON_SIGNER, None))),
            ["a", "b", "c"]
        );
        assert!(of_csr(
            &gocs,
            &csr("kubernetes.io/kube-apiserver-client", Some("c1"))
        )
        .is_empty());
    }

    #[test]
    fn a_gitopscluster_concerns_the_others_sharing_a_cluster() {
        let gocs = fleet();
        assert_eq!(names(of_gitopscluster(&gocs, &gocs[0])), ["b"]);
        assert_eq!(names(of_gitopscluster(&gocs, &gocs[1])), ["a"]);
        assert!(of_gitopscluster(&gocs, &gocs[2]).is_empty());
    }
}
