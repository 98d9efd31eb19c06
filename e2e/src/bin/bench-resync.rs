//! `bench-resync`: how long the gateway takes to converge after a long offline period with N
//! pending objects, next to a baseline measured in the same run: the time the raw apiserver takes
//! to create the same N objects with the same client concurrency (the agent applies events on 8
//! lanes, so 8 concurrent clients).
//!
//! Scenarios, each for N = 1,000 and 5,000 (or `--count N`; `--smoke` = 50):
//! - managed: the agent is stopped, N Applications are created on the hub, the agent is started
//!   again; time from its restart until the spoke holds all N (spoke == hub). Also prints how many
//!   `spec-update`s the principal sent (the checksum resync sends none for unchanged objects).
//! - autonomous: the link between agent and principal is cut (TCP proxy), N Applications are
//!   created on the spoke, the link is restored; time from the restore until the hub mirrors all
//!   N. Includes the agent's reconnect backoff (at most 2 s here).
//!
//! Figures are printed as ratios to the baseline. Runs against whatever profile the binaries were
//! built with (`cargo build --workspace --bins`, add `--release` for release figures).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::bench::{count_arg, BenchSetup};
use e2e::gateway::{application, application_resource, ensure_namespace, Agent};
use e2e::metrics::Scrape;
use e2e::tcp_proxy::TcpProxy;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, PostParams};
use kube::runtime::{watcher, WatchStreamExt};

/// Concurrent clients for both the baseline and the set-up writes: the agent's lane count.
const CLIENTS: usize = 8;
/// Longest a scenario may take to converge.
const CONVERGE_LIMIT: Duration = Duration::from_secs(900);

/// Names seen so far by a watch of one namespace.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<HashSet<String>>>);

impl Seen {
    fn watch(api: Api<DynamicObject>) -> Seen {
        let seen = Seen::default();
        let out = seen.clone();
        tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = stream.next().await {
                let mut names = out.0.lock().unwrap();
                match ev {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                        names.insert(o.metadata.name.unwrap_or_default());
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        names.remove(&o.metadata.name.unwrap_or_default());
                    }
                    _ => {}
                }
            }
        });
        seen
    }

    fn count(&self, prefix: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|n| n.starts_with(prefix))
            .count()
    }

    /// Waits until `n` names with `prefix` were seen; returns when.
    async fn wait_for(&self, prefix: &str, n: usize) -> anyhow::Result<Instant> {
        let deadline = Instant::now() + CONVERGE_LIMIT;
        loop {
            let have = self.count(prefix);
            if have >= n {
                return Ok(Instant::now());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "only {have} of {n} {prefix}* objects arrived within {CONVERGE_LIMIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Creates `{prefix}{i}` for i in 0..n in `api`'s namespace with [`CLIENTS`] concurrent clients;
/// returns how long it took.
async fn create_many(
    api: &Api<DynamicObject>,
    namespace: &str,
    prefix: &str,
    n: usize,
) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let obj = application(&format!("{prefix}{i}"), namespace, "v1");
            async move { api.create(&PostParams::default(), &obj).await }
        })
        .buffer_unordered(CLIENTS)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(t0.elapsed())
}

