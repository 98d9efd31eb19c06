//! Several principals on one hub, each with its embedded GitOpsCluster operator, sharing the
//! GitOpsClusters, Placements and managed clusters of the hub (issue 18): exactly one principal
//! answers each GitOpsCluster (upstream's default Argo CD namespace is the GitOpsCluster's own),
//! a GitOpsCluster naming a namespace no principal serves is reported by the principal serving
//! its own namespace, a cluster selected by two principals' GitOpsClusters goes to the oldest
//! (the other reports the conflict, writes nothing for it, and takes over when the winner goes),
//! and a GitOpsCluster moving to another principal leaves nothing of the old one behind; a
//! GitOpsCluster naming another principal's namespace is not reported unserved while that
//! principal has yet to claim it; a dead principal's claim holds its cluster until released by
//! hand, then the other principal adopts what it left; each principal's pull model wraps only the
//! Applications of its own Argo CD namespaces.
//!
//! OCM's real placement controller decides the Placements (over a ManagedCluster the test creates
//! as a hub admin would, with no klusterlet joining it); no work agent runs: what is asserted is
//! what each operator writes on the hub.

use std::time::Duration;

use argocd_agent_operator::gitops::agent_work::{AGENT_WORK_NAME, PRINCIPAL_ANNOTATION};
use argocd_agent_operator::gitops::crd::GitOpsCluster;
use argocd_agent_operator::gitops::FINALIZER;
use argocd_agent_operator::pull::manifestwork::ManifestWork;
use e2e::gateway::{ensure_namespace, Pki, Principal};
use e2e::ocm::{create_label_placement, managed_cluster_resource, shared_ocm_hub};
use e2e::{shared_planes, wait_until, TestContext};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// The label the test's ManagedCluster carries and its Placements select.
const SITE_LABEL: &str = "operator-principals.test/site";

/// ManagedCluster `name`, created by the hub admin and accepted (no klusterlet joins it: OCM
/// taints it unreachable, which the operator's Placement tolerations admit as upstream's do),
/// labelled `SITE_LABEL=site` so real Placements can select it.
async fn managed_cluster(hub: &kube::Client, name: &str, site: &str) -> anyhow::Result<()> {
    let clusters: Api<DynamicObject> = Api::all_with(hub.clone(), &managed_cluster_resource());
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
                "metadata": {"name": name, "labels": {SITE_LABEL: site}},
                "spec": {"hubAcceptsClient": true}}))?,
        )
        .await?;
    Ok(())
}

/// A GitOpsCluster `name` in `ns` over Placement `placement`, naming `argo_namespace` when given
/// (upstream's GitOpsCluster names none).
fn gitopscluster(
    ns: &str,
    name: &str,
    placement: &str,
    argo_namespace: Option<&str>,
    grpc_port: u16,
) -> anyhow::Result<GitOpsCluster> {
    let mut spec = json!({
        "placementRef": {"kind": "Placement", "name": placement},
        "argoCDAgentAddon": {"mode": "managed", "principalServerAddress": "127.0.0.1",
                             "principalServerPort": grpc_port.to_string(),
                             "agentKeyInManifestWork": true},
    });
    if let Some(argo) = argo_namespace {
        spec["argoServer"] = json!({ "argoNamespace": argo });
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps.open-cluster-management.io/v1alpha1", "kind": "GitOpsCluster",
        "metadata": {"name": name, "namespace": ns}, "spec": spec,
    }))?)
}

