//! The hub Argo CD's cluster list shows each agent's cluster as connected or not, and the counts
//! of the spoke's Argo CD (applications, APIs, resources), as upstream argocd-agent makes it show
//! them: the principal writes Argo CD's cluster info into the hub Argo CD's Redis when the agent
//! connects and disconnects, and stores the counts a managed agent reads from its spoke Argo CD's
//! Redis and sends every `--cache-refresh-interval`.
//!
//! Real ground on both sides: the spoke runs Argo CD's real application-controller (whose cache
//! fills the counts), the hub runs real argocd-server, looked at only with the real `argocd` CLI
//! (`argocd cluster list -o json`). Both Redis servers require a password. Cells: our principal
//! with our agent and with upstream's Go agent, our agent on upstream's principal, and both of
//! upstream's (the reference behaviour).

use std::time::Duration;

use e2e::argocd::{ArgoCd, RedisEndpoint};
use e2e::gateway::{agentctl, application_resource, ensure_namespace, Pki, Principal};
use e2e::git_server::{demo_manifests, GitServer};
use e2e::scenario::{demo_application, wait_synced};
use e2e::sides::{AnyAgent, AnyPrincipal, Mode, Side};
use e2e::upstream::UpstreamPrincipal;
use e2e::{shared_planes, wait_until, Redis, TestContext};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{json, Value};

/// How long the cluster list may take to show a change (counts: the spoke controller's 10 s
/// cluster info period, then the agent's 2 s refresh).
const SHOW_WAIT: Duration = Duration::from_secs(120);

/// The agent's cluster as `argocd cluster list -o json` shows it, if listed.
async fn listed_cluster(server: &ArgoCd, agent: &str) -> anyhow::Result<Option<Value>> {
    let out = server
        .cli_run(&["cluster", "list", "-o", "json"], Duration::from_secs(60))
        .await?
        .success()?;
    let clusters: Vec<Value> = serde_json::from_str(&out)?;
    Ok(clusters.into_iter().find(|c| c["name"] == agent))
}

/// Polls the cluster list (once a second) until `check` accepts the agent's cluster.
async fn wait_listed(
    server: &ArgoCd,
    agent: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
    logs: impl Fn() -> String,
) -> anyhow::Result<Value> {
    wait_until(what, SHOW_WAIT, || async {
        let cluster = listed_cluster(server, agent).await?;
        match cluster {
            Some(c) if check(&c) => Ok(Some(c)),
            other => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Err(anyhow::anyhow!("listed: {other:?}"))
            }
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))
}

