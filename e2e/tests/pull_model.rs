//! The OCM basic pull model and the ApplicationSet report on real control planes with the real OCM
//! and Argo CD CRDs: hub Applications wrapped into ManifestWorks, payload updates, cleanup, cluster
//! Secrets, bad input, malformed feedback and `MulticlusterApplicationSetReport` counts.
//!
//! The pull-model controllers run in-process against the hub (`e2e::pull_model`). Neither OCM's
//! work agent nor Argo CD runs here: the pulled Application applied on a spoke, synced by Argo CD
//! and its status carried back by the work agent is proven with the real ones in `real_ocm`. Two
//! tests write ManifestWork status feedback themselves ("plays the work agent") and say why in
//! their names: feedback a real work agent never writes (a malformed value), and per-cluster
//! health (Degraded, then Progressing) that Argo CD on these planes, which run no kubelet, cannot
//! be made to report on cue. There is no controller-manager either, so nothing relies on garbage
//! collection.

use std::time::{Duration, Instant};

use argocd_agent_kube::CancellationToken;
use argocd_agent_operator::pull::application::{
    APP_NAMESPACE_ANNOTATION, CLUSTER_ANNOTATION, PULL_LABEL, SKIP_RECONCILE_ANNOTATION,
    SPEC_ERROR_CONDITION, WORK_ERROR_CONDITION,
};
use argocd_agent_operator::pull::cluster_secret::AGENT_NAME_LABEL;
use argocd_agent_operator::pull::manifestwork::{
    manifest_work_name, ManifestWork, HUB_APP_NAME_ANNOTATION,
};
use argocd_agent_operator::pull::report::{MulticlusterApplicationSetReport, REPORT_APPSET_LABEL};
use argocd_agent_operator::pull::{run_pull_model, PullModelOptions};
use e2e::pull_model::ARGOCD_NAMESPACE;
use e2e::{shared_planes, wait_until, SharedPlanes, TestContext};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);

fn app_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    )
}

fn appset_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "ApplicationSet"),
        "applicationsets",
    )
}

fn cluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1", "ManagedCluster"),
        "managedclusters",
    )
}

/// The shared planes with the pull-model controllers running against the hub. With
/// `PULL_TRACE=<filter>` (e.g. `argocd_agent_operator=debug`), every controller instance of the
/// binary logs to stderr, by thread (a test's own instances run on the test's thread).
async fn planes() -> anyhow::Result<&'static SharedPlanes> {
    if let Ok(filter) = std::env::var("PULL_TRACE") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_thread_names(true)
            .with_ansi(false)
            .try_init();
    }
    let planes = shared_planes().await;
    e2e::pull_model::start_controllers(planes).await?;
    Ok(planes)
}

async fn ensure_namespace(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A ManagedCluster on the hub, with its namespace unless `with_namespace` is false.
async fn managed_cluster(
    hub: &kube::Client,
    name: &str,
    labels: Value,
    with_namespace: bool,
) -> anyhow::Result<()> {
    let clusters: Api<DynamicObject> = Api::all_with(hub.clone(), &cluster_resource());
    let mc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
        "metadata": {"name": name, "labels": labels}, "spec": {"hubAcceptsClient": true}
    }))?;
    clusters.create(&PostParams::default(), &mc).await?;
    if with_namespace {
        ensure_namespace(hub, name).await?;
    }
    Ok(())
}

/// A hub Application opted into the pull model for `cluster` (when given).
fn pulled_application(
    name: &str,
    ns: &str,
    cluster: Option<&str>,
    spoke_ns: &str,
) -> DynamicObject {
    let mut annotations =
        json!({APP_NAMESPACE_ANNOTATION: spoke_ns, SKIP_RECONCILE_ANNOTATION: "true"});
    if let Some(c) = cluster {
        annotations[CLUSTER_ANNOTATION] = json!(c);
    }
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": ns, "labels": {PULL_LABEL: "true"}, "annotations": annotations},
        "spec": {
            "project": "default",
            "source": {"repoURL": "https://github.com/argoproj/argocd-example-apps.git", "path": "guestbook", "targetRevision": "HEAD"},
            "destination": {"name": cluster.unwrap_or("none"), "namespace": "guestbook"}
        }
    }))
    .expect("valid Application")
}

