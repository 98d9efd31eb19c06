//! `quickstart`: a local hub and spoke (etcd + kube-apiserver each), a local Git server holding the
//! demo manifests, real Argo CD on the spoke (application-controller + repo-server, Redis with a
//! password) and argocd-server on the hub (its Redis behind our principal's Redis proxy), a PKI made
//! with `argocd-agentctl`, `argocd-principal` on the hub and a managed `argocd-agent` on the spoke.
//! A demo Application created on the hub with the `argocd` CLI arrives on the spoke, the spoke's Argo
//! CD syncs it from Git, and `argocd app get` on the hub shows the spoke's real sync and health.
//!
//! Run through `hack/quickstart.sh`. With `--once` it stops after the demo; otherwise it keeps
//! everything running until Ctrl-C and prints how to reach the hub's Argo CD.

use std::time::Duration;

use e2e::argocd::{ArgoCd, RedisEndpoint, ADMIN_PASSWORD};
use e2e::gateway::{application_resource, ensure_namespace, text, Agent, Pki, Principal};
use e2e::git_server::{demo_manifests, GitServer};
use e2e::{wait_until, ControlPlane, Redis};
use kube::api::{Api, DynamicObject};

fn step(msg: &str) {
    eprintln!("==> {msg}");
}

const AGENT: &str = "spoke";
const ARGOCD_NS: &str = "argocd";
const DEMO_NS: &str = "demo";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let once = std::env::args().any(|a| a == "--once");
    step("starting the hub and spoke control planes (etcd 3.6 + kube-apiserver 1.36, CRDs installed)");
    let planes =
        tokio::task::spawn_blocking(|| ControlPlane::start_many(&["hub", "spoke"])).await??;
    let (hub, spoke) = (&planes[0], &planes[1]);
    let dir = e2e::process::temp_dir("quickstart")?;

    step("starting a local Git server (git daemon) with the demo manifests");
    let git = GitServer::start("quickstart")?;
    let revision = git.commit("demo", "demo", &demo_manifests("hello"), "demo app")?;

    step("creating a PKI with argocd-agentctl (CA, principal certificate, JWT key, agent certificate)");
    let pki = Pki::create(&dir.join("pki"))?;
    pki.issue_agent(AGENT)?;

    step("starting Argo CD on the spoke (application-controller, repo-server, Redis with a password)");
    let spoke_argocd = ArgoCd::start_spoke("spoke", &dir, spoke, ARGOCD_NS, &[]).await?;
    ensure_namespace(&spoke.client().await?, DEMO_NS).await?;

    step("starting argocd-principal on the hub, in front of the hub's Redis (password-protected)");
    let hub_redis_password = format!("hub-{}", uuid::Uuid::new_v4().simple());
    let hub_redis = Redis::start_with_password("quickstart-hub", &hub_redis_password)?;
    let principal = Principal::start(
        "quickstart",
        &dir,
        hub,
        &pki,
        ARGOCD_NS,
        &[&format!("--redis-server-address={}", hub_redis.address())],
    )
    .await?;
    let hub_client = hub.client().await?;
    ensure_namespace(&hub_client, AGENT).await?;

    step("starting argocd-server on the hub (Redis through the principal's Redis proxy)");
    let hub_argocd = ArgoCd::start_server(
        "hub",
        &dir,
        hub,
        ARGOCD_NS,
        RedisEndpoint {
            address: format!("127.0.0.1:{}", principal.redis_proxy_port),
            password: Some(hub_redis_password.clone()),
            tls_ca: None,
        },
    )
    .await?;

    step("starting argocd-agent (managed mode) on the spoke");
    let agent = Agent::start(
        AGENT,
        &dir,
        spoke,
        &pki,
        &principal.address(),
        ARGOCD_NS,
        &[],
    )
    .await?;
    agent.wait_connected().await?;

    step("creating the demo Application on the hub with the argocd CLI (namespace 'spoke' = the agent)");
    hub_argocd.cli(&[
        "app",
        "create",
        &format!("{AGENT}/demo"),
        "--repo",
        &git.url("demo"),
        "--path",
        "demo",
        "--revision",
        "main",
        "--dest-server",
        "https://kubernetes.default.svc",
        "--dest-namespace",
        DEMO_NS,
        "--sync-policy",
        "automated",
        "--sync-option",
        "PrunePropagationPolicy=background",
    ])?;
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub_client, AGENT, &application_resource());
    wait_until(
        "the spoke's Argo CD to sync the demo and its status to reach the hub",
        Duration::from_secs(180),
        || async {
            let v = serde_json::to_value(hub_apps.get("demo").await?)?;
            let synced = text(&v, "/status/sync/status") == "Synced"
                && text(&v, "/status/health/status") == "Healthy"
                && text(&v, "/status/sync/revision") == revision;
            Ok::<_, anyhow::Error>(synced.then_some(()))
        },
    )
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}\n--- spoke Argo CD ---\n{}\n--- agent ---\n{}",
            spoke_argocd.log_tails(20),
            agent.process.log_tail(20)
        )
    })?;

    println!("\n$ argocd app get {AGENT}/demo   # on the hub, showing the spoke's state");
    println!(
        "{}",
        hub_argocd.cli(&["app", "get", &format!("{AGENT}/demo")])?
    );
    if once {
        step("demo complete (--once): stopping everything");
        return Ok(());
    }
    let port = hub_argocd.server_port.unwrap_or_default();
    println!("Everything keeps running. The hub's Argo CD:");
    println!("  API and UI: http://127.0.0.1:{port}  (user admin, password {ADMIN_PASSWORD})");
    println!(
        "  CLI: argocd login 127.0.0.1:{port} --plaintext --username admin --password {ADMIN_PASSWORD}"
    );
    println!("  (the argocd binary: `bash hack/peers.sh --dir argocd`)");
    println!(
        "Change the demo in Git and watch it reach the spoke: the repository is {}",
        git.url("demo")
    );
    println!(
        "kubectl: hub {} / spoke {}",
        hub.kubeconfig.display(),
        spoke.kubeconfig.display()
    );
    println!("Logs: {}", dir.display());
    println!("Press Ctrl-C to stop and clean up.");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
