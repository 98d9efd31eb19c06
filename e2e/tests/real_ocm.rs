//! Real Open Cluster Management, each piece proven on its own: a spoke joins through OCM's own
//! registration flow (CSR created by the klusterlet, approved by the hub registration controller,
//! signed by kube-controller-manager's signer with the hub's client CA); the placement controller
//! decides a Placement; the work agent applies a ManifestWork and reports its conditions and status
//! feedback; and the hub taints a cluster whose klusterlet went away and clears the taint when it
//! is back. Then the operator's pull model with all of it real: a hub Application opted into the
//! pull model (controllers of `e2e::pull_model`) is applied on a spoke by the work agent, synced
//! there by real Argo CD from the local Git server, and its status comes back to the hub through
//! the work agent's feedback, a sync requested on the hub runs exactly once there, and a refresh
//! asked on the hub with the `argocd` CLI (a real argocd-server on the hub) reaches the spoke's
//! Argo CD once each time and is cleared on the hub; an
//! ApplicationSet over an OCM Placement (Argo CD's real ApplicationSet controller, the
//! `clusterDecisionResource` generator as upstream documents it) pulled to two clusters, each
//! synced by its own Argo CD, and its MulticlusterApplicationSetReport filled from the work
//! agents' feedback (per-cluster operation, revision, sync and health, and the resources); and one
//! with a two-step `RollingSync` (the controller's progressive syncs on), each step's sync carried
//! to its spoke by the pull model, the second only once the first is Healthy. And the
//! manifest-wrapping plugin (`charts/cmp/plugin.yaml`, `argocd-agentctl wrap`) run by Argo CD's
//! real argocd-cmp-server beside the hub's repo-server: the hub's Argo CD applies the ManifestWork
//! it renders, the work agent delivers it to a spoke without Argo CD. Tests write
//! only what a user writes (Placements, bindings, ManifestWorks, Applications, an ApplicationSet
//! and its generator's ConfigMap, an operation, a pre-created ManagedCluster's spec and labels; a
//! refresh is asked through argocd-server);
//! every status, decision, generated Application, namespace and taint checked here is OCM's or
//! Argo CD's.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_agent_kube::argocd::{
    Application, ApplicationSet, ApplicationSetApplicationStatus, StatusOf,
};
use argocd_agent_operator::pull::application::{
    APP_NAMESPACE_ANNOTATION, CLUSTER_ANNOTATION, PULL_LABEL, SKIP_RECONCILE_ANNOTATION,
};
use argocd_agent_operator::pull::cluster_secret::cluster_secret_name;
use argocd_agent_operator::pull::manifestwork::manifest_work_name;
use argocd_agent_operator::pull::report::MulticlusterApplicationSetReport;
use argocd_agent_proto::event::{HYDRATE_ANNOTATION, REFRESH_ANNOTATION};
use e2e::argocd::{ArgoCd, RedisEndpoint};
use e2e::gateway::{application_resource, ensure_namespace};
use e2e::git_server::{demo_manifests, GitServer};
use e2e::ocm::{
    condition_is, create_label_placement, manifest_work_resource, placement_decision_resource,
    placement_resource, shared_ocm_hub, wait_cluster_available, wait_cluster_taint, Klusterlet,
    KlusterletOptions, OcmHub, AGENT_NAMESPACE, CONDITION_AVAILABLE, PLACEMENT_LABEL,
    UNREACHABLE_TAINT,
};
use e2e::process::print_log_tail;
use e2e::scenario::{demo_application, sync_state, wait_greeting, SYNC_WAIT};
use e2e::{shared_planes, wait_until, Redis, SharedPlanes, TestContext};
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::{json, Value};

/// A join takes a few seconds (CSR round trip, then the first health check); generous for a
/// loaded 2-core machine running every test of this binary at once.
const JOIN_WAIT: Duration = Duration::from_secs(90);
/// Everything after the join reacts within a status-sync or lease period (1-2 s).
const REACT_WAIT: Duration = Duration::from_secs(45);

/// The shared planes and the OCM hub on them.
async fn ocm() -> (&'static SharedPlanes, &'static OcmHub) {
    (shared_planes().await, shared_ocm_hub().await)
}

/// Prints the OCM hub controllers' and the test's klusterlets' logs when dropped before
/// [`passed`](FailureLogs::passed), i.e. when the test fails by panic or by `?`.
struct FailureLogs {
    hub: &'static OcmHub,
    klusterlets: Vec<(String, PathBuf)>,
    passed: bool,
}

impl FailureLogs {
    fn new(hub: &'static OcmHub) -> Self {
        Self {
            hub,
            klusterlets: Vec::new(),
            passed: false,
        }
    }

    fn watch(&mut self, klusterlet: &Klusterlet) {
        self.klusterlets.push((
            format!("klusterlet-{}", klusterlet.cluster_name),
            klusterlet.log_path().to_path_buf(),
        ));
    }

    fn passed(mut self) {
        self.passed = true;
    }
}

impl Drop for FailureLogs {
    fn drop(&mut self) {
        if !self.passed {
            self.hub.print_logs(30);
            for (name, log) in &self.klusterlets {
                print_log_tail(name, log, 40);
            }
        }
    }
}

#[tokio::test]
async fn spoke_joins_through_the_real_registration_flow() -> anyhow::Result<()> {
    let (planes, ocm_hub) = ocm().await;
    let mut logs = FailureLogs::new(ocm_hub);
    let ctx = TestContext::new("ocm-join")?;
    let name = ctx.unique("join");
    let spoke = &planes.spokes[0];
    let hub = planes.hub.client().await?;
    let started = Instant::now();
    let klusterlet = Klusterlet::start(&name, spoke, &planes.hub, &ctx.dir).await?;
    logs.watch(&klusterlet);
    let cluster = wait_cluster_available(&hub, &name, JOIN_WAIT).await?;
    eprintln!(
        "[ocm] {name} joined and Available in {:.1?}",
        started.elapsed()
    );

    // Created by the agent, accepted by the hub's auto-approval (not by this test).
    assert_eq!(cluster.data["spec"]["hubAcceptsClient"], true);
    let annotations = cluster.metadata.annotations.clone().unwrap_or_default();
    assert!(
        annotations.contains_key("open-cluster-management.io/automatically-accepted-on"),
        "the hub did not record its automatic acceptance: {annotations:?}"
    );
    assert_eq!(
        cluster.data["spec"]["managedClusterClientConfigs"][0]["url"],
        spoke.url.as_str(),
        "the agent reports the spoke's apiserver URL"
    );

    // The hub made the cluster's namespace.
    let namespaces: Api<Namespace> = Api::all(hub.clone());
    assert!(
        namespaces.get_opt(&name).await?.is_some(),
        "the hub did not create namespace {name}"
    );

    // The agent's CSR: approved by OCM, signed by kube-controller-manager's signer.
    let csrs: Api<CertificateSigningRequest> = Api::all(hub.clone());
    let listed = csrs
        .list(
            &ListParams::default()
                .labels(&format!("open-cluster-management.io/cluster-name={name}")),
        )
        .await?;
    let csr = listed
        .items
        .first()
        .ok_or_else(|| anyhow::anyhow!("no CSR of cluster {name} on the hub"))?;
    assert_eq!(csr.spec.signer_name, "kubernetes.io/kube-apiserver-client");
    assert_eq!(
        csr.spec.username.as_deref(),
        Some("admin"),
        "bootstrap identity"
    );
    let status = csr.status.clone().unwrap_or_default();
    assert!(
        status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Approved" && c.status == "True"),
        "CSR not approved"
    );
    assert!(
        status.certificate.is_some_and(|c| !c.0.is_empty()),
        "CSR not signed"
    );

    // The hub apiserver authenticates the issued certificate (signed by its client CA) as the
    // cluster's agent.
    let reviews: Api<SelfSubjectReview> = Api::all(klusterlet.hub_client(&planes.hub).await?);
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:open-cluster-management:{name}:{name}-agent").as_str())
    );
    let groups = user.groups.unwrap_or_default();
    assert!(
        groups.contains(&format!("system:open-cluster-management:{name}")),
        "{groups:?}"
    );

    // The agent keeps the hub kubeconfig it earned on the spoke.
    let secrets: Api<Secret> = Api::namespaced(spoke.client().await?, AGENT_NAMESPACE);
    let secret = secrets.get(&format!("hub-kubeconfig-{name}")).await?;
    let data = secret.data.unwrap_or_default();
    for key in ["kubeconfig", "tls.crt", "tls.key", "cluster-name"] {
        assert!(data.contains_key(key), "hub kubeconfig secret lacks {key}");
    }
    logs.passed();
    Ok(())
}

