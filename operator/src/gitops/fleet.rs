//! The fleet as one GitOpsCluster's reconciliation sees it: the decisions that are global
//! although each GitOpsCluster is reconciled on its own, and global across the principals of one
//! hub.
//!
//! Owns which GitOpsClusters this principal serves ([`argocd_namespace_of`]), which it must
//! report on although no principal serves them ([`home_of_unserved`]), which are claimed by
//! another principal ([`claimed_elsewhere`]: they carry another principal's cleanup finalizer,
//! [`finalizer_of`]), every served GitOpsCluster's selection and the assignment of each cluster
//! to one GitOpsCluster across the hub (a cluster selected by two goes to the oldest, whichever
//! principal serves it: the other reports the conflict and writes nothing for that cluster, and
//! takes over when the winner goes), which GitOpsClusters are frozen (placement unresolvable or
//! spec invalid: their objects are left alone), the operator's existing objects of this
//! principal ([`PRINCIPAL_ANNOTATION`]), and who is responsible for each of those objects
//! ([`Fleet::responsible`]): the served GitOpsCluster its cluster is assigned to, else its
//! served owner, else the orphan sweep ([`Responsible::Sweep`]) for objects whose GitOpsCluster
//! is gone, moved to another principal, or lost its cluster to another principal's. So each
//! object has exactly one reconciler that may write or delete it.
//!
//! A claim does not expire: a principal that stops (crashed, paused, mid-upgrade, uninstalled)
//! keeps its GitOpsClusters' clusters, as an unreachable site keeps its agent. Taking a cluster
//! over on a timeout (its operator Lease, say) would repoint the cluster's agent at another hub
//! and replace its Applications during an ordinary outage, and the returning principal's older
//! GitOpsCluster would take it back: the fleet would flap between hubs. A principal gone for good
//! is released as any controller's finalizer is, by hand: its GitOpsCluster deleted and the claim
//! removed (the waiting GitOpsCluster's status says which), after which the objects it left are
//! orphans ([`Fleet::ours`]) that the surviving principals sweep or adopt. Upstream has no such
//! case (one GitOpsCluster controller per hub). Likewise a GitOpsCluster that names an Argo CD
//! namespace no principal has claimed yet is reported unserved by its home principal only after
//! [`CLAIM_GRACE`] ([`Unclaimed`]), so the principal that serves it has time to claim it first.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;

use super::agent_work::{AGENT_WORK_NAME, OWNER_ANNOTATION, PRINCIPAL_ANNOTATION};
use super::crd::GitOpsCluster;
use super::placement::{assign_clusters, goc_key, resolve, PlacementError};
use super::{OperatorError, OperatorOptions, FINALIZER};
use crate::pull::manifestwork::ManifestWork;

/// Reason of a GitOpsCluster whose spec is refused before its Placement is evaluated: an
/// unknown mode.
pub(crate) const INVALID_MODE: &str = "InvalidMode";

/// A GitOpsCluster's selection, or why it has none (reason, message).
pub(crate) type Selection = Result<BTreeSet<String>, (String, String)>;

/// The Argo CD namespace `goc` names: `spec.argoServer.argoNamespace`, else, as upstream
/// argocd-pull-integration ("argoCDNamespace is the same as GitOpsCluster namespace"), the
/// GitOpsCluster's own namespace.
pub fn named_argocd_namespace(goc: &GitOpsCluster) -> String {
    goc.spec
        .argo_server
        .as_ref()
        .and_then(|a| a.argo_namespace.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| goc.metadata.namespace.clone().unwrap_or_default())
}

/// The hub namespace `goc`'s cluster Secrets go to when this operator owns `goc`; `None` when
/// another principal's does (or none does).
///
/// Ownership, with several principals (each with its embedded operator) on one hub: a
/// GitOpsCluster belongs to the principal serving the Argo CD it names
/// ([`named_argocd_namespace`]: `spec.argoServer.argoNamespace`, else the GitOpsCluster's own
/// namespace, upstream's default), that is the principal whose Argo CD namespaces
/// ([`OperatorOptions::argocd_namespaces`]: its own, `--operator-argocd-namespace`,
/// `--operator-extra-argocd-namespaces`) include it. So exactly one principal is responsible
/// for a GitOpsCluster naming no namespace too: the one serving the GitOpsCluster's namespace.
/// Every other principal leaves it alone: no finalizer, no status, its objects neither created
/// nor offboarded.
pub fn argocd_namespace_of(goc: &GitOpsCluster, opts: &OperatorOptions) -> Option<String> {
    let ns = named_argocd_namespace(goc);
    opts.argocd_namespaces().contains(&ns).then_some(ns)
}

