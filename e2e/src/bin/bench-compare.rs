//! `bench-compare`: the same scenarios against {our principal + our agent} and {upstream
//! argocd-agent v0.9.0's principal + agent} (the Go binaries `hack/peers.sh` builds), on one pair
//! of control planes started for this run, alternating ours, upstream, ours, upstream... for
//! `--rounds` rounds; prints each figure for both with the ours/upstream ratio and writes
//! `bench-compare.json`, `bench-compare.tsv` and `bench-compare.png` under `--out` (default
//! `results/`).
//!
//! Every (round, side) cell gets its own agent name, namespaces, principal and agent, all logging
//! at info, managed mode, no Argo CD: the bench itself writes what Argo CD would (status). After a
//! cell its processes are stopped and its Applications removed, so the next cell's principal
//! starts on an empty hub. Scenarios, in order, within a cell:
//! 1. hub create → spoke visible, p50/p99 over `--count` Applications created one at a time;
//! 2. spoke status → hub visible, p50/p99: the bench merge-patches `status` of those spoke copies;
//! 3. `--apps` more Applications created on the hub (8 writers): time until all are on the spoke,
//!    then after an idle pause the VmRSS of the principal and the agent;
//! 4. the agent is killed, `--changes` changes happen on the hub (a third creates, a third spec
//!    updates, a third deletes), the agent is started again: time until the spoke equals the hub
//!    (names and `targetRevision`), then objects lost (missing or stale on the spoke at the
//!    deadline), left over (deleted on the hub, still on the spoke) and rewritten (unchanged on the
//!    hub yet written again on the spoke: duplicate deliveries).
//!
//! `--smoke`: 1 round, small sizes, finishes in about 2 minutes. Build with `--release`
//! (`hack/bench.sh --compare` does).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::bench::{
    flag_value, has_flag, machine_load, percentile, register_chart_font, rss_kib, Arrivals,
};
use e2e::control_plane::ControlPlane;
use e2e::gateway::{application, application_resource, ensure_namespace, text, Pki};
use e2e::sides::{AnyAgent, AnyPrincipal, Mode, Side};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

/// Concurrent hub writers for bulk creates and offline changes.
const WRITERS: usize = 8;
/// How long one object may take to cross before the cell fails.
const ARRIVAL_LIMIT: Duration = Duration::from_secs(30);
/// How long the first Application may take to cross (the agent connects first).
const CONNECT_LIMIT: Duration = Duration::from_secs(90);

/// Sizes of one run, from flags.
#[derive(Debug)]
struct Sizes {
    smoke: bool,
    rounds: usize,
    count: usize,
    apps: usize,
    changes: usize,
    idle: Duration,
    converge_limit: Duration,
}

