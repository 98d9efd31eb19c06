//! One (round, side, mode) cell of the comparison: a principal and an agent of one side, the agent
//! in managed or autonomous mode, the scenarios it runs and the rows they give. The bench writes
//! where the mode's source of truth is (managed: the hub; autonomous: the spoke) and watches the
//! other plane (the replica): latencies, bulk sync, idle RSS, agent offline; managed cells also
//! measure status (spoke → hub) and the live-view reads through the principal ([`crate::proxy`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use e2e::bench::{flag_value, rss_kib, Arrivals};
use e2e::gateway::{application, application_resource, ensure_namespace, text};
use e2e::sides::{AnyAgent, AnyPrincipal, Mode, Side};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use crate::proxy::{self, LiveView, ProxyFigures};
use crate::report::{median, pooled, Row};
use crate::{Ground, Sizes};

/// Our agent's count of resent events (upstream's agent has none).
const AGENT_RESENDS: &str = "argocd_agent_event_resends_total";

/// Concurrent hub writers for bulk creates and offline changes.
const WRITERS: usize = 8;
/// How long one object may take to cross before the cell fails.
const ARRIVAL_LIMIT: Duration = Duration::from_secs(30);
/// How long the first Application may take to cross (the agent connects first).
const CONNECT_LIMIT: Duration = Duration::from_secs(90);
/// A latency sample above this is printed with its timeline (when it started, when the source
/// apiserver answered the create).
const SLOW_SAMPLE: Duration = Duration::from_millis(50);

/// Prints a latency sample over [`SLOW_SAMPLE`] with its timeline: when the bench wrote `what` to
/// the `from` apiserver (wall clock), when that apiserver answered, when `to` showed it. With
/// `--log-level debug` the principal's and agent's logs have the rest (event queued, sent,
/// received, handled: see `proto::sync`).
fn report_slow(
    what: &str,
    wall: time::OffsetDateTime,
    from: &str,
    answered: Duration,
    to: &str,
    took: Duration,
) {
    if took > SLOW_SAMPLE {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        eprintln!(
            "    slow: {what} at {wall} (UTC), the {from} apiserver answered after {:.1} ms, \
             {to} visible after {:.1} ms",
            ms(answered),
            ms(took)
        );
    }
}

/// `--log-level` of a side's binaries: ours take `--log-level FILTER` from the bench's flags
/// (`info` by default; e.g. `debug` gives every event's queued / sent / received / handled time),
/// upstream's stay at `info`.
fn log_level(side: Side) -> String {
    match side {
        Side::Ours => flag_value("log-level").unwrap_or_else(|| "info".into()),
        Side::Upstream => "info".into(),
    }
}

/// What the offline scenario measured.
#[derive(Debug, Default)]
struct Offline {
    converge: Option<Duration>,
    lost: usize,
    left_over: usize,
    rewritten: usize,
    /// Events our agent resent from its restart until the end of the scenario.
    resent: Option<f64>,
}

/// Figures of one side in one round.
#[derive(Debug)]
pub struct CellFigures {
    side: Side,
    mode: Mode,
    round: usize,
    create_to_replica: Vec<Duration>,
    status_to_hub: Vec<Duration>,
    status_missing: usize,
    bulk_sync: Duration,
    principal_rss_kib: u64,
    agent_rss_kib: u64,
    offline: Offline,
    proxy: Option<ProxyFigures>,
}

impl CellFigures {
    pub fn to_json(&self) -> Value {
        let ms = |v: &[Duration]| v.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>();
        json!({
            "side": self.side.label(), "mode": self.mode.flag(), "round": self.round,
            "create_to_replica_ms": ms(&self.create_to_replica),
            "status_to_hub_ms": ms(&self.status_to_hub),
            "status_missing": self.status_missing,
            "bulk_sync_s": self.bulk_sync.as_secs_f64(),
            "principal_rss_kib": self.principal_rss_kib,
            "agent_rss_kib": self.agent_rss_kib,
            "offline": {
                "converge_s": self.offline.converge.map(|d| d.as_secs_f64()),
                "lost": self.offline.lost, "left_over": self.offline.left_over,
                "rewritten": self.offline.rewritten, "resent": self.offline.resent,
            },
            "proxy": self.proxy.as_ref().map(ProxyFigures::to_json),
        })
    }
}

/// One running cell: a principal and an agent of one side, and the Applications they carry.
pub struct Cell {
    mode: Mode,
    name: String,
    spoke_ns: String,
    principal: AnyPrincipal,
    agent: AnyAgent,
    hub_apps: Api<DynamicObject>,
    spoke_apps: Api<DynamicObject>,
    /// Managed cells: the Redis servers behind the live view.
    live: Option<LiveView>,
}

