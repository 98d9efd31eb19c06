//! Link and process faults on real control planes, with a [`TcpProxy`] between each agent and
//! the principal: a link cut while both sides change (exact convergence, no loss, no duplicates,
//! the owner wins a conflict), an agent killed and restarted while offline (its durable queue
//! delivers everything), and a half-open link found by keepalive.
//!
//! Sizes scale with `E2E_FAULT_SCALE` (default 0.2: 100 changes per side instead of the issue's
//! 500) so the suite stays short in CI; convergence times are printed for the record.

use std::time::{Duration, Instant};

use e2e::gateway::{
    application, application_resource, ensure_namespace, http_get, text, Agent, Pki, Principal,
};
use e2e::tcp_proxy::TcpProxy;
use e2e::{shared_planes, wait_until, TestContext};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const CONVERGE: Duration = Duration::from_secs(180);

fn scaled(n: usize) -> usize {
    let scale: f64 = std::env::var("E2E_FAULT_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.2);
    ((n as f64 * scale).round() as usize).max(1)
}

async fn metric(agent: &Agent, name: &str) -> anyhow::Result<Option<f64>> {
    let (_, body) = http_get(agent.ops_port, "/metrics").await?;
    Ok(body
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok()))
}

async fn wait_connection(agent: &Agent, up: bool, within: Duration) -> anyhow::Result<()> {
    let want = if up { 1.0 } else { 0.0 };
    wait_until(
        &format!("agent {} connection status {want}", agent.name),
        within,
        || async {
            Ok::<_, anyhow::Error>(
                (metric(agent, "argocd_agent_connection_status").await? == Some(want))
                    .then_some(()),
            )
        },
    )
    .await
}

async fn list_all(api: &Api<DynamicObject>) -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).expect("serialises"))
        .collect())
}

fn proxy_upstream(principal: &Principal) -> std::net::SocketAddr {
    principal.address().parse().expect("socket address")
}

#[tokio::test]
async fn link_cut_while_both_sides_change_converges_exactly_and_the_owner_wins(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let ctx = TestContext::new("fault_link_cut")?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let principal = Principal::start(
        "p",
        &ctx.dir,
        &planes.hub,
        &pki,
        &ctx.unique("argocd"),
        &["--namespace-create-enable"],
    )
    .await?;
    let hub = planes.hub.client().await?;
    let (managed, auto) = (ctx.unique("shop"), ctx.unique("ship"));
    pki.issue_agent(&managed)?;
    pki.issue_agent(&auto)?;
    ensure_namespace(&hub, &managed).await?;
    let spoke_ns = ctx.unique("spoke-argocd");
    let managed_link = TcpProxy::start(proxy_upstream(&principal)).await?;
    let auto_link = TcpProxy::start(proxy_upstream(&principal)).await?;
    let managed_agent = Agent::start(
        &managed,
        &ctx.dir,
        &planes.spokes[0],
        &pki,
        &managed_link.address(),
        &spoke_ns,
        &[],
    )
    .await?;
    let auto_agent = Agent::start(
        &auto,
        &ctx.dir,
        &planes.spokes[1],
        &pki,
        &auto_link.address(),
        &spoke_ns,
        &["--mode=autonomous"],
    )
    .await?;
    managed_agent.wait_connected().await?;
    auto_agent.wait_connected().await?;

    let hub_managed: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &managed, &application_resource());
    let spoke_managed: Api<DynamicObject> = Api::namespaced_with(
        planes.spokes[0].client().await?,
        &spoke_ns,
        &application_resource(),
    );
    let hub_auto: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &auto, &application_resource());
    let spoke_auto: Api<DynamicObject> = Api::namespaced_with(
        planes.spokes[1].client().await?,
        &spoke_ns,
        &application_resource(),
    );

    // One object of each mode exists on both sides before the cut (for the conflict).
    hub_managed
        .create(&PostParams::default(), &application("both", &managed, "v0"))
        .await?;
    spoke_auto
        .create(
            &PostParams::default(),
            &application("both", &spoke_ns, "v0"),
        )
        .await?;
    for (api, what) in [
        (&spoke_managed, "managed copy"),
        (&hub_auto, "autonomous mirror"),
    ] {
        wait_until(what, WAIT, || async {
            Ok::<_, kube::Error>(api.get_opt("both").await?.map(|_| ()))
        })
        .await?;
    }

    managed_link.cut();
    auto_link.cut();
    wait_connection(&managed_agent, false, WAIT).await?;
    wait_connection(&auto_agent, false, WAIT).await?;

    let n = scaled(500);
    for i in 0..n {
        hub_managed
            .create(
                &PostParams::default(),
                &application(&format!("hub-{i}"), &managed, "v1"),
            )
            .await?;
        spoke_auto
            .create(
                &PostParams::default(),
                &application(&format!("spoke-{i}"), &spoke_ns, "v1"),
            )
            .await?;
    }
    // Both sides change the same objects while apart: the owner's version must win.
    let set_rev = |rev: &str| Patch::Merge(json!({"spec": {"source": {"targetRevision": rev}}}));
    hub_managed
        .patch("both", &PatchParams::default(), &set_rev("hub-owner"))
        .await?;
    spoke_managed
        .patch("both", &PatchParams::default(), &set_rev("spoke-intruder"))
        .await?;
    spoke_auto
        .patch("both", &PatchParams::default(), &set_rev("spoke-owner"))
        .await?;
    hub_auto
        .patch("both", &PatchParams::default(), &set_rev("hub-intruder"))
        .await?;

    let reconnected = Instant::now();
    managed_link.forward();
    auto_link.forward();
    let expected = n + 1;
    wait_until("both sides agree", CONVERGE, || async {
        let spoke_m = list_all(&spoke_managed).await?;
        let hub_a = list_all(&hub_auto).await?;
        let rev = |items: &[serde_json::Value]| {
            items
                .iter()
                .find(|v| text(v, "/metadata/name") == "both")
                .map(|v| text(v, "/spec/source/targetRevision"))
        };
        Ok::<_, anyhow::Error>(
            (spoke_m.len() == expected
                && hub_a.len() == expected
                && rev(&spoke_m).as_deref() == Some("hub-owner")
                && rev(&hub_a).as_deref() == Some("spoke-owner"))
            .then_some(()),
        )
    })
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}\nmanaged agent:\n{}\nautonomous agent:\n{}\nprincipal:\n{}",
            managed_agent.process.log_tail(20),
            auto_agent.process.log_tail(20),
            principal.process.log_tail(20)
        )
    })?;
    let took = reconnected.elapsed();
    eprintln!("[fault] link cut: {n} hub + {n} spoke changes converged {took:?} after reconnect");
    // Exactly: nothing lost, nothing created twice, and the hub copies are the right objects.
    let hub_a = list_all(&hub_auto).await?;
    let spoke_a = list_all(&spoke_auto).await?;
    let mut hub_names: Vec<String> = hub_a.iter().map(|v| text(v, "/metadata/name")).collect();
    let mut spoke_names: Vec<String> = spoke_a.iter().map(|v| text(v, "/metadata/name")).collect();
    hub_names.sort();
    spoke_names.sort();
    assert_eq!(hub_names, spoke_names);
    assert_eq!(
        list_all(&spoke_managed).await?.len(),
        list_all(&hub_managed).await?.len()
    );
    // The losing edits stay lost (no flip-flop).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let both = spoke_managed.get("both").await?;
    assert_eq!(both.data["spec"]["source"]["targetRevision"], "hub-owner");
    let both = hub_auto.get("both").await?;
    assert_eq!(both.data["spec"]["source"]["targetRevision"], "spoke-owner");
    Ok(())
}