#[tokio::test]
async fn placement_is_decided_by_the_real_placement_controller() -> anyhow::Result<()> {
    let (planes, ocm_hub) = ocm().await;
    let mut logs = FailureLogs::new(ocm_hub);
    let ctx = TestContext::new("ocm-placement")?;
    let name = ctx.unique("placed");
    let hub = planes.hub.client().await?;
    // Only this test's cluster carries the label the Placement requires, so clusters other tests
    // join meanwhile stay out of the decision.
    let options = KlusterletOptions {
        labels: vec![("e2e.argocd-agent.io/test".into(), ctx.suffix.clone())],
        ..Default::default()
    };
    let klusterlet =
        Klusterlet::start_with(&name, &planes.spokes[1], &planes.hub, &ctx.dir, &options).await?;
    logs.watch(&klusterlet);
    wait_cluster_available(&hub, &name, JOIN_WAIT).await?;

    let ns = ctx.unique("placement");
    create_label_placement(
        &hub,
        &ns,
        "fleet",
        ("e2e.argocd-agent.io/test", &ctx.suffix),
    )
    .await?;
    let placements: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &ns, &placement_resource());

    let decisions: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &ns, &placement_decision_resource());
    let decided = wait_until(
        &format!("a PlacementDecision of {ns}/fleet selecting {name}"),
        REACT_WAIT,
        || async {
            let list = decisions
                .list(&ListParams::default().labels(&format!("{PLACEMENT_LABEL}=fleet")))
                .await?;
            let clusters: Vec<String> = list.items.iter().flat_map(decision_clusters).collect();
            Ok::<_, kube::Error>((clusters == [name.clone()]).then_some(list.items))
        },
    )
    .await?;
    // The decision belongs to the Placement (written by the placement controller, not by us).
    let owner = decided[0]
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert!(
        owner
            .iter()
            .any(|o| o.kind == "Placement" && o.name == "fleet"),
        "PlacementDecision not owned by its Placement: {owner:?}"
    );
    let placement = wait_until("Placement fleet status", REACT_WAIT, || async {
        let p = placements.get("fleet").await?;
        let selected = p.data.pointer("/status/numberOfSelectedClusters").cloned();
        Ok::<_, kube::Error>(
            (selected == Some(json!(1)) && condition_is(&p, "PlacementSatisfied", "True"))
                .then_some(p),
        )
    })
    .await?;
    assert_eq!(placement.data["status"]["numberOfSelectedClusters"], 1);
    logs.passed();
    Ok(())
}

/// The cluster names of a PlacementDecision's `status.decisions`.
fn decision_clusters(decision: &DynamicObject) -> Vec<String> {
    decision
        .data
        .pointer("/status/decisions")
        .and_then(Value::as_array)
        .map(|ds| {
            ds.iter()
                .filter_map(|d| d["clusterName"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A ManifestWork carrying one ConfigMap (`default/<cm>` with `greeting`) and a JSONPaths feedback
/// rule reporting that greeting back.
fn greeting_work(name: &str, namespace: &str, cm: &str, greeting: &str) -> Value {
    json!({
        "apiVersion": "work.open-cluster-management.io/v1",
        "kind": "ManifestWork",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "workload": {"manifests": [{
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": cm, "namespace": "default"},
                "data": {"greeting": greeting},
            }]},
            "manifestConfigs": [{
                "resourceIdentifier": {
                    "group": "", "resource": "configmaps", "namespace": "default", "name": cm,
                },
                "feedbackRules": [{
                    "type": "JSONPaths",
                    "jsonPaths": [{"name": "greeting", "path": ".data.greeting"}],
                }],
            }],
        },
    })
}

/// The `greeting` status feedback value of a ManifestWork's first manifest, if reported.
fn feedback_greeting(work: &DynamicObject) -> Option<String> {
    work.data
        .pointer("/status/resourceStatus/manifests/0/statusFeedback/values")?
        .as_array()?
        .iter()
        .find(|v| v["name"] == "greeting")
        .filter(|v| v["fieldValue"]["type"] == "String")
        .and_then(|v| v["fieldValue"]["string"].as_str().map(str::to_string))
}

/// Waits until the ManifestWork is Applied and Available (work and manifest) with feedback
/// `greeting`, and the spoke's ConfigMap says it too.
async fn wait_work_reports(
    works: &Api<DynamicObject>,
    spoke_cms: &Api<ConfigMap>,
    name: &str,
    cm: &str,
    greeting: &str,
) -> anyhow::Result<DynamicObject> {
    let work = wait_until(
        &format!("ManifestWork {name} Applied, Available, feedback greeting={greeting}"),
        REACT_WAIT,
        || async {
            let w = works.get(name).await?;
            let manifest_ok = w
                .data
                .pointer("/status/resourceStatus/manifests/0/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| {
                    ["Applied", "Available"]
                        .iter()
                        .all(|t| cs.iter().any(|c| c["type"] == *t && c["status"] == "True"))
                });
            let ok = condition_is(&w, "Applied", "True")
                && condition_is(&w, "Available", "True")
                && manifest_ok
                && feedback_greeting(&w).as_deref() == Some(greeting);
            Ok::<_, kube::Error>(ok.then_some(w))
        },
    )
    .await?;
    let on_spoke = spoke_cms.get(cm).await?;
    assert_eq!(
        on_spoke
            .data
            .unwrap_or_default()
            .get("greeting")
            .map(String::as_str),
        Some(greeting),
        "the spoke's ConfigMap"
    );
    Ok(work)
}

#[tokio::test]
async fn manifest_work_is_applied_by_the_real_work_agent_with_status_feedback() -> anyhow::Result<()>
{
    let (planes, ocm_hub) = ocm().await;
    let mut logs = FailureLogs::new(ocm_hub);
    let ctx = TestContext::new("ocm-work")?;
    let name = ctx.unique("work");
    let spoke = &planes.spokes[0];
    let hub = planes.hub.client().await?;
    let klusterlet = Klusterlet::start(&name, spoke, &planes.hub, &ctx.dir).await?;
    logs.watch(&klusterlet);
    wait_cluster_available(&hub, &name, JOIN_WAIT).await?;

    // ManifestWorks live in the cluster's hub namespace, which OCM created.
    let works: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &name, &manifest_work_resource());
    let spoke_cms: Api<ConfigMap> = Api::namespaced(spoke.client().await?, "default");
    let cm = ctx.unique("greeting");
    let started = Instant::now();
    works
        .create(
            &PostParams::default(),
            &serde_json::from_value(greeting_work("greeting", &name, &cm, "hello"))?,
        )
        .await?;
    let work = wait_work_reports(&works, &spoke_cms, "greeting", &cm, "hello").await?;
    eprintln!(
        "[ocm] ManifestWork applied and reported in {:.1?}",
        started.elapsed()
    );
    let finalizers = work.metadata.finalizers.clone().unwrap_or_default();
    assert!(
        finalizers
            .contains(&"cluster.open-cluster-management.io/manifest-work-cleanup".to_string()),
        "the work agent did not add its cleanup finalizer: {finalizers:?}"
    );

    // A changed manifest is re-applied and its feedback follows.
    works
        .patch(
            "greeting",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"workload": greeting_work("greeting", &name, &cm, "bonjour")["spec"]["workload"]}})),
        )
        .await?;
    wait_work_reports(&works, &spoke_cms, "greeting", &cm, "bonjour").await?;

    // Deleting the work removes what it applied, then the agent releases the work.
    works.delete("greeting", &DeleteParams::default()).await?;
    wait_until(
        "the work agent to delete the ConfigMap and release the ManifestWork",
        REACT_WAIT,
        || async {
            let gone = spoke_cms.get_opt(&cm).await?.is_none()
                && works.get_opt("greeting").await?.is_none();
            Ok::<_, kube::Error>(gone.then_some(()))
        },
    )
    .await?;
    logs.passed();
    Ok(())
}

#[tokio::test]
async fn stopped_klusterlet_is_tainted_unreachable_and_restart_clears_it() -> anyhow::Result<()> {
    let (planes, ocm_hub) = ocm().await;
    let mut logs = FailureLogs::new(ocm_hub);
    let ctx = TestContext::new("ocm-offline")?;
    let name = ctx.unique("offline");
    let hub = planes.hub.client().await?;
    // A 1 s lease: the hub declares the cluster gone 5 lease periods after the last renewal.
    let options = KlusterletOptions {
        lease_duration_seconds: Some(1),
        ..Default::default()
    };
    let mut klusterlet =
        Klusterlet::start_with(&name, &planes.spokes[1], &planes.hub, &ctx.dir, &options).await?;
    logs.watch(&klusterlet);
    wait_cluster_available(&hub, &name, JOIN_WAIT).await?;

    klusterlet.stop();
    let stopped = Instant::now();
    let cluster = wait_cluster_taint(&hub, &name, UNREACHABLE_TAINT, true, REACT_WAIT).await?;
    eprintln!(
        "[ocm] {name} tainted unreachable {:.1?} after its klusterlet stopped",
        stopped.elapsed()
    );
    assert!(
        condition_is(&cluster, CONDITION_AVAILABLE, "Unknown"),
        "an unreachable cluster's availability is Unknown"
    );

    klusterlet.start_again()?;
    let restarted = Instant::now();
    wait_cluster_taint(&hub, &name, UNREACHABLE_TAINT, false, REACT_WAIT).await?;
    wait_cluster_available(&hub, &name, REACT_WAIT).await?;
    eprintln!(
        "[ocm] {name} Available again {:.1?} after restart",
        restarted.elapsed()
    );

    // The restarted agent reused its certificate: still exactly one CSR for the cluster.
    let csrs: Api<CertificateSigningRequest> = Api::all(hub.clone());
    let listed = csrs
        .list(
            &ListParams::default()
                .labels(&format!("open-cluster-management.io/cluster-name={name}")),
        )
        .await?;
    assert_eq!(listed.items.len(), 1, "a restart must not register anew");
    logs.passed();
    Ok(())
}

