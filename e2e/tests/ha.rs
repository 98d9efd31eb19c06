//! HA principal end to end: two `argocd-principal` replicas with `--ha-enabled` on one hub plane
//! (same CA, same JWT key, same namespace) behind a TCP balancer, as a Service over two pods, and
//! two managed agents on two spokes connected through it.
//!
//! Proves: exactly one replica is active (the HA Lease holder: ready, serving the agents, running
//! the embedded operator) while the other stands by (`/readyz` 503 with a reason, no agents, no
//! operator); SIGKILL of the active replica under load (Applications created and updated on the
//! hub, status written on the spokes) moves both agents to the standby within 15 s, and afterwards
//! hub and spokes agree exactly: every created Application reached its spoke with its last spec,
//! every status written on a spoke reached the hub. The failover time is measured and printed.
//!
//! No Argo CD runs here: the test writes the spoke status Argo CD's application-controller would,
//! since the load needs a new status on the newest copies every 150 ms right through the kill,
//! which a real application-controller cannot be made to write on cue; the test says so in its name.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::gateway::{
    application, application_resource, ensure_namespace, http_get, text, Agent, Pki, Principal,
};
use e2e::tcp_proxy::TcpBalancer;
use e2e::{metrics, shared_planes, wait_until};
use e2e::{SharedPlanes, TestContext};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

/// Start-up on a loaded machine is slow; conditions after start-up get this long.
const STARTUP: Duration = Duration::from_secs(60);
/// The promise: a killed active replica's agents are served by the other one within this.
const FAILOVER_BUDGET: Duration = Duration::from_secs(15);
/// HA Lease timings of the test replicas (the defaults are 10s / 2s).
const LEASE_DURATION: &str = "4s";
const RENEW_INTERVAL: &str = "1s";

/// Starts one HA replica of the principal without waiting for readiness (a standby never is).
fn spawn_replica(
    id: &str,
    ctx: &TestContext,
    planes: &SharedPlanes,
    pki: &Pki,
    namespace: &str,
) -> anyhow::Result<Principal> {
    Principal::spawn(
        id,
        &ctx.dir,
        &planes.hub,
        pki,
        namespace,
        &[
            "--enable-operator=true",
            "--ha-enabled",
            &format!("--ha-identity={}", identity(ctx, id)),
            &format!("--ha-lease-duration={LEASE_DURATION}"),
            &format!("--ha-renew-interval={RENEW_INTERVAL}"),
        ],
    )
}

fn identity(ctx: &TestContext, id: &str) -> String {
    ctx.unique(&format!("replica-{id}"))
}

async fn connected_agents(p: &Principal) -> anyhow::Result<f64> {
    Ok(
        metrics::read(p.ops_port, "argocd_principal_connected_agents", &[])
            .await?
            .unwrap_or(0.0),
    )
}

