//! Fleet-scale load through one principal with simulated agents ([`crate::sim_agent`]), whichever
//! principal serves them: a fleet connected until every agent is resynced, hub writes into the
//! agents' namespaces and what delivering them took (events to the agents, status reports ACKed,
//! the principal's CPU), and a reconnect storm after a principal restart. `bench-fleet` and
//! `bench-compare` take their fleet figures through these, so both measure the same way.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::bench::cpu_seconds;
use crate::gateway::{application, application_resource, ensure_namespace, Pki};
use crate::sim_agent::{sim_name, FleetCounters, SimFleet, SimIdentity, SimOptions};
use crate::wait_until;

/// Waits until `count(fleet)` reaches `want`, printing progress every 10 s; `what` names the
/// condition.
pub async fn wait_fleet(
    what: &str,
    fleet: &SimFleet,
    want: usize,
    timeout: Duration,
    count: impl Fn(&SimFleet) -> usize,
) -> anyhow::Result<()> {
    let mut last_print = Instant::now();
    wait_until(what, timeout, || {
        let n = count(fleet);
        if last_print.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "    {what}: {n}/{want} (auth failures {}, connect failures {})",
                FleetCounters::get(&fleet.counters.auth_failures),
                FleetCounters::get(&fleet.counters.connect_failures)
            );
            last_print = Instant::now();
        }
        async move { Ok::<_, anyhow::Error>((n >= want).then_some(())) }
    })
    .await
}

/// Time allowed for `agents` simulated agents to connect and resync (or to resync again).
pub fn connect_limit(agents: usize) -> Duration {
    Duration::from_secs(120 + agents as u64 / 5)
}

/// Starts one simulated agent per identity against `address` and waits until every one is
/// subscribed and resynced (at most [`connect_limit`]); returns the fleet and the time it took.
pub async fn connect(
    address: &str,
    pki: &Pki,
    identities: Vec<SimIdentity>,
    options: SimOptions,
) -> anyhow::Result<(SimFleet, Duration)> {
    let t0 = Instant::now();
    let fleet = SimFleet::start(address, pki, identities, options)?;
    let want = fleet.len();
    wait_fleet(
        "simulated agents subscribed and resynced",
        &fleet,
        want,
        connect_limit(want),
        SimFleet::resynced,
    )
    .await?;
    Ok((fleet, t0.elapsed()))
}

/// Runs `ops` hub writes with `writers` concurrent writers; returns the elapsed time.
pub async fn run_writes<F, Fut>(writers: usize, ops: usize, op: F) -> anyhow::Result<Duration>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let op = Arc::new(op);
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..writers.max(1) {
        let (next, op) = (next.clone(), op.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ops {
                    return Ok::<_, anyhow::Error>(());
                }
                op(i).await?;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(t0.elapsed())
}

/// Creates `count` Applications (index → (namespace, name)) at revision `r0`, then patches their
/// revision to `r1`..`r<updates>`, with `writers` concurrent writers; returns (writes, elapsed).
pub async fn create_and_update(
    client: &kube::Client,
    writers: usize,
    count: usize,
    updates: usize,
    place: impl Fn(usize) -> (String, String) + Send + Sync + Clone + 'static,
) -> anyhow::Result<(usize, Duration)> {
    let mut total = Duration::ZERO;
    // Round 0 creates every Application at `r0`; round n merge-patches its revision to `r<n>`.
    for round in 0..=updates {
        let (client, place) = (client.clone(), place.clone());
        total += run_writes(writers, count, move |i| {
            let (client, (ns, name)) = (client.clone(), place(i));
            async move {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(client, &ns, &application_resource());
                if round == 0 {
                    api.create(&PostParams::default(), &application(&name, &ns, "r0"))
                        .await?;
                } else {
                    let patch =
                        json!({"spec": {"source": {"targetRevision": format!("r{round}")}}});
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                }
                Ok(())
            }
        })
        .await?;
    }
    Ok((count * (updates + 1), total))
}

/// The hub work of a throughput run: Applications spread over the first `agents` simulated
/// agents' namespaces, created and then updated.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Simulated agents whose namespaces get Applications (`sim-0000`...).
    pub agents: usize,
    /// Applications per agent.
    pub apps_per_agent: usize,
    /// Update rounds over every Application after creating them.
    pub updates: usize,
    /// Concurrent hub writers.
    pub writers: usize,
}

