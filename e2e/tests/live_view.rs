//! The hub's live view of agent clusters end to end, on real control planes and real Redis: the
//! principal's resource proxy used by real `kubectl` with the client certificate
//! `argocd-agentctl agent create` puts in the Argo CD cluster secret, and the Redis proxy used by
//! real `redis-cli`, with a real `redis-server` as the hub's Redis and one as each agent's.
//!
//! No Argo CD runs here: the objects it would have deployed on a spoke are created by the test
//! with Argo CD's tracking label, and the cache entries its application controller would write
//! into the agent's Redis are written by the test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e::binaries::system_binary;
use e2e::gateway::{agentctl, ensure_namespace, Agent, Pki, Principal};
use e2e::{shared_planes, wait_until, Redis, SharedPlanes, TestContext};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

/// A principal with both proxies, two agents (one per spoke) each with its own Redis, the hub's
/// Redis, and a kubeconfig per agent built from its Argo CD cluster secret.
struct LiveFleet {
    ctx: TestContext,
    _pki: Pki,
    principal: Principal,
    agents: Vec<Agent>,
    spoke_redis: Vec<Redis>,
    hub_redis: Redis,
    kubeconfigs: Vec<PathBuf>,
}

impl LiveFleet {
    async fn start(test: &str, planes: &'static SharedPlanes) -> anyhow::Result<LiveFleet> {
        let ctx = TestContext::new(test)?;
        let pki = Pki::create(&ctx.dir.join("pki"))?;
        let hub_redis = Redis::start(&format!("{test}-hub"))?;
        let argocd_ns = ctx.unique("argocd");
        let principal = Principal::start(
            "p",
            &ctx.dir,
            &planes.hub,
            &pki,
            &argocd_ns,
            &[&format!("--redis-server-address={}", hub_redis.address())],
        )
        .await?;
        let mut agents = Vec::new();
        let mut spoke_redis = Vec::new();
        let mut kubeconfigs = Vec::new();
        for (i, spoke) in planes.spokes.iter().enumerate() {
            let name = ctx.unique(&format!("agent{}", i + 1));
            pki.issue_agent(&name)?;
            let redis = Redis::start(&format!("{test}-spoke{}", i + 1))?;
            agentctl(&[
                "agent",
                "create",
                &name,
                "--dir",
                pki.dir.to_str().expect("utf-8 path"),
                "--kubeconfig",
                planes.hub.kubeconfig.to_str().expect("utf-8 path"),
                "--resource-proxy-server",
                &format!("127.0.0.1:{}", principal.resource_proxy_port),
                "--argocd-namespace",
                &argocd_ns,
            ])?;
            let kubeconfig = proxy_kubeconfig(
                &planes.hub,
                &argocd_ns,
                &name,
                principal.resource_proxy_port,
                &ctx.dir,
            )
            .await?;
            let agent = Agent::start(
                &name,
                &ctx.dir,
                spoke,
                &pki,
                &principal.address(),
                &ctx.unique("spoke-argocd"),
                &[&format!("--redis-address={}", redis.address())],
            )
            .await?;
            agents.push(agent);
            spoke_redis.push(redis);
            kubeconfigs.push(kubeconfig);
        }
        for a in &agents {
            a.wait_connected().await?;
        }
        Ok(LiveFleet {
            ctx,
            _pki: pki,
            principal,
            agents,
            spoke_redis,
            hub_redis,
            kubeconfigs,
        })
    }

    /// Runs kubectl against the proxy as agent `i`'s cluster; returns (success, stdout, stderr).
    fn kubectl(&self, i: usize, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
        let out = Command::new(system_binary("kubectl", "kubernetes-client")?)
            .arg(format!("--kubeconfig={}", self.kubeconfigs[i].display()))
            .arg(format!(
                "--cache-dir={}",
                self.ctx.dir.join(format!("kube-cache-{i}")).display()
            ))
            .args(args)
            .output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    /// Runs redis-cli against the Redis proxy; returns stdout.
    fn redis_cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(system_binary("redis-cli", "redis-tools")?)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.principal.redis_proxy_port.to_string(),
            ])
            .args(args)
            .output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
    }
}