fn condition(goc: &GitOpsCluster, type_: &str) -> Option<(String, String, String)> {
    goc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn finalizers(goc: &GitOpsCluster) -> Vec<String> {
    goc.metadata.finalizers.clone().unwrap_or_default()
}

/// The agent ManifestWork of `cluster` as (principal, owner), once `pred` holds for it.
async fn wait_agent_work(
    hub: &kube::Client,
    cluster: &str,
    what: &str,
    pred: impl Fn(Option<&ManifestWork>) -> bool,
) -> anyhow::Result<Option<(String, String)>> {
    let api: Api<ManifestWork> = Api::namespaced(hub.clone(), cluster);
    let work = wait_until(what, WAIT, || async {
        let work = api.get_opt(AGENT_WORK_NAME).await?;
        Ok::<_, kube::Error>(pred(work.as_ref()).then_some(work))
    })
    .await?;
    Ok(work.map(|w| {
        let a = w.metadata.annotations.unwrap_or_default();
        let get = |k: &str| a.get(k).cloned().unwrap_or_default();
        (
            get(PRINCIPAL_ANNOTATION),
            get("apps.open-cluster-management.io/gitopscluster"),
        )
    }))
}

fn by(work: Option<&ManifestWork>, principal: &str) -> bool {
    work.and_then(|w| w.metadata.annotations.as_ref())
        .and_then(|a| a.get(PRINCIPAL_ANNOTATION))
        .is_some_and(|p| p == principal)
}

/// Every revision of GitOpsCluster `name` as (resourceVersion, reason of condition `type_`), from
/// a watch started now (before the object exists) until [`Revisions::until`].
fn watch_revisions(gocs: &Api<GitOpsCluster>, name: &str, type_: &str) -> Revisions {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let seen = Seen::default();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let task = tokio::spawn({
        let (gocs, seen, type_) = (gocs.clone(), seen.clone(), type_.to_string());
        async move {
            let mut events = watcher(gocs, config).boxed();
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(g) | watcher::Event::InitApply(g)) = event {
                    let reason = condition(&g, &type_).map(|c| c.1);
                    let version = g.metadata.resource_version.unwrap_or_default();
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((version, reason));
                }
            }
        }
    });
    Revisions { seen, task }
}

/// (resourceVersion, condition reason) of each revision seen.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, Option<String>)>>>;

/// A running [`watch_revisions`].
struct Revisions {
    seen: Seen,
    task: tokio::task::JoinHandle<()>,
}

impl Revisions {
    /// The reasons of every revision up to `version` (read by the test), once the watch has
    /// delivered it.
    async fn until(self, version: &str) -> anyhow::Result<Vec<Option<String>>> {
        let seen = wait_until(
            &format!("the watch to deliver revision {version}"),
            WAIT,
            || async {
                let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
                let done = seen.iter().any(|(v, _)| v == version);
                Ok::<_, kube::Error>(done.then(|| seen.iter().map(|(_, r)| r.clone()).collect()))
            },
        )
        .await;
        self.task.abort();
        seen
    }
}

/// Principal `a`'s GitOpsCluster `ga`, naming no Argo CD namespace (upstream's), over a Placement
/// `pa` selecting the clusters of `site`; waits until a's agent ManifestWork for `cluster`, owned
/// by ga, exists. Returns ga as then.
async fn onboard_by_a(
    hub: &kube::Client,
    (ns_a, a): (&str, &Principal),
    cluster: &str,
    site: &str,
) -> anyhow::Result<GitOpsCluster> {
    let gocs_a: Api<GitOpsCluster> = Api::namespaced(hub.clone(), ns_a);
    create_label_placement(hub, ns_a, "pa", (SITE_LABEL, site)).await?;
    gocs_a
        .create(
            &PostParams::default(),
            &gitopscluster(ns_a, "ga", "pa", None, a.grpc_port)?,
        )
        .await?;
    let work = wait_agent_work(hub, cluster, "a's agent ManifestWork", |w| by(w, ns_a)).await?;
    assert_eq!(work.map(|w| w.1), Some(format!("{ns_a}/ga")), "owned by ga");
    Ok(gocs_a.get("ga").await?)
}

