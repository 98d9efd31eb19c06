//! The fleet part of the comparison: one principal of each side under many agents, and the rows
//! it gives. The agents are simulated ([`e2e::sim_agent`]: protocol-level managed agents over
//! real mutual TLS, client certificate CN = agent name signed by the run's CA, which both
//! principals accept): real agents do not fit this machine (an upstream Go agent takes about
//! 75 MiB, so 100 of them 7.5 GiB). The SAME simulated agents (same identities, same behaviour)
//! run against our principal and against upstream argocd-agent v0.9.0's, so the ratio compares the
//! principals. Sides alternate (ours, upstream, ours, ...) for `--fleet-rounds` rounds; each
//! (round, side) starts its principal on a hub without Applications and, in order:
//! 1. reads the principal's settled RSS with 0 agents;
//! 2. connects `--storm-agents` simulated agents and waits until every one is resynced, then
//!    reads the settled RSS again: RSS per idle connected agent = (RSS − RSS with 0) / N;
//! 3. reconnect storm ([`fleet_load::storm`]): the principal restarted under all the agents,
//!    time until every agent is resynced on a new stream, and authentications refused meanwhile;
//! 4. throughput ([`fleet_load::throughput`]): `--fleet-agents` of them get 10 Applications each
//!    in their hub namespaces (`sim-NNNN`), created then updated 3 times by 16 writers; events/s
//!    (to the agents plus status reports ACKed) until every Application is at its last revision
//!    on its agent (at most 240 s: then over those 240 s, with the Applications unfinished
//!    counted), and the principal's CPU-seconds (utime + stime of `/proc/<pid>/stat`) per 1,000
//!    events. Last because a principal that does not finish would hold up what follows.
//!
//! Then the agents and the principal stop and the Applications are removed. `--skip-fleet` skips
//! all of this; `--smoke` shrinks it to 4 throughput agents among 10.

use std::time::Duration;

use e2e::bench::{flag_value, has_flag, raise_fd_limit, settled_rss};
use e2e::fleet_load::{self, connect_limit, Load, Storm, Throughput};
use e2e::sides::{AnyPrincipal, Side};
use e2e::sim_agent::{issue_identities, FleetCounters, SimIdentity, SimOptions};
use serde_json::{json, Value};

use crate::report::{median, Row};
use crate::Ground;

/// How long the throughput work may take; what was delivered by then is measured over it.
const THROUGHPUT_LIMIT: Duration = Duration::from_secs(240);

/// What the fleet part runs, from flags.
#[derive(Debug)]
pub struct FleetSizes {
    /// Rounds (each runs ours then upstream).
    pub rounds: usize,
    /// The throughput work (its `agents` are the first of the connected ones).
    pub load: Load,
    /// Agents connected for the RSS reading and the reconnect storm.
    pub storm_agents: usize,
}

impl FleetSizes {
    /// `None` under `--skip-fleet`; otherwise `--fleet-rounds` (1), `--fleet-agents` (100, smoke
    /// 4) and `--storm-agents` (1000, smoke 10).
    pub fn from_args(smoke: bool) -> anyhow::Result<Option<FleetSizes>> {
        if has_flag("skip-fleet") {
            return Ok(None);
        }
        let num = |name: &str, full: usize, small: usize| -> anyhow::Result<usize> {
            match flag_value(name) {
                Some(v) => v.parse().map_err(|e| {
                    anyhow::anyhow!(
                        "--{name} {v:?}: {e} (give a whole number, e.g. --{name} {full})"
                    )
                }),
                None => Ok(if smoke { small } else { full }),
            }
        };
        let mut load = if smoke { Load::SMOKE } else { Load::FULL };
        load.agents = num("fleet-agents", Load::FULL.agents, Load::SMOKE.agents)?;
        let sizes = FleetSizes {
            rounds: num("fleet-rounds", 1, 1)?,
            load,
            storm_agents: num("storm-agents", 1000, 10)?,
        };
        anyhow::ensure!(
            sizes.rounds > 0 && sizes.load.agents > 0,
            "--fleet-rounds and --fleet-agents must be at least 1 (use --skip-fleet to skip the fleet part)"
        );
        anyhow::ensure!(
            sizes.storm_agents >= sizes.load.agents,
            "--storm-agents ({}) must be at least --fleet-agents ({}): the throughput agents are the \
             first of the connected ones",
            sizes.storm_agents,
            sizes.load.agents
        );
        Ok(Some(sizes))
    }