/// A kubeconfig for the resource proxy with the client certificate from agent `name`'s Argo CD
/// cluster secret (as the hub's Argo CD would use it).
async fn proxy_kubeconfig(
    hub: &e2e::ControlPlane,
    argocd_ns: &str,
    name: &str,
    port: u16,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let secrets: Api<Secret> = Api::namespaced(hub.client().await?, argocd_ns);
    let secret = secrets.get(&format!("cluster-{name}")).await?;
    let data = secret.data.unwrap_or_default();
    let config: Value = serde_json::from_slice(&data["config"].0)?;
    let server = String::from_utf8(data["server"].0.clone())?;
    assert!(
        server.ends_with(&format!("?agentName={name}")),
        "cluster URL {server}"
    );
    let tls = &config["tlsClientConfig"];
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
        "clusters": [{"name": "proxy", "cluster": {"server": format!("https://127.0.0.1:{port}"),
            "certificate-authority-data": tls["caData"]}}],
        "users": [{"name": "argocd", "user": {"client-certificate-data": tls["certData"],
            "client-key-data": tls["keyData"]}}],
        "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "argocd"}}],
    });
    let path = dir.join(format!("proxy-{name}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig)?)?;
    Ok(path)
}

fn deployment_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apps", "v1", "Deployment"),
        "deployments",
    )
}

/// A Deployment as Argo CD would have deployed it (`tracked`: with its instance label).
fn deployment(name: &str, ns: &str, tracked: bool, marker: &str) -> DynamicObject {
    let labels = if tracked {
        json!({"app": name, "app.kubernetes.io/instance": "guestbook"})
    } else {
        json!({"app": name})
    };
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": {"marker": marker}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
    }))
    .expect("valid Deployment")
}

