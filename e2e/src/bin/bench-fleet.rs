//! `bench-fleet`: the principal at fleet scale, with simulated agents ([`e2e::sim_agent`]) speaking
//! the real protocol over real mutual TLS, and one real `argocd-agent`. Each figure is printed next
//! to a baseline measured in the same run, with the ratio and the target:
//!
//! 1. memory: principal RSS per idle connected agent at `--memory-agents` (default 1000,10000)
//!    simulated agents (RSS delta over the principal with 0 agents, divided by N; target ≤ 64 KiB);
//! 2. throughput: events/s through the principal with `--agents` (default 100) simulated agents —
//!    hub Applications created and updated (events to the agents) and the agents' status reports
//!    (events to the hub) — and the principal's CPU seconds per 1,000 events (utime+stime from
//!    `/proc/<pid>/stat`); baseline: the raw apiserver write rate with the same writer concurrency
//!    (target ≥ 2,000 events/s on 2 cores);
//! 3. agent memory: RSS of a real `argocd-agent` idle with `--agent-apps` (default 1000)
//!    Applications, next to the same agent idle with 0 (target ≤ 40 MiB);
//! 4. reconnect storm: the principal restarted under the agents of the first memory size (still
//!    connected, the throughput agents among them with their Applications); time until every agent is subscribed and resynced again (target ≤ 30 s)
//!    and the number of refused authentications (must be 0); baseline: one agent's connect+resync.
//!
//! `--phases memory,throughput,agent,storm` picks phases (memory always runs: its first fleet is
//! the later phases' agents). `--smoke` shrinks every size so the run finishes quickly (CI); `--out DIR` writes
//! `bench-fleet.json` (every figure) and `bench-fleet.png` (each figure against its target, drawn
//! with DejaVu Sans from Debian's `fonts-dejavu-core`). Build with `--release` for figures worth
//! comparing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::bench::{
    flag_value, has_flag, machine_load, raise_fd_limit, register_chart_font, settled_rss,
    BenchSetup,
};
use e2e::fleet_load::{self, create_and_update, wait_fleet, Load};
use e2e::gateway::{application_resource, ensure_namespace, Agent};
use e2e::sim_agent::{issue_identities, sim_name, FleetCounters, SimFleet, SimOptions};
use e2e::wait_until;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{json, Value};

/// Sizes of one run.
#[derive(Debug, Clone)]
struct Sizes {
    smoke: bool,
    /// Simulated agents generating the throughput load.
    agents: usize,
    /// Applications per throughput agent.
    apps_per_agent: usize,
    /// Update rounds over every throughput Application after creating them.
    updates: usize,
    /// Concurrent hub writers (throughput and its baseline).
    writers: usize,
    /// Connected idle agents at which the principal's RSS is read (ascending).
    memory_agents: Vec<usize>,
    /// Agents connected when the principal is restarted (the first memory size).
    storm_agents: usize,
    /// Applications the real agent manages.
    agent_apps: usize,
}

impl Sizes {
    fn from_args() -> anyhow::Result<Sizes> {
        let smoke = has_flag("smoke");
        let num = |name: &str, full: usize, small: usize| -> anyhow::Result<usize> {
            match flag_value(name) {
                Some(v) => v
                    .parse()
                    .map_err(|e| anyhow::anyhow!("--{name} {v:?}: {e}")),
                None => Ok(if smoke { small } else { full }),
            }
        };
        let mut memory_agents: Vec<usize> = match flag_value("memory-agents") {
            Some(v) => v
                .split(',')
                .map(|n| n.trim().parse())
                .collect::<Result<_, _>>()
                .map_err(|e| anyhow::anyhow!("--memory-agents {v:?}: {e}"))?,
            None if smoke => vec![10, 40],
            None => vec![1000, 10000],
        };
        memory_agents.sort_unstable();
        memory_agents.dedup();
        anyhow::ensure!(
            !memory_agents.is_empty() && memory_agents[0] > 0,
            "--memory-agents needs at least one positive size"
        );
        let (full, small) = (Load::FULL, Load::SMOKE);
        let agents = num("agents", full.agents, small.agents)?;
        let storm_agents = memory_agents[0];
        anyhow::ensure!(agents > 0, "--agents must be positive");
        anyhow::ensure!(
            agents <= memory_agents[0],
            "--agents must not exceed the first --memory-agents size ({}): the throughput agents \
             are the first of those, which stay connected for the later phases",
            memory_agents[0]
        );
        Ok(Sizes {
            smoke,
            agents,
            apps_per_agent: num("apps-per-agent", full.apps_per_agent, small.apps_per_agent)?,
            updates: num("updates", full.updates, small.updates)?,
            writers: num("writers", full.writers, small.writers)?,
            memory_agents,
            storm_agents,
            agent_apps: num("agent-apps", 1000, 20)?,
        })
    }
}