async fn lease_holder(leases: &Api<Lease>, name: &str) -> anyhow::Result<Option<String>> {
    Ok(leases
        .get_opt(name)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

/// What the load wrote: per agent, every Application created on the hub with its last
/// targetRevision, and the last status revision written on the spoke.
#[derive(Default)]
struct Written {
    revisions: Vec<BTreeMap<String, String>>,
    statuses: Vec<BTreeMap<String, String>>,
}

/// Creates an Application on the hub every 150 ms (alternating agents) and updates the spec of
/// an older one; writes a status on each spoke for its newest Applications; until `stop`.
async fn run_load(
    hub: Vec<Api<DynamicObject>>,
    spokes: Vec<Api<DynamicObject>>,
    namespaces: Vec<String>,
    written: Arc<Mutex<Written>>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut i = 0usize;
    while !*stop.borrow() {
        let agent = i % 2;
        let name = format!("load-{i}");
        hub[agent]
            .create(
                &PostParams::default(),
                &application(&name, &namespaces[agent], "v0"),
            )
            .await?;
        written.lock().unwrap().revisions[agent].insert(name, "v0".into());
        if i >= 4 {
            let older = format!("load-{}", i - 4);
            let revision = format!("v{i}");
            let patch = json!({"spec": {"source": {"targetRevision": revision}}});
            hub[agent]
                .patch(&older, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            written.lock().unwrap().revisions[agent].insert(older, revision);
        }
        // Stand-in for the spoke's Argo CD reporting status for what it has (the 3 newest copies).
        let copies = spokes[agent].list(&Default::default()).await?;
        let mut names: Vec<String> = copies
            .items
            .iter()
            .filter_map(|o| o.metadata.name.clone())
            .collect();
        names.sort_by_key(|n| std::cmp::Reverse(n[5..].parse::<usize>().unwrap_or(0)));
        for copy in names.into_iter().take(3) {
            let revision = format!("s{i}");
            let status = json!({"status": {"sync": {"status": "Synced", "revision": revision}}});
            match spokes[agent]
                .patch(&copy, &PatchParams::default(), &Patch::Merge(&status))
                .await
            {
                Ok(_) => {
                    written.lock().unwrap().statuses[agent].insert(copy, revision);
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    Ok(())
}

/// `Ok(Some(()))` when hub and spokes hold exactly what the load wrote.
async fn agree(
    hub: &[Api<DynamicObject>],
    spokes: &[Api<DynamicObject>],
    written: &Written,
) -> anyhow::Result<Option<()>> {
    for agent in 0..2 {
        let expected: BTreeSet<&String> = written.revisions[agent].keys().collect();
        let on_hub = hub[agent].list(&Default::default()).await?.items;
        let on_spoke = spokes[agent].list(&Default::default()).await?.items;
        let names = |items: &[DynamicObject]| -> BTreeSet<String> {
            items
                .iter()
                .filter_map(|o| o.metadata.name.clone())
                .collect()
        };
        let (hub_names, spoke_names) = (names(&on_hub), names(&on_spoke));
        if hub_names.iter().collect::<BTreeSet<_>>() != expected
            || spoke_names.iter().collect::<BTreeSet<_>>() != expected
        {
            return Ok(None);
        }
        for copy in &on_spoke {
            let v = serde_json::to_value(copy)?;
            let name = text(&v, "/metadata/name");
            if text(&v, "/spec/source/targetRevision") != written.revisions[agent][&name] {
                return Ok(None);
            }
        }
        for app in &on_hub {
            let v = serde_json::to_value(app)?;
            let name = text(&v, "/metadata/name");
            if let Some(status) = written.statuses[agent].get(&name) {
                if &text(&v, "/status/sync/revision") != status {
                    return Ok(None);
                }
            }
        }
    }
    Ok(Some(()))
}

#[tokio::test]
async fn killed_active_principal_hands_its_agents_to_the_standby_without_losing_events_with_status_written_by_the_test_since_argocd_cannot_write_statuses_on_cue_through_the_kill(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let ctx = TestContext::new("ha_failover")?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let namespace = ctx.unique("argocd");
    let hub_client = planes.hub.client().await?;
    ensure_namespace(&hub_client, &namespace).await?;
    let leases: Api<Lease> = Api::namespaced(hub_client.clone(), &namespace);

    // Replica a starts first and becomes active; b then stands by.
    let mut a = spawn_replica("a", &ctx, planes, &pki, &namespace)?;
    wait_until("replica a active and ready", STARTUP, || async {
        Ok::<_, anyhow::Error>(
            matches!(http_get(a.ops_port, "/readyz").await, Ok((200, _))).then_some(()),
        )
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", a.process.log_tail(30)))?;
    let b = spawn_replica("b", &ctx, planes, &pki, &namespace)?;
    let standby_reason = format!("standby: HA Lease held by {}", identity(&ctx, "a"));
    wait_until("replica b on standby", STARTUP, || async {
        let (status, body) = http_get(b.ops_port, "/readyz").await?;
        let standby =
            metrics::read(b.ops_port, "argocd_agent_ha_state", &[("state", "standby")]).await?;
        Ok::<_, anyhow::Error>(
            (status == 503 && body.trim() == standby_reason && standby == Some(1.0)).then_some(()),
        )
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", b.process.log_tail(30)))?;
    assert_eq!(
        metrics::read(a.ops_port, "argocd_agent_ha_state", &[("state", "active")]).await?,
        Some(1.0)
    );
    assert_eq!(
        lease_holder(&leases, "argocd-agent-principal").await?,
        Some(identity(&ctx, "a"))
    );
    // The embedded operator runs in the Lease holder only.
    wait_until("the operator Lease held by replica a", STARTUP, || async {
        Ok::<_, anyhow::Error>(
            (lease_holder(&leases, "argocd-agent-operator").await? == Some(identity(&ctx, "a")))
                .then_some(()),
        )
    })
    .await?;
    let operator_started = "GitOpsCluster operator started";
    assert!(
        std::fs::read_to_string(b.process.log_path())?
            .find(operator_started)
            .is_none(),
        "the standby must not run the operator"
    );

    // Two agents, one per spoke, through the balancer; both end up on the active replica.
    let balancer = TcpBalancer::start(vec![
        format!("127.0.0.1:{}", a.grpc_port).parse()?,
        format!("127.0.0.1:{}", b.grpc_port).parse()?,
    ])
    .await?;
    let mut agents = Vec::new();
    let (mut hub, mut spokes) = (Vec::new(), Vec::new());
    for (i, spoke) in planes.spokes.iter().enumerate() {
        let name = ctx.unique(&format!("agent{}", i + 1));
        pki.issue_agent(&name)?;
        ensure_namespace(&hub_client, &name).await?;
        let spoke_ns = ctx.unique("spoke-argocd");
        let agent = Agent::start(
            &name,
            &ctx.dir,
            spoke,
            &pki,
            &balancer.address(),
            &spoke_ns,
            &[],
        )
        .await?;
        hub.push(Api::<DynamicObject>::namespaced_with(
            hub_client.clone(),
            &name,
            &application_resource(),
        ));
        spokes.push(Api::<DynamicObject>::namespaced_with(
            spoke.client().await?,
            &spoke_ns,
            &application_resource(),
        ));
        agents.push(agent);
    }
    for agent in &agents {
        agent.wait_connected().await?;
    }
    wait_until("both agents on replica a", STARTUP, || async {
        Ok::<_, anyhow::Error>((connected_agents(&a).await? == 2.0).then_some(()))
    })
    .await?;
    assert_eq!(
        connected_agents(&b).await?,
        0.0,
        "the standby serves no agent"
    );

    // Load, then SIGKILL the active replica in the middle of it.
    let written = Arc::new(Mutex::new(Written {
        revisions: vec![BTreeMap::new(), BTreeMap::new()],
        statuses: vec![BTreeMap::new(), BTreeMap::new()],
    }));
    let (stop_load, load_stopped) = tokio::sync::watch::channel(false);
    let load = tokio::spawn(run_load(
        hub.clone(),
        spokes.clone(),
        agents.iter().map(|a| a.name.clone()).collect(),
        written.clone(),
        load_stopped,
    ));
    wait_until("load under way", STARTUP, || async {
        let w = written.lock().unwrap();
        Ok::<_, anyhow::Error>(
            (w.revisions.iter().all(|r| r.len() >= 10) && w.statuses.iter().all(|s| !s.is_empty()))
                .then_some(()),
        )
    })
    .await?;
    a.process.kill();
    let killed_at = Instant::now();

    wait_until("both agents on replica b", FAILOVER_BUDGET, || async {
        let mut on_b = connected_agents(&b).await? == 2.0;
        for agent in &agents {
            on_b &= metrics::read(agent.ops_port, "argocd_agent_connection_status", &[]).await?
                == Some(1.0);
        }
        Ok::<_, anyhow::Error>(on_b.then_some(()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", b.process.log_tail(40)))?;
    let failover = killed_at.elapsed();

    // A little more load against the new active replica, then everything must agree.
    let load_after = written.lock().unwrap().revisions[0].len() + 4;
    wait_until("load continues on replica b", STARTUP, || async {
        Ok::<_, anyhow::Error>(
            (written.lock().unwrap().revisions[0].len() >= load_after).then_some(()),
        )
    })
    .await?;
    stop_load.send_replace(true);
    load.await??;
    let load_stopped_at = killed_at.elapsed();
    let final_state = std::mem::take(&mut *written.lock().unwrap());
    wait_until("hub and spokes agree on every Application", STARTUP, || {
        agree(&hub, &spokes, &final_state)
    })
    .await?;
    let converged = killed_at.elapsed();
    let created: usize = final_state.revisions.iter().map(BTreeMap::len).sum();
    let statuses: usize = final_state.statuses.iter().map(BTreeMap::len).sum();
    eprintln!(
        "[ha] failover (SIGKILL of the active replica → both agents connected to the standby): {:.1} s; \
         load stopped at {:.1} s; hub and spokes agreed at {:.1} s after the kill \
         ({created} Applications, {statuses} spoke statuses)",
        failover.as_secs_f64(),
        load_stopped_at.as_secs_f64(),
        converged.as_secs_f64()
    );
    assert!(failover <= FAILOVER_BUDGET);
    assert!(
        converged - load_stopped_at <= FAILOVER_BUDGET,
        "converged {:.1} s after the load stopped",
        (converged - load_stopped_at).as_secs_f64()
    );

    // Replica b is now the active one, counted a failover, and took the operator over.
    let (status, _) = http_get(b.ops_port, "/readyz").await?;
    assert_eq!(status, 200);
    assert_eq!(
        metrics::read(b.ops_port, "argocd_agent_ha_failovers_total", &[]).await?,
        Some(1.0)
    );
    assert_eq!(
        lease_holder(&leases, "argocd-agent-principal").await?,
        Some(identity(&ctx, "b"))
    );
    wait_until(
        "the operator Lease taken over by replica b",
        STARTUP,
        || async {
            Ok::<_, anyhow::Error>(
                (lease_holder(&leases, "argocd-agent-operator").await?
                    == Some(identity(&ctx, "b")))
                .then_some(()),
            )
        },
    )
    .await?;

    // The killed replica comes back as a standby: not ready, no agents.
    a.process.start_again()?;
    let back_reason = format!("standby: HA Lease held by {}", identity(&ctx, "b"));
    wait_until("replica a back on standby", STARTUP, || async {
        let (status, body) = http_get(a.ops_port, "/readyz").await?;
        Ok::<_, anyhow::Error>((status == 503 && body.trim() == back_reason).then_some(()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", a.process.log_tail(30)))?;
    assert_eq!(connected_agents(&b).await?, 2.0);
    assert_eq!(connected_agents(&a).await?, 0.0);
    Ok(())
}