/// The ground of a single-cluster pull test: the pull-model controllers on the shared planes, a
/// klusterlet joined as cluster `<label>-…`, the spoke's Argo CD, the destination and hub
/// namespaces, and a Git server with the demo app at v1. Its `logs` print the OCM logs unless
/// the test passed.
struct PullGround {
    planes: &'static SharedPlanes,
    logs: FailureLogs,
    ctx: TestContext,
    cluster: String,
    spoke: &'static e2e::ControlPlane,
    hub: kube::Client,
    spoke_client: kube::Client,
    spoke_ns: String,
    dest: String,
    hub_ns: String,
    argocd: ArgoCd,
    git: GitServer,
    klusterlet: Klusterlet,
}

impl PullGround {
    async fn start(test: &str, label: &str) -> anyhow::Result<PullGround> {
        let (planes, ocm_hub) = ocm().await;
        e2e::pull_model::start_controllers(planes).await?;
        let mut logs = FailureLogs::new(ocm_hub);
        let ctx = TestContext::new(test)?;
        let cluster = ctx.unique(label);
        let spoke = &planes.spokes[0];
        let hub = planes.hub.client().await?;
        let spoke_client = spoke.client().await?;
        let klusterlet = Klusterlet::start(&cluster, spoke, &planes.hub, &ctx.dir).await?;
        logs.watch(&klusterlet);
        let (spoke_ns, dest, hub_ns) =
            (ctx.unique("argocd"), ctx.unique("demo"), ctx.unique("apps"));
        let argocd = ArgoCd::start_spoke(&ctx.suffix, &ctx.dir, spoke, &spoke_ns, &[]).await?;
        ensure_namespace(&spoke_client, &dest).await?;
        ensure_namespace(&hub, &hub_ns).await?;
        let git = GitServer::start(&ctx.unique("git"))?;
        git.commit("apps", "demo", &demo_manifests("v1"), "demo v1")?;
        wait_cluster_available(&hub, &cluster, JOIN_WAIT).await?;
        Ok(PullGround {
            planes,
            logs,
            ctx,
            cluster,
            spoke,
            hub,
            spoke_client,
            spoke_ns,
            dest,
            hub_ns,
            argocd,
            git,
            klusterlet,
        })
    }
}

/// The hub's `demo` Application (the local Git server's demo app, automated sync) opted into the
/// pull model for `cluster`, to run in Argo CD namespace `spoke_ns` there and deploy into `dest`.
fn pulled_demo_application(
    hub_ns: &str,
    repo_url: &str,
    cluster: &str,
    spoke_ns: &str,
    dest: &str,
) -> DynamicObject {
    let mut app = demo_application(
        "demo",
        hub_ns,
        repo_url,
        json!({"name": cluster, "namespace": dest}),
    );
    app.metadata.labels = Some([(PULL_LABEL.to_string(), "true".to_string())].into());
    app.metadata.annotations = Some(
        [
            (CLUSTER_ANNOTATION, cluster),
            (APP_NAMESPACE_ANNOTATION, spoke_ns),
            (SKIP_RECONCILE_ANNOTATION, "true"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
    );
    // Argo CD on the spoke deletes the app's resources before the Application (in the background:
    // no garbage collector runs here).
    app.metadata.finalizers = Some(vec![
        "resources-finalizer.argocd.argoproj.io/background".to_string()
    ]);
    app
}

/// `status.operationState.startedAt` of an Application as JSON.
fn operation_started_at(app: &Value) -> String {
    app.pointer("/status/operationState/startedAt")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn pulled_application_is_applied_by_the_real_work_agent_synced_by_real_argocd_and_reported_on_the_hub(
) -> anyhow::Result<()> {
    let PullGround {
        logs,
        ctx: _ctx,
        cluster,
        spoke,
        hub,
        spoke_client,
        spoke_ns,
        dest,
        hub_ns,
        argocd,
        git,
        klusterlet: _klusterlet,
        ..
    } = PullGround::start("ocm-pull", "pull").await?;
    let argocd_logs = || argocd.log_tails(20);

    // The hub Application is wrapped into a ManifestWork, which the real work agent applies on
    // the spoke, where the real Argo CD syncs it; the work agent's feedback of the spoke
    // Application's status reaches the hub Application.
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &hub_ns, &application_resource());
    let created = hub_apps
        .create(
            &PostParams::default(),
            &pulled_demo_application(&hub_ns, &git.url("apps"), &cluster, &spoke_ns, &dest),
        )
        .await?;
    let work_name = manifest_work_name("demo", created.metadata.uid.as_deref().unwrap_or_default());
    let started = Instant::now();
    wait_greeting(spoke, &dest, "v1")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
    let reported = |what: &'static str, after: String| {
        let hub_apps = hub_apps.clone();
        let argocd_logs = &argocd_logs;
        async move {
            wait_until(what, SYNC_WAIT, || async {
                let app = serde_json::to_value(hub_apps.get("demo").await?)?;
                let (sync, health, _) = sync_state(&app);
                let phase = app.pointer("/status/operationState/phase");
                let done = sync == "Synced"
                    && health == "Healthy"
                    && phase == Some(&json!("Succeeded"))
                    && operation_started_at(&app) > after;
                Ok::<_, anyhow::Error>(done.then_some(app))
            })
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))
        }
    };
    let first = reported(
        "the spoke's real Synced+Healthy and Succeeded sync on the hub Application",
        String::new(),
    )
    .await?;
    eprintln!(
        "[ocm] pulled Application synced on the spoke and reported on the hub in {:.1?}",
        started.elapsed()
    );
    let spoke_apps: Api<DynamicObject> =
        Api::namespaced_with(spoke_client.clone(), &spoke_ns, &application_resource());
    let spoke_app = serde_json::to_value(spoke_apps.get("demo").await?)?;
    assert_eq!(
        operation_started_at(&first),
        operation_started_at(&spoke_app),
        "the hub shows the spoke's sync"
    );

    // A new path set on the hub reaches the spoke through the work and is synced there.
    git.commit("apps", "demo2", &demo_manifests("v2"), "demo v2")?;
    hub_apps
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"path": "demo2"}}})),
        )
        .await?;
    wait_greeting(spoke, &dest, "v2")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
    reported(
        "the sync of the new path on the hub Application",
        operation_started_at(&first),
    )
    .await?;

    // Deleting the hub Application deletes the work; the work agent deletes the spoke's
    // Application, whose finalizer makes Argo CD delete what it deployed; the hub Application goes.
    hub_apps.delete("demo", &DeleteParams::default()).await?;
    let works: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &cluster, &manifest_work_resource());
    let spoke_cms: Api<ConfigMap> = Api::namespaced(spoke_client, &dest);
    wait_until(
        "work, spoke Application, its ConfigMap and hub Application gone",
        SYNC_WAIT,
        || async {
            let gone = works.get_opt(&work_name).await?.is_none()
                && spoke_apps.get_opt("demo").await?.is_none()
                && spoke_cms.get_opt("demo-config").await?.is_none()
                && hub_apps.get_opt("demo").await?.is_none();
            Ok::<_, kube::Error>(gone.then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
    logs.passed();
    Ok(())
}

/// `status.history` of an Application as JSON: one entry per sync Argo CD completed.
fn sync_history(app: &Value) -> Vec<Value> {
    app.pointer("/status/history")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn sync_requested_on_the_hub_runs_exactly_once_on_the_spoke_across_a_work_agent_reapply(
) -> anyhow::Result<()> {
    let PullGround {
        logs,
        ctx: _ctx,
        cluster,
        spoke,
        hub,
        spoke_client,
        spoke_ns,
        dest,
        hub_ns,
        argocd,
        git,
        klusterlet: _klusterlet,
        ..
    } = PullGround::start("ocm-pull-once", "once").await?;
    let argocd_logs = || argocd.log_tails(20);

    // A hub Application without automated sync: only the operation the test requests syncs it.
    let mut app = pulled_demo_application(&hub_ns, &git.url("apps"), &cluster, &spoke_ns, &dest);
    app.data["spec"]["syncPolicy"] = json!({"syncOptions": ["PrunePropagationPolicy=background"]});
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &hub_ns, &application_resource());
    let created = hub_apps.create(&PostParams::default(), &app).await?;
    let work_name = manifest_work_name("demo", created.metadata.uid.as_deref().unwrap_or_default());
    let works: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &cluster, &manifest_work_resource());
    let spoke_apps: Api<DynamicObject> =
        Api::namespaced_with(spoke_client.clone(), &spoke_ns, &application_resource());
    let spoke_app = || async {
        Ok::<_, anyhow::Error>(match spoke_apps.get_opt("demo").await? {
            Some(a) => Some(serde_json::to_value(a)?),
            None => None,
        })
    };
    wait_until(
        "the spoke's Argo CD to compare the pulled Application (OutOfSync, nothing synced)",
        SYNC_WAIT,
        || async {
            Ok::<_, anyhow::Error>(
                spoke_app()
                    .await?
                    .filter(|a| sync_state(a).0 == "OutOfSync"),
            )
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;

    // The user requests a sync on the hub, as `argocd app sync` does: it reaches the spoke
    // through the work, runs there, and the hub Application's `.operation` is cleared.
    let operation = json!({
        "initiatedBy": {"username": "e2e"},
        "sync": {"revision": "main", "syncOptions": ["PrunePropagationPolicy=background"]},
        "retry": {"limit": 5, "backoff": {"duration": "2s", "factor": 2, "maxDuration": "20s"}}
    });
    hub_apps
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"operation": operation})),
        )
        .await?;
    wait_greeting(spoke, &dest, "v1")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
    let synced = wait_until(
        "one completed sync on the spoke and the operation cleared on the hub",
        SYNC_WAIT,
        || async {
            let hub_app = serde_json::to_value(hub_apps.get("demo").await?)?;
            let Some(spoke) = spoke_app().await? else {
                return Ok(None);
            };
            let done = hub_app.get("operation").is_none()
                && spoke.get("operation").is_none()
                && spoke.pointer("/status/operationState/phase") == Some(&json!("Succeeded"));
            Ok::<_, anyhow::Error>(done.then_some(spoke))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
    assert_eq!(
        sync_history(&synced).len(),
        1,
        "exactly one sync ran: {}",
        synced["status"]["history"]
    );
    // Cleared on the hub, the operation leaves the payload with the next work the controller
    // writes.
    let work = wait_until(
        "the work's payload without the operation",
        REACT_WAIT,
        || async {
            let work = serde_json::to_value(works.get(&work_name).await?)?;
            let gone = work
                .pointer("/spec/workload/manifests/0/operation")
                .is_none();
            Ok::<_, anyhow::Error>(gone.then_some(work))
        },
    )
    .await?;
    assert_eq!(
        work.pointer("/spec/manifestConfigs/0/updateStrategy/serverSideApply/ignoreFields/0"),
        Some(&json!({"condition": "OnSpokeChange", "jsonPaths": [
            ".operation",
            r".metadata.annotations.argocd\.argoproj\.io/refresh",
            r".metadata.annotations.argocd\.argoproj\.io/hydrate"
        ]})),
    );

    // A hub change makes the work agent apply the payload again. Had the payload kept the
    // operation, that same apply would have put `.operation` back on the spoke Application and
    // Argo CD would have synced a second time (a second history entry once done).
    hub_apps
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"e2e/reapplied": "yes"}}})),
        )
        .await?;
    let reapplied = wait_until(
        "the work agent to apply the changed payload on the spoke",
        REACT_WAIT,
        || async {
            Ok::<_, anyhow::Error>(spoke_app().await?.filter(|a| {
                a.pointer("/metadata/annotations/e2e~1reapplied") == Some(&json!("yes"))
            }))
        },
    )
    .await?;
    assert!(
        reapplied.get("operation").is_none(),
        "the re-apply requested the operation again: {}",
        reapplied["operation"]
    );
    assert_eq!(
        sync_history(&reapplied),
        sync_history(&synced),
        "no second sync ran"
    );
    assert_eq!(
        operation_started_at(&reapplied),
        operation_started_at(&synced),
        "the last operation is still the hub's one"
    );

    // The hub shows the spoke's sync, with upstream's feedback fields.
    let revision = synced
        .pointer("/status/sync/revision")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    assert!(!revision.is_empty(), "the spoke synced a revision");
    wait_until(
        "the spoke's operation phase, start and revision on the hub Application",
        REACT_WAIT,
        || async {
            let app = serde_json::to_value(hub_apps.get("demo").await?)?;
            let done = app.pointer("/status/operationState/phase") == Some(&json!("Succeeded"))
                && operation_started_at(&app) == operation_started_at(&synced)
                && app.pointer("/status/sync/revision") == Some(&json!(revision));
            Ok::<_, anyhow::Error>(done.then_some(()))
        },
    )
    .await?;

    hub_apps.delete("demo", &DeleteParams::default()).await?;
    wait_until("hub Application gone", SYNC_WAIT, || async {
        Ok::<_, kube::Error>(hub_apps.get_opt("demo").await?.is_none().then_some(()))
    })
    .await?;
    logs.passed();
    Ok(())
}