/// Principal `b`'s GitOpsCluster `gb` over a Placement `pb` selecting the same `site` as `older`
/// (created at least a second after it, so younger on the hub); waits until gb reports the
/// conflict. Returns gb as then.
async fn contest_by_b(
    hub: &kube::Client,
    older: &GitOpsCluster,
    (ns_b, b): (&str, &Principal),
    site: &str,
) -> anyhow::Result<GitOpsCluster> {
    let created = older
        .metadata
        .creation_timestamp
        .clone()
        .expect("created")
        .0;
    wait_until(
        "a second after the older GitOpsCluster's creation",
        WAIT,
        || async {
            let later = k8s_openapi::jiff::Timestamp::now().as_second() > created.as_second();
            Ok::<_, kube::Error>(later.then_some(()))
        },
    )
    .await?;
    let gocs_b: Api<GitOpsCluster> = Api::namespaced(hub.clone(), ns_b);
    create_label_placement(hub, ns_b, "pb", (SITE_LABEL, site)).await?;
    gocs_b
        .create(
            &PostParams::default(),
            &gitopscluster(ns_b, "gb", "pb", None, b.grpc_port)?,
        )
        .await?;
    wait_until("gb reports the conflict", WAIT, || async {
        let g = gocs_b.get("gb").await?;
        Ok::<_, kube::Error>(in_conflict(&g).then_some(g))
    })
    .await
}

/// `ClustersRegistered` says `ClusterConflict`.
fn in_conflict(goc: &GitOpsCluster) -> bool {
    condition(goc, "ClustersRegistered").is_some_and(|c| c.1 == "ClusterConflict")
}

/// Principals `a` and `b` on the shared hub, each with the operator on and its own Argo CD
/// namespace: `((namespace a, a), (namespace b, b))`.
async fn two_principals(
    ctx: &TestContext,
    pki: &Pki,
) -> anyhow::Result<((String, Principal), (String, Principal))> {
    let hub = &shared_planes().await.hub;
    let mut started = Vec::new();
    for name in ["a", "b"] {
        let ns = ctx.unique(&format!("hub-{name}"));
        let principal =
            Principal::start(name, &ctx.dir, hub, pki, &ns, &["--enable-operator=true"]).await?;
        started.push((ns, principal));
    }
    let b = started.pop().expect("two started");
    let a = started.pop().expect("two started");
    Ok((a, b))
}