async fn create_secret(
    client: &kube::Client,
    ns: &str,
    name: &str,
    tracked: bool,
) -> anyhow::Result<()> {
    let mut meta = json!({"name": name, "namespace": ns});
    if tracked {
        meta["annotations"] =
            json!({"argocd.argoproj.io/tracking-id": "guestbook:/Secret:guestbook/creds"});
    }
    let secret: Secret =
        serde_json::from_value(json!({"metadata": meta, "stringData": {"password": "hunter2"}}))?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

#[tokio::test]
async fn kubectl_reads_tracked_objects_of_its_own_agent_only() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let fleet = LiveFleet::start("live_kubectl", planes).await?;
    let ns = fleet.ctx.unique("guestbook");
    for (i, spoke) in planes.spokes.iter().enumerate() {
        let client = spoke.client().await?;
        ensure_namespace(&client, &ns).await?;
        let deploys: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns, &deployment_resource());
        deploys
            .create(
                &PostParams::default(),
                &deployment("web", &ns, true, &format!("spoke{}", i + 1)),
            )
            .await?;
        if i == 0 {
            deploys
                .create(
                    &PostParams::default(),
                    &deployment("untracked", &ns, false, "spoke1"),
                )
                .await?;
            create_secret(&client, &ns, "tracked-creds", true).await?;
            create_secret(&client, &ns, "plain-creds", false).await?;
        }
    }

    // Discovery through the proxy is the spoke's.
    let (ok, api, err) = fleet.kubectl(0, &["get", "--raw", "/api"])?;
    assert!(ok, "kubectl get --raw /api: {err}");
    let api: Value = serde_json::from_str(&api)?;
    assert_eq!(api["kind"], "APIVersions");
    let (ok, resources, err) = fleet.kubectl(0, &["api-resources"])?;
    assert!(ok, "kubectl api-resources: {err}");
    assert!(
        resources.contains("deployments") && resources.contains("applications"),
        "{resources}"
    );

    // A tracked Deployment is the one on the agent's own spoke.
    for (i, marker) in [(0, "spoke1"), (1, "spoke2")] {
        let (ok, yaml, err) =
            fleet.kubectl(i, &["get", "deploy", "-n", &ns, "web", "-o", "yaml"])?;
        assert!(ok, "kubectl get deploy web as agent {}: {err}", i + 1);
        let obj: Value = serde_yaml::from_str(&yaml)?;
        assert_eq!(
            obj["metadata"]["annotations"]["marker"],
            marker,
            "agent {} sees its own spoke",
            i + 1
        );
    }
    // Agent 2's certificate cannot reach what only exists on agent 1's cluster.
    let (ok, _, err) = fleet.kubectl(
        1,
        &["get", "secret", "-n", &ns, "tracked-creds", "-o", "json"],
    )?;
    assert!(
        !ok && (err.contains("NotFound") || err.contains("not found")),
        "{err}"
    );

    // Untracked objects are refused; a Secret only when tracked.
    let (ok, _, err) =
        fleet.kubectl(0, &["get", "deploy", "-n", &ns, "untracked", "-o", "yaml"])?;
    assert!(
        !ok && err.contains("not managed by Argo CD"),
        "untracked Deployment: {err}"
    );
    let (ok, _, err) = fleet.kubectl(
        0,
        &["get", "secret", "-n", &ns, "plain-creds", "-o", "json"],
    )?;
    assert!(
        !ok && err.contains("not managed by Argo CD"),
        "untracked Secret: {err}"
    );
    let (ok, out, err) = fleet.kubectl(
        0,
        &["get", "secret", "-n", &ns, "tracked-creds", "-o", "json"],
    )?;
    assert!(ok, "tracked Secret: {err}");
    assert!(out.contains("tracked-creds"));
    // Lists carry only tracked objects.
    let (ok, out, err) = fleet.kubectl(
        0,
        &["get", "--raw", &format!("/api/v1/namespaces/{ns}/secrets")],
    )?;
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out)?;
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["tracked-creds"]);

    // A resource action's patch reaches the tracked object; the untracked one stays untouched.
    let (ok, _, err) = fleet.kubectl(
        0,
        &[
            "patch",
            "deploy",
            "-n",
            &ns,
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":3}}"#,
        ],
    )?;
    assert!(ok, "patch tracked: {err}");
    let (ok, _, err) = fleet.kubectl(
        0,
        &[
            "patch",
            "deploy",
            "-n",
            &ns,
            "untracked",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":3}}"#,
        ],
    )?;
    assert!(
        !ok && err.contains("not managed by Argo CD"),
        "patch untracked: {err}"
    );
    let spoke1: Api<DynamicObject> = Api::namespaced_with(
        planes.spokes[0].client().await?,
        &ns,
        &deployment_resource(),
    );
    assert_eq!(spoke1.get("web").await?.data["spec"]["replicas"], 3);
    assert_eq!(spoke1.get("untracked").await?.data["spec"]["replicas"], 1);

    // No credentials in the logs.
    for log in [
        fleet.principal.process.log_path(),
        fleet.agents[0].process.log_path(),
    ] {
        let text = std::fs::read_to_string(log)?;
        assert!(
            !text.contains("hunter2") && !text.contains("PRIVATE KEY"),
            "{} leaks a secret",
            log.display()
        );
        assert!(!text.contains("aHVudGVyMg=="), "base64 of the secret");
    }
    Ok(())
}