/// The annotations of Argo CD's refresh request on the spoke Application, and the test's re-apply
/// marker, as `key=value` pairs (`""` for none).
fn request_annotations(app: DynamicObject) -> String {
    let annotations = app.metadata.annotations.unwrap_or_default();
    [REFRESH_ANNOTATION, HYDRATE_ANNOTATION, REAPPLIED_ANNOTATION]
        .iter()
        .filter_map(|k| annotations.get(*k).map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(",")
}

/// What a hub change makes the work agent apply again on the spoke.
const REAPPLIED_ANNOTATION: &str = "e2e/reapplied";

/// A refresh asked on the hub with the real `argocd` CLI (`argocd app get --refresh`, twice, the
/// second right after the first returns) against a real argocd-server on the hub: argocd-server
/// writes the refresh and hydrate annotations on the hub Application and returns only once the
/// refresh annotation is gone from it, which in the pull model only the operator does. Each
/// request is put on the spoke Application once by the real work agent, consumed by the spoke's
/// real Argo CD (its controller logs the requested refresh and removes the annotations) and
/// cleared on the hub, so the next request is a change again and reaches the spoke too. A hub
/// change then makes the work agent apply the payload again, and that apply puts no request back;
/// a third request after it (`--hard-refresh`) is delivered as asked. Every version of the spoke
/// Application's request annotations is watched, so a request put back and consumed within a
/// moment is seen.
#[tokio::test]
async fn refresh_requested_on_the_hub_with_the_argocd_cli_reaches_the_spoke_once_and_is_cleared_on_the_hub(
) -> anyhow::Result<()> {
    let PullGround {
        planes,
        logs,
        ctx,
        cluster,
        spoke_client,
        hub,
        spoke_ns,
        dest,
        hub_ns,
        argocd,
        git,
        klusterlet: _klusterlet,
        ..
    } = PullGround::start("ocm-pull-refresh", "refresh").await?;
    // The hub's argocd-server (API and CLI) with a Redis of its own; no application controller
    // runs on the hub, as the pull model has it.
    let server_redis = Redis::start(&ctx.unique("hub-redis"))?;
    let server = ArgoCd::start_server(
        &ctx.suffix,
        &ctx.dir,
        &planes.hub,
        &ctx.unique("hub-argocd"),
        RedisEndpoint {
            address: server_redis.address(),
            password: None,
            tls_ca: None,
        },
    )
    .await?;
    let argocd_logs = || format!("{}\n{}", argocd.log_tails(20), server.log_tails(20));

    let spoke_apps: Api<DynamicObject> =
        Api::namespaced_with(spoke_client.clone(), &spoke_ns, &application_resource());
    let spoke_versions = Recorded::watch(
        spoke_apps.clone(),
        watcher::Config::default().fields("metadata.name=demo"),
        request_annotations,
    );
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &hub_ns, &application_resource());
    hub_apps
        .create(
            &PostParams::default(),
            &pulled_demo_application(&hub_ns, &git.url("apps"), &cluster, &spoke_ns, &dest),
        )
        .await?;
    wait_until(
        "the spoke's Argo CD to compare the pulled Application",
        SYNC_WAIT,
        || async {
            let app = spoke_apps.get_opt("demo").await?;
            let app = app.map(serde_json::to_value).transpose()?;
            Ok::<_, anyhow::Error>(app.filter(|a| sync_state(a).0 == "Synced"))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;

    let app_ref = format!("{hub_ns}/demo");
    let refreshes = |kind: &str| {
        argocd
            .log_of("argocd-application-controller")
            .matches(&format!("({kind} refresh requested)"))
            .count()
    };
    let requested = |kind: &'static str| {
        let (app_ref, hub_apps, server, refreshes) = (&app_ref, &hub_apps, &server, &refreshes);
        async move {
            let flag = if kind == "hard" {
                "--hard-refresh"
            } else {
                "--refresh"
            };
            let before = refreshes(kind);
            let started = Instant::now();
            server
                .cli_run(&["app", "get", app_ref, flag], SYNC_WAIT)
                .await?
                .success()?;
            eprintln!(
                "[ocm] hub `argocd app get {flag}` returned in {:.1?}",
                started.elapsed()
            );
            // argocd-server returned: the hub Application no longer carries the request.
            let annotations = hub_apps.get("demo").await?.metadata.annotations;
            let left: Vec<String> = annotations
                .unwrap_or_default()
                .into_keys()
                .filter(|k| [REFRESH_ANNOTATION, HYDRATE_ANNOTATION].contains(&k.as_str()))
                .collect();
            anyhow::ensure!(left.is_empty(), "left on the hub Application: {left:?}");
            // The spoke's Argo CD refreshed as asked.
            wait_until(
                &format!("the spoke's application controller to log a {kind} refresh requested"),
                REACT_WAIT,
                || async { Ok::<_, anyhow::Error>((refreshes(kind) > before).then_some(())) },
            )
            .await
        }
    };
    let versions = |want: Vec<String>| {
        let spoke_versions = &spoke_versions;
        async move {
            wait_until(
                "the spoke Application's request annotations to go through",
                REACT_WAIT,
                || async {
                    let seen = spoke_versions.values();
                    Ok::<_, anyhow::Error>((seen == want).then_some(()))
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}: {:?}", spoke_versions.values()))
        }
    };
    let on_spoke = |refresh: &str, extra: &str| {
        format!("{REFRESH_ANNOTATION}={refresh},{HYDRATE_ANNOTATION}=normal{extra}")
    };

    // Two refreshes, the second asked as soon as the first returned (the same request again, while
    // the operator's cache may still show the first consumed): each is put on the spoke once and
    // removed there by Argo CD.
    requested("normal")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
    requested("normal")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
    let mut want = vec![
        String::new(),
        on_spoke("normal", ""),
        String::new(),
        on_spoke("normal", ""),
        String::new(),
    ];
    versions(want.clone()).await?;

    // A hub change makes the work agent apply the payload again: without the requests, which the
    // hub no longer carries. Had it put one back, the watch would show that version.
    hub_apps
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {REAPPLIED_ANNOTATION: "yes"}}})),
        )
        .await?;
    want.push(format!("{REAPPLIED_ANNOTATION}=yes"));
    versions(want.clone()).await?;
    // A third request after the re-apply, a hard refresh, reaches the spoke again as asked.
    requested("hard")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
    want.extend([
        on_spoke("hard", &format!(",{REAPPLIED_ANNOTATION}=yes")),
        format!("{REAPPLIED_ANNOTATION}=yes"),
    ]);
    versions(want).await?;

    hub_apps.delete("demo", &DeleteParams::default()).await?;
    wait_until("hub Application gone", SYNC_WAIT, || async {
        Ok::<_, kube::Error>(hub_apps.get_opt("demo").await?.is_none().then_some(()))
    })
    .await?;
    logs.passed();
    Ok(())
}

