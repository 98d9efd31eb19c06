//! One (round, side) cell of the comparison: a principal and an agent of one side in managed mode,
//! the scenarios it runs (latencies, bulk sync, idle RSS, agent offline) and the rows they give.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use e2e::bench::{percentile, rss_kib, Arrivals};
use e2e::gateway::{application, application_resource, ensure_namespace, text};
use e2e::sides::{AnyAgent, AnyPrincipal, Mode, Side};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use crate::report::{median, Row};
use crate::{Ground, Sizes};

/// Concurrent hub writers for bulk creates and offline changes.
const WRITERS: usize = 8;
/// How long one object may take to cross before the cell fails.
const ARRIVAL_LIMIT: Duration = Duration::from_secs(30);
/// How long the first Application may take to cross (the agent connects first).
const CONNECT_LIMIT: Duration = Duration::from_secs(90);

/// What the offline scenario measured.
#[derive(Debug, Default)]
struct Offline {
    converge: Option<Duration>,
    lost: usize,
    left_over: usize,
    rewritten: usize,
}

/// Figures of one side in one round.
#[derive(Debug)]
pub struct CellFigures {
    side: Side,
    round: usize,
    create_to_spoke: Vec<Duration>,
    status_to_hub: Vec<Duration>,
    status_missing: usize,
    bulk_sync: Duration,
    principal_rss_kib: u64,
    agent_rss_kib: u64,
    offline: Offline,
}

impl CellFigures {
    pub fn to_json(&self) -> Value {
        let ms = |v: &[Duration]| v.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>();
        json!({
            "side": self.side.label(), "round": self.round,
            "create_to_spoke_ms": ms(&self.create_to_spoke),
            "status_to_hub_ms": ms(&self.status_to_hub),
            "status_missing": self.status_missing,
            "bulk_sync_s": self.bulk_sync.as_secs_f64(),
            "principal_rss_kib": self.principal_rss_kib,
            "agent_rss_kib": self.agent_rss_kib,
            "offline": {
                "converge_s": self.offline.converge.map(|d| d.as_secs_f64()),
                "lost": self.offline.lost, "left_over": self.offline.left_over,
                "rewritten": self.offline.rewritten,
            },
        })
    }
}

/// One running cell: a principal and an agent of one side, and the Applications they carry.
pub struct Cell {
    principal: AnyPrincipal,
    agent: AnyAgent,
    hub_apps: Api<DynamicObject>,
    spoke_apps: Api<DynamicObject>,
}

impl Cell {
    pub async fn start(ground: &Ground, side: Side, round: usize) -> anyhow::Result<Cell> {
        let name = format!("{}-{round}", side.label());
        ground.pki.issue_agent(&name)?;
        let hub_client = ground.hub.client().await?;
        ensure_namespace(&hub_client, &name).await?;
        let spoke_ns = format!("spoke-{name}");
        let principal = AnyPrincipal::start(
            side,
            &name,
            &ground.dir,
            &ground.hub,
            &ground.pki,
            &format!("hub-{name}"),
            &["--log-level=info"],
        )
        .await?;
        let agent = AnyAgent::start(
            side,
            &name,
            &ground.dir,
            &ground.spoke,
            &ground.pki,
            &principal.address(),
            Mode::Managed,
            &spoke_ns,
            None,
            &["--log-level=info"],
        )
        .await?;
        Ok(Cell {
            principal,
            agent,
            hub_apps: Api::namespaced_with(hub_client, &name, &application_resource()),
            spoke_apps: Api::namespaced_with(
                ground.spoke.client().await?,
                &spoke_ns,
                &application_resource(),
            ),
        })
    }

    pub fn logs(&self) -> String {
        format!(
            "--- principal ---\n{}\n--- agent ---\n{}",
            self.principal.process().log_tail(20),
            self.agent.process().log_tail(20)
        )
    }

    fn pid(process: &e2e::ManagedProcess) -> anyhow::Result<u32> {
        process
            .pid()
            .ok_or_else(|| anyhow::anyhow!("{} is not running", process.name()))
    }

