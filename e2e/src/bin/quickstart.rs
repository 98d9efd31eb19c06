//! `quickstart`: a local hub and spoke (real etcd + kube-apiserver each), a PKI made with
//! `argocd-agentctl`, `argocd-principal` on the hub and a managed `argocd-agent` on the spoke, and a
//! demo Application created on the hub that arrives on the spoke, with its status (written on the
//! spoke, as Argo CD's application-controller would) visible on the hub.
//!
//! Run through `hack/quickstart.sh`. With `--once` it stops after the demo (used by the tests);
//! otherwise it keeps everything running until Ctrl-C and prints how to reach it.

use std::time::Duration;

use e2e::gateway::{
    application, application_resource, ensure_namespace, text, Agent, Pki, Principal,
};
use e2e::{wait_until, ControlPlane};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

fn step(msg: &str) {
    eprintln!("==> {msg}");
}

fn kubectl_get_apps(plane: &ControlPlane) -> String {
    match std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&plane.kubeconfig)
        .args(["get", "applications.argoproj.io", "-A", "-o", "custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name,REVISION:.spec.source.targetRevision,SYNC:.status.sync.status,HEALTH:.status.health.status"])
        .output()
    {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(out) => format!("kubectl failed: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => format!("(kubectl not available: {e})"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let once = std::env::args().any(|a| a == "--once");
    step("starting the hub and spoke control planes (etcd + kube-apiserver, CRDs installed)");
    let planes =
        tokio::task::spawn_blocking(|| ControlPlane::start_many(&["hub", "spoke"])).await??;
    let (hub, spoke) = (&planes[0], &planes[1]);
    let dir = e2e::process::temp_dir("quickstart")?;

    step("creating a PKI with argocd-agentctl (CA, principal certificate, JWT key, agent certificate)");
    let pki = Pki::create(&dir.join("pki"))?;
    let agent_name = "spoke";
    pki.issue_agent(agent_name)?;

    step("starting argocd-principal on the hub");
    let principal = Principal::start("quickstart", &dir, hub, &pki, "argocd", &[]).await?;
    let hub_client = hub.client().await?;
    ensure_namespace(&hub_client, agent_name).await?;

    step("starting argocd-agent (managed mode) on the spoke");
    let agent = Agent::start(
        agent_name,
        &dir,
        spoke,
        &pki,
        &principal.address(),
        "argocd",
        &[],
    )
    .await?;
    agent.wait_connected().await?;

    step("creating the demo Application 'guestbook' on the hub in namespace 'spoke'");
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub_client, agent_name, &application_resource());
    hub_apps
        .create(
            &PostParams::default(),
            &application("guestbook", agent_name, "HEAD"),
        )
        .await?;
    let spoke_apps: Api<DynamicObject> =
        Api::namespaced_with(spoke.client().await?, "argocd", &application_resource());
    wait_until(
        "guestbook on the spoke",
        Duration::from_secs(30),
        || async { Ok::<_, kube::Error>(spoke_apps.get_opt("guestbook").await?.map(|_| ())) },
    )
    .await?;
    step("it arrived on the spoke; playing Argo CD there: marking it Synced/Healthy");
    let status = json!({"status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}});
    spoke_apps
        .patch("guestbook", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    wait_until("status on the hub", Duration::from_secs(30), || async {
        let app = hub_apps.get("guestbook").await?;
        let v = serde_json::to_value(app).unwrap_or_default();
        Ok::<_, kube::Error>((text(&v, "/status/health/status") == "Healthy").then_some(()))
    })
    .await?;

    println!(
        "\n$ kubectl --kubeconfig {} get app -A   # the hub",
        hub.kubeconfig.display()
    );
    println!("{}", kubectl_get_apps(hub));
    println!(
        "$ kubectl --kubeconfig {} get app -A   # the spoke",
        spoke.kubeconfig.display()
    );
    println!("{}", kubectl_get_apps(spoke));
    if once {
        step("demo complete (--once): stopping everything");
        return Ok(());
    }
    println!("Everything keeps running. Try:");
    println!(
        "  kubectl --kubeconfig {} -n spoke edit app guestbook     # change it on the hub",
        hub.kubeconfig.display()
    );
    println!(
        "  kubectl --kubeconfig {} -n argocd get app guestbook -o yaml  # see it on the spoke",
        spoke.kubeconfig.display()
    );
    println!("Logs: {}", dir.display());
    println!("Press Ctrl-C to stop and clean up.");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
