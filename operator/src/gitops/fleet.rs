//! The fleet as one GitOpsCluster's reconciliation sees it: the decisions that are global
//! although each GitOpsCluster is reconciled on its own.
//!
//! Owns which GitOpsClusters this principal serves ([`argocd_namespace_of`]), every served
//! GitOpsCluster's selection and the assignment of each cluster to one of them (a cluster
//! selected by two goes to the oldest), which GitOpsClusters are frozen (placement unresolvable
//! or spec invalid: their objects are left alone), the operator's existing objects of this
//! principal, and who is responsible for each of those objects ([`Fleet::responsible`]): the
//! GitOpsCluster its cluster is assigned to, else its owner, else, for objects whose
//! GitOpsCluster is gone, the orphan sweep ([`Responsible::Sweep`]). So each object has exactly
//! one reconciler that may write or delete it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};

use super::agent_work::{MANAGED_BY_LABEL, MANAGED_BY_OPERATOR, OWNER_ANNOTATION};
use super::crd::GitOpsCluster;
use super::placement::{assign_clusters, goc_key, resolve, PlacementError};
use super::{OperatorError, OperatorOptions};
use crate::pull::manifestwork::ManifestWork;

/// Reason of a GitOpsCluster whose spec is refused before its Placement is evaluated: an
/// unknown mode.
pub(crate) const INVALID_MODE: &str = "InvalidMode";

/// A GitOpsCluster's selection, or why it has none (reason, message).
pub(crate) type Selection = Result<BTreeSet<String>, (String, String)>;

/// The hub namespace `goc`'s cluster Secrets go to when this operator owns `goc`; `None` when
/// another principal's does.
///
/// Ownership, with several principals (each with its embedded operator) on one hub: a
/// GitOpsCluster belongs to the principal serving the Argo CD it names in
/// `spec.argoServer.argoNamespace` (upstream's field: where the Argo CD it feeds runs), that is
/// the principal whose Argo CD namespaces ([`OperatorOptions::argocd_namespaces`]: its own,
/// `--operator-argocd-namespace`, `--operator-extra-argocd-namespaces`) include it. Every other
/// principal leaves it alone: no finalizer, no status, its objects neither created nor
/// offboarded. A GitOpsCluster naming no namespace (our extension) goes to the operator's default
/// Argo CD namespace, so with several principals on one hub each GitOpsCluster must name one.
pub fn argocd_namespace_of(goc: &GitOpsCluster, opts: &OperatorOptions) -> Option<String> {
    let ns = goc
        .spec
        .argo_server
        .as_ref()
        .and_then(|a| a.argo_namespace.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| opts.argocd_namespace().to_owned());
    opts.argocd_namespaces().contains(&ns).then_some(ns)
}

/// Who decides about one of the operator's objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Responsible {
    /// The GitOpsCluster with this key.
    GitOpsCluster(String),
    /// Nobody: the object belongs to a frozen GitOpsCluster and stays as it is.
    Nobody,
    /// The orphan sweep: no GitOpsCluster wants the cluster and the object's owner is gone.
    Sweep,
}

/// The fleet at one moment.
pub struct Fleet {
    /// Every GitOpsCluster on the hub (any principal's), by key.
    every_goc: BTreeSet<String>,
    /// The GitOpsClusters this principal serves, sorted by key.
    pub served: Vec<GitOpsCluster>,
    /// The selection of every served, live GitOpsCluster.
    pub selections: BTreeMap<String, Selection>,
    /// Each selected cluster's GitOpsCluster (by key).
    pub assignment: BTreeMap<String, String>,
    /// GitOpsClusters whose objects are left alone (unresolvable or invalid).
    pub frozen: BTreeSet<String>,
    /// The operator's agent and Argo CD CR ManifestWorks of this principal.
    pub works: Vec<ManifestWork>,
    /// The operator's Argo CD cluster Secrets of this principal.
    pub cluster_secrets: Vec<Secret>,
}