/// The ApplicationSet controller's duck-type description of OCM's PlacementDecisions
/// (`clusterDecisionResource` generator), as argocd-pull-integration's chart ships it.
const PLACEMENT_GENERATOR: &str = "ocm-placement-generator";

/// `(cluster, spoke Application)` as JSON, for each `(cluster, spoke plane)` of `sites`, where the
/// Application is `<cluster>-<suffix>` in `spoke_ns`.
async fn spoke_applications(
    sites: &[(String, &e2e::ControlPlane)],
    spoke_ns: &str,
    suffix: &str,
) -> anyhow::Result<Vec<(String, Value)>> {
    let mut apps = Vec::new();
    for (cluster, spoke) in sites {
        let api: Api<DynamicObject> =
            Api::namespaced_with(spoke.client().await?, spoke_ns, &application_resource());
        if let Some(app) = api.get_opt(&format!("{cluster}-{suffix}")).await? {
            apps.push((cluster.clone(), serde_json::to_value(app)?));
        }
    }
    Ok(apps)
}

/// What the report should say of `cluster` given its spoke Application: `(cluster, app, sync,
/// health, operation phase, operation start, revision)`.
fn expected_condition(cluster: &str, hub_app: &str, spoke_app: &Value) -> [String; 7] {
    let (sync, health, revision) = sync_state(spoke_app);
    let phase = spoke_app
        .pointer("/status/operationState/phase")
        .and_then(Value::as_str)
        .unwrap_or_default();
    [
        cluster.to_string(),
        hub_app.to_string(),
        sync,
        health,
        phase.to_string(),
        operation_started_at(spoke_app),
        revision,
    ]
}

/// `(apiVersion, kind, name, namespace)` of a spoke Application's `status.resources`.
fn spoke_resources(spoke_app: &Value) -> Vec<(String, String, String, String)> {
    let listed = spoke_app
        .pointer("/status/resources")
        .cloned()
        .unwrap_or_default();
    let typed: Vec<argocd_agent_kube::argocd::ResourceStatus> =
        serde_json::from_value(listed).unwrap_or_default();
    let mut refs: Vec<_> = typed
        .iter()
        .map(|r| {
            (
                r.api_version(),
                r.kind.clone().unwrap_or_default(),
                r.name.clone().unwrap_or_default(),
                r.namespace.clone().unwrap_or_default(),
            )
        })
        .collect();
    refs.sort();
    refs
}

/// What the ApplicationSet tests stand on, all real: two managed clusters joined through the
/// registration flow, one per spoke plane, each with its own Argo CD; a Placement in the hub's Argo
/// CD namespace deciding both (by a label unique to the test); the `clusterDecisionResource`
/// generator's ConfigMap; both clusters registered with the hub Argo CD by the pull model; the
/// binary's ApplicationSet controller; the Git server with the demo app. Built in the order
/// upstream's instructions apply it: the Placement decided before the ApplicationSet exists (Argo
/// CD's controller retries a generator that found no PlacementDecision only after 3 minutes).
struct PlacedSites {
    /// Kept for its drop, which names the test's files when it fails.
    _ctx: TestContext,
    logs: FailureLogs,
    hub: kube::Client,
    git: GitServer,
    /// `(cluster, its spoke plane)`, in spoke order.
    sites: Vec<(String, &'static e2e::ControlPlane)>,
    _klusterlets: Vec<Klusterlet>,
    argocds: Vec<ArgoCd>,
    appset_controller: &'static ArgoCd,
    /// The ManagedCluster label the Placement selects by.
    label: (&'static str, String),
    /// Argo CD's namespace on the spokes.
    spoke_ns: String,
    /// Where the demo app deploys on the spokes.
    dest: String,
    /// The ApplicationSet's name, the suffix of each generated Application's.
    set: String,
    /// The Placement deciding both clusters.
    placement: String,
}

impl PlacedSites {
    async fn start(name: &str) -> anyhow::Result<PlacedSites> {
        let (planes, ocm_hub) = ocm().await;
        e2e::pull_model::start_controllers(planes).await?;
        let appset_controller = e2e::pull_model::shared_applicationset_controller(planes).await?;
        let mut logs = FailureLogs::new(ocm_hub);
        let ctx = TestContext::new(name)?;
        let hub = planes.hub.client().await?;
        let ns = e2e::pull_model::ARGOCD_NAMESPACE;
        let label = ("e2e.argocd-agent.io/appset", ctx.suffix.clone());
        let (spoke_ns, dest, set) = (ctx.unique("argocd"), ctx.unique("demo"), ctx.unique("demo"));
        let git = GitServer::start(&ctx.unique("git"))?;
        git.commit("apps", "demo", &demo_manifests("v1"), "demo v1")?;

        let mut klusterlets = Vec::new();
        let mut argocds = Vec::new();
        let mut sites = Vec::new();
        for (i, spoke) in planes.spokes.iter().enumerate() {
            let cluster = ctx.unique(&format!("set{i}"));
            let options = KlusterletOptions {
                labels: vec![(label.0.to_string(), label.1.clone())],
                ..Default::default()
            };
            let klusterlet =
                Klusterlet::start_with(&cluster, spoke, &planes.hub, &ctx.dir, &options).await?;
            logs.watch(&klusterlet);
            klusterlets.push(klusterlet);
            let instance = format!("{}-{i}", ctx.suffix);
            argocds.push(ArgoCd::start_spoke(&instance, &ctx.dir, spoke, &spoke_ns, &[]).await?);
            ensure_namespace(&spoke.client().await?, &dest).await?;
            sites.push((cluster, spoke));
        }
        for (cluster, _) in &sites {
            wait_cluster_available(&hub, cluster, JOIN_WAIT).await?;
        }

        // What a user writes on the hub, as upstream documents it: the generator's ConfigMap and
        // a Placement in the Argo CD namespace.
        let cms: Api<ConfigMap> = Api::namespaced(hub.clone(), ns);
        let generator = serde_json::from_value(json!({
            "metadata": {"name": PLACEMENT_GENERATOR},
            "data": {"apiVersion": "cluster.open-cluster-management.io/v1beta1",
                     "kind": "placementdecisions", "statusListKey": "decisions",
                     "matchKey": "clusterName"},
        }))?;
        match cms.create(&PostParams::default(), &generator).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let placement = ctx.unique("sites");
        create_label_placement(&hub, ns, &placement, (label.0, &label.1)).await?;
        let decisions: Api<DynamicObject> =
            Api::namespaced_with(hub.clone(), ns, &placement_decision_resource());
        let cluster_secrets: Api<Secret> = Api::namespaced(hub.clone(), ns);
        let mut clusters_wanted: Vec<String> = sites.iter().map(|(c, _)| c.clone()).collect();
        clusters_wanted.sort();
        wait_until(
            "the Placement deciding both clusters, each with its cluster Secret",
            REACT_WAIT,
            || async {
                let selector = format!("{PLACEMENT_LABEL}={placement}");
                let listed = decisions
                    .list(&ListParams::default().labels(&selector))
                    .await?;
                let mut decided: Vec<String> =
                    listed.items.iter().flat_map(decision_clusters).collect();
                decided.sort();
                let mut registered = true;
                for cluster in &clusters_wanted {
                    registered &= cluster_secrets
                        .get_opt(&cluster_secret_name(cluster))
                        .await?
                        .is_some();
                }
                Ok::<_, kube::Error>((decided == clusters_wanted && registered).then_some(()))
            },
        )
        .await?;
        Ok(PlacedSites {
            _ctx: ctx,
            logs,
            hub,
            git,
            sites,
            _klusterlets: klusterlets,
            argocds,
            appset_controller,
            label,
            spoke_ns,
            dest,
            set,
            placement,
        })
    }

    /// The tails of the spokes' Argo CD and the ApplicationSet controller logs.
    fn argocd_logs(&self) -> String {
        self.argocds
            .iter()
            .chain([self.appset_controller])
            .map(|a| a.log_tails(20))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The hub Application generated for `cluster`.
    fn app_name(&self, cluster: &str) -> String {
        format!("{cluster}-{}", self.set)
    }

    fn hub_apps(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.hub.clone(),
            e2e::pull_model::ARGOCD_NAMESPACE,
            &application_resource(),
        )
    }

    fn appsets(&self) -> Api<ApplicationSet> {
        Api::namespaced(self.hub.clone(), e2e::pull_model::ARGOCD_NAMESPACE)
    }

    /// The ApplicationSet over the Placement, whose template opts into the pull model with the
    /// cluster's name (the demo app, automated sync) as `customize` leaves it, with the given
    /// `spec.strategy`.
    fn applicationset(
        &self,
        customize: impl FnOnce(&mut DynamicObject),
        strategy: Option<Value>,
    ) -> anyhow::Result<ApplicationSet> {
        let ns = e2e::pull_model::ARGOCD_NAMESPACE;
        let mut template = pulled_demo_application(
            ns,
            &self.git.url("apps"),
            "{{name}}",
            &self.spoke_ns,
            &self.dest,
        );
        template.metadata.name = Some(format!("{{{{name}}}}-{}", self.set));
        template.metadata.namespace = None;
        customize(&mut template);
        let template = serde_json::to_value(template)?;
        let mut spec = template["spec"].clone();
        spec["destination"] =
            json!({"server": "https://kubernetes.default.svc", "namespace": self.dest});
        let mut appset_spec = json!({
            "generators": [{"clusterDecisionResource": {
                "configMapRef": PLACEMENT_GENERATOR,
                "labelSelector": {"matchLabels": {PLACEMENT_LABEL: self.placement}},
                "requeueAfterSeconds": 5,
            }}],
            "template": {"metadata": template["metadata"], "spec": spec},
        });
        if let Some(strategy) = strategy {
            appset_spec["strategy"] = strategy;
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
            "metadata": {"name": self.set, "namespace": ns},
            "spec": appset_spec,
        }))?)
    }

    fn passed(self) {
        self.logs.passed();
    }
}