/// This principal's cleanup finalizer on the GitOpsClusters it serves: [`FINALIZER`] followed by
/// its namespace (a hash of it when the name would pass Kubernetes' 63 characters), so that
/// principals tell their claims apart: one whose GitOpsCluster moved to another principal releases
/// its own once its objects are gone, without touching the new owner's. [`FINALIZER`] alone is
/// what earlier versions put, for one principal per hub.
pub fn finalizer_of(opts: &OperatorOptions) -> String {
    let name_part = FINALIZER.rsplit('/').next().unwrap_or(FINALIZER);
    let suffix = if name_part.len() + 1 + opts.namespace.len() <= 63 {
        opts.namespace.clone()
    } else {
        // FNV-1a: stable across builds, unlike std's hasher.
        let hash = opts
            .namespace
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        format!("{hash:016x}")
    };
    format!("{FINALIZER}-{suffix}")
}

/// Whether another principal claims `goc`: it carries a principal's cleanup finalizer
/// ([`finalizer_of`]) that is not this principal's. (The legacy [`FINALIZER`] names no
/// principal; the principal serving the GitOpsCluster replaces it with its own.)
pub fn claimed_elsewhere(goc: &GitOpsCluster, opts: &OperatorOptions) -> bool {
    claim_elsewhere(goc, opts).is_some()
}

/// Another principal's claim on `goc`: its cleanup finalizer, which an admin removes to release
/// the GitOpsCluster of a principal gone for good.
pub fn claim_elsewhere<'a>(goc: &'a GitOpsCluster, opts: &OperatorOptions) -> Option<&'a String> {
    let own = finalizer_of(opts);
    let prefix = format!("{FINALIZER}-");
    goc.metadata
        .finalizers
        .iter()
        .flatten()
        .find(|f| f.starts_with(&prefix) && **f != own)
}

/// How long a GitOpsCluster naming an Argo CD namespace this principal does not serve may stay
/// unclaimed before its home principal ([`home_of_unserved`]) reports that no principal serves
/// it. The serving principal claims a GitOpsCluster at its first reconciliation, within a second
/// of its creation or edit, and its standby replica takes over within one operator Lease
/// duration (15 s by default): without the wait, the home principal would write
/// `ArgoServerNotFound` for a moment before the serving principal's first status.
pub const CLAIM_GRACE: Duration = Duration::from_secs(15);

/// Since when each GitOpsCluster naming an Argo CD namespace this principal does not serve has
/// been seen unclaimed, at its current generation (an edit of the spec starts the wait again).
/// Kept in memory: a restarted principal waits [`CLAIM_GRACE`] again.
#[derive(Debug, Default)]
pub struct Unclaimed(Mutex<HashMap<String, (Option<i64>, Instant)>>);