async fn get_json<K>(api: &Api<K>, name: &str) -> Result<Option<Value>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    Ok(api
        .get_opt(name)
        .await?
        .map(|o| serde_json::to_value(o).expect("object serialises")))
}

/// Waits until `name` exists and satisfies `pred`; returns it as JSON.
async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value>
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    wait_until(what, WAIT, || async {
        Ok::<_, kube::Error>(get_json(api, name).await?.filter(|v| pred(v)))
    })
    .await
}

async fn wait_gone<K>(api: &Api<K>, name: &str, what: &str) -> anyhow::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    wait_until(what, WAIT, || async {
        Ok::<_, kube::Error>(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

fn condition<'a>(app: &'a Value, type_: &str) -> Option<&'a str> {
    app.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?
        .get("message")?
        .as_str()
}

fn text(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The ManifestWork status the work agent writes: an Applied condition and the feedback values.
fn work_status(values: Value, applied: Result<(), &str>) -> Value {
    let now = "2024-05-01T10:00:00Z";
    let (status, reason, message) = match applied {
        Ok(()) => (
            "True",
            "AppliedManifestWorkComplete",
            "Apply manifest work complete".to_string(),
        ),
        Err(m) => ("False", "AppliedManifestWorkFailed", m.to_string()),
    };
    let cond = json!({"type": "Applied", "status": status, "reason": reason, "message": message, "lastTransitionTime": now});
    json!({"status": {
        "conditions": [cond],
        "resourceStatus": {"manifests": [{
            "resourceMeta": {"ordinal": 0, "group": "argoproj.io", "version": "v1alpha1", "kind": "Application", "resource": "applications"},
            "statusFeedback": {"values": values},
            "conditions": [cond]
        }]}
    }})
}

fn string_value(name: &str, value: &str) -> Value {
    json!({"name": name, "fieldValue": {"type": "String", "string": value}})
}

/// Stand-in for the work agent's feedback scrape: writes `values` into the work's status.
async fn write_feedback(
    works: &Api<ManifestWork>,
    work: &str,
    values: Value,
    applied: Result<(), &str>,
) -> anyhow::Result<()> {
    works
        .patch_status(
            work,
            &PatchParams::default(),
            &Patch::Merge(&work_status(values, applied)),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn pulled_application_is_wrapped_into_a_work_that_follows_it_and_is_cleaned_up(
) -> anyhow::Result<()> {
    let planes = planes().await?;
    let ctx = TestContext::new("pull_round_trip")?;
    let hub = planes.hub.client().await?;
    let cluster = ctx.unique("spoke1");
    let (hub_ns, spoke_ns) = (ctx.unique("apps"), ctx.unique("spoke-argocd"));
    managed_cluster(&hub, &cluster, json!({}), true).await?;
    ensure_namespace(&hub, &hub_ns).await?;
    let hub_apps: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &hub_ns, &app_resource());
    let mut app = pulled_application("guestbook", &hub_ns, Some(&cluster), &spoke_ns);
    app.metadata.finalizers = Some(vec!["resources-finalizer.argocd.argoproj.io".into()]);
    let created = hub_apps.create(&PostParams::default(), &app).await?;
    let work_name = manifest_work_name("guestbook", created.metadata.uid.as_deref().unwrap());

    // The hub Application is wrapped into a ManifestWork in the cluster's namespace.
    let works: Api<ManifestWork> = Api::namespaced(hub.clone(), &cluster);
    let work = wait_for(
        &works,
        &work_name,
        "ManifestWork for the hub Application",
        |_| true,
    )
    .await?;
    let payload = &work["spec"]["workload"]["manifests"][0];
    assert_eq!(payload["metadata"]["namespace"], json!(spoke_ns));
    assert_eq!(
        payload["spec"]["destination"],
        json!({"server": "https://kubernetes.default.svc", "namespace": "guestbook"})
    );
    assert!(
        payload["metadata"]["labels"].get(PULL_LABEL).is_none(),
        "{payload}"
    );
    assert!(
        payload["metadata"]
            .get("annotations")
            .is_none_or(|a| a.get(CLUSTER_ANNOTATION).is_none()),
        "{payload}"
    );
    assert!(
        payload["metadata"].get("uid").is_none() && payload.get("status").is_none(),
        "{payload}"
    );
    let rules = &work["spec"]["manifestConfigs"][0]["feedbackRules"];
    let paths: Vec<String> = rules
        .as_array()
        .unwrap()
        .iter()
        .map(|r| text(r, "/jsonPaths/0/path"))
        .collect();
    assert!(
        paths.contains(&".status.health.status".into())
            && paths.contains(&".status.sync.status".into()),
        "{rules}"
    );

    // Applying the payload, Argo CD syncing it and the work agent's feedback reaching the hub
    // Application are proven with the real work agent and Argo CD in
    // `real_ocm::pulled_application_is_applied_by_the_real_work_agent_synced_by_real_argocd_and_reported_on_the_hub`.

    // A spec change on the hub reaches the payload.
    let change = json!({"spec": {"source": {"targetRevision": "v2"}}});
    hub_apps
        .patch("guestbook", &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    wait_for(&works, &work_name, "payload with targetRevision v2", |w| {
        text(w, "/spec/workload/manifests/0/spec/source/targetRevision") == "v2"
    })
    .await?;

    // Deleting the hub Application deletes the ManifestWork, then releases the Application.
    hub_apps
        .delete("guestbook", &DeleteParams::default())
        .await?;
    wait_gone(
        &works,
        &work_name,
        "ManifestWork deleted with its Application",
    )
    .await?;
    wait_gone(
        &hub_apps,
        "guestbook",
        "hub Application gone (resources finalizer released)",
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn unlabelled_retargeted_and_orphaned_works_are_deleted() -> anyhow::Result<()> {
    let planes = planes().await?;
    let ctx = TestContext::new("pull_cleanup")?;
    let hub = planes.hub.client().await?;
    let (c1, c2, hub_ns) = (
        ctx.unique("clean-a"),
        ctx.unique("clean-b"),
        ctx.unique("apps"),
    );
    managed_cluster(&hub, &c1, json!({}), true).await?;
    managed_cluster(&hub, &c2, json!({}), true).await?;
    ensure_namespace(&hub, &hub_ns).await?;
    let hub_apps: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &hub_ns, &app_resource());
    let works_c1: Api<ManifestWork> = Api::namespaced(hub.clone(), &c1);
    let works_c2: Api<ManifestWork> = Api::namespaced(hub.clone(), &c2);

    // Removing the pull label deletes the work.
    let a = hub_apps
        .create(
            &PostParams::default(),
            &pulled_application("unlabel", &hub_ns, Some(&c1), "argocd"),
        )
        .await?;
    let a_work = manifest_work_name("unlabel", a.metadata.uid.as_deref().unwrap());
    wait_for(
        &works_c1,
        &a_work,
        "work of the labelled Application",
        |_| true,
    )
    .await?;
    hub_apps
        .patch(
            "unlabel",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {PULL_LABEL: null}}})),
        )
        .await?;
    wait_gone(
        &works_c1,
        &a_work,
        "work deleted after the pull label was removed",
    )
    .await?;

    // Pointing the Application at another cluster moves the work.
    let b = hub_apps
        .create(
            &PostParams::default(),
            &pulled_application("retarget", &hub_ns, Some(&c1), "argocd"),
        )
        .await?;
    let b_work = manifest_work_name("retarget", b.metadata.uid.as_deref().unwrap());
    wait_for(&works_c1, &b_work, "work on the first cluster", |_| true).await?;
    let move_it = json!({"metadata": {"annotations": {CLUSTER_ANNOTATION: c2}}});
    hub_apps
        .patch("retarget", &PatchParams::default(), &Patch::Merge(&move_it))
        .await?;
    wait_for(&works_c2, &b_work, "work on the second cluster", |_| true).await?;
    wait_gone(&works_c1, &b_work, "work removed from the first cluster").await?;

    // A work whose Application never existed (or vanished unseen) is garbage collected.
    let orphan: ManifestWork = serde_json::from_value(json!({
        "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
        "metadata": {"name": "ghost-12345", "namespace": c1, "labels": {PULL_LABEL: "true"},
                     "annotations": {"apps.open-cluster-management.io/hub-application-namespace": hub_ns,
                                     HUB_APP_NAME_ANNOTATION: "ghost"}},
        "spec": {"workload": {"manifests": []}}
    }))?;
    works_c1.create(&PostParams::default(), &orphan).await?;
    wait_gone(
        &works_c1,
        "ghost-12345",
        "orphaned ManifestWork garbage collected",
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn bad_pull_requests_get_a_condition_and_no_work() -> anyhow::Result<()> {
    let planes = planes().await?;
    let ctx = TestContext::new("pull_bad_input")?;
    let hub = planes.hub.client().await?;
    let hub_ns = ctx.unique("apps");
    ensure_namespace(&hub, &hub_ns).await?;
    let hub_apps: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &hub_ns, &app_resource());
    let all_works: Api<ManifestWork> = Api::all(hub.clone());
    let works_for = |name: &'static str| {
        let all_works = all_works.clone();
        let hub_ns = hub_ns.clone();
        async move {
            let list = all_works.list(&ListParams::default()).await?;
            Ok::<_, kube::Error>(
                list.items
                    .into_iter()
                    .filter(|w| {
                        let a = w.metadata.annotations.clone().unwrap_or_default();
                        a.get(HUB_APP_NAME_ANNOTATION).map(String::as_str) == Some(name)
                            && a.get("apps.open-cluster-management.io/hub-application-namespace")
                                == Some(&hub_ns)
                    })
                    .count(),
            )
        }
    };

    // Label without the cluster annotation: a condition, nothing created.
    hub_apps
        .create(
            &PostParams::default(),
            &pulled_application("no-cluster", &hub_ns, None, "argocd"),
        )
        .await?;
    let app = wait_for(&hub_apps, "no-cluster", "spec error condition", |a| {
        condition(a, SPEC_ERROR_CONDITION).is_some()
    })
    .await?;
    let message = condition(&app, SPEC_ERROR_CONDITION).unwrap();
    assert!(
        message.contains(CLUSTER_ANNOTATION) && message.contains("nothing is propagated"),
        "{message}"
    );
    assert_eq!(works_for("no-cluster").await?, 0);

    // A cluster annotation naming no ManagedCluster.
    let unknown = ctx.unique("nowhere");
    hub_apps
        .create(
            &PostParams::default(),
            &pulled_application("unknown-cluster", &hub_ns, Some(&unknown), "argocd"),
        )
        .await?;
    let app = wait_for(
        &hub_apps,
        "unknown-cluster",
        "unknown cluster condition",
        |a| condition(a, SPEC_ERROR_CONDITION).is_some(),
    )
    .await?;
    assert!(
        condition(&app, SPEC_ERROR_CONDITION)
            .unwrap()
            .contains("does not exist on the hub"),
        "{app}"
    );

    // A ManagedCluster without its namespace: a condition; once the namespace exists, the work
    // appears and the condition goes (event driven, no poll).
    let bare = ctx.unique("bare");
    managed_cluster(&hub, &bare, json!({}), false).await?;
    let created = hub_apps
        .create(
            &PostParams::default(),
            &pulled_application("no-namespace", &hub_ns, Some(&bare), "argocd"),
        )
        .await?;
    let app = wait_for(
        &hub_apps,
        "no-namespace",
        "missing namespace condition",
        |a| condition(a, SPEC_ERROR_CONDITION).is_some_and(|m| m.contains("has no namespace")),
    )
    .await?;
    assert!(condition(&app, SPEC_ERROR_CONDITION)
        .unwrap()
        .contains(&bare));
    assert_eq!(works_for("no-namespace").await?, 0);
    ensure_namespace(&hub, &bare).await?;
    let works: Api<ManifestWork> = Api::namespaced(hub.clone(), &bare);
    wait_for(
        &works,
        &manifest_work_name("no-namespace", created.metadata.uid.as_deref().unwrap()),
        "work once the namespace exists",
        |_| true,
    )
    .await?;
    wait_for(&hub_apps, "no-namespace", "condition cleared", |a| {
        condition(a, SPEC_ERROR_CONDITION).is_none()
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn malformed_feedback_is_reported_on_the_hub_application_with_feedback_written_by_the_test_since_the_real_work_agent_never_writes_it(
) -> anyhow::Result<()> {
    let planes = planes().await?;
    let ctx = TestContext::new("pull_malformed_feedback")?;
    let hub = planes.hub.client().await?;
    let (cluster, hub_ns) = (ctx.unique("feedback"), ctx.unique("apps"));
    managed_cluster(&hub, &cluster, json!({}), true).await?;
    ensure_namespace(&hub, &hub_ns).await?;
    let hub_apps: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &hub_ns, &app_resource());
    let app = hub_apps
        .create(
            &PostParams::default(),
            &pulled_application("guestbook", &hub_ns, Some(&cluster), "argocd"),
        )
        .await?;
    let works: Api<ManifestWork> = Api::namespaced(hub.clone(), &cluster);
    let work = manifest_work_name("guestbook", app.metadata.uid.as_deref().unwrap());
    wait_for(&works, &work, "work", |_| true).await?;

    // Stand-in for a misbehaving work agent: health as an integer, sync as a proper string.
    let values = json!([
        {"name": "healthStatus", "fieldValue": {"type": "Integer", "integer": 3}},
        string_value("syncStatus", "OutOfSync"),
    ]);
    write_feedback(&works, &work, values, Ok(())).await?;
    let hub_app = wait_for(&hub_apps, "guestbook", "ManifestWorkError condition", |a| {
        condition(a, WORK_ERROR_CONDITION).is_some()
    })
    .await?;
    let message = condition(&hub_app, WORK_ERROR_CONDITION).unwrap();
    assert!(
        message.contains("healthStatus") && message.contains("Integer") && message.contains(&work),
        "{message}"
    );
    assert_eq!(
        text(&hub_app, "/status/sync/status"),
        "OutOfSync",
        "the valid value is still written"
    );
    assert_eq!(
        text(&hub_app, "/status/health/status"),
        "",
        "the malformed value is not"
    );

    // Valid feedback clears the condition.
    write_feedback(
        &works,
        &work,
        json!([
            string_value("healthStatus", "Healthy"),
            string_value("syncStatus", "Synced")
        ]),
        Ok(()),
    )
    .await?;
    wait_for(
        &hub_apps,
        "guestbook",
        "condition cleared and status written",
        |a| {
            condition(a, WORK_ERROR_CONDITION).is_none()
                && text(a, "/status/health/status") == "Healthy"
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn cluster_secret_follows_its_managed_cluster() -> anyhow::Result<()> {
    let planes = planes().await?;
    let ctx = TestContext::new("pull_cluster_secret")?;
    let hub = planes.hub.client().await?;
    let cluster = ctx.unique("fleet");
    managed_cluster(&hub, &cluster, json!({"env": "prod"}), true).await?;
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), ARGOCD_NAMESPACE);
    let name = format!("{cluster}-secret");
    let secret = wait_for(&secrets, &name, "cluster Secret", |s| {
        text(s, "/metadata/labels/env") == "prod"
    })
    .await?;
    assert_eq!(
        text(&secret, "/metadata/labels/argocd.argoproj.io~1secret-type"),
        "cluster"
    );
    let data: Secret = serde_json::from_value(secret)?;
    assert_eq!(data.data.as_ref().unwrap()["name"].0, cluster.as_bytes());

    // Labels follow the ManagedCluster (ApplicationSet cluster generators select on them).
    let clusters: Api<DynamicObject> = Api::all_with(hub.clone(), &cluster_resource());
    clusters
        .patch(
            &cluster,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"env": "staging"}}})),
        )
        .await?;
    wait_for(&secrets, &name, "label update", |s| {
        text(s, "/metadata/labels/env") == "staging"
    })
    .await?;

    // An agent registering the same cluster takes over: no duplicate cluster in Argo CD.
    let agent_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("cluster-{cluster}"), "labels": {"argocd.argoproj.io/secret-type": "cluster", AGENT_NAME_LABEL: cluster}},
        "stringData": {"name": cluster, "server": format!("https://proxy?agentName={cluster}")}
    }))?;
    secrets
        .create(&PostParams::default(), &agent_secret)
        .await?;
    wait_gone(
        &secrets,
        &name,
        "pull-model Secret removed for an agent-registered cluster",
    )
    .await?;
    secrets
        .delete(&format!("cluster-{cluster}"), &DeleteParams::default())
        .await?;
    wait_for(
        &secrets,
        &name,
        "pull-model Secret back after the agent left",
        |_| true,
    )
    .await?;

    // Deleting the ManagedCluster deletes the Secret.
    clusters.delete(&cluster, &DeleteParams::default()).await?;
    wait_gone(
        &secrets,
        &name,
        "cluster Secret deleted with its ManagedCluster",
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn appset_report_counts_three_clusters_with_one_failing_with_feedback_written_by_the_test_since_argocd_here_cannot_turn_degraded_then_progressing_on_cue(
) -> anyhow::Result<()> {
    let planes = planes().await?;
    let ctx = TestContext::new("pull_appset_report")?;
    let hub = planes.hub.client().await?;
    let hub_ns = ctx.unique("appsets");
    ensure_namespace(&hub, &hub_ns).await?;
    let clusters: Vec<String> = (1..=3).map(|i| ctx.unique(&format!("report{i}"))).collect();
    for c in &clusters {
        managed_cluster(&hub, c, json!({}), true).await?;
    }
    // The ApplicationSet; no ApplicationSet controller runs, so the test creates what it would
    // generate: one pulled Application per cluster, owned by the set.
    let appsets: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &hub_ns, &appset_resource());
    let appset: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
        "metadata": {"name": "guestbook", "namespace": hub_ns},
        "spec": {
            "generators": [{"clusters": {}}],
            "template": {"metadata": {"name": "{{name}}-guestbook"}, "spec": {"project": "default", "destination": {"name": "{{name}}", "namespace": "guestbook"}}}
        }
    }))?;
    let appset = appsets.create(&PostParams::default(), &appset).await?;
    let hub_apps: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &hub_ns, &app_resource());
    let mut work_names = Vec::new();
    for c in &clusters {
        let mut app = pulled_application(&format!("{c}-guestbook"), &hub_ns, Some(c), "argocd");
        app.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "argoproj.io/v1alpha1".into(),
                kind: "ApplicationSet".into(),
                name: "guestbook".into(),
                uid: appset.metadata.uid.clone().unwrap(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        ]);
        let created = hub_apps.create(&PostParams::default(), &app).await?;
        work_names.push(manifest_work_name(
            &format!("{c}-guestbook"),
            created.metadata.uid.as_deref().unwrap(),
        ));
    }
    // Stand-in for the work agents of the three clusters: two healthy, one failing to apply.
    for (c, work) in clusters.iter().zip(&work_names) {
        let works: Api<ManifestWork> = Api::namespaced(hub.clone(), c);
        let w = wait_for(&works, work, "work of the generated Application", |_| true).await?;
        assert_eq!(
            text(
                &w,
                "/metadata/annotations/apps.open-cluster-management.io~1hosting-applicationset"
            ),
            format!("{hub_ns}/guestbook")
        );
    }
    let healthy = || {
        json!([
            string_value("healthStatus", "Healthy"),
            string_value("syncStatus", "Synced")
        ])
    };
    let t0 = Instant::now();
    for i in 0..2 {
        write_feedback(
            &Api::namespaced(hub.clone(), &clusters[i]),
            &work_names[i],
            healthy(),
            Ok(()),
        )
        .await?;
    }
    let failing = json!([
        string_value("healthStatus", "Degraded"),
        string_value("syncStatus", "OutOfSync")
    ]);
    write_feedback(
        &Api::namespaced(hub.clone(), &clusters[2]),
        &work_names[2],
        failing,
        Err("namespaces \"guestbook\" not found"),
    )
    .await?;

    let reports: Api<MulticlusterApplicationSetReport> = Api::namespaced(hub.clone(), &hub_ns);
    let summary = |r: &Value| {
        let s = &r["statuses"]["summary"];
        [
            "clusters",
            "synced",
            "notSynced",
            "healthy",
            "notHealthy",
            "inProgress",
        ]
        .map(|k| text(s, &format!("/{k}")))
    };
    let report = wait_for(
        &reports,
        "guestbook",
        "report with 3 clusters, one failing",
        |r| {
            summary(r) == ["3", "2", "1", "2", "1", "0"]
                && r["statuses"]["clusterConditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["conditions"].is_array()))
        },
    )
    .await?;
    eprintln!(
        "[measure] feedback of 3 clusters -> ApplicationSet report: {:?}",
        t0.elapsed()
    );
    assert_eq!(
        text(
            &report,
            &format!(
                "/metadata/labels/{}",
                REPORT_APPSET_LABEL.replace('/', "~1")
            )
        ),
        format!("{hub_ns}.guestbook")
    );
    let conditions = report["statuses"]["clusterConditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 3);
    let bad = conditions
        .iter()
        .find(|c| c["cluster"] == json!(clusters[2]))
        .expect("failing cluster listed");
    assert_eq!(
        (text(bad, "/syncStatus"), text(bad, "/healthStatus")),
        ("OutOfSync".into(), "Degraded".into())
    );
    assert_eq!(bad["conditions"][0]["type"], WORK_ERROR_CONDITION);
    assert!(
        text(bad, "/conditions/0/message").contains("not applied on cluster"),
        "{bad}"
    );
    assert!(
        text(bad, "/conditions/0/message").contains("namespaces \"guestbook\" not found"),
        "{bad}"
    );

    // The failing cluster recovers and starts progressing: the report follows (event driven).
    let t1 = Instant::now();
    let progressing = json!([
        string_value("healthStatus", "Progressing"),
        string_value("syncStatus", "Synced")
    ]);
    write_feedback(
        &Api::namespaced(hub.clone(), &clusters[2]),
        &work_names[2],
        progressing,
        Ok(()),
    )
    .await?;
    let recovered = format!("{}-guestbook", clusters[2]);
    wait_for(&hub_apps, &recovered, "hub Application progressing", |a| {
        text(a, "/status/health/status") == "Progressing"
    })
    .await?;
    let hub_status_latency = t1.elapsed();
    let report = wait_for(&reports, "guestbook", "report after recovery", |r| {
        summary(r) == ["3", "3", "0", "2", "1", "1"]
    })
    .await?;
    eprintln!(
        "[measure] one cluster's feedback -> hub Application {hub_status_latency:?} -> ApplicationSet report {:?}",
        t1.elapsed()
    );
    assert!(
        report["statuses"]["clusterConditions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c.get("conditions").is_none()),
        "{report}"
    );

    // Deleting the ApplicationSet deletes its report (explicitly: no garbage collector here).
    appsets
        .delete("guestbook", &DeleteParams::default())
        .await?;
    wait_gone(
        &reports,
        "guestbook",
        "report deleted with its ApplicationSet",
    )
    .await?;
    Ok(())
}

/// A second instance, started and stopped by the test: once before its watches have listed
/// anything, once after it has done work.
#[tokio::test]
async fn controllers_stop_cleanly_on_shutdown() -> anyhow::Result<()> {
    let planes = planes().await?;
    let ctx = TestContext::new("pull_shutdown")?;
    let hub = planes.hub.client().await?;
    let argocd = ctx.unique("argocd");
    ensure_namespace(&hub, &argocd).await?;
    let opts = PullModelOptions {
        argocd_namespace: argocd.clone(),
        ..Default::default()
    };
    let start = |opts: PullModelOptions| {
        let stop = CancellationToken::new();
        let task = tokio::spawn(run_pull_model(hub.clone(), opts, stop.clone()));
        (stop, task)
    };

    let (stop, task) = start(opts.clone());
    stop.cancel();
    let result = tokio::time::timeout(WAIT, task).await??;
    assert!(result.is_ok(), "{result:?}");

    let (stop, task) = start(opts);
    let cluster = ctx.unique("shutdown");
    managed_cluster(&hub, &cluster, json!({}), true).await?;
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), &argocd);
    wait_for(
        &secrets,
        &format!("{cluster}-secret"),
        "the second instance at work",
        |_| true,
    )
    .await?;
    let t0 = Instant::now();
    stop.cancel();
    let result = tokio::time::timeout(WAIT, task).await??;
    assert!(result.is_ok(), "{result:?}");
    eprintln!(
        "[measure] shutdown of a running instance took {:?}",
        t0.elapsed()
    );
    Ok(())
}