/// What upstream documents for the pull model with ApplicationSets, all real: an ApplicationSet
/// whose `clusterDecisionResource` generator reads an OCM Placement (argocd-pull-integration's
/// `ocm-placement-generator` duck type) makes Argo CD's real ApplicationSet controller generate one
/// hub Application per decided cluster, which it finds through the cluster Secrets the pull model
/// writes per ManagedCluster; the pull model wraps each into a ManifestWork, the real work agent
/// applies it on its spoke, where that spoke's real Argo CD syncs it from Git; the work agents'
/// feedback (with `status.resources`) fills the MulticlusterApplicationSetReport: per cluster the
/// sync and health, the operation's phase and start and the synced revision, each equal to what
/// the spoke's Argo CD says, and the resources deployed. A cluster leaving the Placement leaves
/// the report with its Application.
#[tokio::test]
async fn applicationset_over_an_ocm_placement_is_pulled_synced_by_real_argocd_and_reported_per_cluster(
) -> anyhow::Result<()> {
    let ground = PlacedSites::start("ocm-appset").await?;
    let (hub, sites, set) = (&ground.hub, &ground.sites, &ground.set);
    let (spoke_ns, dest, label) = (&ground.spoke_ns, &ground.dest, &ground.label);
    let ns = e2e::pull_model::ARGOCD_NAMESPACE;
    let argocd_logs = || ground.argocd_logs();
    let appsets = ground.appsets();
    let started = Instant::now();
    appsets
        .create(
            &PostParams::default(),
            &ground.applicationset(|_| {}, None)?,
        )
        .await?;

    // The real controller generates one Application per decided cluster; each reaches its spoke
    // and is synced there.
    let hub_apps = ground.hub_apps();
    for (cluster, spoke) in sites {
        let name = format!("{cluster}-{set}");
        let generated = wait_until(
            &format!("the ApplicationSet controller to generate {name}"),
            SYNC_WAIT,
            || async { hub_apps.get_opt(&name).await },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
        let owners = generated
            .metadata
            .owner_references
            .clone()
            .unwrap_or_default();
        assert!(
            owners
                .iter()
                .any(|o| o.kind == "ApplicationSet" && o.name == *set),
            "{name} is the ApplicationSet's: {owners:?}"
        );
        wait_greeting(spoke, dest, "v1")
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
    }
    eprintln!(
        "[ocm] ApplicationSet generated, pulled and synced on {} clusters in {:.1?}",
        sites.len(),
        started.elapsed()
    );

    // The report: per cluster what that spoke's Argo CD says, and the resources deployed.
    let reports: Api<MulticlusterApplicationSetReport> = Api::namespaced(hub.clone(), ns);
    let report_matches = |wanted: usize| {
        let (reports, sites, spoke_ns, set, hub_apps) =
            (&reports, &sites, &spoke_ns, &set, &hub_apps);
        async move {
            let Some(report) = reports.get_opt(set).await? else {
                return Ok::<_, anyhow::Error>(None);
            };
            let spoke_apps = spoke_applications(&sites[..wanted], spoke_ns, set).await?;
            // `app` as upstream's aggregator writes it: the hub Application, the cluster and
            // the ManifestWork carrying it there.
            let mut expected: Vec<[String; 7]> = Vec::new();
            for (c, a) in &spoke_apps {
                let hub_name = format!("{c}-{set}");
                let uid = hub_apps
                    .get(&hub_name)
                    .await?
                    .metadata
                    .uid
                    .unwrap_or_default();
                let work = manifest_work_name(&hub_name, &uid);
                expected.push(expected_condition(
                    c,
                    &format!("{ns}/{hub_name}/{c}/{work}"),
                    a,
                ));
            }
            let statuses = &report.spec.statuses;
            let reported: Vec<[String; 7]> = statuses
                .cluster_conditions
                .iter()
                .map(|c| {
                    [
                        c.cluster.clone(),
                        c.app.clone(),
                        c.sync_status.clone(),
                        c.health_status.clone(),
                        c.operation_state_phase.clone(),
                        c.operation_state_started_at.clone(),
                        c.sync_revision.clone(),
                    ]
                })
                .collect();
            let mut resources: Vec<_> = statuses
                .resources
                .iter()
                .map(|r| {
                    (
                        r.api_version.clone(),
                        r.kind.clone(),
                        r.name.clone(),
                        r.namespace.clone(),
                    )
                })
                .collect();
            resources.sort();
            let synced = spoke_apps.len() == wanted
                && expected
                    .iter()
                    .all(|e| e[2] == "Synced" && e[3] == "Healthy" && e[4] == "Succeeded");
            let done = synced
                && reported == expected
                && spoke_apps
                    .iter()
                    .all(|(_, a)| spoke_resources(a) == resources)
                && statuses.summary.clusters == wanted.to_string()
                && statuses.summary.synced == wanted.to_string()
                && statuses.summary.healthy == wanted.to_string();
            Ok(done.then_some(report))
        }
    };
    let report = wait_until(
        "the report of both clusters as their spokes' Argo CD say",
        SYNC_WAIT,
        || report_matches(2),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
    eprintln!(
        "[ocm] ApplicationSet report complete {:.1?} after the ApplicationSet was created",
        started.elapsed()
    );
    let statuses = &report.spec.statuses;
    let kinds: Vec<&str> = statuses.resources.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(
        kinds.len(),
        3,
        "the demo's three resources, listed once: {kinds:?}"
    );
    for kind in ["ConfigMap", "Secret", "ServiceAccount"] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
    assert!(statuses.resources.iter().all(|r| r.namespace == *dest));
    let revision = &statuses.cluster_conditions[0].sync_revision;
    assert_eq!(revision.len(), 40, "a Git commit: {revision}");
    assert_eq!(statuses.summary.not_synced, "0");
    assert_eq!(statuses.summary.in_progress, "0");
    // The hub Applications carry the spoke's resources too (the work agent's feedback).
    let hub_app = serde_json::to_value(hub_apps.get(&format!("{}-{set}", sites[0].0)).await?)?;
    let spoke_app = &spoke_applications(&sites[..1], spoke_ns, set).await?[0].1;
    assert_eq!(spoke_resources(&hub_app), spoke_resources(spoke_app));

    // The second cluster leaves the Placement: the ApplicationSet controller deletes its
    // Application, the pull model its work, and the report keeps the first cluster only.
    let clusters: Api<DynamicObject> =
        Api::all_with(hub.clone(), &e2e::ocm::managed_cluster_resource());
    clusters
        .patch(
            &sites[1].0,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {label.0: "retired"}}})),
        )
        .await?;
    let leaving = format!("{}-{set}", sites[1].0);
    let works: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &sites[1].0, &manifest_work_resource());
    wait_until(
        "the deselected cluster's Application and work gone, the report of one cluster",
        SYNC_WAIT,
        || async {
            let gone = hub_apps.get_opt(&leaving).await?.is_none()
                && works.list(&ListParams::default()).await?.items.is_empty();
            Ok::<_, anyhow::Error>(if gone { report_matches(1).await? } else { None })
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;

    // Deleting the ApplicationSet deletes its report.
    appsets.delete(set, &DeleteParams::default()).await?;
    wait_until(
        "the report deleted with its ApplicationSet",
        REACT_WAIT,
        || async { Ok::<_, kube::Error>(reports.get_opt(set).await?.is_none().then_some(())) },
    )
    .await?;
    let _ = hub_apps
        .delete(&format!("{}-{set}", sites[0].0), &DeleteParams::default())
        .await;
    ground.passed();
    Ok(())
}

/// Label of the RollingSync test's generated Applications naming their cluster; each step selects
/// one cluster's Application by it.
const STEP_LABEL: &str = "e2e.argocd-agent.io/rollout-cluster";

/// Two steps, each a sync through the pull model after the previous step is Healthy.
const ROLLOUT_WAIT: Duration = Duration::from_secs(2 * SYNC_WAIT.as_secs());

/// Every distinct value `read` takes from the objects a watch of `api` sends, in order, from
/// before they exist (each object's versions as the apiserver sends them).
struct Recorded<T> {
    values: Arc<Mutex<Vec<T>>>,
    task: tokio::task::JoinHandle<()>,
}

impl<T: Clone + PartialEq + Send + 'static> Recorded<T> {
    fn watch<K>(
        api: Api<K>,
        config: watcher::Config,
        read: impl Fn(K) -> T + Send + 'static,
    ) -> Recorded<T>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let values = Arc::new(Mutex::new(Vec::new()));
        let seen = values.clone();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher::watcher(api, config)
                .default_backoff()
                .applied_objects());
            while let Some(event) = events.next().await {
                match event {
                    Ok(object) => {
                        let value = read(object);
                        let mut seen = seen.lock().expect("record lock");
                        if seen.last() != Some(&value) {
                            seen.push(value);
                        }
                    }
                    Err(e) => eprintln!("[ocm] watch: {e}"),
                }
            }
        });
        Recorded { values, task }
    }

    fn values(&self) -> Vec<T> {
        self.values.lock().expect("record lock").clone()
    }
}