impl Sizes {
    fn from_args() -> anyhow::Result<Sizes> {
        let smoke = has_flag("smoke");
        let num = |name: &str, default: usize| -> anyhow::Result<usize> {
            Ok(flag_value(name)
                .map(|v| v.parse())
                .transpose()?
                .unwrap_or(default))
        };
        let (rounds, count, apps, changes, idle, limit) = if smoke {
            (1, 10, 30, 15, 3, 60)
        } else {
            (3, 50, 300, 150, 10, 180)
        };
        let sizes = Sizes {
            smoke,
            rounds: num("rounds", rounds)?,
            count: num("count", count)?,
            apps: num("apps", apps)?,
            changes: num("changes", changes)?,
            idle: Duration::from_secs(num("idle-seconds", idle)? as u64),
            converge_limit: Duration::from_secs(num("converge-seconds", limit)? as u64),
        };
        anyhow::ensure!(
            sizes.apps >= sizes.changes,
            "--apps must be at least --changes (updates and deletes touch existing Applications)"
        );
        Ok(sizes)
    }
}

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
struct CellFigures {
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
    fn to_json(&self) -> Value {
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

/// The planes and PKI every cell uses.
struct Ground {
    hub: ControlPlane,
    spoke: ControlPlane,
    dir: PathBuf,
    pki: Pki,
}

/// One running cell: a principal and an agent of one side, and the Applications they carry.
struct Cell {
    principal: AnyPrincipal,
    agent: AnyAgent,
    hub_apps: Api<DynamicObject>,
    spoke_apps: Api<DynamicObject>,
}

impl Cell {
    async fn start(ground: &Ground, side: Side, round: usize) -> anyhow::Result<Cell> {
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

    fn logs(&self) -> String {
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
    async fn measure(
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
    async fn tear_down(mut self) -> anyhow::Result<()> {
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

/// One line of the comparison: a figure for both sides (lower is better for every figure here).
struct Row {
    figure: String,
    unit: &'static str,
    ours: Option<f64>,
    upstream: Option<f64>,
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        match (self.ours, self.upstream) {
            (Some(o), Some(u)) if u > 0.0 => Some(o / u),
            _ => None,
        }
    }

    /// figure, unit, ours, upstream, ours/upstream, as printed.
    fn cells(&self) -> [String; 5] {
        [
            self.figure.clone(),
            self.unit.to_string(),
            fmt(self.ours),
            fmt(self.upstream),
            fmt(self.ratio()),
        ]
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// The comparison rows: latencies pooled over rounds, other figures the median of rounds, fault
/// counts summed over rounds.
fn rows(cells: &[CellFigures], sizes: &Sizes) -> Vec<Row> {
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

fn fmt(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}

fn print_rows(rows: &[Row]) {
    let header = ["figure", "unit", "ours", "upstream", "ours/upstream"].map(String::from);
    for [figure, unit, ours, upstream, ratio] in
        std::iter::once(header).chain(rows.iter().map(Row::cells))
    {
        println!("{figure:<62} {unit:>7} {ours:>10} {upstream:>10} {ratio:>14}");
    }
}

/// Writes the JSON report, the TSV table and the chart under `dir`.
fn write_results(
    dir: &Path,
    sizes: &Sizes,
    rows: &[Row],
    cells: &[CellFigures],
    failures: &[String],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (load, cpus) = machine_load();
    let report = json!({
        "bench": "bench-compare",
        "upstream": "argocd-agent v0.9.0 (hack/peers.sh)",
        "note": "managed mode, 1 agent, no Argo CD: the bench writes the spoke status itself",
        "sizes": {"smoke": sizes.smoke, "rounds": sizes.rounds, "count": sizes.count,
                  "apps": sizes.apps, "changes": sizes.changes,
                  "idle_s": sizes.idle.as_secs(), "converge_limit_s": sizes.converge_limit.as_secs()},
        "machine": {"cpus": cpus, "load_average_1m_at_end": load},
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs(),
        "figures": rows.iter().map(|r| json!({
            "figure": r.figure, "unit": r.unit, "ours": r.ours, "upstream": r.upstream,
            "ratio": r.ratio(),
        })).collect::<Vec<_>>(),
        "cells": cells.iter().map(CellFigures::to_json).collect::<Vec<_>>(),
        "failures": failures,
    });
    std::fs::write(
        dir.join("bench-compare.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    let mut tsv = String::from("figure\tunit\tours\tupstream\tours_over_upstream\n");
    for r in rows {
        tsv += &(r.cells().join("\t") + "\n");
    }
    std::fs::write(dir.join("bench-compare.tsv"), tsv)?;
    draw_chart(&dir.join("bench-compare.png"), rows)?;
    eprintln!(
        "==> wrote bench-compare.json, bench-compare.tsv and bench-compare.png in {}",
        dir.display()
    );
    Ok(())
}

/// One panel per figure, a bar for each side in the figure's own unit.
fn draw_chart(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    register_chart_font()?;
    const COLUMNS: usize = 3;
    let lines = rows.len().div_ceil(COLUMNS);
    let root = BitMapBackend::new(path, (1350, 60 + 260 * lines as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "bench-compare: ours (blue) vs upstream argocd-agent v0.9.0 (orange), lower is better",
        ("sans-serif", 22),
    )?;
    let orange = RGBColor(230, 140, 30);
    for (area, row) in root.split_evenly((lines, COLUMNS)).iter().zip(rows) {
        let top = row.ours.unwrap_or(0.0).max(row.upstream.unwrap_or(0.0));
        let top = if top > 0.0 { top * 1.25 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{} ({})", row.figure, row.unit), ("sans-serif", 13))
            .margin(10)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..2f64, 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .disable_x_axis()
            .label_style(("sans-serif", 12))
            .draw()?;
        for (x, value, color, who) in [
            (0.0, row.ours, BLUE.mix(0.7), "ours"),
            (1.0, row.upstream, orange.mix(0.9), "upstream"),
        ] {
            let v = value.unwrap_or(0.0);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x + 0.2, 0.0), (x + 0.8, v)],
                color.filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                format!("{who} {}", fmt(value)),
                (x + 0.2, v + top * 0.08),
                ("sans-serif", 13).into_font(),
            )))?;
        }
    }
    root.present()?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sizes = Sizes::from_args()?;
    let out = PathBuf::from(flag_value("out").unwrap_or_else(|| "results".into()));
    let started = Instant::now();
    eprintln!("==> bench-compare {sizes:?}");
    eprintln!("==> starting hub and spoke control planes");
    let mut planes =
        tokio::task::spawn_blocking(|| ControlPlane::start_many(&["hub", "spoke"])).await??;
    let spoke = planes.pop().expect("two planes");
    let hub = planes.pop().expect("two planes");
    let dir = e2e::process::temp_dir("bench-compare")?;
    let pki = Pki::create(&dir.join("pki"))?;
    let ground = Ground {
        hub,
        spoke,
        dir,
        pki,
    };

    let mut cells = Vec::new();
    let mut failures = Vec::new();
    for round in 1..=sizes.rounds {
        for side in [Side::Ours, Side::Upstream] {
            eprintln!("==> round {round}/{}: {}", sizes.rounds, side.label());
            let measured = async {
                let mut cell = Cell::start(&ground, side, round).await?;
                let figures = cell
                    .measure(side, round, &sizes)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e:#}\n{}", cell.logs()));
                cell.tear_down().await?;
                figures
            }
            .await;
            match measured {
                Ok(f) => cells.push(f),
                Err(e) => {
                    eprintln!("round {round} {} failed: {e:#}", side.label());
                    failures.push(format!("round {round} {}: {e:#}", side.label()));
                }
            }
        }
    }

    let rows = rows(&cells, &sizes);
    let (load, cpus) = machine_load();
    println!(
        "\nbench-compare: ours vs upstream argocd-agent v0.9.0, managed mode, 1 agent, no Argo CD \
         (the bench writes the spoke status); {} round(s) alternating, {} samples per latency per \
         round; {cpus} CPUs, load average (1 min) {load:.2}; took {:.0?}",
        sizes.rounds,
        sizes.count,
        started.elapsed()
    );
    print_rows(&rows);
    write_results(&out, &sizes, &rows, &cells, &failures)?;
    anyhow::ensure!(failures.is_empty(), "{} cell(s) failed", failures.len());
    Ok(())
}