    pub fn to_json(&self) -> Value {
        json!({"rounds": self.rounds, "fleet_agents": self.load.agents,
               "apps_per_agent": self.load.apps_per_agent, "updates": self.load.updates,
               "writers": self.load.writers, "storm_agents": self.storm_agents})
    }

    /// One line saying what the fleet rows are.
    pub fn describe(&self) -> String {
        format!(
            "fleet rows: the same {} simulated agents (e2e::sim_agent, protocol level, mTLS) against \
             each principal, {} of them with {} Applications each, created + {} update rounds by {} \
             writers; {} round(s) alternating",
            self.storm_agents,
            self.load.agents,
            self.load.apps_per_agent,
            self.load.updates,
            self.load.writers,
            self.rounds
        )
    }
}

/// Figures of one side in one round.
#[derive(Debug)]
pub struct FleetFigures {
    side: Side,
    round: usize,
    rss0_kib: u64,
    rss_kib: u64,
    agents: usize,
    connect: Duration,
    connect_auth_failures: u64,
    throughput: Throughput,
    storm: Storm,
}

impl FleetFigures {
    fn rss_per_agent_kib(&self) -> f64 {
        self.rss_kib.saturating_sub(self.rss0_kib) as f64 / self.agents as f64
    }

    fn to_json(&self) -> Value {
        json!({
            "side": self.side.label(), "round": self.round,
            "principal_rss_kib_0_agents": self.rss0_kib,
            "principal_rss_kib": self.rss_kib, "agents": self.agents,
            "rss_per_agent_kib": self.rss_per_agent_kib(),
            "connect_s": self.connect.as_secs_f64(),
            "connect_auth_failures": self.connect_auth_failures,
            "throughput": self.throughput.to_json(),
            "storm": self.storm.to_json(),
        })
    }
}

/// The raw samples of the fleet part, for the JSON report.
pub fn to_json(figures: &[FleetFigures], sizes: &FleetSizes) -> Value {
    json!({
        "agents": "simulated (e2e::sim_agent), the same against both principals",
        "sizes": sizes.to_json(),
        "runs": figures.iter().map(FleetFigures::to_json).collect::<Vec<_>>(),
    })
}

/// Runs every (round, side) of the fleet part; a failed one is reported in `failures` and left
/// out of the figures.
pub async fn run(
    ground: &Ground,
    sizes: &FleetSizes,
    failures: &mut Vec<String>,
) -> anyhow::Result<Vec<FleetFigures>> {
    // One socket per agent here and one in the principal (which inherits the limit).
    let nofile = raise_fd_limit()?;
    if nofile < sizes.storm_agents as u64 + 1024 {
        eprintln!(
            "warning: the open-file limit is {nofile}; {} agents may need {} (raise the hard limit: ulimit -Hn)",
            sizes.storm_agents,
            sizes.storm_agents + 1024
        );
    }
    eprintln!(
        "==> fleet: issuing {} simulated agent certificates",
        sizes.storm_agents
    );
    let identities = issue_identities(&ground.pki, 0..sizes.storm_agents)?;
    let mut figures = Vec::new();
    for round in 1..=sizes.rounds {
        for side in [Side::Ours, Side::Upstream] {
            eprintln!(
                "==> fleet round {round}/{}: {} principal, {} simulated agents",
                sizes.rounds,
                side.label(),
                sizes.storm_agents
            );
            match measure(ground, side, round, sizes, &identities).await {
                Ok(f) => figures.push(f),
                Err(e) => {
                    eprintln!("fleet round {round} {} failed: {e:#}", side.label());
                    failures.push(format!("fleet round {round} {}: {e:#}", side.label()));
                }
            }
        }
    }
    Ok(figures)
}

fn pid(principal: &AnyPrincipal) -> anyhow::Result<u32> {
    let process = principal.process();
    process
        .pid()
        .ok_or_else(|| anyhow::anyhow!("{} is not running", process.name()))
}