impl<T> Drop for Recorded<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every version of an ApplicationSet's `status.applicationStatus` that the apiserver sends a
/// watch, from before the ApplicationSet exists: what the controller wrote, in order.
struct Progression(Recorded<Vec<ApplicationSetApplicationStatus>>);

impl Progression {
    fn watch(api: Api<ApplicationSet>, name: &str) -> Progression {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        Progression(Recorded::watch(api, config, |set: ApplicationSet| {
            set.status.map(|s| s.application_status).unwrap_or_default()
        }))
    }

    fn versions(&self) -> Vec<Vec<ApplicationSetApplicationStatus>> {
        self.0.values()
    }

    /// The statuses `app` went through, repeats folded.
    fn path(&self, app: &str) -> Vec<String> {
        fold_repeats(self.versions().iter().filter_map(|version| {
            let entry = version.iter().find(|e| e.application == app)?;
            Some(entry.status.clone())
        }))
    }

    /// Every version, one line each: `app=status(step) since: message` per Application.
    fn summary(&self) -> String {
        self.versions()
            .iter()
            .map(|v| {
                v.iter()
                    .map(|e| {
                        let at = e.last_transition_time.as_deref().unwrap_or_default();
                        format!(
                            "{}={}({}) {at} {:?}: {}",
                            e.application, e.status, e.step, e.target_revisions, e.message
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" | ")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `values` with consecutive repeats folded into one.
fn fold_repeats(values: impl Iterator<Item = String>) -> Vec<String> {
    let mut path: Vec<String> = Vec::new();
    for value in values {
        if path.last() != Some(&value) {
            path.push(value);
        }
    }
    path
}

/// A time Argo CD wrote (Go's `metav1.Time`: RFC 3339 in UTC to the second), checked to be of that
/// form so that comparing two as strings compares the times.
fn go_time(written: Option<&str>) -> String {
    let t = written.unwrap_or_default();
    assert!(
        t.len() == 20 && t.ends_with('Z') && t.as_bytes()[10] == b'T',
        "not a metav1.Time: {t:?}"
    );
    t.to_string()
}

/// Argo CD's progressive sync (ApplicationSet `RollingSync`) over the pull model, all real: an
/// ApplicationSet over the Placement with two steps, each selecting one cluster's Application by a
/// label, run by the ApplicationSet controller with progressive syncs enabled. The controller
/// requests a sync (`.operation`) of the generated Applications step by step;
/// the pull model carries it to the spoke, whose Argo CD runs it, and brings the spoke's operation,
/// sync and health back to the hub Application, from which the controller moves on. Asserted from
/// the controller's own writes (every version of `status.applicationStatus`, watched): each
/// Application is Pending (its sync requested), then Progressing, then Healthy, and the second
/// step's leaves Waiting only once the first's is Healthy; from the hub Applications' health (a
/// watch): each Progressing before Healthy; and from the spokes: each ran exactly one
/// sync, the controller's, the second cluster's starting after the first's Application became
/// Healthy, and the hub Applications show those syncs with their operation cleared.
#[tokio::test]
async fn rolling_sync_applicationset_over_the_pull_model_syncs_a_step_only_once_the_previous_is_healthy(
) -> anyhow::Result<()> {
    let ground = PlacedSites::start("ocm-rolling").await?;
    let argocd_logs = || ground.argocd_logs();
    let clusters: Vec<&str> = ground.sites.iter().map(|(c, _)| c.as_str()).collect();
    let apps: Vec<String> = clusters.iter().map(|c| ground.app_name(c)).collect();
    let steps: Vec<Value> = clusters
        .iter()
        .map(
            |c| json!({"matchExpressions": [{"key": STEP_LABEL, "operator": "In", "values": [c]}]}),
        )
        .collect();
    let strategy = json!({"type": "RollingSync", "rollingSync": {"steps": steps}});
    // No automated sync in the template: Argo CD v3.4.3 turns it off in the Applications it
    // writes but compares them with the template's spec, so with it every reconciliation finds
    // the spec changed and sets the Application back to Waiting (Pending → Progressing never
    // happens; the step is Healthy only once a sync it requested happened to finish).
    let template = |app: &mut DynamicObject| {
        app.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(STEP_LABEL.to_string(), "{{name}}".to_string());
        app.data["spec"]["syncPolicy"] =
            json!({"syncOptions": ["PrunePropagationPolicy=background"]});
    };
    let appsets = ground.appsets();
    let progression = Progression::watch(appsets.clone(), &ground.set);
    // The generated hub Applications as the ApplicationSet controller and the pull model write
    // them: `(name, health, "sync revision operation? startedAt")`.
    let hub_states = Recorded::watch(
        Api::<Application>::namespaced(ground.hub.clone(), e2e::pull_model::ARGOCD_NAMESPACE),
        watcher::Config::default().labels(STEP_LABEL),
        |app: Application| {
            let status = app.status.unwrap_or_default();
            let word = |of: Option<StatusOf>| of.and_then(|o| o.status).unwrap_or_default();
            let sync = status.sync.clone();
            let revision = sync.as_ref().and_then(|s| s.other.get("revision").cloned());
            let started = status.operation_state.and_then(|o| o.started_at);
            let rest = format!(
                "{} {} operation={} started={}",
                word(sync),
                revision.unwrap_or_default(),
                app.operation.is_some(),
                started.unwrap_or_default()
            );
            (
                app.metadata.name.unwrap_or_default(),
                word(status.health),
                rest,
            )
        },
    );
    let started = Instant::now();
    appsets
        .create(
            &PostParams::default(),
            &ground.applicationset(template, Some(strategy))?,
        )
        .await?;
    let timeline = || {
        let hub = hub_states
            .values()
            .iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>();
        format!(
            "ApplicationSet progression:\n{}\nhub Applications:\n{}",
            progression.summary(),
            hub.join("\n")
        )
    };
    let failed = |e: anyhow::Error| anyhow::anyhow!("{e}\n{}\n{}", timeline(), argocd_logs());
    let rolled_out = wait_until(
        "the ApplicationSet controller to roll both steps out to Healthy",
        ROLLOUT_WAIT,
        || async {
            let set = appsets.get(&ground.set).await?;
            let done = apps.iter().all(|a| {
                set.application_status(a)
                    .is_some_and(|s| s.status == "Healthy")
            });
            Ok::<_, kube::Error>(done.then_some(set))
        },
    )
    .await
    .map_err(failed)?;
    eprintln!(
        "[ocm] RollingSync rolled out to {} clusters in {:.1?}; progression:\n{}",
        apps.len(),
        started.elapsed(),
        progression.summary()
    );

    // The controller's own record: each step's Application was last Pending (the controller
    // requested its sync: the hub Application's revision is settled by then, or it would have been
    // set back to Waiting), then Progressing (it saw the sync start; the pull model reports a
    // Healthy Application Progressing first) and Healthy; the second left Waiting only once the
    // first was Healthy.
    for (i, app) in apps.iter().enumerate() {
        let entry = rolled_out.application_status(app).expect("rolled out");
        assert_eq!(entry.step, (i + 1).to_string(), "{app}'s step");
        let path = progression.path(app);
        let from_pending = path.iter().rposition(|s| s == "Pending");
        let rest: Option<Vec<&str>> =
            from_pending.map(|p| path[p + 1..].iter().map(String::as_str).collect());
        assert_eq!(
            rest.as_deref(),
            Some(&["Progressing", "Healthy"][..]),
            "{app} went {path:?}"
        );
    }
    // As upstream reports it: the hub Application Progressing before it is Healthy.
    let health_paths = wait_until("the hub Applications' Healthy seen", REACT_WAIT, || async {
        let paths: Vec<Vec<String>> = apps
            .iter()
            .map(|app| {
                let health = hub_states.values().into_iter().filter(|(a, ..)| a == app);
                fold_repeats(health.map(|(_, h, _)| h))
            })
            .collect();
        let seen = paths.iter().all(|p| p.iter().any(|h| h == "Healthy"));
        Ok::<_, anyhow::Error>(seen.then_some(paths))
    })
    .await?;
    eprintln!("[ocm] hub Applications' health: {health_paths:?}");
    for (app, path) in apps.iter().zip(health_paths) {
        let healthy = path.iter().position(|h| h == "Healthy");
        assert!(
            healthy.is_some_and(|i| i > 0 && path[i - 1] == "Progressing"),
            "{app}'s hub Application health went {path:?}"
        );
    }
    for version in progression.versions() {
        let status = |app: &str| {
            version
                .iter()
                .find(|e| e.application == app)
                .map(|e| e.status.as_str())
        };
        if status(&apps[1]).is_some_and(|s| s != "Waiting") {
            assert_eq!(
                status(&apps[0]),
                Some("Healthy"),
                "step 2 moved before step 1 was Healthy:\n{}",
                progression.summary()
            );
        }
    }

    // The spokes: each ran exactly one sync, the one the controller requested, the second after the first step's Application was Healthy;
    // the hub shows each sync, its `.operation` cleared by the pull model.
    let hub_apps = ground.hub_apps();
    let spoke_apps = wait_until(
        "the hub Applications to show their spoke's sync with the operation cleared",
        SYNC_WAIT,
        || async {
            let spoke_apps =
                spoke_applications(&ground.sites, &ground.spoke_ns, &ground.set).await?;
            let mut done = spoke_apps.len() == apps.len();
            for ((_, spoke_app), app) in spoke_apps.iter().zip(&apps) {
                let hub_app = serde_json::to_value(hub_apps.get(app).await?)?;
                done &= hub_app.get("operation").is_none()
                    && operation_started_at(&hub_app) == operation_started_at(spoke_app)
                    && sync_state(&hub_app) == sync_state(spoke_app);
            }
            Ok::<_, anyhow::Error>(done.then_some(spoke_apps))
        },
    )
    .await
    .map_err(failed)?;
    for (_, spoke_app) in &spoke_apps {
        let name = spoke_app
            .pointer("/metadata/name")
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            spoke_app.pointer("/status/operationState/operation/initiatedBy/username"),
            Some(&json!("applicationset-controller")),
            "{name}: the spoke's sync is the controller's"
        );
        assert_eq!(
            sync_history(spoke_app).len(),
            1,
            "{name} synced once: {spoke_app}\n{}",
            timeline()
        );
    }
    let first_healthy = go_time(
        rolled_out
            .application_status(&apps[0])
            .and_then(|e| e.last_transition_time.as_deref()),
    );
    let second_started = go_time(Some(&operation_started_at(&spoke_apps[1].1)));
    assert!(
        second_started >= first_healthy,
        "the second cluster's sync started at {second_started}, before the first step was Healthy at {first_healthy}"
    );

    appsets
        .delete(&ground.set, &DeleteParams::default())
        .await?;
    for app in &apps {
        let _ = hub_apps.delete(app, &DeleteParams::default()).await;
    }
    ground.passed();
    Ok(())
}

/// Manifests of the plugin test's Git path: a ConfigMap that names its namespace (the work agent
/// applies a ManifestWork's objects as written). No Namespace object: the planes run no namespace
/// controller, so a deleted Namespace would stay Terminating and hold the work's cleanup.
fn wrapped_manifests(namespace: &str, greeting: &str) -> Vec<(&'static str, String)> {
    vec![(
        "configmap.yaml",
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo-config\n  namespace: {namespace}\ndata:\n  greeting: {greeting}\n"
        ),
    )]
}

#[tokio::test]
async fn hub_argocd_with_the_wrap_plugin_delivers_through_the_real_work_agent_without_argocd_on_the_spoke(
) -> anyhow::Result<()> {
    let (planes, ocm_hub) = ocm().await;
    let mut logs = FailureLogs::new(ocm_hub);
    let ctx = TestContext::new("ocm-cmp")?;
    let cluster = ctx.unique("cmp");
    let spoke = &planes.spokes[0];
    let hub = planes.hub.client().await?;
    let klusterlet = Klusterlet::start(&cluster, spoke, &planes.hub, &ctx.dir).await?;
    logs.watch(&klusterlet);
    // Argo CD on the hub only, managing the hub itself; its repo-server has the shipped plugin
    // (charts/cmp/plugin.yaml) run by the real argocd-cmp-server, with argocd-agentctl on PATH.
    let (hub_argocd_ns, dest) = (ctx.unique("argocd"), ctx.unique("wrapped"));
    let mut argocd =
        ArgoCd::start_spoke(&ctx.suffix, &ctx.dir, &planes.hub, &hub_argocd_ns, &[]).await?;
    let agentctl = e2e::binaries::project_binary("argocd-agentctl")?;
    argocd
        .start_plugin(
            &e2e::binaries::workspace_root().join("charts/cmp/plugin.yaml"),
            agentctl.parent().expect("a binary's directory"),
        )
        .await?;
    ensure_namespace(&spoke.client().await?, &dest).await?;
    let git = GitServer::start(&ctx.unique("git"))?;
    git.commit("apps", "wrapped", &wrapped_manifests(&dest, "v1"), "v1")?;
    wait_cluster_available(&hub, &cluster, JOIN_WAIT).await?;
    let argocd_logs = || argocd.log_tails(20);

    // The user's Application: the plugin with the cluster as its only parameter, the hub as its
    // destination (where the ManifestWork goes), the cluster's namespace there.
    let mut app = serde_json::to_value(demo_application(
        "wrapped",
        &hub_argocd_ns,
        &git.url("apps"),
        json!({"server": "https://kubernetes.default.svc", "namespace": cluster}),
    ))?;
    // Cascade delete as users ask for it; background, as no garbage collector runs here.
    app["metadata"]["finalizers"] = json!(["resources-finalizer.argocd.argoproj.io/background"]);
    app["spec"]["source"] = json!({
        "repoURL": git.url("apps"), "path": "wrapped", "targetRevision": "main",
        "plugin": {"name": "argocd-agent-wrap", "env": [{"name": "CLUSTER", "value": cluster}]},
    });
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &hub_argocd_ns, &application_resource());
    let started = Instant::now();
    hub_apps
        .create(&PostParams::default(), &serde_json::from_value(app)?)
        .await?;

    // Argo CD renders the ManifestWork (named after the Application) and applies it in the
    // cluster's hub namespace; the real work agent applies what it carries on the spoke, where no
    // Argo CD runs.
    wait_greeting(spoke, &dest, "v1")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
    eprintln!(
        "[ocm] plugin-rendered ManifestWork applied on the spoke {:.1?} after the Application was created",
        started.elapsed()
    );
    let works: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &cluster, &manifest_work_resource());
    let work = serde_json::to_value(works.get("wrapped").await?)?;
    let kinds: Vec<&str> = work
        .pointer("/spec/workload/manifests")
        .and_then(Value::as_array)
        .map(|m| m.iter().filter_map(|o| o["kind"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(kinds, ["ConfigMap"], "{work}");
    assert!(
        work.pointer("/metadata/labels/app.kubernetes.io~1instance")
            .is_some()
            || work
                .pointer("/metadata/annotations/argocd.argoproj.io~1tracking-id")
                .is_some(),
        "the ManifestWork is Argo CD's (tracked): {work}"
    );
    wait_until("the hub Application Synced", SYNC_WAIT, || async {
        let app = serde_json::to_value(hub_apps.get("wrapped").await?)?;
        Ok::<_, anyhow::Error>((sync_state(&app).0 == "Synced").then_some(()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;

    // A new commit: Argo CD renders the changed work, the work agent updates the spoke.
    git.commit("apps", "wrapped", &wrapped_manifests(&dest, "v2"), "v2")?;
    wait_greeting(spoke, &dest, "v2")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;

    // Deleting the Application (cascade) deletes the work; the work agent removes what it applied.
    hub_apps.delete("wrapped", &DeleteParams::default()).await?;
    let spoke_cms: Api<ConfigMap> = Api::namespaced(spoke.client().await?, &dest);
    wait_until("work and the spoke's ConfigMap gone", SYNC_WAIT, || async {
        let gone = works.get_opt("wrapped").await?.is_none()
            && spoke_cms.get_opt("demo-config").await?.is_none();
        Ok::<_, kube::Error>(gone.then_some(()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd_logs()))?;
    logs.passed();
    Ok(())
}