fn count(cluster: &Value, pointer: &str) -> i64 {
    cluster
        .pointer(pointer)
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

async fn cluster_list_shows_the_agent(
    principal_side: Side,
    agent_side: Side,
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let (hub, spoke) = (&planes.hub, &planes.spokes[0]);
    let ctx = TestContext::new(&format!(
        "real_cluster_info_{}_principal_{}_agent",
        principal_side.label(),
        agent_side.label()
    ))?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let agent_name = ctx.unique("agent");
    pki.issue_agent(&agent_name)?;
    let git = GitServer::start(&ctx.unique("git"))?;
    let revision = git.commit("apps", "demo", &demo_manifests("counted"), "demo")?;

    // Hub: a password-protected Redis; the principal writes the cluster info into it.
    let hub_redis =
        Redis::start_as_hub(&ctx.unique("hub-redis"), &ctx.dir.join("hub-redis-creds"))?;
    let hub_password = hub_redis.password.clone().expect("password-protected");
    let principal_ns = ctx.unique("hub-argocd");
    let hub_client = hub.client().await?;
    ensure_namespace(&hub_client, &agent_name).await?;
    let (principal, resource_proxy, server_redis) = match principal_side {
        Side::Ours => {
            let p = Principal::start(
                &ctx.suffix,
                &ctx.dir,
                hub,
                &pki,
                &principal_ns,
                &hub_redis
                    .principal_flags()
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
            )
            .await?;
            let proxy = format!("127.0.0.1:{}", p.resource_proxy_port);
            // argocd-server's Redis is our Redis proxy in front of the hub Redis.
            let redis = format!("127.0.0.1:{}", p.redis_proxy_port);
            (AnyPrincipal::Ours(p), proxy, redis)
        }
        Side::Upstream => {
            let p = UpstreamPrincipal::start(
                &ctx.suffix,
                &ctx.dir,
                hub,
                &pki,
                &principal_ns,
                Some(&hub_redis.address()),
                &[&format!("--redis-password={hub_password}")],
            )
            .await?;
            // Its resource and Redis proxies are off in this harness: argocd-server reads the
            // hub Redis directly, and the cluster URL only names the agent.
            (
                AnyPrincipal::Upstream(p),
                "127.0.0.1:9".to_string(),
                hub_redis.address(),
            )
        }
    };
    // The agent's cluster Secret on the hub (labelled with the agent's name).
    agentctl(&[
        "agent",
        "create",
        &agent_name,
        "--dir",
        pki.dir.to_str().expect("utf-8 path"),
        "--kubeconfig",
        hub.kubeconfig.to_str().expect("utf-8 path"),
        "--resource-proxy-server",
        &resource_proxy,
        "--argocd-namespace",
        &principal_ns,
    ])?;

    // Spoke: real Argo CD; the agent reads its password-protected Redis.
    let spoke_ns = ctx.unique("argocd");
    let spoke_argocd = ArgoCd::start_spoke(&ctx.suffix, &ctx.dir, spoke, &spoke_ns, &[]).await?;
    let spoke_redis = spoke_argocd
        .redis_endpoint()
        .expect("a spoke Argo CD has a Redis");
    let dest = ctx.unique("demo");
    ensure_namespace(&spoke.client().await?, &dest).await?;
    let redis_address = format!("--redis-address={}", spoke_redis.address);
    let redis_password = format!(
        "--redis-password={}",
        spoke_redis.password.clone().unwrap_or_default()
    );
    let agent_args: Vec<&str> = match agent_side {
        Side::Ours => vec![
            &redis_address,
            &redis_password,
            "--cache-refresh-interval=2s",
        ],
        Side::Upstream => vec!["--cache-refresh-interval=2s"],
    };
    let mut agent = AnyAgent::start(
        agent_side,
        &agent_name,
        &ctx.dir,
        spoke,
        &pki,
        &principal.address(),
        Mode::Managed,
        &spoke_ns,
        Some(&spoke_argocd),
        &agent_args,
    )
    .await?;

    let server = ArgoCd::start_server(
        &ctx.suffix,
        &ctx.dir,
        hub,
        &principal_ns,
        RedisEndpoint {
            address: server_redis,
            password: Some(hub_password.clone()),
            tls_ca: None,
        },
    )
    .await?;
    let logs = |agent: &AnyAgent| {
        format!(
            "--- principal ---\n{}\n--- agent ---\n{}\n--- spoke argocd ---\n{}\n--- hub argocd ---\n{}",
            principal.process().log_tail(30),
            agent.process().log_tail(30),
            spoke_argocd.log_tails(10),
            server.log_tails(20)
        )
    };

    // Connected: Successful, with upstream's message.
    let connected = wait_listed(
        &server,
        &agent_name,
        "the hub's cluster list to show the agent connected",
        |c| c.pointer("/connectionState/status") == Some(&json!("Successful")),
        || logs(&agent),
    )
    .await?;
    assert_eq!(
        connected["connectionState"]["message"],
        json!(format!("Agent: '{agent_name}' is connected with principal")),
        "{connected}"
    );

    // An Application on the spoke makes its controller count the cluster; the counts reach the hub.
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub_client.clone(), &agent_name, &application_resource());
    let app = "counted";
    hub_apps
        .create(
            &PostParams::default(),
            &demo_application(
                app,
                &agent_name,
                &git.url("apps"),
                json!({"name": agent_name, "namespace": dest}),
            ),
        )
        .await?;
    wait_synced(
        &hub_apps,
        app,
        &revision,
        "the app synced on the spoke",
        || logs(&agent),
    )
    .await?;
    let counted = wait_listed(
        &server,
        &agent_name,
        "the hub's cluster list to show the spoke's counts",
        |c| {
            count(c, "/info/applicationsCount") >= 1
                && count(c, "/info/cacheInfo/apisCount") > 0
                && count(c, "/info/cacheInfo/resourcesCount") > 0
        },
        || logs(&agent),
    )
    .await?;
    assert_eq!(
        counted.pointer("/info/connectionState/status"),
        Some(&json!("Successful")),
        "the counts keep the connection state: {counted}"
    );

    // The agent stops: Failed.
    agent.process_mut().kill();
    let gone = wait_listed(
        &server,
        &agent_name,
        "the hub's cluster list to show the agent disconnected",
        |c| c.pointer("/connectionState/status") == Some(&json!("Failed")),
        || logs(&agent),
    )
    .await?;
    assert_eq!(
        gone["connectionState"]["message"],
        json!(format!(
            "Agent: '{agent_name}' is disconnected with principal"
        )),
        "{gone}"
    );
    Ok(())
}

#[tokio::test]
async fn hub_cluster_list_shows_our_agent_on_our_principal() -> anyhow::Result<()> {
    cluster_list_shows_the_agent(Side::Ours, Side::Ours).await
}

#[tokio::test]
async fn hub_cluster_list_shows_an_upstream_agent_on_our_principal() -> anyhow::Result<()> {
    cluster_list_shows_the_agent(Side::Ours, Side::Upstream).await
}

#[tokio::test]
async fn hub_cluster_list_shows_our_agent_on_an_upstream_principal() -> anyhow::Result<()> {
    cluster_list_shows_the_agent(Side::Upstream, Side::Ours).await
}

#[tokio::test]
async fn hub_cluster_list_shows_an_upstream_agent_on_an_upstream_principal() -> anyhow::Result<()> {
    cluster_list_shows_the_agent(Side::Upstream, Side::Upstream).await
}
