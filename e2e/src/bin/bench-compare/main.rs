//! `bench-compare`: the same scenarios against {our principal + our agent} and {upstream
//! argocd-agent v0.9.0's principal + agent} (the Go binaries `hack/peers.sh` builds), on one pair
//! of control planes started for this run, alternating ours, upstream, ours, upstream... for
//! `--rounds` rounds; prints each figure for both with the ours/upstream ratio and writes
//! `bench-compare.json`, `bench-compare.tsv` and `bench-compare.png` under `--out` (default
//! `results/`).
//!
//! Every (round, mode, side) cell gets its own agent name, namespaces, principal and agent, all
//! logging at info, no Argo CD: the bench itself writes what Argo CD would (status, the resource
//! tree). After a cell its processes are stopped and its Applications removed, so the next cell's
//! principal starts on an empty hub. Each round runs a managed cell per side, then an autonomous
//! cell per side. The bench writes where the mode's source of truth is (managed: the hub;
//! autonomous: the spoke) and watches the other plane. Scenarios, in order, within a cell:
//! 1. source create → replica visible, p50/p99 over `--count` Applications created one at a time;
//! 2. managed: spoke status → hub visible, p50/p99 (the bench merge-patches `status` of those spoke
//!    copies), then the live-view reads through the principal next to their direct baselines,
//!    `--count` each (`proxy.rs`);
//! 3. `--apps` more Applications created in the source (8 writers): time until all are in the
//!    replica, then after an idle pause the VmRSS of the principal and the agent;
//! 4. the agent is killed, `--changes` changes happen in the source (a third creates, a third spec
//!    updates, a third deletes), the agent is started again: time until the replica equals the
//!    source (names and `targetRevision`), then objects lost (missing or stale in the replica at
//!    the deadline), left over (deleted in the source, still in the replica), rewritten (unchanged
//!    in the source yet written again in the replica: duplicate deliveries) and, for our agent,
//!    the events it resent.
//!
//! After the cells, the fleet part (`fleet.rs`): one principal of each side under many
//! simulated agents (the same ones against both): events/s and CPU per 1,000 events with
//! `--fleet-agents` (100) of them busy, RSS per idle agent and a reconnect storm at
//! `--storm-agents` (1000), for `--fleet-rounds` (1) rounds; `--skip-fleet` skips it.
//!
//! `--modes managed,autonomous` and `--sides ours,upstream` (both by default) run only those
//! cells, e.g. `--modes autonomous --sides ours --skip-fleet` for our autonomous catch-up alone.
//!
//! `--log-level FILTER` (ours only; default `info`): e.g. `info,argocd_agent_proto=debug` logs
//! every event's queued / sent / received / handled time in our principal's and agent's logs;
//! a latency sample over 50 ms is printed with when it started and when the source apiserver
//! answered, to match against them.
//!
//! `--smoke`: 1 round, small sizes, finishes in a few minutes (the fleet part in about 1 more).
//! Full runs default to the sizes (5,000 Applications and 5,000 offline changes per cell).
//! Build with `--release` (`hack/bench.sh --compare` does).

mod cell;
mod fleet;
mod proxy;
mod report;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use e2e::bench::{flag_value, has_flag, machine_load};
use e2e::control_plane::ControlPlane;
use e2e::gateway::Pki;
use e2e::sides::{Mode, Side};
use serde_json::json;

use cell::Cell;

/// Sizes of one run, from flags.
#[derive(Debug)]
pub struct Sizes {
    pub smoke: bool,
    pub rounds: usize,
    pub count: usize,
    pub apps: usize,
    pub changes: usize,
    pub idle: Duration,
    pub converge_limit: Duration,
    /// `--modes`: the modes whose cells run (both by default).
    pub modes: Vec<Mode>,
    /// `--sides`: the sides whose cells run (both by default).
    pub sides: Vec<Side>,
}