impl Load {
    /// 100 agents × 10 Applications, 3 update rounds, 16 writers.
    pub const FULL: Load = Load {
        agents: 100,
        apps_per_agent: 10,
        updates: 3,
        writers: 16,
    };

    /// The same shape at smoke size (4 agents × 2 Applications, 1 update round, 4 writers).
    pub const SMOKE: Load = Load {
        agents: 4,
        apps_per_agent: 2,
        updates: 1,
        writers: 4,
    };

    /// Applications in all.
    pub fn applications(&self) -> usize {
        self.agents * self.apps_per_agent
    }

    /// Namespace and name of Application `i`: agents take turns, so every agent gets its share
    /// from the start.
    pub fn place(&self) -> impl Fn(usize) -> (String, String) + Send + Sync + Clone + 'static {
        let agents = self.agents;
        move |i| (sim_name(i % agents), format!("app-{}", i / agents))
    }

    /// Removes this load's Applications from the hub (finalizers first) and waits until they are
    /// gone, so the next principal starts on an empty hub.
    pub async fn clean_up(&self, hub: &kube::Client) -> anyhow::Result<()> {
        for a in 0..self.agents {
            let api: Api<DynamicObject> =
                Api::namespaced_with(hub.clone(), &sim_name(a), &application_resource());
            for app in api.list_metadata(&ListParams::default()).await? {
                if app.metadata.finalizers.is_some_and(|f| !f.is_empty()) {
                    let name = app.metadata.name.unwrap_or_default();
                    let patch = json!({"metadata": {"finalizers": null}});
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                }
            }
            api.delete_collection(&DeleteParams::default(), &ListParams::default())
                .await?;
            wait_until(
                &format!("the Applications in {} deleted", sim_name(a)),
                Duration::from_secs(60),
                || {
                    let api = api.clone();
                    async move {
                        let left = api.list_metadata(&ListParams::default()).await?;
                        Ok::<_, anyhow::Error>(left.items.is_empty().then_some(()))
                    }
                },
            )
            .await?;
        }
        Ok(())
    }
}

/// What delivering a [`Load`] through the principal took.
#[derive(Debug, Clone)]
pub struct Throughput {
    /// Hub writes made.
    pub writes: usize,
    /// Time the writes took.
    pub write_time: Duration,
    /// From the first write until every Application was at its last revision on its agent and
    /// every status report ACKed, or until the limit passed (then `unfinished` > 0).
    pub took: Duration,
    /// Applications not at their last revision on their agent (or with status reports un-ACKed)
    /// when the limit passed; 0 when the work finished.
    pub unfinished: usize,
    /// Events the agents received from the principal (ACKs and pings excluded).
    pub to_agents: u64,
    /// Status reports (and other agent events) the principal ACKed.
    pub acked: u64,
    /// Status reports the agents queued (more than were sent: an outbox keeps only the newest
    /// per Application).
    pub status_queued: u64,
    /// The principal's CPU time (user + system) over `took`.
    pub cpu_seconds: f64,
}

impl Throughput {
    /// Events through the principal: to the agents plus ACKed from them.
    pub fn events(&self) -> u64 {
        self.to_agents + self.acked
    }

    /// [`Self::events`] per second of [`Self::took`].
    pub fn events_per_second(&self) -> f64 {
        self.events() as f64 / self.took.as_secs_f64()
    }

    /// The principal's CPU seconds per 1,000 events.
    pub fn cpu_per_1000_events(&self) -> f64 {
        self.cpu_seconds / self.events().max(1) as f64 * 1000.0
    }

    /// The figures as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "writes": self.writes, "write_time_s": self.write_time.as_secs_f64(),
            "took_s": self.took.as_secs_f64(), "unfinished": self.unfinished,
            "to_agents": self.to_agents,
            "acked": self.acked, "status_queued": self.status_queued,
            "principal_cpu_s": self.cpu_seconds, "events_per_s": self.events_per_second(),
            "cpu_s_per_1000_events": self.cpu_per_1000_events(),
        })
    }
}