impl Sizes {
    /// The throughput phase's hub work.
    fn load(&self) -> Load {
        Load {
            agents: self.agents,
            apps_per_agent: self.apps_per_agent,
            updates: self.updates,
            writers: self.writers,
        }
    }
}

/// One printed figure.
#[derive(Debug, Clone)]
struct Figure {
    name: String,
    value: f64,
    unit: String,
    baseline: Option<(String, f64)>,
    /// Target and whether higher is better.
    target: Option<(f64, bool)>,
}

impl Figure {
    fn new(name: &str, value: f64, unit: &str) -> Figure {
        Figure {
            name: name.into(),
            value,
            unit: unit.into(),
            baseline: None,
            target: None,
        }
    }

    fn baseline(mut self, what: &str, value: f64) -> Figure {
        self.baseline = Some((what.into(), value));
        self
    }

    fn at_most(mut self, target: f64) -> Figure {
        self.target = Some((target, false));
        self
    }

    fn at_least(mut self, target: f64) -> Figure {
        self.target = Some((target, true));
        self
    }

    fn met(&self) -> Option<bool> {
        self.target.map(|(t, higher)| {
            if higher {
                self.value >= t
            } else {
                self.value <= t
            }
        })
    }

    fn print(&self) {
        let mut line = format!("{:<44} {:>12.2} {:<10}", self.name, self.value, self.unit);
        if let Some((what, b)) = &self.baseline {
            let ratio = if *b != 0.0 {
                format!("{:.2}x", self.value / b)
            } else {
                "-".into()
            };
            line.push_str(&format!(" baseline {what} {b:.2} (ratio {ratio})"));
        }
        if let Some((t, higher)) = self.target {
            let verdict = if self.met() == Some(true) {
                "met"
            } else {
                "MISSED"
            };
            line.push_str(&format!(
                " target {} {t} {verdict}",
                if higher { ">=" } else { "<=" }
            ));
        }
        println!("{line}");
    }

    fn to_json(&self) -> Value {
        json!({
            "name": self.name, "value": self.value, "unit": self.unit,
            "baseline": self.baseline.as_ref().map(|(w, v)| json!({"what": w, "value": v})),
            "ratio_to_baseline": self.baseline.as_ref().filter(|(_, b)| *b != 0.0).map(|(_, b)| self.value / b),
            "target": self.target.map(|(t, higher)| json!({"value": t, "higher_is_better": higher})),
            "target_met": self.met(),
        })
    }
}

fn pid_of(process: &e2e::ManagedProcess) -> anyhow::Result<u32> {
    process
        .pid()
        .ok_or_else(|| anyhow::anyhow!("{} is not running", process.name()))
}

/// Principal auth failures by reason, summed (from its `/metrics`).
async fn principal_auth_failures(ops_port: u16) -> u64 {
    let Ok(scrape) = e2e::metrics::Scrape::of(ops_port).await else {
        return 0;
    };
    scrape
        .value("argocd_principal_auth_failures", &[])
        .unwrap_or_default() as u64
}

struct Bench {
    setup: BenchSetup,
    sizes: Sizes,
    figures: Vec<Figure>,
    hub: kube::Client,
}

impl Bench {
    fn principal_pid(&self) -> anyhow::Result<u32> {
        pid_of(&self.setup.principal.process)
    }

    fn record(&mut self, f: Figure) {
        f.print();
        self.figures.push(f);
    }