    /// Runs the four scenarios.
    pub async fn measure(
        &mut self,
        side: Side,
        round: usize,
        sizes: &Sizes,
    ) -> anyhow::Result<CellFigures> {
        let spoke_seen = Arrivals::watch(self.spoke_apps.clone(), |_| true);
        let hub_healthy = Arrivals::watch(self.hub_apps.clone(), |v| {
            text(v, "/status/health/status") == "Healthy"
        });
        let ns = self.hub_apps_namespace();
        self.hub_apps
            .create(&PostParams::default(), &application("warmup", &ns, "v1"))
            .await?;
        spoke_seen.wait("warmup", CONNECT_LIMIT).await?;

        eprintln!(
            "    hub create → spoke visible ({} Applications)",
            sizes.count
        );
        let mut create_to_spoke = Vec::new();
        for i in 0..sizes.count {
            let name = format!("lat-{i}");
            let t0 = Instant::now();
            self.hub_apps
                .create(&PostParams::default(), &application(&name, &ns, "v1"))
                .await?;
            create_to_spoke.push(spoke_seen.wait(&name, ARRIVAL_LIMIT).await? - t0);
        }

        eprintln!("    spoke status (written by the bench) → hub visible");
        let status =
            json!({"status": {"health": {"status": "Healthy"}, "sync": {"status": "Synced"}}});
        let mut status_to_hub = Vec::new();
        for i in 0..sizes.count {
            let name = format!("lat-{i}");
            let t0 = Instant::now();
            self.spoke_apps
                .patch(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
            match hub_healthy.wait(&name, ARRIVAL_LIMIT).await {
                Ok(t) => status_to_hub.push(t - t0),
                Err(e) => {
                    eprintln!("    {e}: the remaining status updates are counted as missing");
                    break;
                }
            }
        }
        let status_missing = sizes.count - status_to_hub.len();

        eprintln!("    {} more Applications, then idle RSS", sizes.apps);
        let t0 = Instant::now();
        self.create_apps((0..sizes.apps).map(|i| format!("idle-{i}")), &ns)
            .await?;
        let mut last = t0;
        for i in 0..sizes.apps {
            last = last.max(spoke_seen.wait(&format!("idle-{i}"), ARRIVAL_LIMIT).await?);
        }
        let bulk_sync = last - t0;
        tokio::time::sleep(sizes.idle).await;
        let principal_rss_kib = rss_kib(Self::pid(self.principal.process())?)?;
        let agent_rss_kib = rss_kib(Self::pid(self.agent.process())?)?;

        eprintln!(
            "    agent offline while {} changes happen on the hub",
            sizes.changes
        );
        let offline = self.offline(sizes, &ns).await?;
        Ok(CellFigures {
            side,
            round,
            create_to_spoke,
            status_to_hub,
            status_missing,
            bulk_sync,
            principal_rss_kib,
            agent_rss_kib,
            offline,
        })
    }

    fn hub_apps_namespace(&self) -> String {
        self.hub_apps
            .namespace()
            .map(str::to_string)
            .unwrap_or_default()
    }

    /// Creates Applications `names` in the hub namespace `ns` with [`WRITERS`] concurrent writers.
    async fn create_apps(
        &self,
        names: impl Iterator<Item = String>,
        ns: &str,
    ) -> anyhow::Result<()> {
        futures::stream::iter(names)
            .map(|name| async move {
                self.hub_apps
                    .create(&PostParams::default(), &application(&name, ns, "v1"))
                    .await
                    .map(drop)
            })
            .buffer_unordered(WRITERS)
            .try_collect::<()>()
            .await?;
        Ok(())
    }

    /// Scenario 4: kill the agent, change the hub, start the agent, wait for the spoke to match.
    async fn offline(&mut self, sizes: &Sizes, ns: &str) -> anyhow::Result<Offline> {
        let third = sizes.changes / 3;
        let (updates, deletes) = (0..third, third..sizes.changes - third);
        let creates = (0..third).map(|i| format!("off-{i}"));
        let before = revisions(&self.spoke_apps).await?;
        self.agent.process_mut().kill();

        let hub_apps = &self.hub_apps;
        let patch = json!({"spec": {"source": {"targetRevision": "v2"}}});
        futures::stream::iter(updates.clone())
            .map(|i| {
                let patch = &patch;
                async move {
                    hub_apps
                        .patch(
                            &format!("idle-{i}"),
                            &PatchParams::default(),
                            &Patch::Merge(patch),
                        )
                        .await
                        .map(drop)
                }
            })
            .buffer_unordered(WRITERS)
            .try_collect::<()>()
            .await?;
        futures::stream::iter(deletes.clone())
            .map(|i| async move {
                hub_apps
                    .delete(&format!("idle-{i}"), &DeleteParams::default())
                    .await
                    .map(drop)
            })
            .buffer_unordered(WRITERS)
            .try_collect::<()>()
            .await?;
        self.create_apps(creates, ns).await?;
        let changed: Vec<String> = updates
            .chain(deletes)
            .map(|i| format!("idle-{i}"))
            .collect();

        let t0 = Instant::now();
        self.agent.process_mut().start_again()?;
        let deadline = t0 + sizes.converge_limit;
        let mut result = Offline::default();
        loop {
            let (lost, left_over) = differences(&self.hub_apps, &self.spoke_apps).await?;
            (result.lost, result.left_over) = (lost, left_over);
            if lost == 0 && left_over == 0 {
                result.converge = Some(t0.elapsed());
                break;
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Late duplicate writes count too.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = revisions(&self.spoke_apps).await?;
        result.rewritten = before
            .iter()
            .filter(|(name, rv)| {
                !changed.contains(name) && after.get(*name).is_some_and(|now| now != *rv)
            })
            .count();
        Ok(result)
    }

    /// Stops both processes and removes every Application of the cell from hub and spoke.
    pub async fn tear_down(mut self) -> anyhow::Result<()> {
        self.agent.process_mut().stop();
        match &mut self.principal {
            AnyPrincipal::Ours(p) => p.process.stop(),
            AnyPrincipal::Upstream(p) => p.process.stop(),
        }
        for api in [&self.hub_apps, &self.spoke_apps] {
            for app in api.list(&ListParams::default()).await? {
                let name = app.metadata.name.clone().unwrap_or_default();
                if app.metadata.finalizers.is_some_and(|f| !f.is_empty()) {
                    api.patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await?;
                }
            }
            api.delete_collection(&DeleteParams::default(), &ListParams::default())
                .await?;
        }
        Ok(())
    }
}

/// `field` of every Application in `api`, by name.
async fn by_name(
    api: &Api<DynamicObject>,
    field: fn(&Value) -> String,
) -> anyhow::Result<HashMap<String, String>> {
    Ok(api
        .list(&ListParams::default())
        .await?
        .into_iter()
        .map(|o| {
            let v = serde_json::to_value(&o).unwrap_or_default();
            (text(&v, "/metadata/name"), field(&v))
        })
        .collect())
}

/// `resourceVersion` of every Application in `api`, by name.
async fn revisions(api: &Api<DynamicObject>) -> anyhow::Result<HashMap<String, String>> {
    by_name(api, |v| text(v, "/metadata/resourceVersion")).await
}

/// (hub Applications missing or stale on the spoke, spoke Applications no longer on the hub).
async fn differences(
    hub: &Api<DynamicObject>,
    spoke: &Api<DynamicObject>,
) -> anyhow::Result<(usize, usize)> {
    let target = |v: &Value| text(v, "/spec/source/targetRevision");
    let hub = by_name(hub, target).await?;
    let spoke = by_name(spoke, target).await?;
    let lost = hub.iter().filter(|(n, r)| spoke.get(*n) != Some(r)).count();
    let left_over = spoke.keys().filter(|n| !hub.contains_key(*n)).count();
    Ok((lost, left_over))
}

/// The comparison rows: latencies pooled over rounds, other figures the median of rounds, fault
/// counts summed over rounds.
pub fn rows(cells: &[CellFigures], sizes: &Sizes) -> Vec<Row> {
    let of = |side: Side| cells.iter().filter(move |c| c.side == side);
    let pooled = |side: Side, pick: fn(&CellFigures) -> &Vec<Duration>, p: f64| {
        let mut all: Vec<Duration> = of(side).flat_map(|c| pick(c).iter().copied()).collect();
        all.sort();
        (!all.is_empty()).then(|| percentile(&all, p).as_secs_f64() * 1e3)
    };
    let med = |side: Side, pick: fn(&CellFigures) -> Option<f64>| {
        median(of(side).filter_map(pick).collect())
    };
    let total = |side: Side, pick: fn(&CellFigures) -> usize| {
        (of(side).count() > 0).then(|| of(side).map(pick).sum::<usize>() as f64)
    };
    let mut rows = Vec::new();
    for (name, pick) in [
        (
            "hub create → spoke visible",
            (|c: &CellFigures| &c.create_to_spoke) as fn(&CellFigures) -> &Vec<Duration>,
        ),
        (
            "spoke status (bench-written) → hub visible",
            |c: &CellFigures| &c.status_to_hub,
        ),
    ] {
        for (label, p) in [("p50", 0.5), ("p99", 0.99)] {
            rows.push(Row {
                figure: format!("{name} {label}"),
                unit: "ms",
                ours: pooled(Side::Ours, pick, p),
                upstream: pooled(Side::Upstream, pick, p),
            });
        }
    }
    let both = |figure: String, unit, pick: fn(&CellFigures) -> Option<f64>| Row {
        figure,
        unit,
        ours: med(Side::Ours, pick),
        upstream: med(Side::Upstream, pick),
    };
    let count = |figure: String, pick: fn(&CellFigures) -> usize| Row {
        figure,
        unit: "objects",
        ours: total(Side::Ours, pick),
        upstream: total(Side::Upstream, pick),
    };
    rows.push(count("status updates never seen on the hub".into(), |c| {
        c.status_missing
    }));
    rows.push(both(
        format!(
            "{} Applications created on the hub → all on the spoke",
            sizes.apps
        ),
        "s",
        |c| Some(c.bulk_sync.as_secs_f64()),
    ));
    let synced = sizes.apps + sizes.count + 1;
    rows.push(both(
        format!("principal idle RSS, {synced} Applications synced"),
        "MiB",
        |c| Some(c.principal_rss_kib as f64 / 1024.0),
    ));
    rows.push(both(
        format!("agent idle RSS, {synced} Applications synced"),
        "MiB",
        |c| Some(c.agent_rss_kib as f64 / 1024.0),
    ));
    rows.push(both(
        format!(
            "agent offline, {} hub changes: converge after restart",
            sizes.changes
        ),
        "s",
        |c| c.offline.converge.map(|d| d.as_secs_f64()),
    ));
    rows.push(count(
        "offline: lost (missing or stale on the spoke)".into(),
        |c| c.offline.lost,
    ));
    rows.push(count(
        "offline: left over (deleted on the hub)".into(),
        |c| c.offline.left_over,
    ));
    rows.push(count(
        "offline: unchanged Applications rewritten on the spoke".into(),
        |c| c.offline.rewritten,
    ));
    rows
}