impl Unclaimed {
    /// How long `goc` (key `key`) has been seen unclaimed at its generation; `None` the first
    /// time. Entries of GitOpsClusters not in `every` (keys of every GitOpsCluster on the hub) are
    /// dropped, so the map never outgrows the hub's GitOpsClusters.
    pub fn seen(
        &self,
        key: &str,
        goc: &GitOpsCluster,
        every: &BTreeSet<String>,
    ) -> Option<Duration> {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|k, _| every.contains(k));
        let generation = goc.metadata.generation;
        match seen.get(key) {
            Some((g, since)) if *g == generation => Some(since.elapsed()),
            _ => {
                seen.insert(key.to_owned(), (generation, Instant::now()));
                None
            }
        }
    }

    /// Forgets `key`: it is claimed, served here, or no longer unserved.
    pub fn forget(&self, key: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

/// The namespace no principal may serve for `goc`, when this principal is the one to say so:
/// `goc` names an Argo CD namespace this principal does not serve, no principal claims it, and
/// this principal serves the GitOpsCluster's own namespace (upstream's default Argo CD
/// namespace, so at most one principal is this "home"). A GitOpsCluster whose own namespace no
/// principal serves has no home: nobody reports on it.
pub fn home_of_unserved(goc: &GitOpsCluster, opts: &OperatorOptions) -> Option<String> {
    if argocd_namespace_of(goc, opts).is_some() || claimed_elsewhere(goc, opts) || !is_live(goc) {
        return None;
    }
    let own = goc.metadata.namespace.clone().unwrap_or_default();
    opts.argocd_namespaces()
        .contains(&own)
        .then(|| named_argocd_namespace(goc))
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

/// The operator's stores the fleet is read from (one watch each, shared with the controller's
/// triggers): Placements, PlacementDecisions, the operator's ManifestWorks (label
/// `app.kubernetes.io/managed-by=argocd-agent-operator`, any principal's) and its cluster Secrets
/// in each of this principal's Argo CD namespaces.
///
/// A store may lag behind a write of this very operator by a moment; every write carries what
/// it read (a replace its resourceVersion, a create nothing), so a stale read ends in a conflict
/// and a retry, never in a lost update, and each change of a stored object triggers the
/// GitOpsClusters it concerns again.
#[derive(Clone)]
pub struct Stores {
    /// Placements.
    pub placements: Store<DynamicObject>,
    /// PlacementDecisions.
    pub decisions: Store<DynamicObject>,
    /// The operator's ManifestWorks.
    pub works: Store<ManifestWork>,
    /// The operator's cluster Secrets, one store per Argo CD namespace.
    pub secrets: Vec<Store<Secret>>,
}

/// The fleet at one moment.
pub struct Fleet {
    /// This principal ([`PRINCIPAL_ANNOTATION`]'s value on its objects).
    principal: String,
    /// Every GitOpsCluster on the hub (any principal's), by key.
    every_goc: BTreeSet<String>,
    /// The GitOpsClusters this principal serves, sorted by key.
    pub served: Vec<GitOpsCluster>,
    /// The selection of every served, live GitOpsCluster.
    pub selections: BTreeMap<String, Selection>,
    /// Each selected cluster's GitOpsCluster (by key), across the principals of the hub.
    pub assignment: BTreeMap<String, String>,
    /// GitOpsClusters whose objects are left alone (unresolvable or invalid).
    pub frozen: BTreeSet<String>,
    /// The operator's agent and Argo CD CR ManifestWorks of this principal.
    pub works: Vec<ManifestWork>,
    /// The operator's Argo CD cluster Secrets of this principal.
    pub cluster_secrets: Vec<Secret>,
    /// Agent ManifestWorks of other principals, by cluster namespace.
    pub foreign_agent_works: BTreeMap<String, ManifestWork>,
    /// The claim (cleanup finalizer) of every other principal's GitOpsCluster competing for
    /// clusters, by key: what an admin removes if that principal is gone for good.
    pub claims: BTreeMap<String, String>,
}

impl Fleet {
    /// Reads the fleet from the operator's stores, given every GitOpsCluster on the hub (its
    /// store): resolves the placements of the served live ones (adding the offline tolerations
    /// they lack) and, read-only, of the live ones another principal claims, assigns the
    /// clusters across them, and takes the operator's objects.
    pub async fn gather(
        client: &kube::Client,
        opts: &OperatorOptions,
        stores: &Stores,
        mut gocs: Vec<GitOpsCluster>,
    ) -> Result<Fleet, OperatorError> {
        gocs.sort_by_key(goc_key);
        let every_goc: BTreeSet<String> = gocs.iter().map(goc_key).collect();
        let (served, others): (Vec<_>, Vec<_>) = gocs
            .into_iter()
            .partition(|g| argocd_namespace_of(g, opts).is_some());
        let mut selections = BTreeMap::new();
        for goc in served.iter().filter(|g| is_live(g)) {
            let selected = match goc.mode() {
                "managed" | "autonomous" => {
                    resolve(client, &stores.placements, &stores.decisions, goc, true)
                        .await
                        .map_err(|e: PlacementError| (e.reason().to_owned(), e.to_string()))
                }
                other => Err((
                    INVALID_MODE.to_owned(),
                    format!("spec.argoCDAgentAddon.mode is {other:?}; use managed or autonomous"),
                )),
            };
            selections.insert(goc_key(goc), selected);
        }
        // Another principal's GitOpsClusters compete for clusters (oldest wins across the hub);
        // their placements are read, never written: they are that principal's to fix.
        let mut competing = Vec::new();
        let mut claims = BTreeMap::new();
        for goc in others.iter().filter(|g| competes(g, opts)) {
            if let Some(claim) = claim_elsewhere(goc, opts) {
                claims.insert(goc_key(goc), claim.clone());
            }
            let read = resolve(client, &stores.placements, &stores.decisions, goc, false);
            if let Ok(clusters) = read.await {
                competing.push((goc, clusters));
            }
        }
        let assignment = assign_clusters(
            &served
                .iter()
                .filter(|g| is_live(g))
                .filter_map(|g| {
                    let clusters = selections.get(&goc_key(g))?.as_ref().ok()?.clone();
                    Some((g, clusters))
                })
                .chain(competing)
                .map(|(g, clusters)| (goc_key(g), creation_key(g), clusters))
                .collect::<Vec<_>>(),
        );
        let frozen = selections
            .iter()
            .filter(|(_, s)| s.is_err())
            .map(|(k, _)| k.clone())
            .collect();
        let mut fleet = Fleet {
            principal: opts.namespace.clone(),
            every_goc,
            served,
            selections,
            assignment,
            frozen,
            works: Vec::new(),
            cluster_secrets: Vec::new(),
            foreign_agent_works: BTreeMap::new(),
            claims,
        };
        for work in stores.works.state() {
            if fleet.ours(work.as_ref()) {
                fleet.works.push(work.as_ref().clone());
            } else if work.metadata.name.as_deref() == Some(AGENT_WORK_NAME) {
                let cluster = work.metadata.namespace.clone().unwrap_or_default();
                fleet
                    .foreign_agent_works
                    .insert(cluster, work.as_ref().clone());
            }
        }
        for store in &stores.secrets {
            let ours: Vec<Secret> = store
                .state()
                .into_iter()
                .filter(|s| fleet.ours(s.as_ref()))
                .map(|s| s.as_ref().clone())
                .collect();
            fleet.cluster_secrets.extend(ours);
        }
        Ok(fleet)
    }

    /// The served GitOpsClusters not being deleted.
    pub fn live(&self) -> impl Iterator<Item = &GitOpsCluster> {
        self.served.iter().filter(|g| is_live(g))
    }

    /// Whether an object of the operator is this principal's to decide about: it says so
    /// ([`PRINCIPAL_ANNOTATION`]); another principal's whose GitOpsCluster is gone (that
    /// principal removes its objects before it releases its claim, so such an object outlived a
    /// claim removed by hand: the principal is gone, and its orphans are swept, or adopted by
    /// the GitOpsCluster the cluster is assigned to, by whichever principal sees them); an object
    /// of an earlier version, saying nothing, when owned by a served GitOpsCluster, by none, or
    /// by one that is gone.
    pub fn ours(&self, obj: &impl kube::Resource) -> bool {
        let gone = |o: &String| !self.every_goc.contains(o);
        match principal_of(obj) {
            Some(p) if *p == self.principal => true,
            Some(_) => owner(obj).is_some_and(gone),
            None => owner(obj).is_none_or(|o| gone(o) || self.serves(o)),
        }
    }

    fn serves(&self, key: &str) -> bool {
        self.served.iter().any(|g| goc_key(g) == key)
    }

    /// Who decides about `obj`, an object of this principal's for `cluster`: the served
    /// GitOpsCluster the cluster is assigned to; when it is assigned to none or to another
    /// principal's, the object's served owner (which offboards it); else the sweep. A frozen
    /// owner's objects stay.
    pub fn responsible(&self, cluster: &str, obj: &impl kube::Resource) -> Responsible {
        let left_by_another = principal_of(obj).is_some_and(|p| *p != self.principal);
        if left_by_another
            && self
                .assignment
                .get(cluster)
                .is_some_and(|a| !self.serves(a))
        {
            // Another principal's orphan on a cluster a third principal's GitOpsCluster has:
            // that principal adopts it.
            return Responsible::Nobody;
        }
        self.responsible_for(cluster, owner(obj))
    }

    /// [`Fleet::responsible`] for an object of `owner`.
    pub fn responsible_for(&self, cluster: &str, owner: Option<&String>) -> Responsible {
        if owner.is_some_and(|o| self.frozen.contains(o)) {
            return Responsible::Nobody;
        }
        if let Some(assigned) = self.assignment.get(cluster).filter(|a| self.serves(a)) {
            return Responsible::GitOpsCluster(assigned.clone());
        }
        match owner {
            Some(o) if self.serves(o) => Responsible::GitOpsCluster(o.clone()),
            _ => Responsible::Sweep,
        }
    }
}

/// Whether another principal's GitOpsCluster competes for clusters with this principal's: live,
/// claimed by its principal, with a mode its principal accepts.
fn competes(goc: &GitOpsCluster, opts: &OperatorOptions) -> bool {
    is_live(goc) && claimed_elsewhere(goc, opts) && matches!(goc.mode(), "managed" | "autonomous")
}

/// Sort key of "oldest first": the creation time.
fn creation_key(goc: &GitOpsCluster) -> String {
    goc.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| format!("{:020}", t.0.as_second()))
        .unwrap_or_default()
}

/// The principal that created an object of the operator.
pub fn principal_of(obj: &impl kube::Resource) -> Option<&String> {
    obj.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(PRINCIPAL_ANNOTATION))
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
        // Naming none (or an empty one): upstream's default, the GitOpsCluster's own namespace
        // ("ns" here), which this principal does not serve...
        assert_eq!(argocd_namespace_of(&goc("g", None), &opts), None);
        assert_eq!(argocd_namespace_of(&goc("g", Some("")), &opts), None);
        // ...and the one serving it does, alone.
        let home = OperatorOptions::new("ns");
        assert_eq!(
            argocd_namespace_of(&goc("g", None), &home).as_deref(),
            Some("ns")
        );
        assert_eq!(
            argocd_namespace_of(&goc("g", Some("")), &home).as_deref(),
            Some("ns")
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
        marked_work(cluster, owner, None)
    }

    fn marked_work(cluster: &str, owner: Option<&str>, principal: Option<&str>) -> ManifestWork {
        let mut meta = json!({"name": "argocd-agent", "namespace": cluster, "annotations": {}});
        if let Some(o) = owner {
            meta["annotations"][OWNER_ANNOTATION] = json!(o);
        }
        if let Some(p) = principal {
            meta["annotations"][PRINCIPAL_ANNOTATION] = json!(p);
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
            principal: "hub-p".into(),
            every_goc: ["ns/a", "ns/b", "ns/frozen", "ns/theirs"]
                .map(String::from)
                .into(),
            served: vec![goc("a", None), goc("b", None), goc("frozen", None)],
            selections: BTreeMap::new(),
            assignment: [
                ("c1".to_string(), "ns/a".to_string()),
                ("c3".to_string(), "ns/theirs".to_string()),
            ]
            .into(),
            frozen: ["ns/frozen".to_string()].into(),
            works: Vec::new(),
            cluster_secrets: Vec::new(),
            foreign_agent_works: BTreeMap::new(),
            claims: BTreeMap::new(),
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
        // Objects that say whose they are: this principal's even when their GitOpsCluster moved
        // to another principal, and then swept...
        let moved = marked_work("c2", Some("ns/theirs"), Some("hub-p"));
        assert!(fleet.ours(&moved));
        assert_eq!(fleet.responsible("c2", &moved), Responsible::Sweep);
        // ...never another principal's while their GitOpsCluster exists, whatever it is...
        assert!(!fleet.ours(&marked_work("c1", Some("ns/a"), Some("hub-q"))));
        assert!(!fleet.ours(&marked_work("c1", Some("ns/theirs"), Some("hub-q"))));
        assert!(!fleet.ours(&marked_work("c1", None, Some("hub-q"))));
        // ...but once it is gone (its principal's claim removed by hand): an orphan, adopted by
        // the GitOpsCluster its cluster is assigned to, or swept.
        let left = marked_work("c1", Some("ns/released"), Some("hub-q"));
        assert!(fleet.ours(&left));
        assert_eq!(fleet.responsible("c1", &left), by("ns/a"));
        let left = marked_work("c2", Some("ns/released"), Some("hub-q"));
        assert_eq!(fleet.responsible("c2", &left), Responsible::Sweep);
        // On a cluster another principal's GitOpsCluster has, that principal adopts it.
        let left = marked_work("c3", Some("ns/released"), Some("hub-q"));
        assert_eq!(fleet.responsible("c3", &left), Responsible::Nobody);
        // A cluster assigned to another principal's (older) GitOpsCluster: this principal's
        // objects for it are offboarded by their served owner, or swept.
        assert_eq!(
            fleet.responsible("c3", &marked_work("c3", Some("ns/b"), Some("hub-p"))),
            by("ns/b")
        );
        assert_eq!(
            fleet.responsible("c3", &marked_work("c3", Some("ns/gone"), Some("hub-p"))),
            Responsible::Sweep
        );
    }

    fn with_finalizers(mut g: GitOpsCluster, finalizers: &[&str]) -> GitOpsCluster {
        g.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        g
    }

    #[test]
    fn principals_claim_with_finalizers_of_their_own() {
        let p = OperatorOptions::new("hub-p");
        let q = OperatorOptions::new("hub-q");
        assert_eq!(finalizer_of(&p), format!("{FINALIZER}-hub-p"));
        assert_ne!(finalizer_of(&p), finalizer_of(&q));
        // A namespace too long for a finalizer's name: a hash of it, within 63 characters.
        let long = OperatorOptions::new(&"n".repeat(63));
        let name = finalizer_of(&long);
        assert!(name.rsplit('/').next().unwrap().len() <= 63, "{name}");
        assert_eq!(name, finalizer_of(&OperatorOptions::new(&"n".repeat(63))));
        let g = with_finalizers(goc("g", Some("x")), &[&finalizer_of(&q), "other/f"]);
        assert!(claimed_elsewhere(&g, &p));
        assert_eq!(claim_elsewhere(&g, &p), Some(&finalizer_of(&q)));
        assert!(!claimed_elsewhere(&g, &q), "its own claim is not another's");
        // The legacy finalizer names nobody.
        assert!(!claimed_elsewhere(
            &with_finalizers(goc("g", Some("x")), &[FINALIZER]),
            &p
        ));
    }

    #[test]
    fn another_principals_gitopscluster_competes_for_clusters_only_while_claimed_live_and_valid() {
        let p = OperatorOptions::new("hub-p");
        let q = OperatorOptions::new("hub-q");
        let claimed = with_finalizers(goc("g", Some("hub-q")), &[&finalizer_of(&q)]);
        assert!(competes(&claimed, &p));
        // Not claimed (no principal serves it, or its principal has not reconciled it yet).
        assert!(!competes(&goc("g", Some("hub-q")), &p));
        // Being deleted: its clusters are free to take over.
        let mut deleted = claimed.clone();
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert!(!competes(&deleted, &p));
        // A mode its principal refuses: it onboards nothing.
        let mut sideways = claimed.clone();
        sideways.spec.argocd_agent_addon.mode = Some("sideways".into());
        assert!(!competes(&sideways, &p));
    }

    #[test]
    fn an_unclaimed_gitopscluster_is_timed_per_generation_and_forgotten_when_gone() {
        let unclaimed = Unclaimed::default();
        let mut g = goc("g", Some("elsewhere"));
        g.metadata.generation = Some(1);
        let every: BTreeSet<String> = ["ns/g".to_string()].into();
        assert_eq!(unclaimed.seen("ns/g", &g, &every), None, "first sighting");
        let waited = unclaimed.seen("ns/g", &g, &every).expect("seen before");
        assert!(waited < CLAIM_GRACE, "{waited:?}");
        // An edit (new generation) starts the wait again.
        g.metadata.generation = Some(2);
        assert_eq!(unclaimed.seen("ns/g", &g, &every), None);
        assert!(unclaimed.seen("ns/g", &g, &every).is_some());
        unclaimed.forget("ns/g");
        assert_eq!(unclaimed.seen("ns/g", &g, &every), None, "forgotten");
        // A GitOpsCluster no longer on the hub is dropped at the next look at any other.
        let other = goc("h", Some("elsewhere"));
        let now: BTreeSet<String> = ["ns/h".to_string()].into();
        assert_eq!(unclaimed.seen("ns/h", &other, &now), None);
        assert_eq!(unclaimed.0.lock().unwrap().len(), 1, "ns/g dropped");
    }

    #[test]
    fn a_gitopscluster_naming_an_unserved_namespace_is_reported_by_the_home_principal_alone() {
        // "ns" is the GitOpsCluster's own namespace: served by `home` only.
        let home = OperatorOptions::new("ns");
        let mut other = OperatorOptions::new("hub-q");
        other.extra_argocd_namespaces = vec!["served-by-q".into()];
        let typo = goc("g", Some("typo"));
        assert_eq!(home_of_unserved(&typo, &home).as_deref(), Some("typo"));
        assert_eq!(home_of_unserved(&typo, &other), None, "not its home");
        // Served by someone: its server reconciles it, nobody reports it unserved.
        let by_q = goc("g", Some("served-by-q"));
        assert!(argocd_namespace_of(&by_q, &other).is_some());
        assert_eq!(home_of_unserved(&by_q, &other), None);
        // Claimed by another principal (which serves a namespace home does not know of).
        let claimed = with_finalizers(goc("g", Some("served-by-q")), &[&finalizer_of(&other)]);
        assert_eq!(home_of_unserved(&claimed, &home), None);
        // Naming none: the home serves it (upstream's default), so it is no one's typo.
        assert_eq!(home_of_unserved(&goc("g", None), &home), None);
        assert!(argocd_namespace_of(&goc("g", None), &home).is_some());
    }
}