impl Sizes {
    fn to_json(&self) -> serde_json::Value {
        json!({"smoke": self.smoke, "rounds": self.rounds, "count": self.count,
               "apps": self.apps, "changes": self.changes, "idle_s": self.idle.as_secs(),
               "converge_limit_s": self.converge_limit.as_secs()})
    }

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
            (3, 50, 5000, 5000, 10, 600)
        };
        let sizes = Sizes {
            smoke,
            rounds: num("rounds", rounds)?,
            count: num("count", count)?,
            apps: num("apps", apps)?,
            changes: num("changes", changes)?,
            idle: Duration::from_secs(num("idle-seconds", idle)? as u64),
            converge_limit: Duration::from_secs(num("converge-seconds", limit)? as u64),
            modes: chosen("modes", &[Mode::Managed, Mode::Autonomous], |m: &Mode| {
                m.flag()
            })?,
            sides: chosen("sides", &[Side::Ours, Side::Upstream], |s: &Side| s.label())?,
        };
        anyhow::ensure!(
            sizes.apps >= sizes.changes,
            "--apps must be at least --changes (updates and deletes touch existing Applications)"
        );
        Ok(sizes)
    }
}

/// The values of the comma-separated flag `--<name>` among `all` (named by `label`), in `all`'s
/// order; all of them without the flag.
fn chosen<T: Copy>(name: &str, all: &[T], label: fn(&T) -> &'static str) -> anyhow::Result<Vec<T>> {
    let Some(value) = flag_value(name) else {
        return Ok(all.to_vec());
    };
    let wanted: Vec<&str> = value.split(',').map(str::trim).collect();
    if let Some(bad) = wanted.iter().find(|w| !all.iter().any(|v| label(v) == **w)) {
        let known: Vec<&str> = all.iter().map(label).collect();
        anyhow::bail!(
            "--{name}: unknown value {bad:?} (one or more of {})",
            known.join(",")
        );
    }
    Ok(all
        .iter()
        .copied()
        .filter(|v| wanted.contains(&label(v)))
        .collect())
}

/// The planes and PKI every cell uses.
pub struct Ground {
    pub hub: ControlPlane,
    pub spoke: ControlPlane,
    pub dir: PathBuf,
    pub pki: Pki,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sizes = Sizes::from_args()?;
    let fleet_sizes = fleet::FleetSizes::from_args(sizes.smoke)?;
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
    let (modes, sides) = (sizes.modes.clone(), sizes.sides.clone());
    let cases = (1..=sizes.rounds).flat_map(move |round| {
        let sides = sides.clone();
        modes.clone().into_iter().flat_map(move |mode| {
            sides
                .clone()
                .into_iter()
                .map(move |side| (round, mode, side))
        })
    });
    for (round, mode, side) in cases {
        eprintln!(
            "==> round {round}/{}: {} {}",
            sizes.rounds,
            side.label(),
            mode.flag()
        );
        let measured = async {
            let mut cell = Cell::start(&ground, side, mode, round).await?;
            let figures = cell
                .measure(&ground, side, round, &sizes)
                .await
                .map_err(|e| anyhow::anyhow!("{e:#}\n{}", cell.logs()));
            cell.tear_down().await?;
            figures
        }
        .await;
        match measured {
            Ok(f) => cells.push(f),
            Err(e) => {
                let what = format!("round {round} {} {}", side.label(), mode.flag());
                eprintln!("{what} failed: {e:#}");
                failures.push(format!("{what}: {e:#}"));
            }
        }
    }

    let fleet_figures = match &fleet_sizes {
        Some(f) => fleet::run(&ground, f, &mut failures).await?,
        None => Vec::new(),
    };

    let mut rows = cell::rows(&cells, Mode::Managed, &sizes);
    rows.extend(cell::rows(&cells, Mode::Autonomous, &sizes));
    let (load, cpus) = machine_load();
    println!(
        "\nbench-compare: ours vs upstream argocd-agent v0.9.0, managed and autonomous, 1 agent, no \
         Argo CD (the bench writes the spoke status and resource tree); {} round(s) alternating, \
         {} samples per latency per round; {cpus} CPUs, load average (1 min) {load:.2}; took {:.0?}",
        sizes.rounds,
        sizes.count,
        started.elapsed()
    );
    let mut samples =
        json!({"cells": cells.iter().map(cell::CellFigures::to_json).collect::<Vec<_>>()});
    if let Some(f) = &fleet_sizes {
        println!("{}", f.describe());
        rows.extend(fleet::rows(&fleet_figures, f));
        samples["fleet"] = fleet::to_json(&fleet_figures, f);
    }
    report::print_rows(&rows);
    report::write_results(&out, sizes.to_json(), &rows, samples, &failures)?;
    anyhow::ensure!(
        failures.is_empty(),
        "{} cell(s) or fleet run(s) failed",
        failures.len()
    );
    Ok(())
}
