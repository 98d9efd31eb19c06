//! Proves the harness itself on real control planes: independent planes that serve the Argo CD CRDs
//! with watch, status subresource and server-side apply; kubectl against a generated kubeconfig;
//! and no orphan processes after a test binary panics.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;

use e2e::gateway::application_resource;
use e2e::{shared_planes, wait_until, TestContext};

fn application(name: &str, ns: &str, repo: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "project": "default",
            "source": {"repoURL": repo, "path": "guestbook", "targetRevision": "HEAD"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "guestbook"}
        }
    }))
    .expect("valid Application")
}

async fn ensure_namespace(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[tokio::test]
async fn two_planes_serve_applications_independently_with_status_written_by_the_test_since_it_proves_the_crds_not_argocd(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let ctx = TestContext::new("two_planes")?;
    let ns = ctx.unique("apps");
    let hub = planes.hub.client().await?;
    let spoke = planes.spokes[0].client().await?;
    let ar = application_resource();
    for c in [&hub, &spoke] {
        ensure_namespace(c, &ns).await?;
    }
    let hub_apps: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &ns, &ar);
    let spoke_apps: Api<DynamicObject> = Api::namespaced_with(spoke.clone(), &ns, &ar);

    // Watch the hub before creating, so the create must arrive as a watch event.
    let mut events = watcher::watcher(hub_apps.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    hub_apps
        .create(
            &PostParams::default(),
            &application("guestbook", &ns, "https://example.com/hub.git"),
        )
        .await?;
    spoke_apps
        .create(
            &PostParams::default(),
            &application("guestbook", &ns, "https://example.com/spoke.git"),
        )
        .await?;
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(obj) = events.try_next().await? {
            if obj.metadata.name.as_deref() == Some("guestbook") {
                return Ok::<_, anyhow::Error>(obj);
            }
        }
        anyhow::bail!("watch ended")
    })
    .await??;
    assert_eq!(
        seen.data["spec"]["source"]["repoURL"],
        "https://example.com/hub.git"
    );

    // Stand-in for Argo CD's application-controller, proving the CRD takes status the way it
    // writes it: Application has no status subresource (subresources: {} in Argo CD's CRD), so
    // status is patched on the object itself.
    let status = json!({"status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}});
    spoke_apps
        .patch("guestbook", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let spoke_app = spoke_apps.get("guestbook").await?;
    assert_eq!(spoke_app.data["status"]["health"]["status"], "Healthy");

    // The status subresource on a CRD that has one (OCM ManagedCluster; the test stands in for the
    // registration controller): a status patch through it changes status only, and a status
    // written through the main resource is ignored.
    let mc_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.open-cluster-management.io", "v1", "ManagedCluster"),
        "managedclusters",
    );
    let clusters: Api<DynamicObject> = Api::all_with(hub.clone(), &mc_ar);
    let mc_name = ctx.unique("cluster");
    let mc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
        "metadata": {"name": mc_name}, "spec": {"hubAcceptsClient": true},
        "status": {"version": {"kubernetes": "ignored-on-create"}}
    }))?;
    clusters.create(&PostParams::default(), &mc).await?;
    assert!(clusters
        .get(&mc_name)
        .await?
        .data
        .get("status")
        .and_then(|s| s.get("version"))
        .is_none());
    let st = json!({"status": {"version": {"kubernetes": "v1.20.2"}}});
    clusters
        .patch_status(&mc_name, &PatchParams::default(), &Patch::Merge(&st))
        .await?;
    let got = clusters.get(&mc_name).await?;
    assert_eq!(got.data["status"]["version"]["kubernetes"], "v1.20.2");
    assert_eq!(got.data["spec"]["hubAcceptsClient"], true);

    // Server-side apply of a spec change on the hub.
    let change = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "guestbook", "namespace": ns},
        "spec": {"source": {"repoURL": "https://example.com/hub.git", "path": "guestbook", "targetRevision": "v2"}}
    });
    hub_apps
        .patch(
            "guestbook",
            &PatchParams::apply("e2e-harness").force(),
            &Patch::Apply(&change),
        )
        .await?;
    let hub_app = hub_apps.get("guestbook").await?;
    assert_eq!(hub_app.data["spec"]["source"]["targetRevision"], "v2");
    assert!(
        hub_app.data.get("status").is_none(),
        "the spoke's status must not leak into the hub"
    );

    // Isolation: the spoke's object kept its own spec, and each plane has exactly its own object.
    let spoke_app = spoke_apps.get("guestbook").await?;
    assert_eq!(
        spoke_app.data["spec"]["source"]["repoURL"],
        "https://example.com/spoke.git"
    );
    assert_eq!(spoke_app.data["spec"]["source"]["targetRevision"], "HEAD");
    assert_ne!(hub_app.metadata.uid, spoke_app.metadata.uid);
    let only_hub = ctx.unique("only-hub");
    hub_apps
        .create(
            &PostParams::default(),
            &application(&only_hub, &ns, "https://example.com/x.git"),
        )
        .await?;
    wait_until(
        "hub-only app listed on the hub",
        Duration::from_secs(5),
        || {
            let hub_apps = hub_apps.clone();
            let n = only_hub.clone();
            async move { Ok::<_, kube::Error>(hub_apps.get_opt(&n).await?.map(|_| ())) }
        },
    )
    .await?;
    assert!(
        spoke_apps.get_opt(&only_hub).await?.is_none(),
        "an object created on the hub appeared on the spoke"
    );
    Ok(())
}

#[tokio::test]
async fn kubectl_uses_the_generated_kubeconfig() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let kubectl = e2e::binaries::kubectl()?;
    let out = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(&planes.spokes[1].kubeconfig)
        .args([
            "get",
            "crd",
            "applications.argoproj.io",
            "-o",
            "jsonpath={.spec.group}",
        ])
        .output()
        .await?;
    assert!(
        out.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "argoproj.io");
    Ok(())
}

/// Not run directly: started as a child process by `no_orphans_after_a_panicking_test`.
#[tokio::test]
#[ignore = "helper for no_orphans_after_a_panicking_test"]
async fn panicking_child_with_a_plane() {
    let plane = e2e::ControlPlane::start_async("doomed")
        .await
        .expect("plane starts");
    let redis = e2e::Redis::start("doomed").expect("redis starts");
    // The per-process base directory holds every child's data dir, so it names all of them.
    println!(
        "CHILD-DIR {}",
        plane.dir().parent().expect("base dir").display()
    );
    println!("CHILD-REDIS {}", redis.port);
    // Keep both alive in statics-like fashion: leak them so only the exit hooks can clean up.
    std::mem::forget(plane);
    std::mem::forget(redis);
    panic!("deliberate panic to prove cleanup");
}

#[test]
fn no_orphans_after_a_panicking_test() -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "panicking_child_with_a_plane",
            "--nocapture",
        ])
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the child test was expected to fail");
    let dir = stdout
        .lines()
        .find_map(|l| l.strip_prefix("CHILD-DIR "))
        .unwrap_or_else(|| {
            panic!(
                "child printed no plane dir; stdout:\n{stdout}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_string();
    // The child has exited: nothing referencing its directory may still run, and the directory is gone.
    let leftovers = std::process::Command::new("pgrep")
        .args(["-f", &dir])
        .output()?;
    assert!(
        String::from_utf8_lossy(&leftovers.stdout).trim().is_empty(),
        "processes of the panicked test are still running: {}",
        String::from_utf8_lossy(&leftovers.stdout)
    );
    assert!(
        !std::path::Path::new(&dir).exists(),
        "temporary directory {dir} was not removed"
    );
    Ok(())
}
