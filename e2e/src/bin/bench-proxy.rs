//! `bench-proxy`: latency of a GET through the resource proxy (hub client → principal → agent's
//! event stream → spoke apiserver and back) next to the same GET sent straight to the spoke
//! apiserver in the same run (the baseline).
//!
//! Both are made with the same kube-rs client code; the proxied one uses the client certificate
//! `argocd-agentctl agent create` put in the Argo CD cluster secret, as the hub's Argo CD would.
//! Prints p50 / p99 over `--count` GETs (default 200) and the proxied/direct ratio. Build with
//! `--release` for figures worth comparing.

use std::time::{Duration, Instant};

use e2e::bench::{count_arg, percentile, BenchSetup};
use e2e::gateway::{agentctl, ensure_namespace, Agent};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

async fn measure(
    client: &kube::Client,
    path: &str,
    count: usize,
) -> anyhow::Result<(Duration, Duration)> {
    // Warm up connections and caches.
    for _ in 0..5 {
        client
            .request_text(http::Request::get(path).body(Vec::new())?)
            .await?;
    }
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let t0 = Instant::now();
        client
            .request_text(http::Request::get(path).body(Vec::new())?)
            .await?;
        samples.push(t0.elapsed());
    }
    samples.sort();
    Ok((percentile(&samples, 0.5), percentile(&samples, 0.99)))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count = count_arg(200)?;
    let setup = BenchSetup::start("bench-proxy").await?;
    let (hub, spoke, dir, pki, principal) = (
        setup.hub(),
        setup.spoke(),
        &setup.dir,
        &setup.pki,
        &setup.principal,
    );
    agentctl(&[
        "agent",
        "create",
        "bench",
        "--dir",
        pki.dir.to_str().expect("utf-8 path"),
        "--kubeconfig",
        hub.kubeconfig.to_str().expect("utf-8 path"),
        "--resource-proxy-server",
        &format!("127.0.0.1:{}", principal.resource_proxy_port),
        "--argocd-namespace",
        "argocd",
    ])?;
    let agent = Agent::start(
        "bench",
        dir,
        spoke,
        pki,
        &principal.address(),
        "argocd",
        &["--log-level=info"],
    )
    .await?;
    agent.wait_connected().await?;

    let spoke_client = spoke.client().await?;
    ensure_namespace(&spoke_client, "guestbook").await?;
    let deploys: Api<DynamicObject> = Api::namespaced_with(
        spoke_client.clone(),
        "guestbook",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apps", "v1", "Deployment"),
            "deployments",
        ),
    );
    deploys
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "guestbook", "annotations": {"argocd.argoproj.io/tracking-id": "guestbook:apps/Deployment:guestbook/web"}},
                "spec": {"selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
            }))?,
        )
        .await?;

    // The hub Argo CD's view of the agent: the cluster secret's certificate against the proxy.
    let secret = Api::<Secret>::namespaced(hub.client().await?, "argocd")
        .get("cluster-bench")
        .await?;
    let config: serde_json::Value =
        serde_json::from_slice(&secret.data.unwrap_or_default()["config"].0)?;
    let tls = &config["tlsClientConfig"];
    let kubeconfig: Kubeconfig = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
        "clusters": [{"name": "proxy", "cluster": {"server": format!("https://127.0.0.1:{}", principal.resource_proxy_port),
            "certificate-authority-data": tls["caData"]}}],
        "users": [{"name": "argocd", "user": {"client-certificate-data": tls["certData"], "client-key-data": tls["keyData"]}}],
        "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "argocd"}}],
    }))?;
    let proxy_client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?,
    )?;

    let path = "/apis/apps/v1/namespaces/guestbook/deployments/web";
    eprintln!("==> {count} GETs of {path}, direct then proxied");
    let (d50, d99) = measure(&spoke_client, path, count).await?;
    let (p50, p99) = measure(&proxy_client, path, count).await?;
    println!("direct  GET (spoke apiserver)       n={count:<4} p50={d50:>9.2?} p99={d99:>9.2?}");
    println!("proxied GET (principal→agent→spoke) n={count:<4} p50={p50:>9.2?} p99={p99:>9.2?}");
    println!(
        "ratio proxied/direct: p50 {:.2}x, p99 {:.2}x",
        p50.as_secs_f64() / d50.as_secs_f64(),
        p99.as_secs_f64() / d99.as_secs_f64()
    );
    drop(agent);
    drop(setup);
    Ok(())
}