#[tokio::test]
async fn principals_on_one_hub_share_gitopsclusters_and_clusters_without_fighting(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    shared_ocm_hub().await;
    let ctx = TestContext::new("operator_principals")?;
    let hub = planes.hub.client().await?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let ((ns_a, a), (ns_b, b)) = two_principals(&ctx, &pki).await?;
    let fin = |ns: &str| format!("{FINALIZER}-{ns}");
    let (cluster, site) = (ctx.unique("c"), ctx.unique("site"));
    managed_cluster(&hub, &cluster, &site).await?;
    ensure_namespace(&hub, &cluster).await?;
    let gocs_a: Api<GitOpsCluster> = Api::namespaced(hub.clone(), &ns_a);
    let gocs_b: Api<GitOpsCluster> = Api::namespaced(hub.clone(), &ns_b);
    let secrets_a: Api<Secret> = Api::namespaced(hub.clone(), &ns_a);
    let secrets_b: Api<Secret> = Api::namespaced(hub.clone(), &ns_b);
    let cluster_secret = format!("cluster-{cluster}");

    // 1. Naming no Argo CD namespace, as upstream's: the principal serving the GitOpsCluster's
    //    namespace (a's) claims and onboards it; b neither claims nor registers the cluster.
    let ga = onboard_by_a(&hub, (&ns_a, &a), &cluster, &site).await?;
    assert_eq!(finalizers(&ga), [fin(&ns_a)], "claimed by a alone");
    wait_until("a's cluster Secret", WAIT, || async {
        Ok::<_, kube::Error>(secrets_a.get_opt(&cluster_secret).await?.map(|_| ()))
    })
    .await?;

    // 2. A namespace no principal serves: a (home of the GitOpsCluster's namespace) reports it
    //    with multicloud-integrations' condition and claims nothing.
    gocs_a
        .create(
            &PostParams::default(),
            &gitopscluster(&ns_a, "typo", "pa", Some("no-such-argocd"), a.grpc_port)?,
        )
        .await?;
    let typo = wait_until("the unserved namespace reported", WAIT, || async {
        let g = gocs_a.get("typo").await?;
        Ok::<_, kube::Error>(
            condition(&g, "ArgoServerVerified")
                .is_some_and(|c| c.0 == "False" && c.1 == "ArgoServerNotFound")
                .then_some(g),
        )
    })
    .await?;
    assert!(finalizers(&typo).is_empty(), "{:?}", finalizers(&typo));
    assert!(condition(&typo, "ArgoServerVerified")
        .unwrap()
        .2
        .contains("no-such-argocd"));
    gocs_a.delete("typo", &DeleteParams::default()).await?;

    // 2b. One naming b's namespace, created while b is paused (as between its restart and its
    //     first pass): a, its home, gives b time to claim it and never reports it unserved; b
    //     claims it once it runs again. Every status revision is watched from before it exists.
    let revisions = watch_revisions(&gocs_a, "toward-b", "ArgoServerVerified");
    b.process.pause();
    let paused = async {
        gocs_a
            .create(
                &PostParams::default(),
                &gitopscluster(&ns_a, "toward-b", "nowhere", Some(&ns_b), b.grpc_port)?,
            )
            .await?;
        wait_until("a to wait for toward-b's principal", WAIT, || async {
            let waiting = a.process.log().lines().any(|l| {
                l.contains("waiting for its principal to claim it") && l.contains("toward-b")
            });
            Ok::<_, kube::Error>(waiting.then_some(()))
        })
        .await
    }
    .await;
    b.process.resume();
    paused?;
    let claimed = wait_until("b claims toward-b and writes its status", WAIT, || async {
        let g = gocs_a.get("toward-b").await?;
        let claimed =
            finalizers(&g) == [fin(&ns_b)] && condition(&g, "PlacementResolved").is_some();
        Ok::<_, kube::Error>(claimed.then_some(g))
    })
    .await?;
    let reasons = revisions
        .until(
            claimed
                .metadata
                .resource_version
                .as_deref()
                .unwrap_or_default(),
        )
        .await?;
    assert!(
        !reasons.iter().flatten().any(|r| r == "ArgoServerNotFound"),
        "a reported a GitOpsCluster its principal was about to claim: {reasons:?}"
    );
    gocs_a.delete("toward-b", &DeleteParams::default()).await?;

    // 3. b's GitOpsCluster, younger, selects the same cluster: ga keeps it, gb reports the
    //    conflict naming ga, and b writes nothing for the cluster.
    let gb = contest_by_b(&hub, &ga, (&ns_b, &b), &site).await?;
    let message = condition(&gb, "ClustersRegistered").unwrap().2;
    assert!(message.contains(&format!("{ns_a}/ga")), "{message}");
    assert!(gb
        .status
        .as_ref()
        .unwrap()
        .clusters
        .iter()
        .any(|c| c.name == cluster && c.phase == "Conflict"));
    assert!(
        by(
            Api::<ManifestWork>::namespaced(hub.clone(), &cluster)
                .get_opt(AGENT_WORK_NAME)
                .await?
                .as_ref(),
            &ns_a
        ),
        "the agent ManifestWork stays a's"
    );
    assert!(secrets_b.get_opt(&cluster_secret).await?.is_none());

    // 4. The winner goes: a offboards the cluster, b takes it over.
    gocs_a.delete("ga", &DeleteParams::default()).await?;
    let work = wait_agent_work(&hub, &cluster, "b's agent ManifestWork", |w| by(w, &ns_b)).await?;
    assert_eq!(work.map(|w| w.1), Some(format!("{ns_b}/gb")));
    wait_until("the cluster Secret moved from a to b", WAIT, || async {
        let moved = secrets_a.get_opt(&cluster_secret).await?.is_none()
            && secrets_b.get_opt(&cluster_secret).await?.is_some();
        Ok::<_, kube::Error>(moved.then_some(()))
    })
    .await?;

    // 5. gb moves to a's Argo CD namespace: b removes what it made and releases its claim; a
    //    claims gb and onboards the cluster.
    gocs_b
        .patch(
            "gb",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"argoServer": {"argoNamespace": ns_a}}})),
        )
        .await?;
    let work = wait_agent_work(&hub, &cluster, "a's agent ManifestWork for gb", |w| {
        by(w, &ns_a)
    })
    .await?;
    assert_eq!(work.map(|w| w.1), Some(format!("{ns_b}/gb")));
    wait_until("b's objects gone and its claim released", WAIT, || async {
        let gb = gocs_b.get("gb").await?;
        let done = secrets_b.get_opt(&cluster_secret).await?.is_none()
            && secrets_a.get_opt(&cluster_secret).await?.is_some()
            && finalizers(&gb) == [fin(&ns_a)];
        Ok::<_, kube::Error>(done.then_some(()))
    })
    .await?;

    gocs_b.delete("gb", &DeleteParams::default()).await?;
    wait_agent_work(&hub, &cluster, "the cluster offboarded", |w| w.is_none()).await?;
    drop((a, b));
    Ok(())
}