/// The sum of `name`'s samples with `labels` on the process serving ops on `ops_port` (an
/// error if it does not declare the metric).
async fn metric(ops_port: u16, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<f64> {
    Scrape::of(ops_port).await?.value(name, labels)
}

/// `principal_events_sent_total{event_type="<t>"}` from the principal's metrics.
async fn principal_sent(ops_port: u16, event_type: &str) -> anyhow::Result<f64> {
    metric(
        ops_port,
        "principal_events_sent",
        &[("event_type", event_type)],
    )
    .await
}

const PRINCIPAL_RESENDS: &str = "argocd_principal_event_resends_total";
const AGENT_RESENDS: &str = "argocd_agent_event_resends_total";

/// Objects each plane creates before the first baseline, so that no figure pays the apiserver's
/// and etcd's warm-up (first writes of a resource are markedly slower).
const WARM_UP: usize = 300;

struct Figure {
    mode: &'static str,
    pending: usize,
    baseline: Duration,
    converge: Duration,
    note: String,
}

fn print(figures: &[Figure]) {
    let (cpus, load) = (
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default(),
    );
    println!(
        "\nresync after a long offline period (machine: {cpus} cores, load {}; baseline = raw apiserver creating the same N with {CLIENTS} clients)",
        load.split_whitespace().next().unwrap_or("?")
    );
    println!(
        "{:<11} {:>7} {:>11} {:>11} {:>16}  notes",
        "mode", "pending", "baseline", "converge", "ratio"
    );
    for f in figures {
        println!(
            "{:<11} {:>7} {:>11.2?} {:>11.2?} {:>15.2}x  {}",
            f.mode,
            f.pending,
            f.baseline,
            f.converge,
            f.converge.as_secs_f64() / f.baseline.as_secs_f64(),
            f.note
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let sizes: Vec<usize> = if smoke {
        vec![50]
    } else if std::env::args().any(|a| a == "--count") {
        vec![count_arg(1000)?]
    } else {
        vec![1000, 5000]
    };
    let setup = BenchSetup::start("bench-resync").await?;
    let (hub, spoke, dir, pki, principal) = (
        setup.hub(),
        setup.spoke(),
        &setup.dir,
        &setup.pki,
        &setup.principal,
    );
    let hub_client = hub.client().await?;
    let spoke_client = spoke.client().await?;
    for ns in ["bench", "bench-auto", "baseline"] {
        ensure_namespace(&hub_client, ns).await?;
        ensure_namespace(&spoke_client, ns).await?;
    }
    pki.issue_agent("bench-auto")?;
    let api = |c: &kube::Client, ns: &str| -> Api<DynamicObject> {
        Api::namespaced_with(c.clone(), ns, &application_resource())
    };

    let mut managed = Agent::start(
        "bench",
        dir,
        spoke,
        pki,
        &principal.address(),
        "argocd",
        &["--log-level=info"],
    )
    .await?;
    managed.wait_connected().await?;
    let principal_addr: SocketAddr = principal.address().parse()?;
    let proxy = TcpProxy::start(principal_addr).await?;
    let autonomous = Agent::start(
        "bench-auto",
        dir,
        spoke,
        pki,
        &proxy.address(),
        "bench-auto",
        &["--mode=autonomous", "--log-level=info"],
    )
    .await?;
    autonomous.wait_connected().await?;
    let spoke_copies = Seen::watch(api(&spoke_client, "argocd"));
    let hub_mirrors = Seen::watch(api(&hub_client, "bench-auto"));

    eprintln!("==> warm-up: {WARM_UP} creates on each plane");
    create_many(
        &api(&spoke_client, "baseline"),
        "baseline",
        "warm-",
        WARM_UP,
    )
    .await?;
    create_many(&api(&hub_client, "baseline"), "baseline", "warm-", WARM_UP).await?;

    let mut figures = Vec::new();
    for (round, &n) in sizes.iter().enumerate() {
        eprintln!("==> N = {n}: baselines (raw apiserver, {CLIENTS} clients)");
        let spoke_baseline = create_many(
            &api(&spoke_client, "baseline"),
            "baseline",
            &format!("s{round}-"),
            n,
        )
        .await?;
        let hub_baseline = create_many(
            &api(&hub_client, "baseline"),
            "baseline",
            &format!("h{round}-"),
            n,
        )
        .await?;

        eprintln!("==> N = {n}: managed agent stopped, {n} Applications created on the hub");
        managed.process.kill();
        let prefix = format!("m{round}-");
        let setup_time = create_many(&api(&hub_client, "bench"), "bench", &prefix, n).await?;
        let sent_before = principal_sent(principal.ops_port, "spec-update").await?
            + principal_sent(principal.ops_port, "create").await?;
        let spec_before = principal_sent(principal.ops_port, "spec-update").await?;
        let resends_before = metric(principal.ops_port, PRINCIPAL_RESENDS, &[]).await?;
        let t0 = Instant::now();
        managed.process.start_again()?;
        let done = spoke_copies.wait_for(&prefix, n).await?;
        let resends = metric(principal.ops_port, PRINCIPAL_RESENDS, &[]).await? - resends_before;
        let sent = principal_sent(principal.ops_port, "spec-update").await?
            + principal_sent(principal.ops_port, "create").await?
            - sent_before;
        let spec = principal_sent(principal.ops_port, "spec-update").await? - spec_before;
        figures.push(Figure {
            mode: "managed",
            pending: n,
            baseline: spoke_baseline,
            converge: done - t0,
            note: format!(
                "from agent restart; hub writes took {setup_time:.2?}; principal sent {sent} object events ({spec} spec-update, {resends} resends) for {n} pending + {} unchanged",
                spoke_copies.count("m").saturating_sub(n)
            ),
        });

        eprintln!("==> N = {n}: autonomous link cut, {n} Applications created on the spoke");
        proxy.cut();
        let prefix = format!("a{round}-");
        let setup_time =
            create_many(&api(&spoke_client, "bench-auto"), "bench-auto", &prefix, n).await?;
        let resends_before = metric(autonomous.ops_port, AGENT_RESENDS, &[]).await?;
        let t0 = Instant::now();
        proxy.forward();
        let done = hub_mirrors.wait_for(&prefix, n).await?;
        let resends = metric(autonomous.ops_port, AGENT_RESENDS, &[]).await? - resends_before;
        figures.push(Figure {
            mode: "autonomous",
            pending: n,
            baseline: hub_baseline,
            converge: done - t0,
            note: format!(
                "from link restore (incl. reconnect backoff ≤ 2 s); spoke writes took {setup_time:.2?}; agent resent {resends}"
            ),
        });
    }
    print(&figures);
    drop(autonomous);
    drop(managed);
    drop(setup);
    Ok(())
}
