//! `bench-propagation`: how long a change takes to cross the gateway, next to the apiserver's own
//! create → watch latency measured in the same run (the baseline).
//!
//! Figures (p50 / p99 over `--count` Applications, default 50):
//! - baselines: create (and status patch) on the hub → the hub's own watch sees it (one hop);
//! - hub → spoke: create on the hub → the spoke's watch sees the agent's copy;
//! - spoke → hub: status written on the spoke → the hub's watch sees it.
//!
//! The gateway path needs at least two watch hops (principal's watch on the hub, then the spoke's
//! watch after the agent writes), so the ratios are reported against 2 × baseline: create for the
//! hub → spoke path, status patch for the spoke → hub path. Build with `--release` (hack/bench.sh).

use std::time::{Duration, Instant};

use e2e::bench::{count_arg, percentile, Arrivals, BenchSetup};
use e2e::gateway::{application, application_resource, ensure_namespace, text, Agent};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

/// How long to wait for one object to cross.
const ARRIVAL_LIMIT: Duration = Duration::from_secs(60);

fn summary(name: &str, mut samples: Vec<Duration>, baseline_p50: Option<Duration>) -> Duration {
    samples.sort();
    let (p50, p99) = (percentile(&samples, 0.5), percentile(&samples, 0.99));
    let ratio = baseline_p50
        .map(|b| {
            format!(
                "  p50 = {:.2}x baseline, {:.2}x two watch hops",
                p50.as_secs_f64() / b.as_secs_f64(),
                p50.as_secs_f64() / (2.0 * b.as_secs_f64())
            )
        })
        .unwrap_or_default();
    println!(
        "{name:<34} n={:<4} p50={:>8.2?} p99={:>8.2?}{ratio}",
        samples.len(),
        p50,
        p99
    );
    p50
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count = count_arg(50)?;
    let setup = BenchSetup::start("bench").await?;
    let (hub, spoke, dir, pki, principal) = (
        setup.hub(),
        setup.spoke(),
        &setup.dir,
        &setup.pki,
        &setup.principal,
    );
    let hub_client = hub.client().await?;
    ensure_namespace(&hub_client, "bench").await?;
    ensure_namespace(&hub_client, "baseline").await?;
    let agent = Agent::start(
        "bench",
        dir,
        spoke,
        pki,
        &principal.address(),
        "argocd",
        &["--log-level=info"],
    )
    .await?;
    agent.wait_connected().await?;

    eprintln!("==> baseline: create → watch on one apiserver ({count} Applications)");
    let base_api: Api<DynamicObject> =
        Api::namespaced_with(hub_client.clone(), "baseline", &application_resource());
    let base_seen = Arrivals::watch(base_api.clone(), |_| true);
    tokio::time::sleep(Duration::from_millis(500)).await; // let the watch establish before measuring
    let mut base = Vec::new();
    for i in 0..count {
        let name = format!("b{i}");
        let t0 = Instant::now();
        base_api
            .create(
                &PostParams::default(),
                &application(&name, "baseline", "v1"),
            )
            .await?;
        base.push(base_seen.wait(&name, ARRIVAL_LIMIT).await? - t0);
    }

    eprintln!("==> baseline: status patch → watch on one apiserver");
    let base_status_seen = Arrivals::watch(base_api.clone(), |v| {
        text(v, "/status/health/status") == "Healthy"
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut base_patch = Vec::new();
    let healthy =
        json!({"status": {"health": {"status": "Healthy"}, "sync": {"status": "Synced"}}});
    for i in 0..count {
        let name = format!("b{i}");
        let t0 = Instant::now();
        base_api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&healthy))
            .await?;
        base_patch.push(base_status_seen.wait(&name, ARRIVAL_LIMIT).await? - t0);
    }

    eprintln!("==> hub create → spoke visible through principal and agent");
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub_client.clone(), "bench", &application_resource());
    let spoke_apps: Api<DynamicObject> =
        Api::namespaced_with(spoke.client().await?, "argocd", &application_resource());
    let spoke_seen = Arrivals::watch(spoke_apps.clone(), |_| true);
    let hub_status_seen = Arrivals::watch(hub_apps.clone(), |v| {
        text(v, "/status/health/status") == "Healthy"
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut down = Vec::new();
    for i in 0..count {
        let name = format!("g{i}");
        let t0 = Instant::now();
        hub_apps
            .create(&PostParams::default(), &application(&name, "bench", "v1"))
            .await?;
        down.push(spoke_seen.wait(&name, ARRIVAL_LIMIT).await? - t0);
    }

    eprintln!("==> spoke status → hub visible");
    let mut up = Vec::new();
    let status = json!({"status": {"health": {"status": "Healthy"}, "sync": {"status": "Synced"}}});
    for i in 0..count {
        let name = format!("g{i}");
        let t0 = Instant::now();
        spoke_apps
            .patch(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        up.push(hub_status_seen.wait(&name, ARRIVAL_LIMIT).await? - t0);
    }

    println!(
        "\npropagation latency (machine: {} cores)",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    let b = summary("baseline: apiserver create→watch", base, None);
    let bp = summary("baseline: apiserver patch→watch", base_patch, None);
    summary("gateway: hub create → spoke", down, Some(b));
    summary("gateway: spoke status → hub", up, Some(bp));
    drop(agent);
    drop(setup);
    Ok(())
}