/// How long a dead principal's claim is watched holding: beyond its operator Lease (15 s), by
/// which a claim that expired with its Lease would have been taken over.
const DEAD_HOLD: Duration = Duration::from_secs(25);

/// A claim does not expire: a killed principal's older GitOpsCluster keeps the cluster (its Lease
/// lapses, nothing moves), while the other principal's GitOpsCluster reports the conflict with
/// the claim to release. Released by hand as the status says (the GitOpsCluster deleted, the dead
/// principal's finalizer removed), the cluster is taken over: the agent ManifestWork the dead
/// principal left is adopted in place (same object: the spoke's agent is updated, not removed).
#[tokio::test]
async fn a_dead_principals_claim_keeps_its_cluster_until_released_by_hand_then_the_other_takes_it_over(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    shared_ocm_hub().await;
    let ctx = TestContext::new("dead_principal")?;
    let hub = planes.hub.client().await?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let ((ns_a, mut a), (ns_b, b)) = two_principals(&ctx, &pki).await?;
    let claim = format!("{FINALIZER}-{ns_a}");
    let (cluster, site) = (ctx.unique("c"), ctx.unique("site"));
    managed_cluster(&hub, &cluster, &site).await?;
    ensure_namespace(&hub, &cluster).await?;
    let gocs_a: Api<GitOpsCluster> = Api::namespaced(hub.clone(), &ns_a);
    let gocs_b: Api<GitOpsCluster> = Api::namespaced(hub.clone(), &ns_b);
    let ga = onboard_by_a(&hub, (&ns_a, &a), &cluster, &site).await?;
    let works: Api<ManifestWork> = Api::namespaced(hub.clone(), &cluster);
    let uid = works.get(AGENT_WORK_NAME).await?.metadata.uid;
    contest_by_b(&hub, &ga, (&ns_b, &b), &site).await?;

    // a dies. Long past its Lease, ga keeps the cluster: a's ManifestWork stays, gb waits.
    a.process.kill();
    let killed = std::time::Instant::now();
    let held = wait_until(
        &format!("{DEAD_HOLD:?} after a's death with its claim holding"),
        DEAD_HOLD + WAIT,
        || async {
            let work = works.get_opt(AGENT_WORK_NAME).await?;
            let gb = gocs_b.get("gb").await?;
            if !by(work.as_ref(), &ns_a) || work.and_then(|w| w.metadata.uid) != uid {
                return Ok::<_, kube::Error>(Some(Err("a's agent ManifestWork was taken over")));
            }
            if !in_conflict(&gb) {
                return Ok(Some(Err("gb stopped reporting the conflict")));
            }
            Ok((killed.elapsed() >= DEAD_HOLD).then_some(Ok(gb)))
        },
    )
    .await?;
    let gb = held.map_err(|why| anyhow::anyhow!("a dead principal's claim expired: {why}"))?;
    let message = gb
        .status
        .as_ref()
        .and_then(|s| s.clusters.iter().find(|c| c.name == cluster))
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("does not expire")
            && message.contains(&claim)
            && message.contains(&format!("kubectl -n {ns_a} delete gitopscluster ga")),
        "gb says how to release the dead principal's claim: {message}"
    );

    // Released by hand as the status says: b adopts the work a left and registers the cluster.
    gocs_a.delete("ga", &DeleteParams::default()).await?;
    gocs_a
        .patch(
            "ga",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    let work = wait_agent_work(&hub, &cluster, "b's agent ManifestWork", |w| by(w, &ns_b)).await?;
    assert_eq!(work.map(|w| w.1), Some(format!("{ns_b}/gb")));
    assert_eq!(
        works.get(AGENT_WORK_NAME).await?.metadata.uid,
        uid,
        "adopted in place, not re-created"
    );
    wait_until("gb registers the cluster", WAIT, || async {
        let gb = gocs_b.get("gb").await?;
        let registered = condition(&gb, "ClustersRegistered").is_some_and(|c| c.0 == "True");
        let secret = Api::<Secret>::namespaced(hub.clone(), &ns_b)
            .get_opt(&format!("cluster-{cluster}"))
            .await?;
        Ok::<_, kube::Error>((registered && secret.is_some()).then_some(()))
    })
    .await?;
    gocs_b.delete("gb", &DeleteParams::default()).await?;
    wait_agent_work(&hub, &cluster, "the cluster offboarded", |w| w.is_none()).await?;
    drop((a, b));
    Ok(())
}

