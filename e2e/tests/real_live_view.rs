//! The live view user story with real Argo CD on both sides: the hub's argocd-server shows an
//! Application that runs on a spoke it cannot reach (resource tree, live manifests, sync and
//! health), through our principal's Redis proxy (argocd-server's Redis; the live-view keys are
//! answered from the agent's spoke Redis) and resource proxy (the hub cluster secret of the agent
//! points at it; the agent reads the spoke).
//!
//! Both Redis servers require a password, as Argo CD's default install configures them: the
//! spoke's real application-controller writes its cache into a password-protected Redis that our
//! agent reads with `--redis-password`; the hub Redis is protected too, and our principal reads
//! its password from a creds directory (the mounted `argocd-redis` secret) while argocd-server
//! authenticates to the proxy with `REDIS_PASSWORD`. Nobody here writes what Argo CD or an agent
//! would write: the hub is looked at with the real `argocd` CLI and REST API only.

use std::time::{Duration, Instant};

use e2e::argocd::{ArgoCd, RedisEndpoint};
use e2e::gateway::{agentctl, application_resource, ensure_namespace, Agent, Pki, Principal};
use e2e::git_server::{demo_manifests, GitServer};
use e2e::redis::resp_exchange;
use e2e::scenario::{demo_application, wait_synced};
use e2e::{shared_planes, wait_until, Redis, TestContext};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{json, Value};

/// The greeting of the demo ConfigMap in Git, to recognise the spoke's live copy.
const GREETING: &str = "live-from-the-spoke";