    /// Principal RSS per idle agent; returns the fleet of the first size (left connected).
    async fn memory(&mut self) -> anyhow::Result<SimFleet> {
        let pid = self.principal_pid()?;
        let rss0 = settled_rss(pid).await?;
        self.record(Figure::new("principal RSS, 0 agents", rss0 as f64, "KiB"));
        let sizes = self.sizes.memory_agents.clone();
        let largest = *sizes.last().expect("one size");
        eprintln!("==> issuing {largest} simulated agent certificates");
        let mut identities = issue_identities(&self.setup.pki, 0..largest)?;
        let options = SimOptions {
            connect_concurrency: 128,
            ..SimOptions::default()
        };
        let mut fleets: Vec<SimFleet> = Vec::new();
        let mut connected = 0;
        for &n in &sizes {
            let batch: Vec<_> = identities.drain(..n - connected).collect();
            eprintln!(
                "==> connecting {} more simulated agents ({n} in all)",
                batch.len()
            );
            let (fleet, took) = fleet_load::connect(
                &self.setup.principal.address(),
                &self.setup.pki,
                batch,
                options.clone(),
            )
            .await?;
            eprintln!(
                "    {} agents subscribed and resynced in {took:.1?}",
                fleet.len()
            );
            fleets.push(fleet);
            connected = n;
            let all: usize = fleets.iter().map(SimFleet::subscribed).sum();
            anyhow::ensure!(all == n, "only {all} of {n} agents stay subscribed");
            let rss = settled_rss(pid).await?;
            let per_agent = rss.saturating_sub(rss0) as f64 / n as f64;
            self.record(Figure::new(
                &format!("principal RSS, {n} agents"),
                rss as f64,
                "KiB",
            ));
            self.record(
                Figure::new(
                    &format!("principal RSS per idle agent at {n}"),
                    per_agent,
                    "KiB",
                )
                .at_most(64.0),
            );
            let auth: u64 = fleets
                .iter()
                .map(|f| FleetCounters::get(&f.counters.auth_failures))
                .sum();
            anyhow::ensure!(auth == 0, "{auth} authentications refused while connecting");
        }
        let mut fleets = fleets.into_iter();
        let first = fleets.next().expect("one fleet");
        for f in fleets {
            f.stop().await;
        }
        Ok(first)
    }

    /// Events/s through the principal with the first `agents` of `fleet` active.
    async fn throughput(&mut self, fleet: &SimFleet) -> anyhow::Result<()> {
        let s = self.sizes.clone();
        let count = s.agents * s.apps_per_agent;
        eprintln!(
            "==> throughput baseline: {count} Applications created + {} update rounds by {} writers, no agent",
            s.updates, s.writers
        );
        ensure_namespace(&self.hub, "bench-baseline").await?;
        let (writes, took) = create_and_update(&self.hub, s.writers, count, s.updates, |i| {
            ("bench-baseline".to_string(), format!("base-{i}"))
        })
        .await?;
        let baseline = writes as f64 / took.as_secs_f64();
        self.record(Figure::new(
            "apiserver writes/s (baseline)",
            baseline,
            "writes/s",
        ));

        eprintln!(
            "==> throughput: the same writes into the namespaces of {} simulated agents",
            s.agents
        );
        let t = fleet_load::throughput(
            &self.hub,
            fleet,
            self.principal_pid()?,
            &s.load(),
            Duration::from_secs(300),
        )
        .await?;
        anyhow::ensure!(
            t.unfinished == 0,
            "{} Applications not at their last revision on their agents after {:.0?}",
            t.unfinished,
            t.took
        );
        let (writes, took) = (t.writes, t.took);
        let rate = t.events_per_second();
        eprintln!(
            "    {writes} hub writes in {:.1?}; {} events in {took:.1?} (to agents {}, status ACKed {})",
            t.write_time,
            t.events(),
            t.to_agents,
            t.acked
        );
        eprintln!(
            "    status reports queued by the agents {}, sent and ACKed {} (the rest replaced by a newer one in the agents' outboxes)",
            t.status_queued, t.acked
        );
        self.record(
            Figure::new(
                &format!("events/s through the principal, {} agents", s.agents),
                rate,
                "events/s",
            )
            .baseline("apiserver writes/s", baseline)
            .at_least(2000.0),
        );
        self.record(
            Figure::new(
                "hub writes/s while agents were served",
                writes as f64 / took.as_secs_f64(),
                "writes/s",
            )
            .baseline("apiserver writes/s", baseline),
        );
        // Every ACKed status report is one status patch by the principal (unless unchanged), so
        // the apiserver served the bench's writes plus these in the same time.
        let status_writes = t.acked;
        self.record(
            Figure::new(
                "apiserver writes/s incl. principal status patches",
                (writes as u64 + status_writes) as f64 / took.as_secs_f64(),
                "writes/s",
            )
            .baseline("apiserver writes/s", baseline),
        );
        self.record(Figure::new(
            "principal CPU per 1,000 events",
            t.cpu_per_1000_events(),
            "cpu-s",
        ));
        Ok(())
    }