/// Writes `load` into the hub (namespaces created if needed) while `fleet`, whose first
/// `load.agents` agents own those namespaces, is served by the principal with process id
/// `principal_pid`; waits (at most 300 s) until every Application is at its last revision on its
/// agent and nothing is left un-ACKed in the agents' outboxes, at most `limit`: what was delivered
/// by then is measured over `limit`, with [`Throughput::unfinished`] saying how much was not.
pub async fn throughput(
    hub: &kube::Client,
    fleet: &SimFleet,
    principal_pid: u32,
    load: &Load,
    limit: Duration,
) -> anyhow::Result<Throughput> {
    anyhow::ensure!(
        load.agents <= fleet.len(),
        "the load spans {} agents, the fleet has {}",
        load.agents,
        fleet.len()
    );
    for a in 0..load.agents {
        ensure_namespace(hub, &sim_name(a)).await?;
    }
    let c = &fleet.counters;
    let (ev0, ack0, queued0) = (
        FleetCounters::get(&c.events_received),
        FleetCounters::get(&c.acks_received),
        FleetCounters::get(&c.status_queued),
    );
    let apps0 = fleet.applications();
    let cpu0 = cpu_seconds(principal_pid)?;
    let count = load.applications();
    let t0 = Instant::now();
    let (writes, write_time) =
        create_and_update(hub, load.writers, count, load.updates, load.place()).await?;
    let last = format!("r{}", load.updates);
    // Reaches `count` only once nothing is left un-ACKed.
    let done = |f: &SimFleet| {
        f.applications_at(&last)
            .min(count - usize::from(f.pending() > 0))
    };
    let waited = wait_fleet(
        "every Application at its last revision on its agent, every status ACKed",
        fleet,
        count,
        limit,
        done,
    )
    .await;
    let took = t0.elapsed();
    let unfinished = count - done(fleet);
    if let Err(e) = waited {
        eprintln!("    {e:#}");
    }
    let cpu_seconds = cpu_seconds(principal_pid)? - cpu0;
    anyhow::ensure!(
        unfinished > 0 || fleet.applications() >= apps0 + count,
        "Applications missing on the agents"
    );
    Ok(Throughput {
        writes,
        write_time,
        took,
        unfinished,
        to_agents: FleetCounters::get(&c.events_received) - ev0,
        acked: FleetCounters::get(&c.acks_received) - ack0,
        status_queued: FleetCounters::get(&c.status_queued) - queued0,
        cpu_seconds,
    })
}

/// What a principal restart under a connected fleet did.
#[derive(Debug, Clone)]
pub struct Storm {
    /// Agents connected when the principal was restarted.
    pub agents: usize,
    /// From the restart until the principal answered its readiness probe.
    pub ready: Duration,
    /// From the restart until every agent was subscribed and resynced on a new stream with all
    /// its Applications; `None` if that did not happen within the limit.
    pub resynced_in: Option<Duration>,
    /// Agents resynced on a new stream when the wait ended.
    pub resynced: usize,
    /// Authentications the principal refused meanwhile (agents' view).
    pub auth_failures: u64,
    /// Other failed attempts meanwhile (refused connections while the principal was down,
    /// timeouts).
    pub connect_failures: u64,
}

impl Storm {
    /// The figures as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "agents": self.agents, "ready_s": self.ready.as_secs_f64(),
            "resynced_s": self.resynced_in.map(|d| d.as_secs_f64()),
            "resynced": self.resynced, "auth_failures": self.auth_failures,
            "connect_failures": self.connect_failures,
        })
    }
}

/// Restarts the principal under `fleet` (`restart` stops it, starts it and waits until it is
/// ready) and waits at most `limit` until every agent is resynced on a new stream holding all the
/// Applications it held before.
pub async fn storm(
    fleet: &SimFleet,
    restart: impl Future<Output = anyhow::Result<()>>,
    limit: Duration,
) -> anyhow::Result<Storm> {
    let expected_apps = fleet.applications();
    let before = fleet.stream_numbers();
    let c = &fleet.counters;
    let (auth0, connect0) = (
        FleetCounters::get(&c.auth_failures),
        FleetCounters::get(&c.connect_failures),
    );
    let t0 = Instant::now();
    restart.await?;
    let ready = t0.elapsed();
    let count = |f: &SimFleet| {
        if f.applications() >= expected_apps {
            f.resynced_after(&before)
        } else {
            0
        }
    };
    let done = wait_fleet(
        "every agent subscribed and resynced again",
        fleet,
        fleet.len(),
        limit,
        count,
    )
    .await;
    let resynced_in = match done {
        Ok(()) => Some(t0.elapsed()),
        Err(e) => {
            eprintln!("    {e:#}");
            None
        }
    };
    Ok(Storm {
        agents: fleet.len(),
        ready,
        resynced_in,
        resynced: count(fleet),
        auth_failures: FleetCounters::get(&c.auth_failures) - auth0,
        connect_failures: FleetCounters::get(&c.connect_failures) - connect0,
    })
}