#[tokio::test]
async fn agent_killed_and_restarted_while_offline_delivers_its_queued_changes() -> anyhow::Result<()>
{
    let planes = shared_planes().await;
    let ctx = TestContext::new("fault_restart_offline")?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let principal = Principal::start(
        "p",
        &ctx.dir,
        &planes.hub,
        &pki,
        &ctx.unique("argocd"),
        &["--namespace-create-enable"],
    )
    .await?;
    let hub = planes.hub.client().await?;
    let auto = ctx.unique("ship");
    pki.issue_agent(&auto)?;
    let spoke_ns = ctx.unique("spoke-argocd");
    let link = TcpProxy::start(proxy_upstream(&principal)).await?;
    let mut agent = Agent::start(
        &auto,
        &ctx.dir,
        &planes.spokes[0],
        &pki,
        &link.address(),
        &spoke_ns,
        &["--mode=autonomous"],
    )
    .await?;
    agent.wait_connected().await?;
    let hub_auto: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &auto, &application_resource());
    let spoke_auto: Api<DynamicObject> = Api::namespaced_with(
        planes.spokes[0].client().await?,
        &spoke_ns,
        &application_resource(),
    );

    link.cut();
    wait_connection(&agent, false, WAIT).await?;
    let n = scaled(1000);
    for i in 0..n {
        spoke_auto
            .create(
                &PostParams::default(),
                &application(&format!("app-{i}"), &spoke_ns, "v1"),
            )
            .await?;
    }
    // Queued (the outbox gauge is sampled every few seconds), then the process dies hard.
    wait_until("changes queued", WAIT, || async {
        Ok::<_, anyhow::Error>(
            (metric(&agent, "argocd_agent_outbox_resources").await? >= Some(n as f64))
                .then_some(()),
        )
    })
    .await?;
    agent.process.kill();
    agent.process.start_again()?;
    wait_until("queue restored after the restart", WAIT, || async {
        Ok::<_, anyhow::Error>(
            agent
                .process
                .log_tail(400)
                .contains(&format!("restored={n}"))
                .then_some(()),
        )
    })
    .await?;
    let reconnected = Instant::now();
    link.forward();
    wait_until(
        "every offline change mirrored on the hub",
        CONVERGE,
        || async { Ok::<_, anyhow::Error>((list_all(&hub_auto).await?.len() == n).then_some(())) },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", agent.process.log_tail(30)))?;
    eprintln!(
        "[fault] agent restarted offline: {n} queued objects mirrored {:?} after reconnect",
        reconnected.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn half_open_link_is_detected_by_keepalive_and_recovered() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let ctx = TestContext::new("fault_half_open")?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let principal = Principal::start(
        "p",
        &ctx.dir,
        &planes.hub,
        &pki,
        &ctx.unique("argocd"),
        &["--namespace-create-enable"],
    )
    .await?;
    let auto = ctx.unique("ship");
    pki.issue_agent(&auto)?;
    let link = TcpProxy::start(proxy_upstream(&principal)).await?;
    let agent = Agent::start(
        &auto,
        &ctx.dir,
        &planes.spokes[0],
        &pki,
        &link.address(),
        &ctx.unique("spoke-argocd"),
        &[
            "--mode=autonomous",
            "--keepalive-interval=1s",
            "--keepalive-timeout=2s",
        ],
    )
    .await?;
    agent.wait_connected().await?;
    link.blackhole();
    let started = Instant::now();
    // interval + timeout = 3s; allow scheduling slack on a loaded machine.
    wait_connection(&agent, false, Duration::from_secs(10)).await?;
    eprintln!(
        "[fault] half-open link detected after {:?}",
        started.elapsed()
    );
    link.forward();
    wait_connection(&agent, true, WAIT).await?;
    Ok(())
}