    /// RSS of a real agent idle with 0 and with `agent_apps` Applications.
    async fn agent_memory(&mut self) -> anyhow::Result<()> {
        let n = self.sizes.agent_apps;
        let setup = &self.setup;
        let spoke_client = setup.spoke().client().await?;
        let address = setup.principal.address();
        let start_agent = || {
            Agent::start(
                "bench",
                &setup.dir,
                setup.spoke(),
                &setup.pki,
                &address,
                "argocd",
                &["--log-level=info"],
            )
        };
        eprintln!("==> real agent idle with 0 Applications");
        let agent = start_agent().await?;
        agent.wait_connected().await?;
        let rss0 = settled_rss(pid_of(&agent.process)?).await?;
        drop(agent);
        eprintln!("==> real agent with {n} Applications");
        ensure_namespace(&self.hub, "bench").await?;
        create_and_update(&self.hub, self.sizes.writers, n, 0, |i| {
            ("bench".to_string(), format!("agent-app-{i}"))
        })
        .await?;
        let agent = start_agent().await?;
        agent.wait_connected().await?;
        let spoke_apps: Api<DynamicObject> =
            Api::namespaced_with(spoke_client, "argocd", &application_resource());
        wait_until(
            &format!("{n} Applications on the spoke"),
            Duration::from_secs(300),
            || {
                let api = spoke_apps.clone();
                async move {
                    let list = api.list_metadata(&ListParams::default()).await?;
                    Ok::<_, anyhow::Error>((list.items.len() >= n).then_some(()))
                }
            },
        )
        .await?;
        let rss = settled_rss(pid_of(&agent.process)?).await?;
        self.record(Figure::new(
            "agent RSS idle, 0 Applications",
            rss0 as f64 / 1024.0,
            "MiB",
        ));
        self.record(
            Figure::new(
                &format!("agent RSS idle, {n} Applications"),
                rss as f64 / 1024.0,
                "MiB",
            )
            .baseline("0 Applications", rss0 as f64 / 1024.0)
            .at_most(40.0),
        );
        drop(agent);
        Ok(())
    }

    /// One agent's connect+resync time, then the principal restarted under `fleet`.
    async fn storm(&mut self, fleet: &SimFleet) -> anyhow::Result<()> {
        let s = self.sizes.clone();
        let address = self.setup.principal.address();
        // Baseline: one agent with as many Applications as a throughput agent, connecting alone.
        let solo = sim_name(*s.memory_agents.last().expect("one size"));
        ensure_namespace(&self.hub, &solo).await?;
        {
            let solo = solo.clone();
            create_and_update(&self.hub, s.writers, s.apps_per_agent, 0, move |i| {
                (solo.clone(), format!("app-{i}"))
            })
            .await?;
        }
        let ids = issue_identities(
            &self.setup.pki,
            s.memory_agents.last().copied().unwrap_or(0)
                ..s.memory_agents.last().copied().unwrap_or(0) + 1,
        )?;
        let mut samples = Vec::new();
        for _ in 0..3 {
            let t0 = Instant::now();
            let one = SimFleet::start(
                &address,
                &self.setup.pki,
                ids.clone(),
                SimOptions::default(),
            )?;
            wait_fleet(
                "the single agent resynced",
                &one,
                1,
                Duration::from_secs(60),
                |f| {
                    if f.applications() >= s.apps_per_agent {
                        f.resynced()
                    } else {
                        0
                    }
                },
            )
            .await?;
            samples.push(t0.elapsed());
            one.stop().await;
        }
        samples.sort();
        let baseline = samples[samples.len() / 2];

        let principal_auth0 = principal_auth_failures(self.setup.principal.ops_port).await;
        eprintln!(
            "==> reconnect storm: restarting the principal under {} connected agents ({} Applications)",
            fleet.len(),
            fleet.applications()
        );
        let principal = &mut self.setup.principal;
        let storm = fleet_load::storm(
            fleet,
            async {
                principal.process.restart()?;
                principal.wait_ready().await
            },
            Duration::from_secs(300),
        )
        .await?;
        let took = storm.resynced_in.ok_or_else(|| {
            anyhow::anyhow!(
                "only {} of {} agents resynced within 300 s of the restart",
                storm.resynced,
                storm.agents
            )
        })?;
        let (ready, auth) = (storm.ready, storm.auth_failures);
        let principal_auth = principal_auth_failures(self.setup.principal.ops_port)
            .await
            .saturating_sub(principal_auth0);
        self.record(Figure::new(
            "principal restart until ready",
            ready.as_secs_f64(),
            "s",
        ));
        self.record(
            Figure::new(
                &format!("reconnect storm, {} agents resynced", fleet.len()),
                took.as_secs_f64(),
                "s",
            )
            .baseline("one agent connect+resync", baseline.as_secs_f64())
            .at_most(30.0),
        );
        self.record(
            Figure::new(
                "reconnect storm auth failures (agents' view)",
                auth as f64,
                "count",
            )
            .at_most(0.0),
        );
        self.record(
            Figure::new(
                "reconnect storm auth failures (principal metrics)",
                principal_auth as f64,
                "count",
            )
            .at_most(0.0),
        );
        Ok(())
    }
}