impl Cell {
    pub async fn start(
        ground: &Ground,
        side: Side,
        mode: Mode,
        round: usize,
    ) -> anyhow::Result<Cell> {
        let name = format!("{}-{}-{round}", side.label(), mode.flag());
        ground.pki.issue_agent(&name)?;
        let hub_client = ground.hub.client().await?;
        ensure_namespace(&hub_client, &name).await?;
        let spoke_ns = format!("spoke-{name}");
        let principal_ns = format!("hub-{name}");
        let live = match mode {
            Mode::Managed => Some(LiveView::start(side, &name, &ground.dir).await?),
            Mode::Autonomous => {
                ensure_namespace(&hub_client, &principal_ns).await?;
                e2e::scenario::register_agent_cluster(&hub_client, &principal_ns, &name).await?;
                None
            }
        };
        let log_level = format!("--log-level={}", log_level(side));
        let principal_args: Vec<String> = std::iter::once(log_level.clone())
            .chain(
                live.iter()
                    .flat_map(|l| l.principal_args(side, &ground.pki)),
            )
            .collect();
        let principal = AnyPrincipal::start(
            side,
            &name,
            &ground.dir,
            &ground.hub,
            &ground.pki,
            &principal_ns,
            &principal_args
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
        .await?;
        let agent_args: Vec<String> = std::iter::once(log_level)
            .chain(live.iter().flat_map(|l| l.agent_args(side)))
            .collect();
        let agent = AnyAgent::start(
            side,
            &name,
            &ground.dir,
            &ground.spoke,
            &ground.pki,
            &principal.address(),
            mode,
            &spoke_ns,
            None,
            &agent_args.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .await?;
        Ok(Cell {
            mode,
            hub_apps: Api::namespaced_with(hub_client, &name, &application_resource()),
            spoke_apps: Api::namespaced_with(
                ground.spoke.client().await?,
                &spoke_ns,
                &application_resource(),
            ),
            name,
            spoke_ns,
            live,
            principal,
            agent,
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

    /// The Applications the bench writes: the mode's source of truth.
    fn source(&self) -> &Api<DynamicObject> {
        match self.mode {
            Mode::Managed => &self.hub_apps,
            Mode::Autonomous => &self.spoke_apps,
        }
    }

    /// Where the agent and principal carry the source's Applications to.
    fn replica(&self) -> &Api<DynamicObject> {
        match self.mode {
            Mode::Managed => &self.spoke_apps,
            Mode::Autonomous => &self.hub_apps,
        }
    }

    /// Runs the scenarios of the cell's mode.
    pub async fn measure(
        &mut self,
        ground: &Ground,
        side: Side,
        round: usize,
        sizes: &Sizes,
    ) -> anyhow::Result<CellFigures> {
        let replica_seen = Arrivals::watch(self.replica().clone(), |_| true);
        let hub_healthy = Arrivals::watch(self.hub_apps.clone(), |v| {
            text(v, "/status/health/status") == "Healthy"
        });
        let ns = self.source_namespace();
        self.source()
            .create(&PostParams::default(), &application("warmup", &ns, "v1"))
            .await?;
        replica_seen.wait("warmup", CONNECT_LIMIT).await?;

        let (from, to) = match self.mode {
            Mode::Managed => ("hub", "spoke"),
            Mode::Autonomous => ("spoke", "hub"),
        };
        eprintln!(
            "    {from} create → {to} visible ({} Applications)",
            sizes.count
        );
        let mut create_to_replica = Vec::new();
        for i in 0..sizes.count {
            let name = format!("lat-{i}");
            let (t0, wall) = (Instant::now(), time::OffsetDateTime::now_utc());
            self.source()
                .create(&PostParams::default(), &application(&name, &ns, "v1"))
                .await?;
            let answered = t0.elapsed();
            let took = replica_seen.wait(&name, ARRIVAL_LIMIT).await? - t0;
            report_slow(&format!("{name} created"), wall, from, answered, to, took);
            create_to_replica.push(took);
        }

        let mut status_to_hub = Vec::new();
        if self.mode == Mode::Managed {
            eprintln!("    spoke status (written by the bench) → hub visible");
            let status =
                json!({"status": {"health": {"status": "Healthy"}, "sync": {"status": "Synced"}}});
            for i in 0..sizes.count {
                let name = format!("lat-{i}");
                let (t0, wall) = (Instant::now(), time::OffsetDateTime::now_utc());
                self.spoke_apps
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await?;
                let answered = t0.elapsed();
                match hub_healthy.wait(&name, ARRIVAL_LIMIT).await {
                    Ok(t) => {
                        report_slow(
                            &format!("{name} status"),
                            wall,
                            "spoke",
                            answered,
                            "hub",
                            t - t0,
                        );
                        status_to_hub.push(t - t0)
                    }
                    Err(e) => {
                        eprintln!("    {e}: the remaining status updates are counted as missing");
                        break;
                    }
                }
            }
        }
        let status_missing = match self.mode {
            Mode::Managed => sizes.count - status_to_hub.len(),
            Mode::Autonomous => 0,
        };

        let proxy = match &self.live {
            Some(live) => {
                let target = proxy::Target {
                    principal: &self.principal,
                    agent: &self.name,
                    spoke_ns: &self.spoke_ns,
                    app: "warmup",
                    spoke: self.spoke_apps.clone().into_client(),
                    pki: &ground.pki,
                };
                Some(proxy::measure(live, &target, sizes.count).await?)
            }
            None => None,
        };

        eprintln!("    {} more Applications, then idle RSS", sizes.apps);
        let t0 = Instant::now();
        self.create_apps((0..sizes.apps).map(|i| format!("idle-{i}")), &ns)
            .await?;
        // The whole batch gets the convergence limit: a side that carries thousands at a slow
        // steady pace is measured, not failed by the per-object limit.
        let deadline = Instant::now() + sizes.converge_limit;
        let mut last = t0;
        for i in 0..sizes.apps {
            let left = deadline.saturating_duration_since(Instant::now());
            last = last.max(
                replica_seen
                    .wait(&format!("idle-{i}"), left.max(ARRIVAL_LIMIT))
                    .await?,
            );
        }
        let bulk_sync = last - t0;
        tokio::time::sleep(sizes.idle).await;
        let principal_rss_kib = rss_kib(Self::pid(self.principal.process())?)?;
        let agent_rss_kib = rss_kib(Self::pid(self.agent.process())?)?;

        eprintln!(
            "    agent offline while {} changes happen on the {from}",
            sizes.changes
        );
        let offline = self.offline(sizes, &ns).await?;
        Ok(CellFigures {
            side,
            mode: self.mode,
            round,
            create_to_replica,
            status_to_hub,
            status_missing,
            bulk_sync,
            principal_rss_kib,
            agent_rss_kib,
            offline,
            proxy,
        })
    }

    fn source_namespace(&self) -> String {
        self.source()
            .namespace()
            .map(str::to_string)
            .unwrap_or_default()
    }

    /// Creates Applications `names` in the source namespace `ns` with [`WRITERS`] concurrent
    /// writers.
    async fn create_apps(
        &self,
        names: impl Iterator<Item = String>,
        ns: &str,
    ) -> anyhow::Result<()> {
        futures::stream::iter(names)
            .map(|name| async move {
                self.source()
                    .create(&PostParams::default(), &application(&name, ns, "v1"))
                    .await
                    .map(drop)
            })
            .buffer_unordered(WRITERS)
            .try_collect::<()>()
            .await?;
        Ok(())
    }

    /// The offline scenario: kill the agent, change the source, start the agent, wait for the
    /// replica to match.
    async fn offline(&mut self, sizes: &Sizes, ns: &str) -> anyhow::Result<Offline> {
        let third = sizes.changes / 3;
        let (updates, deletes) = (0..third, third..sizes.changes - third);
        let creates = (0..third).map(|i| format!("off-{i}"));
        let before = revisions(self.replica()).await?;
        self.agent.process_mut().kill();

        let source = self.source();
        let patch = json!({"spec": {"source": {"targetRevision": "v2"}}});
        futures::stream::iter(updates.clone())
            .map(|i| {
                let patch = &patch;
                async move {
                    source
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
                source
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
            let (lost, left_over) = differences(self.source(), self.replica()).await?;
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
        let after = revisions(self.replica()).await?;
        result.rewritten = before
            .iter()
            .filter(|(name, rv)| {
                !changed.contains(name) && after.get(*name).is_some_and(|now| now != *rv)
            })
            .count();
        if let AnyAgent::Ours(agent) = &self.agent {
            result.resent = Some(
                e2e::metrics::read(agent.ops_port, AGENT_RESENDS, &[])
                    .await?
                    .unwrap_or(0.0),
            );
        }
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

/// (source Applications missing or stale on the replica, replica Applications no longer in the
/// source).
async fn differences(
    source: &Api<DynamicObject>,
    replica: &Api<DynamicObject>,
) -> anyhow::Result<(usize, usize)> {
    let target = |v: &Value| text(v, "/spec/source/targetRevision");
    let source = by_name(source, target).await?;
    let replica = by_name(replica, target).await?;
    let lost = source
        .iter()
        .filter(|(n, r)| replica.get(*n) != Some(r))
        .count();
    let left_over = replica.keys().filter(|n| !source.contains_key(*n)).count();
    Ok((lost, left_over))
}

/// The comparison rows of `mode`'s cells: latencies pooled over rounds, other figures the median
/// of rounds, fault counts summed over rounds; managed cells add the live-view rows.
pub fn rows(cells: &[CellFigures], mode: Mode, sizes: &Sizes) -> Vec<Row> {
    let of = |side: Side| {
        cells
            .iter()
            .filter(move |c| c.side == side && c.mode == mode)
    };
    type Samples = fn(&CellFigures) -> &Vec<Duration>;
    let latency = |side: Side, pick: Samples, p: f64| {
        pooled(of(side).flat_map(|c| pick(c).iter().copied()), p).map(|d| d.as_secs_f64() * 1e3)
    };
    let med = |side: Side, pick: fn(&CellFigures) -> Option<f64>| {
        median(of(side).filter_map(pick).collect())
    };
    let total = |side: Side, pick: fn(&CellFigures) -> Option<f64>| {
        let picked: Vec<f64> = of(side).filter_map(pick).collect();
        (!picked.is_empty()).then(|| picked.iter().sum::<f64>())
    };
    let (source, replica, prefix) = match mode {
        Mode::Managed => ("hub", "spoke", ""),
        Mode::Autonomous => ("spoke", "hub", "autonomous: "),
    };
    let mut latencies: Vec<(String, Samples)> = vec![(
        format!("{prefix}{source} create → {replica} visible"),
        |c| &c.create_to_replica,
    )];
    if mode == Mode::Managed {
        latencies.push(("spoke status (bench-written) → hub visible".into(), |c| {
            &c.status_to_hub
        }));
    }
    let mut rows = Vec::new();
    for (name, pick) in latencies {
        for (label, p) in [("p50", 0.5), ("p99", 0.99)] {
            rows.push(Row {
                figure: format!("{name} {label}"),
                unit: "ms",
                ours: latency(Side::Ours, pick, p),
                upstream: latency(Side::Upstream, pick, p),
            });
        }
    }
    let both = |figure: String, unit, pick: fn(&CellFigures) -> Option<f64>| Row {
        figure,
        unit,
        ours: med(Side::Ours, pick),
        upstream: med(Side::Upstream, pick),
    };
    let count = |figure: String, pick: fn(&CellFigures) -> Option<f64>| Row {
        figure,
        unit: "objects",
        ours: total(Side::Ours, pick),
        upstream: total(Side::Upstream, pick),
    };
    if mode == Mode::Managed {
        rows.push(count("status updates never seen on the hub".into(), |c| {
            Some(c.status_missing as f64)
        }));
    }
    rows.push(both(
        format!(
            "{prefix}{} Applications created on the {source} → all on the {replica}",
            sizes.apps
        ),
        "s",
        |c| Some(c.bulk_sync.as_secs_f64()),
    ));
    let synced = sizes.apps + sizes.count + 1;
    rows.push(both(
        format!("{prefix}principal idle RSS, {synced} Applications synced"),
        "MiB",
        |c| Some(c.principal_rss_kib as f64 / 1024.0),
    ));
    rows.push(both(
        format!("{prefix}agent idle RSS, {synced} Applications synced"),
        "MiB",
        |c| Some(c.agent_rss_kib as f64 / 1024.0),
    ));
    rows.push(both(
        format!(
            "{prefix}agent offline, {} {source} changes: converge after restart",
            sizes.changes
        ),
        "s",
        |c| c.offline.converge.map(|d| d.as_secs_f64()),
    ));
    rows.push(count(
        format!("{prefix}offline: lost (missing or stale on the {replica})"),
        |c| Some(c.offline.lost as f64),
    ));
    rows.push(count(
        format!("{prefix}offline: left over (deleted on the {source})"),
        |c| Some(c.offline.left_over as f64),
    ));
    rows.push(count(
        format!("{prefix}offline: unchanged Applications rewritten on the {replica}"),
        |c| Some(c.offline.rewritten as f64),
    ));
    rows.push(count(
        format!("{prefix}offline: events the agent resent (upstream counts none)"),
        |c| c.offline.resent,
    ));
    if mode == Mode::Managed {
        rows.extend(proxy::rows(|side| {
            of(side).filter_map(|c| c.proxy.as_ref()).collect()
        }));
    }
    rows
}
