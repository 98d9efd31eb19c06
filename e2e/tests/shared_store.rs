//! One store per kind per process: a real `argocd-principal` with the embedded operator
//! (`--enable-operator=true`) keeps one Application watch on the hub, its hub informer, which the
//! operator's pull model reads too, also when `--label-selector` and `--allowed-namespaces` narrow
//! what the hub serves (it then narrows in process; `flags.rs` shows the narrowing still holds).
//!
//! Counted with the apiserver's own gauge of open watches (`apiserver_longrunning_requests`,
//! verb WATCH), on a plane of its own so no other process's watches are counted.

use std::time::Duration;

use e2e::gateway::{Pki, Principal};
use e2e::{wait_until, ControlPlane, TestContext};

const WAIT: Duration = Duration::from_secs(60);

/// Open cluster-wide watches of `resource` (group `group`) on the plane, from its `/metrics`.
async fn open_watches(client: &kube::Client, group: &str, resource: &str) -> anyhow::Result<u64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let metrics = client.request_text(request).await?;
    let labels = [
        format!("group=\"{group}\""),
        format!("resource=\"{resource}\""),
        "scope=\"cluster\"".to_string(),
        "verb=\"WATCH\"".to_string(),
    ];
    Ok(metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{"))
        .filter(|l| labels.iter().all(|label| l.contains(label.as_str())))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum())
}

/// Waits until the principal's pull model watches every kind it needs besides Applications (it
/// starts them together with its own Application watch, when it has one).
async fn wait_pull_model_watching(client: &kube::Client) -> anyhow::Result<()> {
    let kinds = [
        ("work.open-cluster-management.io", "manifestworks"),
        ("cluster.open-cluster-management.io", "managedclusters"),
    ];
    wait_until("the pull model watches its kinds", WAIT, || async {
        for (group, resource) in kinds {
            if open_watches(client, group, resource).await? == 0 {
                return Ok::<_, anyhow::Error>(None);
            }
        }
        Ok(Some(()))
    })
    .await
}

#[tokio::test]
async fn the_principal_watches_applications_once_for_its_hub_view_and_its_pull_model(
) -> anyhow::Result<()> {
    let plane = ControlPlane::start_async("shared-store").await?;
    let client = plane.client().await?;
    let ctx = TestContext::new("shared_store")?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let apps = || open_watches(&client, "argoproj.io", "applications");
    assert_eq!(apps().await?, 0, "nothing else watches Applications here");

    let principal = Principal::start(
        "shared",
        &ctx.dir,
        &plane,
        &pki,
        "argocd",
        &["--enable-operator=true"],
    )
    .await?;
    wait_pull_model_watching(&client).await?;
    wait_until("the hub informer watches Applications", WAIT, || async {
        Ok::<_, anyhow::Error>((apps().await? >= 1).then_some(()))
    })
    .await?;
    assert_eq!(
        apps().await?,
        1,
        "the hub informer's watch is the pull model's too"
    );
    drop(principal);
    wait_until("the principal's watches closed", WAIT, || async {
        Ok::<_, anyhow::Error>((apps().await? == 0).then_some(()))
    })
    .await?;

    // Narrowed by --label-selector and --allowed-namespaces, the hub's view is narrowed in
    // process: still one watch, shared with the pull model, which reads every Application.
    let _narrowed = Principal::start(
        "narrowed",
        &ctx.dir,
        &plane,
        &pki,
        "argocd",
        &[
            "--enable-operator=true",
            "--label-selector=team=a",
            "--allowed-namespaces=team-*",
        ],
    )
    .await?;
    wait_pull_model_watching(&client).await?;
    wait_until(
        "the narrowed principal watches Applications",
        WAIT,
        || async { Ok::<_, anyhow::Error>((apps().await? >= 1).then_some(())) },
    )
    .await?;
    assert_eq!(
        apps().await?,
        1,
        "a narrowed hub view still shares its one Application watch with the pull model"
    );
    Ok(())
}