/// Writes the JSON report and the chart.
fn write_results(
    dir: &Path,
    sizes: &Sizes,
    figures: &[Figure],
    load: (f64, usize),
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let report = json!({
        "bench": "bench-fleet",
        "smoke": sizes.smoke,
        "sizes": {
            "agents": sizes.agents, "apps_per_agent": sizes.apps_per_agent, "updates": sizes.updates,
            "writers": sizes.writers, "memory_agents": sizes.memory_agents,
            "storm_agents": sizes.storm_agents, "agent_apps": sizes.agent_apps,
        },
        "machine": {"cpus": load.1, "load_average_1m_at_end": load.0},
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs(),
        "figures": figures.iter().map(Figure::to_json).collect::<Vec<_>>(),
    });
    let json_path = dir.join("bench-fleet.json");
    std::fs::write(&json_path, serde_json::to_vec_pretty(&report)?)?;
    let png_path = dir.join("bench-fleet.png");
    draw_chart(&png_path, figures)?;
    eprintln!(
        "==> wrote {} and {}",
        json_path.display(),
        png_path.display()
    );
    Ok(())
}

/// One horizontal bar per figure that has a target: value ÷ target (lower is better for limits,
/// inverted for "at least" targets so that ≤ 1 always means met).
fn draw_chart(path: &Path, figures: &[Figure]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    register_chart_font()?;
    let bars: Vec<(String, f64, &Figure)> = figures
        .iter()
        .filter_map(|f| {
            let (t, higher) = f.target?;
            let score = match (higher, t == 0.0) {
                (true, _) => t / f.value.max(f64::MIN_POSITIVE),
                (false, true) => {
                    if f.value == 0.0 {
                        0.0
                    } else {
                        2.0
                    }
                }
                (false, false) => f.value / t,
            };
            Some((f.name.clone(), score.min(3.0), f))
        })
        .collect();
    let height = 120 + 48 * bars.len() as u32;
    let root = BitMapBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "bench-fleet: each figure / its target (<= 1 is met)",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(10)
        .build_cartesian_2d(0f64..3f64, 0f64..bars.len().max(1) as f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("value / target")
        .label_style(("sans-serif", 14))
        .draw()?;
    for (i, (name, score, f)) in bars.iter().enumerate() {
        let y = (bars.len() - 1 - i) as f64;
        let color = if f.met() == Some(true) {
            GREEN.mix(0.6)
        } else {
            RED.mix(0.6)
        };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(0.0, y + 0.15), (*score, y + 0.85)],
            color.filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{name}: {:.2} {}", f.value, f.unit),
            (0.03, y + 0.62),
            ("sans-serif", 15).into_font(),
        )))?;
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(1.0, 0.0), (1.0, bars.len().max(1) as f64)],
        BLACK.stroke_width(2),
    )))?;
    root.present()?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sizes = Sizes::from_args()?;
    let out = flag_value("out").map(PathBuf::from);
    let nofile = raise_fd_limit()?;
    // One socket per simulated agent here, one per agent in the principal (which inherits it).
    let needed = *sizes.memory_agents.last().expect("one size") as u64 + 1024;
    if nofile < needed {
        eprintln!(
            "warning: the open-file limit is {nofile}; {needed} may be needed (raise the hard limit: ulimit -Hn)"
        );
    }
    let started = Instant::now();
    eprintln!("==> bench-fleet {sizes:?}");
    let setup = BenchSetup::start("bench-fleet").await?;
    let hub = setup.hub().client().await?;
    let mut bench = Bench {
        setup,
        sizes,
        figures: Vec::new(),
        hub,
    };
    let phases = flag_value("phases").unwrap_or_else(|| "memory,throughput,agent,storm".into());
    let phase = |p: &str| phases.split(',').any(|x| x.trim() == p);
    let result = async {
        // The memory phase always runs: its agents are the later phases' fleet.
        let fleet = bench.memory().await?;
        if phase("throughput") {
            bench.throughput(&fleet).await?;
        }
        if phase("agent") {
            bench.agent_memory().await?;
        }
        if phase("storm") {
            bench.storm(&fleet).await?;
        }
        fleet.stop().await;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = &result {
        eprintln!(
            "bench-fleet failed: {e:#}\nprincipal log tail:\n{}",
            bench.setup.principal.process.log_tail(30)
        );
    }
    let load = machine_load();
    println!(
        "machine: {} CPUs, load average (1 min) {:.2}; bench took {:.0?}",
        load.1,
        load.0,
        started.elapsed()
    );
    if let Some(dir) = out {
        write_results(&dir, &bench.sizes, &bench.figures, load)?;
    }
    result
}