#[tokio::test]
async fn an_agent_that_is_away_gets_502_and_its_waiting_redis_clients_an_error(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let mut fleet = LiveFleet::start("live_agent_away", planes).await?;
    fleet.agents[1].process.stop();
    let agent2 = fleet.agents[1].name.clone();
    let (ok, _, err) = fleet.kubectl(1, &["get", "--raw", "/api"])?;
    assert!(!ok, "an away agent must not answer");
    assert!(
        err.contains("not connected") || err.contains("502") || err.contains("Bad Gateway"),
        "{err}"
    );
    let reply = fleet.redis_cli(&[
        "GET",
        &format!("app|resources-tree|{agent2}_guestbook|1.8.3"),
    ])?;
    assert!(reply.contains("not connected"), "redis reply: {reply}");
    // Agent 1 is unaffected.
    let (ok, _, err) = fleet.kubectl(0, &["get", "--raw", "/version"])?;
    assert!(ok, "{err}");
    Ok(())
}

#[tokio::test]
async fn redis_cli_reads_an_agents_cache_through_the_proxy_and_the_rest_from_the_hub(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let fleet = LiveFleet::start("live_redis", planes).await?;
    let agent1 = fleet.agents[0].name.clone();
    let spoke_cli = |port: u16, args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new(system_binary("redis-cli", "redis-tools")?)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
    };
    // What the agent's application controller would have cached, and what the hub has.
    spoke_cli(
        fleet.spoke_redis[0].port,
        &[
            "SET",
            "app|resources-tree|guestbook|1.8.3",
            "tree-from-spoke1",
        ],
    )?;
    spoke_cli(
        fleet.spoke_redis[1].port,
        &[
            "SET",
            "app|resources-tree|guestbook|1.8.3",
            "tree-from-spoke2",
        ],
    )?;
    spoke_cli(fleet.hub_redis.port, &["SET", "mfst|hub-key", "from-hub"])?;

    let key = format!("app|resources-tree|{agent1}_guestbook|1.8.3");
    assert_eq!(fleet.redis_cli(&["GET", &key])?, "tree-from-spoke1");
    assert_eq!(
        fleet.redis_cli(&["GET", &format!("app|managed-resources|{agent1}_missing|1")])?,
        ""
    );
    assert_eq!(fleet.redis_cli(&["GET", "mfst|hub-key"])?, "from-hub");
    assert_eq!(fleet.redis_cli(&["PING"])?, "PONG");

    // Malformed RESP gets an error reply and the proxy keeps serving.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s =
            tokio::net::TcpStream::connect(("127.0.0.1", fleet.principal.redis_proxy_port)).await?;
        s.write_all(b"*2\r\n$x\r\n").await?;
        let mut buf = vec![0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await??;
        let reply = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(
            reply.starts_with("-ERR"),
            "reply to malformed RESP: {reply:?}"
        );
    }
    assert_eq!(fleet.redis_cli(&["GET", &key])?, "tree-from-spoke1");

    // SUBSCRIBE to an agent's key: a publish on the spoke reaches the hub client.
    let mut sub = tokio::process::Command::new(system_binary("redis-cli", "redis-tools")?)
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &fleet.principal.redis_proxy_port.to_string(),
            "SUBSCRIBE",
            &key,
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let out = std::sync::Arc::new(tokio::sync::Mutex::new(tokio::io::BufReader::new(
        sub.stdout.take().expect("piped"),
    )));
    let port = fleet.spoke_redis[0].port;
    let seen = wait_until(
        "a spoke publish reaches the hub subscriber",
        Duration::from_secs(30),
        || {
            let out = out.clone();
            async move {
                let mut out = out.lock().await;
                use tokio::io::AsyncBufReadExt;
                spoke_cli(port, &["PUBLISH", "app|resources-tree|guestbook|1.8.3", ""])?;
                let mut line = String::new();
                while let Ok(Ok(n)) =
                    tokio::time::timeout(Duration::from_millis(500), out.read_line(&mut line)).await
                {
                    if n == 0 {
                        break;
                    }
                    if line.contains("message") {
                        return Ok::<_, anyhow::Error>(Some(()));
                    }
                    line.clear();
                }
                Ok(None)
            }
        },
    )
    .await;
    seen?;
    Ok(())
}