impl Fleet {
    /// Reads the fleet, given every GitOpsCluster on the hub: resolves the placements of the
    /// served live ones (adding the offline tolerations they lack) and lists the operator's
    /// objects.
    pub async fn gather(
        client: &kube::Client,
        opts: &OperatorOptions,
        mut gocs: Vec<GitOpsCluster>,
    ) -> Result<Fleet, OperatorError> {
        gocs.sort_by_key(goc_key);
        let every_goc: BTreeSet<String> = gocs.iter().map(goc_key).collect();
        gocs.retain(|g| argocd_namespace_of(g, opts).is_some());
        let mut selections = BTreeMap::new();
        for goc in gocs.iter().filter(|g| is_live(g)) {
            let selected = match goc.mode() {
                "managed" | "autonomous" => resolve(client, goc)
                    .await
                    .map_err(|e: PlacementError| (e.reason().to_owned(), e.to_string())),
                other => Err((
                    INVALID_MODE.to_owned(),
                    format!("spec.argoCDAgentAddon.mode is {other:?}; use managed or autonomous"),
                )),
            };
            selections.insert(goc_key(goc), selected);
        }
        let assignment = assign_clusters(
            &gocs
                .iter()
                .filter(|g| is_live(g))
                .filter_map(|g| {
                    let key = goc_key(g);
                    let clusters = selections.get(&key)?.as_ref().ok()?.clone();
                    let created = g
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| format!("{:020}", t.0.as_second()))
                        .unwrap_or_default();
                    Some((key, created, clusters))
                })
                .collect::<Vec<_>>(),
        );
        let frozen = selections
            .iter()
            .filter(|(_, s)| s.is_err())
            .map(|(k, _)| k.clone())
            .collect();
        let mut fleet = Fleet {
            every_goc,
            served: gocs,
            selections,
            assignment,
            frozen,
            works: Vec::new(),
            cluster_secrets: Vec::new(),
        };
        let managed =
            ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY_OPERATOR}"));
        let works_api: Api<ManifestWork> = Api::all(client.clone());
        let works = works_api
            .list(&managed)
            .await
            .map_err(kube_err("listing agent ManifestWorks"))?
            .items;
        fleet.works = works.into_iter().filter(|w| fleet.ours(w)).collect();
        for ns in opts.argocd_namespaces() {
            let secrets_api: Api<Secret> = Api::namespaced(client.clone(), &ns);
            let secrets = secrets_api
                .list(&managed)
                .await
                .map_err(kube_err(format!("listing cluster secrets in {ns}")))?
                .items;
            let ours: Vec<Secret> = secrets.into_iter().filter(|s| fleet.ours(s)).collect();
            fleet.cluster_secrets.extend(ours);
        }
        Ok(fleet)
    }

    /// The served GitOpsClusters not being deleted.
    pub fn live(&self) -> impl Iterator<Item = &GitOpsCluster> {
        self.served.iter().filter(|g| is_live(g))
    }

    /// Whether an object of the operator is this principal's: owned by a served GitOpsCluster,
    /// by none, or by one that is gone (objects of another principal's are left to it).
    pub fn ours(&self, obj: &impl kube::Resource) -> bool {
        owner(obj).is_none_or(|o| !self.every_goc.contains(o) || self.serves(o))
    }

    fn serves(&self, key: &str) -> bool {
        self.served.iter().any(|g| goc_key(g) == key)
    }

    /// Who decides about `obj`, an object of this principal's for `cluster`.
    pub fn responsible(&self, cluster: &str, obj: &impl kube::Resource) -> Responsible {
        let owner = owner(obj);
        if owner.is_some_and(|o| self.frozen.contains(o)) {
            return Responsible::Nobody;
        }
        if let Some(assigned) = self.assignment.get(cluster) {
            return Responsible::GitOpsCluster(assigned.clone());
        }
        match owner {
            Some(o) if self.serves(o) => Responsible::GitOpsCluster(o.clone()),
            _ => Responsible::Sweep,
        }
    }
}

/// The GitOpsCluster (key) that created an object of the operator.
pub fn owner(obj: &impl kube::Resource) -> Option<&String> {
    obj.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(OWNER_ANNOTATION))
}

/// Not being deleted.
pub fn is_live(goc: &GitOpsCluster) -> bool {
    goc.metadata.deletion_timestamp.is_none()
}

pub(crate) fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> OperatorError {
    let action = action.into();
    move |source| OperatorError::Kube { action, source }
}