/// Each principal's pull model handles the Applications of its own Argo CD namespaces only: an
/// Application in a's namespace is wrapped by a alone (b's log never names it), one in a
/// namespace neither serves by nobody.
#[tokio::test]
async fn each_principals_pull_model_handles_only_its_argo_cd_namespaces_applications(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let ctx = TestContext::new("pull_principals")?;
    let hub = planes.hub.client().await?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let ((ns_a, a), (_, b)) = two_principals(&ctx, &pki).await?;
    let nobody = ctx.unique("apps");
    ensure_namespace(&hub, &nobody).await?;
    let cluster = ctx.unique("c");
    let clusters: Api<DynamicObject> = Api::all_with(
        hub.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1", "ManagedCluster"),
            "managedclusters",
        ),
    );
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
                "metadata": {"name": cluster}, "spec": {"hubAcceptsClient": true}}))?,
        )
        .await?;
    ensure_namespace(&hub, &cluster).await?;
    let application = |name: &str, ns: &str| -> anyhow::Result<DynamicObject> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {"apps.open-cluster-management.io/pull-to-ocm-managed-cluster": "true"},
                         "annotations": {"apps.open-cluster-management.io/ocm-managed-cluster": cluster,
                                         "argocd.argoproj.io/skip-reconcile": "true"}},
            "spec": {"project": "default",
                     "source": {"repoURL": "https://github.com/argoproj/argocd-example-apps.git",
                                "path": "guestbook", "targetRevision": "HEAD"},
                     "destination": {"name": cluster, "namespace": "guestbook"}}
        }))?)
    };
    let apps = |ns: &str| {
        Api::<DynamicObject>::namespaced_with(
            hub.clone(),
            ns,
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
                "applications",
            ),
        )
    };
    // The unserved one first: handled, it would be wrapped before the other.
    apps(&nobody)
        .create(&PostParams::default(), &application("stray", &nobody)?)
        .await?;
    apps(&ns_a)
        .create(&PostParams::default(), &application("mine", &ns_a)?)
        .await?;
    let works: Api<ManifestWork> = Api::namespaced(hub.clone(), &cluster);
    let hub_namespace = |w: &ManifestWork| {
        w.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("apps.open-cluster-management.io/hub-application-namespace"))
            .cloned()
            .unwrap_or_default()
    };
    wait_until("a's Application wrapped", WAIT, || async {
        let listed = works.list(&Default::default()).await?.items;
        Ok::<_, kube::Error>(
            listed
                .iter()
                .any(|w| hub_namespace(w) == ns_a)
                .then_some(()),
        )
    })
    .await?;
    let listed = works.list(&Default::default()).await?.items;
    assert!(
        listed.iter().all(|w| hub_namespace(w) == ns_a),
        "only a's Application is wrapped: {:?}",
        listed.iter().map(hub_namespace).collect::<Vec<_>>()
    );
    let applied = |log: &str, app: &str| {
        log.lines()
            .any(|l| l.contains("ManifestWork applied") && l.contains(app))
    };
    let mine = format!("{ns_a}/mine");
    assert!(applied(&a.process.log(), &mine), "a wrapped {mine}");
    assert!(!applied(&b.process.log(), &mine), "b left {mine} alone");
    drop((a, b));
    Ok(())
}