/// One (round, side): start the principal, measure, stop everything and clean the hub.
async fn measure(
    ground: &Ground,
    side: Side,
    round: usize,
    sizes: &FleetSizes,
    identities: &[SimIdentity],
) -> anyhow::Result<FleetFigures> {
    let name = format!("fleet-{}-{round}", side.label());
    let hub = ground.hub.client().await?;
    let mut principal = AnyPrincipal::start(
        side,
        &name,
        &ground.dir,
        &ground.hub,
        &ground.pki,
        &format!("hub-{name}"),
        &["--log-level=info"],
    )
    .await?;
    let measured = async {
        let rss0_kib = settled_rss(pid(&principal)?).await?;
        let agents = identities.len();
        let limit = connect_limit(agents);
        let options = SimOptions {
            connect_concurrency: 128,
            subscribe_timeout: limit,
            ..SimOptions::default()
        };
        let (fleet, connect) = fleet_load::connect(
            &principal.address(),
            &ground.pki,
            identities.to_vec(),
            options,
        )
        .await?;
        eprintln!("    {agents} agents subscribed and resynced in {connect:.1?}");
        let with_fleet = async {
            let connect_auth_failures = FleetCounters::get(&fleet.counters.auth_failures);
            let rss_kib = settled_rss(pid(&principal)?).await?;
            eprintln!(
                "    principal RSS {rss0_kib} KiB with 0 agents, {rss_kib} KiB with {agents}"
            );
            eprintln!("    reconnect storm: restarting the principal under {agents} agents");
            let storm = fleet_load::storm(&fleet, principal.restart(), limit).await?;
            eprintln!(
                "    ready after {:.1?}, all resynced after {:?} ({} of {agents}), auth failures {}",
                storm.ready, storm.resynced_in, storm.resynced, storm.auth_failures
            );
            let throughput = fleet_load::throughput(
                &hub,
                &fleet,
                pid(&principal)?,
                &sizes.load,
                THROUGHPUT_LIMIT,
            )
            .await?;
            eprintln!(
                "    throughput: {} events in {:.1?} ({:.0}/s), principal CPU {:.2} s, {} Applications unfinished",
                throughput.events(),
                throughput.took,
                throughput.events_per_second(),
                throughput.cpu_seconds,
                throughput.unfinished
            );
            anyhow::Ok(FleetFigures {
                side,
                round,
                rss0_kib,
                rss_kib,
                agents,
                connect,
                connect_auth_failures,
                throughput,
                storm,
            })
        }
        .await;
        fleet.stop().await;
        with_fleet
    }
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}\n--- principal ---\n{}", principal.process().log_tail(20)));
    principal.process_mut().stop();
    sizes.load.clean_up(&hub).await?;
    measured
}

/// The fleet rows: the median over rounds of each figure, auth failures summed.
pub fn rows(figures: &[FleetFigures], sizes: &FleetSizes) -> Vec<Row> {
    let of = |side: Side| figures.iter().filter(move |f| f.side == side);
    let both = |figure: String, unit, pick: fn(&FleetFigures) -> Option<f64>| Row {
        figure,
        unit,
        ours: median(of(Side::Ours).filter_map(pick).collect()),
        upstream: median(of(Side::Upstream).filter_map(pick).collect()),
    };
    let total = |figure: String, pick: fn(&FleetFigures) -> u64| {
        let sum =
            |side: Side| (of(side).count() > 0).then(|| of(side).map(pick).sum::<u64>() as f64);
        Row {
            figure,
            unit: "count",
            ours: sum(Side::Ours),
            upstream: sum(Side::Upstream),
        }
    };
    let (load, n) = (&sizes.load, sizes.storm_agents);
    vec![
        both(
            format!(
                "events through one principal, {} simulated agents (HIGHER is better)",
                load.agents
            ),
            "events/s",
            |f| Some(f.throughput.events_per_second()),
        ),
        both(
            format!(
                "{} Applications × {} writes → on {} simulated agents, statuses ACKed",
                load.applications(),
                load.updates + 1,
                load.agents
            ),
            "s",
            |f| (f.throughput.unfinished == 0).then_some(f.throughput.took.as_secs_f64()),
        ),
        total(
            format!(
                "of those, Applications unfinished after {} s",
                THROUGHPUT_LIMIT.as_secs()
            ),
            |f| f.throughput.unfinished as u64,
        ),
        both(
            "principal CPU per 1,000 events (simulated agents)".into(),
            "cpu-s",
            |f| Some(f.throughput.cpu_per_1000_events()),
        ),
        both(
            format!("principal RSS per idle simulated agent at {n}"),
            "KiB",
            |f| Some(f.rss_per_agent_kib()),
        ),
        both(
            format!("principal restart (stop + start) → ready, {n} simulated agents"),
            "s",
            |f| Some(f.storm.ready.as_secs_f64()),
        ),
        both(
            format!("principal restart → {n} simulated agents resynced"),
            "s",
            |f| f.storm.resynced_in.map(|d| d.as_secs_f64()),
        ),
        total(
            format!("restart under {n} simulated agents: not resynced in time"),
            |f| (f.storm.agents - f.storm.resynced) as u64,
        ),
        total(
            "auth failures: connecting + reconnect storm (simulated agents)".into(),
            |f| f.connect_auth_failures + f.storm.auth_failures,
        ),
    ]
}