/// The name of an object of the operator, for logs.
pub(crate) fn name_in(obj: &impl kube::Resource) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn goc(name: &str, argo_namespace: Option<&str>) -> GitOpsCluster {
        let mut spec = json!({"placementRef": {"name": "p"}, "argoCDAgentAddon": {}});
        if let Some(ns) = argo_namespace {
            spec["argoServer"] = json!({"argoNamespace": ns});
        }
        serde_json::from_value(json!({
            "apiVersion": "apps.open-cluster-management.io/v1alpha1",
            "kind": "GitOpsCluster",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": spec,
        }))
        .expect("a GitOpsCluster")
    }

    #[test]
    fn a_gitopscluster_belongs_to_the_principal_serving_the_argo_cd_it_names() {
        let mut opts = OperatorOptions::new("agents");
        opts.argocd_namespace = Some("argocd".into());
        opts.extra_argocd_namespaces = vec!["gitops".into()];
        assert_eq!(
            argocd_namespace_of(&goc("g", None), &opts).as_deref(),
            Some("argocd")
        );
        assert_eq!(
            argocd_namespace_of(&goc("g", Some("")), &opts).as_deref(),
            Some("argocd")
        );
        for served in ["agents", "argocd", "gitops"] {
            assert_eq!(
                argocd_namespace_of(&goc("g", Some(served)), &opts).as_deref(),
                Some(served)
            );
        }
        // Another principal's Argo CD: not this operator's.
        assert_eq!(
            argocd_namespace_of(&goc("g", Some("other-argocd")), &opts),
            None
        );
        let other = OperatorOptions::new("other-argocd");
        assert_eq!(
            argocd_namespace_of(&goc("g", Some("other-argocd")), &other).as_deref(),
            Some("other-argocd")
        );
        assert_eq!(argocd_namespace_of(&goc("g", Some("gitops")), &other), None);
    }

    fn work(cluster: &str, owner: Option<&str>) -> ManifestWork {
        let mut meta = json!({"name": "argocd-agent", "namespace": cluster});
        if let Some(o) = owner {
            meta["annotations"] = json!({ OWNER_ANNOTATION: o });
        }
        serde_json::from_value(json!({
            "apiVersion": "work.open-cluster-management.io/v1",
            "kind": "ManifestWork",
            "metadata": meta,
            "spec": {},
        }))
        .expect("a ManifestWork")
    }

    #[test]
    fn every_object_has_one_reconciler_the_assigned_gitopscluster_first() {
        let fleet = Fleet {
            every_goc: ["ns/a", "ns/b", "ns/frozen", "ns/theirs"]
                .map(String::from)
                .into(),
            served: vec![goc("a", None), goc("b", None), goc("frozen", None)],
            selections: BTreeMap::new(),
            assignment: [("c1".to_string(), "ns/a".to_string())].into(),
            frozen: ["ns/frozen".to_string()].into(),
            works: Vec::new(),
            cluster_secrets: Vec::new(),
        };
        let by = |k: &str| Responsible::GitOpsCluster(k.into());
        // The assigned GitOpsCluster decides, whoever created the object (it adopts it).
        assert_eq!(
            fleet.responsible("c1", &work("c1", Some("ns/b"))),
            by("ns/a")
        );
        assert_eq!(fleet.responsible("c1", &work("c1", None)), by("ns/a"));
        // An unassigned cluster's objects: their served owner offboards them...
        assert_eq!(
            fleet.responsible("c2", &work("c2", Some("ns/b"))),
            by("ns/b")
        );
        // ...the sweep those of no owner or of a GitOpsCluster that is gone...
        assert_eq!(
            fleet.responsible("c2", &work("c2", None)),
            Responsible::Sweep
        );
        assert_eq!(
            fleet.responsible("c2", &work("c2", Some("ns/gone"))),
            Responsible::Sweep
        );
        // ...and a frozen GitOpsCluster's stay, even on a cluster assigned elsewhere.
        assert_eq!(
            fleet.responsible("c1", &work("c1", Some("ns/frozen"))),
            Responsible::Nobody
        );
        // Another principal's objects are not this principal's; orphans are anyone's.
        assert!(!fleet.ours(&work("c1", Some("ns/theirs"))));
        assert!(fleet.ours(&work("c1", Some("ns/gone"))));
        assert!(fleet.ours(&work("c1", None)));
    }
}