#[tokio::test]
async fn hub_argocd_shows_tree_and_live_manifests_of_an_app_on_a_spoke_it_cannot_reach(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let (hub, spoke) = (&planes.hub, &planes.spokes[0]);
    let ctx = TestContext::new("real_live_view")?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let agent_name = ctx.unique("agent");
    pki.issue_agent(&agent_name)?;
    let git = GitServer::start(&ctx.unique("git"))?;
    let revision = git.commit("apps", "demo", &demo_manifests(GREETING), "demo")?;

    // Hub: a password-protected Redis behind our principal, which reads the password from a creds
    // directory laid out as the `argocd-redis` secret is mounted (file `auth`).
    let hub_password = format!("hub-{}", uuid::Uuid::new_v4().simple());
    let hub_redis = Redis::start_with_password(&ctx.unique("hub-redis"), &hub_password)?;
    let creds_dir = ctx.dir.join("hub-redis-creds");
    std::fs::create_dir_all(&creds_dir)?;
    std::fs::write(creds_dir.join("auth"), &hub_password)?;
    let principal_ns = ctx.unique("hub-argocd");
    let hub_client = hub.client().await?;
    ensure_namespace(&hub_client, &agent_name).await?;
    let principal = Principal::start(
        &ctx.suffix,
        &ctx.dir,
        hub,
        &pki,
        &principal_ns,
        &[
            &format!("--redis-server-address={}", hub_redis.address()),
            &format!("--redis-creds-dir-path={}", creds_dir.display()),
        ],
    )
    .await?;
    // The agent's Argo CD cluster secret on the hub: its server is our resource proxy.
    agentctl(&[
        "agent",
        "create",
        &agent_name,
        "--dir",
        pki.dir.to_str().expect("utf-8 path"),
        "--kubeconfig",
        hub.kubeconfig.to_str().expect("utf-8 path"),
        "--resource-proxy-server",
        &format!("127.0.0.1:{}", principal.resource_proxy_port),
        "--argocd-namespace",
        &principal_ns,
    ])?;

    // Spoke: real Argo CD with its password-protected Redis, and our agent reading that Redis.
    let spoke_ns = ctx.unique("argocd");
    let spoke_argocd = ArgoCd::start_spoke(&ctx.suffix, &ctx.dir, spoke, &spoke_ns, &[]).await?;
    let spoke_redis = spoke_argocd
        .redis_endpoint()
        .expect("a spoke Argo CD has a Redis");
    let spoke_redis_password = spoke_redis.password.clone().expect("password-protected");
    let dest = ctx.unique("demo");
    ensure_namespace(&spoke.client().await?, &dest).await?;
    let agent = Agent::start(
        &agent_name,
        &ctx.dir,
        spoke,
        &pki,
        &principal.address(),
        &spoke_ns,
        &[
            &format!("--redis-address={}", spoke_redis.address),
            &format!("--redis-password={spoke_redis_password}"),
        ],
    )
    .await?;
    agent.wait_connected().await?;

    // Hub: real argocd-server whose Redis is our Redis proxy, with the hub Redis password.
    let server = ArgoCd::start_server(
        &ctx.suffix,
        &ctx.dir,
        hub,
        &principal_ns,
        RedisEndpoint {
            address: format!("127.0.0.1:{}", principal.redis_proxy_port),
            password: Some(hub_password.clone()),
        },
    )
    .await?;
    let logs = || {
        format!(
            "--- principal ---\n{}\n--- agent ---\n{}\n--- spoke argocd ---\n{}\n--- hub argocd ---\n{}",
            principal.process.log_tail(30),
            agent.process.log_tail(30),
            spoke_argocd.log_tails(15),
            server.log_tails(30)
        )
    };

    // The user's Application on the hub, destined for the agent's cluster.
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub_client.clone(), &agent_name, &application_resource());
    hub_apps
        .create(
            &PostParams::default(),
            &demo_application(
                "demo",
                &agent_name,
                &git.url("apps"),
                json!({"name": agent_name, "namespace": dest}),
            ),
        )
        .await?;
    wait_synced(
        &hub_apps,
        "demo",
        &revision,
        "the spoke's Synced+Healthy status on the hub Application",
        logs,
    )
    .await?;
    // The spoke's own view, to compare the hub's with.
    let spoke_cm = Api::<ConfigMap>::namespaced(spoke.client().await?, &dest)
        .get("demo-config")
        .await?;
    let spoke_uid = spoke_cm
        .metadata
        .uid
        .clone()
        .expect("a live object has a uid");
    assert_eq!(
        spoke_cm
            .data
            .unwrap_or_default()
            .get("greeting")
            .map(String::as_str),
        Some(GREETING)
    );

    // `argocd app get`: sync, health and the spoke's resources.
    let app_ref = format!("{agent_name}/demo");
    let get = server.cli(&["app", "get", &app_ref])?;
    for expected in ["Synced", "Healthy", "demo-config", "demo-secret", &dest] {
        assert!(
            get.contains(expected),
            "`argocd app get` lacks {expected:?}:\n{get}"
        );
    }

    // `argocd app resources`: the resource tree, answered from the spoke's Redis by the agent
    // (the first read may race the controller's first cache write: retry briefly).
    let resources = wait_until(
        "the resource tree through the CLI",
        Duration::from_secs(60),
        || async {
            Ok::<_, anyhow::Error>(
                server
                    .cli(&["app", "resources", &app_ref])
                    .ok()
                    .filter(|out| out.contains("demo-config") && out.contains("demo-secret")),
            )
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    assert!(resources.contains("ConfigMap"), "{resources}");

    // `argocd app manifests --source live`: the spoke's live ConfigMap, by its uid on the spoke.
    let live = server.cli(&["app", "manifests", &app_ref, "--source", "live"])?;
    assert!(
        live.contains(&spoke_uid),
        "live manifests lack the spoke ConfigMap's uid {spoke_uid}:\n{live}"
    );
    assert!(live.contains(GREETING), "{live}");

    // The REST API the UI uses: the resource tree, and one live resource read through the
    // resource proxy from the spoke.
    let token = server.session_token().await?;
    let (status, body) = server
        .api_get(
            &format!("/api/v1/applications/demo/resource-tree?appNamespace={agent_name}"),
            &token,
        )
        .await?;
    assert_eq!(status, 200, "resource-tree: {body}\n{}", logs());
    let tree: Value = serde_json::from_str(&body)?;
    let nodes = tree["nodes"].as_array().cloned().unwrap_or_default();
    let node = |kind: &str, name: &str| {
        nodes
            .iter()
            .find(|n| n["kind"] == kind && n["name"] == name)
            .cloned()
    };
    let cm_node =
        node("ConfigMap", "demo-config").unwrap_or_else(|| panic!("no demo-config in {tree}"));
    assert_eq!(cm_node["uid"], spoke_uid.as_str(), "{cm_node}");
    assert_eq!(cm_node["namespace"], dest.as_str());
    assert!(node("Secret", "demo-secret").is_some(), "{tree}");
    assert!(node("ServiceAccount", "demo").is_some(), "{tree}");

    let (status, body) = server
        .api_get(
            &format!(
                "/api/v1/applications/demo/resource?appNamespace={agent_name}&namespace={dest}\
                 &resourceName=demo-config&version=v1&kind=ConfigMap&group="
            ),
            &token,
        )
        .await?;
    assert_eq!(status, 200, "live resource: {body}\n{}", logs());
    let manifest: Value = serde_json::from_str(
        serde_json::from_str::<Value>(&body)?["manifest"]
            .as_str()
            .unwrap_or("{}"),
    )?;
    assert_eq!(
        manifest["metadata"]["uid"],
        spoke_uid.as_str(),
        "{manifest}"
    );
    assert_eq!(manifest["data"]["greeting"], GREETING);

    // The proxy is no way around the hub Redis password: without it, neither the hub's keys nor
    // the agent's cache are served.
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", principal.redis_proxy_port)).await?;
    let tree_key = format!("app|resources-tree|{agent_name}_demo|1.8.3");
    let reply = resp_exchange(&mut raw, &["GET", &tree_key]).await?;
    assert!(reply.starts_with("-NOAUTH"), "{reply}");
    let reply = resp_exchange(&mut raw, &["AUTH", "not-the-password"]).await?;
    assert!(reply.starts_with("-WRONGPASS"), "{reply}");
    let reply = resp_exchange(&mut raw, &["PING"]).await?;
    assert!(reply.starts_with("-NOAUTH"), "{reply}");
    assert_eq!(
        resp_exchange(&mut raw, &["AUTH", &hub_password]).await?,
        "+OK\r\n"
    );
    assert_eq!(resp_exchange(&mut raw, &["PING"]).await?, "+PONG\r\n");

    // What a user waits for: `argocd app get` on the hub.
    let mut times = Vec::new();
    for _ in 0..9 {
        let started = Instant::now();
        server.cli(&["app", "get", &app_ref])?;
        times.push(started.elapsed());
    }
    times.sort();
    println!(
        "hub `argocd app get` of an agent's app: p50 {:?} (min {:?}, max {:?}, n={})",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1],
        times.len()
    );
    Ok(())
}
