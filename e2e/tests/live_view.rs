//! The hub's live view of agent clusters end to end, on real control planes and real Redis: the
//! principal's resource proxy used by real `kubectl` with the client certificate
//! `argocd-agentctl agent create` puts in the Argo CD cluster secret, and the Redis proxy used by
//! real `redis-cli`, with a real `redis-server` as the hub's Redis and one as each agent's.
//!
//! No Argo CD runs here: the objects it would have deployed on a spoke are created by the test
//! with Argo CD 3's tracking annotation (and the spoke's `argocd-cm` that chooses another tracking
//! method is written by the test too), and the cache entries its application controller would write
//! into the agent's Redis are written by the test (that test says why in its name: it tells the
//! spokes' caches apart by value). The same views with real Argo CD on both sides, its real cache
//! read through the proxies, are `real_live_view.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use e2e::binaries::system_binary;
use e2e::gateway::{agent_identity, agentctl, ensure_namespace, Agent, Pki, Principal};
use e2e::kubelet::LogBody;
use e2e::redis::TlsFiles;
use e2e::{shared_planes, wait_until, Redis, SharedPlanes, TestContext};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

/// A principal with both proxies, two agents (one per spoke) each with its own Redis, the hub's
/// Redis, and a kubeconfig per agent built from its Argo CD cluster secret.
struct LiveFleet {
    ctx: TestContext,
    pki: Pki,
    argocd_ns: String,
    principal: Principal,
    agents: Vec<Agent>,
    spoke_redis: Vec<Redis>,
    hub_redis: Redis,
    kubeconfigs: Vec<PathBuf>,
    /// Whether the Redis proxy serves TLS (with the principal certificate of `pki`).
    redis_tls: bool,
}

/// How a [`LiveFleet`] differs from the default one.
#[derive(Default)]
struct FleetOptions {
    /// Extra flags of the principal.
    principal_args: Vec<String>,
    /// Extra flags of every agent.
    agent_args: Vec<String>,
    /// Agents (by index) that get no `argocd-agentctl agent create` cluster secret: the principal
    /// runs with self-registration (shared client certificate in [`SHARED_CLIENT_SECRET`]) and
    /// must create theirs.
    self_registered: Vec<usize>,
    /// Every Redis serves TLS only (its certificate from a PKI of its own), the principal runs
    /// with `--redis-tls-enabled` (hub Redis CA from a file, the proxy's certificate from the Secret
    /// `argocd-redis-proxy-tls`) and the agents with `--redis-tls-enabled` alone (their Redis CA
    /// from the Secret `argocd-redis-tls`, upstream's default).
    redis_tls: bool,
}

/// How long the agent may take to see a changed `argocd-cm` (it re-reads it every 5 s).
const WAIT: Duration = Duration::from_secs(30);

/// The Secret holding the resource-proxy client certificate shared by self-registered clusters.
const SHARED_CLIENT_SECRET: &str = "resource-proxy-shared-client";

impl LiveFleet {
    async fn start(test: &str, planes: &'static SharedPlanes) -> anyhow::Result<LiveFleet> {
        Self::start_with(test, planes, FleetOptions::default()).await
    }

    async fn start_with(
        test: &str,
        planes: &'static SharedPlanes,
        options: FleetOptions,
    ) -> anyhow::Result<LiveFleet> {
        let ctx = TestContext::new(test)?;
        let pki = Pki::create(&ctx.dir.join("pki"))?;
        let redis_pki = match options.redis_tls {
            true => Some(Pki::create(&ctx.dir.join("redis-pki"))?),
            false => None,
        };
        let start_redis = |name: &str| match &redis_pki {
            Some(rp) => Redis::start_tls(
                name,
                TlsFiles {
                    cert: &rp.dir.join("principal.crt"),
                    key: &rp.dir.join("principal.key"),
                    ca: &rp.ca(),
                },
                None,
            ),
            None => Redis::start(name),
        };
        let hub_redis = start_redis(&format!("{test}-hub"))?;
        let argocd_ns = ctx.unique("argocd");
        let mut principal_args = vec![format!("--redis-server-address={}", hub_redis.address())];
        if let Some(rp) = &redis_pki {
            let hub = planes.hub.client().await?;
            ensure_namespace(&hub, &argocd_ns).await?;
            create_tls_secret(
                &hub,
                &argocd_ns,
                "argocd-redis-proxy-tls",
                &pki.dir.join("principal.crt"),
                &pki.dir.join("principal.key"),
            )
            .await?;
            principal_args.push("--redis-tls-enabled".into());
            principal_args.push(format!("--redis-ca-path={}", rp.ca().display()));
        }
        if !options.self_registered.is_empty() {
            // The shared certificate's CN names no agent; only the bearer token does.
            let shared = ctx.unique("shared-client");
            pki.issue_agent(&shared)?;
            let (cert, key) = agent_identity(&pki, &shared)?;
            let hub = planes.hub.client().await?;
            ensure_namespace(&hub, &argocd_ns).await?;
            let secret: Secret = serde_json::from_value(json!({
                "metadata": {"name": SHARED_CLIENT_SECRET, "namespace": argocd_ns},
                "type": "kubernetes.io/tls",
                "stringData": {"tls.crt": cert, "tls.key": key},
            }))?;
            Api::<Secret>::namespaced(hub, &argocd_ns)
                .create(&PostParams::default(), &secret)
                .await?;
            principal_args.push("--enable-self-cluster-registration".into());
            principal_args.push(format!(
                "--self-registration-client-cert-secret={SHARED_CLIENT_SECRET}"
            ));
        }
        principal_args.extend(options.principal_args.iter().cloned());
        let principal_args: Vec<&str> = principal_args.iter().map(String::as_str).collect();
        let principal = Principal::start(
            "p",
            &ctx.dir,
            &planes.hub,
            &pki,
            &argocd_ns,
            &principal_args,
        )
        .await?;
        let mut agents = Vec::new();
        let mut spoke_redis = Vec::new();
        for (i, spoke) in planes.spokes.iter().enumerate() {
            let name = ctx.unique(&format!("agent{}", i + 1));
            pki.issue_agent(&name)?;
            let redis = start_redis(&format!("{test}-spoke{}", i + 1))?;
            if !options.self_registered.contains(&i) {
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
            }
            let mut agent_args = vec![format!("--redis-address={}", redis.address())];
            let agent_ns = ctx.unique("spoke-argocd");
            if let Some(rp) = &redis_pki {
                let spoke_client = spoke.client().await?;
                ensure_namespace(&spoke_client, &agent_ns).await?;
                let secret: Secret = serde_json::from_value(json!({
                    "metadata": {"name": "argocd-redis-tls", "namespace": agent_ns},
                    "stringData": {"ca.crt": std::fs::read_to_string(rp.ca())?},
                }))?;
                Api::<Secret>::namespaced(spoke_client, &agent_ns)
                    .create(&PostParams::default(), &secret)
                    .await?;
                agent_args.push("--redis-tls-enabled".into());
            }
            agent_args.extend(options.agent_args.iter().cloned());
            let agent_args: Vec<&str> = agent_args.iter().map(String::as_str).collect();
            let agent = Agent::start(
                &name,
                &ctx.dir,
                spoke,
                &pki,
                &principal.address(),
                &agent_ns,
                &agent_args,
            )
            .await?;
            agents.push(agent);
            spoke_redis.push(redis);
        }
        for a in &agents {
            a.wait_connected().await?;
        }
        let mut kubeconfigs = Vec::new();
        for a in &agents {
            kubeconfigs.push(
                proxy_kubeconfig(
                    &planes.hub,
                    &argocd_ns,
                    &a.name,
                    principal.resource_proxy_port,
                    &ctx.dir,
                )
                .await?,
            );
        }
        Ok(LiveFleet {
            ctx,
            pki,
            argocd_ns,
            principal,
            agents,
            spoke_redis,
            hub_redis,
            kubeconfigs,
            redis_tls: options.redis_tls,
        })
    }

    /// Runs kubectl against the proxy as agent `i`'s cluster; returns (success, stdout, stderr).
    fn kubectl(&self, i: usize, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
        let cache = self.ctx.dir.join(format!("kube-cache-{i}"));
        e2e::binaries::run_kubectl(&self.kubeconfigs[i], &cache, args)
    }

    /// Runs redis-cli against the Redis proxy (over TLS, trusting the principal's CA, when the
    /// fleet's Redis runs TLS); returns stdout.
    fn redis_cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = Command::new(system_binary("redis-cli", "redis-tools")?);
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.principal.redis_proxy_port.to_string(),
        ]);
        if self.redis_tls {
            cmd.arg("--tls").arg("--cacert").arg(self.pki.ca());
        }
        let out = cmd.args(args).output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
    }
}

/// A `kubernetes.io/tls` Secret `name` with `cert` and `key`.
async fn create_tls_secret(
    client: &kube::Client,
    ns: &str,
    name: &str,
    cert: &Path,
    key: &Path,
) -> anyhow::Result<()> {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": std::fs::read_to_string(cert)?,
            "tls.key": std::fs::read_to_string(key)?},
    }))?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

/// A kubeconfig for the resource proxy with the credentials from agent `name`'s Argo CD cluster
/// secret (as the hub's Argo CD would use them: client certificate, and the bearer token of a
/// self-registered cluster); waits for the secret to exist.
async fn proxy_kubeconfig(
    hub: &e2e::ControlPlane,
    argocd_ns: &str,
    name: &str,
    port: u16,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let secrets: Api<Secret> = Api::namespaced(hub.client().await?, argocd_ns);
    let secret_name = format!("cluster-{name}");
    let secret = wait_until(
        &format!("cluster secret {secret_name}"),
        Duration::from_secs(60),
        || secrets.get_opt(&secret_name),
    )
    .await?;
    let data = secret.data.unwrap_or_default();
    let config: Value = serde_json::from_slice(&data["config"].0)?;
    let server = String::from_utf8(data["server"].0.clone())?;
    assert!(
        server.ends_with(&format!("?agentName={name}")),
        "cluster URL {server}"
    );
    let tls = &config["tlsClientConfig"];
    let mut user = json!({"client-certificate-data": tls["certData"],
        "client-key-data": tls["keyData"]});
    if let Some(token) = config["bearerToken"].as_str() {
        user["token"] = token.into();
    }
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
        "clusters": [{"name": "proxy", "cluster": {"server": format!("https://127.0.0.1:{port}"),
            "certificate-authority-data": tls["caData"]}}],
        "users": [{"name": "argocd", "user": user}],
        "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "argocd"}}],
    });
    let path = dir.join(format!("proxy-{name}.kubeconfig"));
    std::fs::write(&path, serde_norway::to_string(&kubeconfig)?)?;
    Ok(path)
}

fn deployment_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apps", "v1", "Deployment"),
        "deployments",
    )
}

/// A Deployment as Argo CD 3 would have deployed it (`tracked`: with its tracking annotation; both
/// carry the instance label a Helm release would set, which is not Argo CD's tracking).
fn deployment(name: &str, ns: &str, tracked: bool, marker: &str) -> DynamicObject {
    let mut annotations = json!({"marker": marker});
    if tracked {
        annotations["argocd.argoproj.io/tracking-id"] =
            format!("guestbook:apps/Deployment:{ns}/{name}").into();
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations,
            "labels": {"app": name, "app.kubernetes.io/instance": "guestbook"}},
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
        let obj: Value = serde_norway::from_str(&yaml)?;
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

/// The tracking method is what the spoke's `argocd-cm` says, read as Argo CD reads it: under
/// annotation tracking (no `argocd-cm`: Argo CD 3's default) a Deployment that only carries a Helm
/// release's `app.kubernetes.io/instance` label is not Argo CD's and is refused; under `label`
/// tracking it is served; an `argocd-cm` naming an unknown method makes object requests 503 with
/// the reason (never a guess), and removing it brings the default back.
#[tokio::test]
async fn the_tracking_method_comes_from_the_spokes_argocd_cm() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let fleet = LiveFleet::start("live_tracking", planes).await?;
    let ns = fleet.ctx.unique("helm");
    let client = planes.spokes[0].client().await?;
    ensure_namespace(&client, &ns).await?;
    Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &deployment_resource())
        .create(
            &PostParams::default(),
            &deployment("web", &ns, false, "helm"),
        )
        .await?;
    let get = || fleet.kubectl(0, &["get", "deploy", "-n", &ns, "web", "-o", "yaml"]);
    let (ok, _, err) = get()?;
    assert!(
        !ok && err.contains("not managed by Argo CD"),
        "annotation tracking by default: {err}"
    );

    let argocd_ns = fleet.agents[0].namespace.clone();
    ensure_namespace(&client, &argocd_ns).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &argocd_ns);
    let argocd_cm = |method: &str| -> anyhow::Result<ConfigMap> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": "argocd-cm", "namespace": argocd_ns,
                "labels": {"app.kubernetes.io/part-of": "argocd"}},
            "data": {"application.resourceTrackingMethod": method},
        }))?)
    };
    cms.create(&PostParams::default(), &argocd_cm("label")?)
        .await?;
    let served = wait_until(
        "label tracking serves the labelled Deployment",
        WAIT,
        || async {
            let (ok, yaml, _) = get()?;
            anyhow::Ok(ok.then_some(yaml))
        },
    )
    .await?;
    let obj: Value = serde_norway::from_str(&served)?;
    assert_eq!(obj["metadata"]["annotations"]["marker"], "helm");

    let mut unknown = argocd_cm("labels")?;
    unknown.metadata.resource_version = cms.get("argocd-cm").await?.metadata.resource_version;
    cms.replace("argocd-cm", &PostParams::default(), &unknown)
        .await?;
    let err = wait_until("an unknown tracking method answers 503", WAIT, || async {
        let (ok, _, err) = get()?;
        anyhow::Ok((!ok && err.contains("resourceTrackingMethod")).then_some(err))
    })
    .await?;
    assert!(err.contains("\"labels\""), "names the value: {err}");

    cms.delete("argocd-cm", &DeleteParams::default()).await?;
    wait_until(
        "no argocd-cm is annotation tracking again",
        WAIT,
        || async {
            let (ok, _, err) = get()?;
            anyhow::Ok((!ok && err.contains("not managed by Argo CD")).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// Redis with TLS everywhere, as an Argo CD whose Redis runs TLS has it (upstream's flags): the
/// hub and spoke `redis-server`s serve TLS only; the principal (`--redis-tls-enabled`) reaches the
/// hub Redis over TLS verified against its CA file and serves its Redis proxy over TLS with the
/// certificate of the Secret `argocd-redis-proxy-tls`; the agent (`--redis-tls-enabled` alone)
/// reaches its Redis over TLS verified against the CA in the Secret `argocd-redis-tls`. A real
/// `redis-cli --tls` plays argocd-server; the spoke cache entry is written by the test.
#[tokio::test]
async fn redis_over_tls_through_proxy_principal_and_agent_with_cache_written_by_the_test(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let fleet = LiveFleet::start_with(
        "live_redis_tls",
        planes,
        FleetOptions {
            redis_tls: true,
            ..FleetOptions::default()
        },
    )
    .await?;
    let agent = fleet.agents[0].name.clone();
    fleet.spoke_redis[0].cli(&["SET", "app|resources-tree|guestbook|1.8.3", "tree-over-tls"])?;
    fleet
        .hub_redis
        .cli(&["SET", "mfst|hub-key", "hub-over-tls"])?;
    // Answered by the agent from its Redis over TLS, through the proxy's TLS listener.
    let key = format!("app|resources-tree|{agent}_guestbook|1.8.3");
    assert_eq!(fleet.redis_cli(&["GET", &key])?, "tree-over-tls");
    // Answered by the hub Redis over the principal's TLS connection.
    assert_eq!(fleet.redis_cli(&["GET", "mfst|hub-key"])?, "hub-over-tls");
    assert_eq!(fleet.redis_cli(&["PING"])?, "PONG");

    // The listener speaks TLS only, and with the proxy's certificate: a plaintext client and one
    // trusting only the Redis servers' CA get no answer.
    let cli = || -> anyhow::Result<Command> {
        let mut cmd = Command::new(system_binary("redis-cli", "redis-tools")?);
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &fleet.principal.redis_proxy_port.to_string(),
        ]);
        Ok(cmd)
    };
    let plain = cli()?.arg("PING").output()?;
    assert!(
        !String::from_utf8_lossy(&plain.stdout).contains("PONG"),
        "a plaintext client got {plain:?}"
    );
    let wrong_ca = cli()?
        .arg("--tls")
        .arg("--cacert")
        .arg(fleet.spoke_redis[0].tls_ca.as_ref().expect("TLS redis"))
        .arg("PING")
        .output()?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&wrong_ca.stdout),
        String::from_utf8_lossy(&wrong_ca.stderr)
    );
    assert!(
        !said.contains("PONG") && said.to_lowercase().contains("certificate"),
        "a client trusting another CA: {said}"
    );
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

/// Destination-based mapping: an Application's live-view key names its hub namespace, which is no
/// agent's; the Redis proxy asks the agent its destination names, which reads the key as its Argo
/// CD names an Application kept in that namespace.
#[tokio::test]
async fn redis_keys_follow_the_destination_under_destination_based_mapping_with_cache_written_by_the_test_since_it_tells_the_spokes_apart_by_value(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let apps_ns = format!("apps-{}", uuid::Uuid::new_v4().simple());
    let apps_ns = &apps_ns[..20];
    let options = FleetOptions {
        principal_args: vec!["--destination-based-mapping".into()],
        agent_args: vec![
            "--destination-based-mapping".into(),
            "--create-namespace".into(),
            format!("--allowed-namespaces={apps_ns}"),
        ],
        ..FleetOptions::default()
    };
    let fleet = LiveFleet::start_with("live_redis_dest", planes, options).await?;
    let hub = planes.hub.client().await?;
    ensure_namespace(&hub, apps_ns).await?;
    let mut app = serde_json::to_value(e2e::gateway::application("guestbook", apps_ns, "main"))?;
    app["spec"]["destination"]["name"] = json!(fleet.agents[1].name);
    Api::<DynamicObject>::namespaced_with(hub, apps_ns, &e2e::gateway::application_resource())
        .create(&PostParams::default(), &serde_json::from_value(app)?)
        .await?;
    // The principal routed it: the second agent keeps it in the hub namespace on its spoke.
    let spoke_apps: Api<DynamicObject> = Api::namespaced_with(
        planes.spokes[1].client().await?,
        apps_ns,
        &e2e::gateway::application_resource(),
    );
    wait_until(
        "the Application on the spoke its destination names",
        Duration::from_secs(30),
        || async { spoke_apps.get_opt("guestbook").await },
    )
    .await?;
    let key = format!("app|resources-tree|{apps_ns}_guestbook|1.8.3");
    for (i, value) in ["tree-from-spoke1", "tree-from-spoke2"]
        .into_iter()
        .enumerate()
    {
        let out = Command::new(system_binary("redis-cli", "redis-tools")?)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &fleet.spoke_redis[i].port.to_string(),
            ])
            .args(["SET", &key, value])
            .output()?;
        assert!(out.status.success());
    }
    assert_eq!(fleet.redis_cli(&["GET", &key])?, "tree-from-spoke2");
    Ok(())
}

#[tokio::test]
async fn redis_cli_reads_an_agents_cache_through_the_proxy_and_the_rest_from_the_hub_with_cache_written_by_the_test_since_it_tells_the_spokes_apart_by_value(
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
    // Stand-in for what each spoke's application controller would have cached (one value per
    // spoke, so the test sees whose cache answered), and what the hub has.
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

    // The agent keeps its connection to the spoke Redis between reads: ten more reads open at
    // most one more connection there (the cluster-info reader may open its own meanwhile), where
    // a connection per read would open ten.
    let connections_opened = || -> anyhow::Result<u64> {
        let info = spoke_cli(fleet.spoke_redis[0].port, &["INFO", "stats"])?;
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .ok_or_else(|| anyhow::anyhow!("no total_connections_received in INFO stats: {info}"))?
            .trim()
            .parse()
            .map_err(Into::into)
    };
    let before = connections_opened()?;
    for _ in 0..10 {
        assert_eq!(fleet.redis_cli(&["GET", &key])?, "tree-from-spoke1");
    }
    // Less the connection of the second INFO itself.
    let opened = connections_opened()? - before - 1;
    assert!(
        opened <= 1,
        "10 reads through the proxy opened {opened} connections to the spoke Redis"
    );

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

    // One client SUBSCRIBEs to a key of each agent: a publish on either spoke reaches it.
    let agent2 = fleet.agents[1].name.clone();
    let key2 = format!("app|resources-tree|{agent2}_guestbook|1.8.3");
    let mut sub = tokio::process::Command::new(system_binary("redis-cli", "redis-tools")?)
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &fleet.principal.redis_proxy_port.to_string(),
            "SUBSCRIBE",
            &key,
            &key2,
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let out = std::sync::Arc::new(tokio::sync::Mutex::new(tokio::io::BufReader::new(
        sub.stdout.take().expect("piped"),
    )));
    for (spoke, channel) in [(0, &key), (1, &key2)] {
        let port = fleet.spoke_redis[spoke].port;
        let out = out.clone();
        wait_until(
            &format!(
                "a publish on spoke {} reaches the hub subscriber as {channel}",
                spoke + 1
            ),
            Duration::from_secs(30),
            || {
                let out = out.clone();
                async move {
                    let mut out = out.lock().await;
                    use tokio::io::AsyncBufReadExt;
                    spoke_cli(port, &["PUBLISH", "app|resources-tree|guestbook|1.8.3", ""])?;
                    // redis-cli prints a push as the lines `message`, its channel, its payload.
                    let (mut previous, mut line) = (String::new(), String::new());
                    while let Ok(Ok(n)) =
                        tokio::time::timeout(Duration::from_millis(500), out.read_line(&mut line))
                            .await
                    {
                        if n == 0 {
                            break;
                        }
                        if previous.trim_end() == "message" && line.trim_end() == channel {
                            return Ok::<_, anyhow::Error>(Some(()));
                        }
                        previous = std::mem::take(&mut line);
                    }
                    Ok(None)
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// Lines of history the log endpoint holds per container, one a minute up to now.
const LOG_HISTORY: u32 = 100;

/// What the test's log endpoint saw (the same as a fake kubelet's).
type LogStats = e2e::kubelet::KubeletStats;

/// A Kubernetes-shaped container log endpoint for the agent's `--log-endpoint` (no kubelet exists
/// on the test planes, so the spoke apiserver cannot serve `pods/log`). `GET
/// /api/v1/namespaces/{ns}/pods/{pod}/log` serves [`LOG_HISTORY`] numbered lines per container
/// (`web` by default, or `sidecar`), line `i` written `(100-i)` minutes and 30 s ago, and honours
/// `container`, `tailLines`, `sinceSeconds`, `timestamps`, `limitBytes` and `follow` (then a
/// `live` line every 200 ms until the client goes away, which it notices and counts).
struct LogEndpoint {
    url: String,
    stats: Arc<LogStats>,
}

impl LogEndpoint {
    async fn start() -> anyhow::Result<LogEndpoint> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let stats = Arc::new(LogStats::default());
        let served = stats.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let stats = served.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let stats = stats.clone();
                        async move { Ok::<_, std::convert::Infallible>(serve_log(&stats, &req)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Ok(LogEndpoint { url, stats })
    }

    fn requests(&self) -> usize {
        self.stats.queries.lock().unwrap().len()
    }
}

fn log_response(status: u16, content_type: &str, body: LogBody) -> http::Response<LogBody> {
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(body)
        .expect("valid response")
}

fn full_body(text: String) -> LogBody {
    use http_body_util::BodyExt;
    http_body_util::Full::new(bytes::Bytes::from(text)).boxed()
}

fn rfc3339(unix: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(unix).expect("valid time");
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn serve_log<B>(stats: &Arc<LogStats>, req: &http::Request<B>) -> http::Response<LogBody> {
    let segs: Vec<&str> = req.uri().path().split('/').collect();
    if !matches!(
        segs.as_slice(),
        ["", "api", "v1", "namespaces", _, "pods", _, "log"]
    ) {
        return log_response(404, "text/plain", full_body("not a pods/log path".into()));
    }
    let query = req.uri().query().unwrap_or_default().to_string();
    stats.queries.lock().unwrap().push(query.clone());
    let params: std::collections::HashMap<&str, &str> =
        query.split('&').filter_map(|p| p.split_once('=')).collect();
    let container = params
        .get("container")
        .copied()
        .unwrap_or("web")
        .to_string();
    if container != "web" && container != "sidecar" {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "BadRequest", "code": 400,
            "message": format!("container {container} is not valid for this pod")});
        return log_response(400, "application/json", full_body(status.to_string()));
    }
    let number = |k: &str| params.get(k).and_then(|v| v.parse::<i64>().ok());
    let stamps = params.get("timestamps") == Some(&"true");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    let line = move |text: String, at: i64| {
        if stamps {
            format!("{} {text}\n", rfc3339(at))
        } else {
            format!("{text}\n")
        }
    };
    let mut history: Vec<String> = (1..=LOG_HISTORY)
        .map(|i| (i, i64::from(LOG_HISTORY - i) * 60 + 30))
        .filter(|(_, age)| number("sinceSeconds").is_none_or(|since| *age <= since))
        .map(|(i, age)| line(format!("{container} line {i:03}"), now - age))
        .collect();
    if let Some(tail) = number("tailLines") {
        let keep = usize::try_from(tail.max(0)).unwrap_or(0);
        history.drain(..history.len().saturating_sub(keep));
    }
    let mut text = history.concat();
    if let Some(limit) = number("limitBytes") {
        text.truncate(usize::try_from(limit.max(0)).unwrap_or(0));
    }
    if params.get("follow") != Some(&"true") {
        return log_response(200, "text/plain", full_body(text));
    }
    let next = move |n: u32| line(format!("{container} live {n}"), now);
    log_response(
        200,
        "text/plain",
        e2e::kubelet::follow_body(text, next, stats.clone()),
    )
}

/// A Pod as Argo CD 3 would have deployed it (`tracked`: with its tracking annotation; both carry
/// a Helm release's instance label, which is not Argo CD's tracking); it stays Pending (no
/// scheduler or kubelet).
fn pod(name: &str, ns: &str, tracked: bool) -> anyhow::Result<Pod> {
    let mut annotations = json!({"kubectl.kubernetes.io/default-container": "web"});
    if tracked {
        annotations["argocd.argoproj.io/tracking-id"] =
            format!("guestbook:/Pod:{ns}/{name}").into();
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "annotations": annotations,
            "labels": {"app": "web", "app.kubernetes.io/instance": "guestbook"}},
        "spec": {"automountServiceAccountToken": false,
            "containers": [{"name": "web", "image": "nginx"},
            {"name": "sidecar", "image": "busybox"}]}
    }))?)
}

/// Lines of a log output.
fn lines(out: &str) -> Vec<&str> {
    out.lines().collect()
}

/// A plain HTTP/1.1 GET through the resource proxy with the given client certificate and, if
/// any, bearer token; returns (status, body).
async fn proxy_get(
    fleet: &LiveFleet,
    identity: (&str, &str),
    path: &str,
    bearer: Option<&str>,
) -> anyhow::Result<(u16, Value)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tls = e2e::gateway::client_tls(&fleet.pki, Some(identity), &[b"http/1.1"])?;
    let address = format!("127.0.0.1:{}", fleet.principal.resource_proxy_port);
    let mut s = e2e::gateway::tls_connect(&address, Arc::new(tls)).await?;
    let auth = bearer
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    // Read until the whole body (Content-Length) is in; the close may come without close_notify.
    let (status, body) = loop {
        let n = tokio::time::timeout(Duration::from_secs(60), s.read(&mut chunk))
            .await?
            .unwrap_or(0);
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(usize::MAX);
            if body.len() >= length || n == 0 {
                let status = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                break (status, body.to_string());
            }
        }
        anyhow::ensure!(n > 0, "the proxy closed the connection early: {text}");
    };
    Ok((
        status,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_tunnel_tail_since_container_and_follow_and_a_gone_client_closes_the_source(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let endpoint = LogEndpoint::start().await?;
    let fleet = LiveFleet::start_with(
        "live_logs",
        planes,
        FleetOptions {
            agent_args: vec![format!("--log-endpoint={}", endpoint.url)],
            ..FleetOptions::default()
        },
    )
    .await?;
    let ns = fleet.ctx.unique("guestbook");
    let spoke1 = planes.spokes[0].client().await?;
    ensure_namespace(&spoke1, &ns).await?;
    // No controller-manager makes the namespace's default ServiceAccount; Pod admission needs it
    // (and the Pods mount no token, which nothing would issue).
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
    Api::<ServiceAccount>::namespaced(spoke1.clone(), &ns)
        .create(&PostParams::default(), &sa)
        .await?;
    let pods: Api<Pod> = Api::namespaced(spoke1, &ns);
    pods.create(&PostParams::default(), &pod("web-1", &ns, true)?)
        .await?;
    pods.create(&PostParams::default(), &pod("untracked-1", &ns, false)?)
        .await?;

    // --tail: exactly the last N lines of the container asked for, through principal and agent.
    let (ok, out, err) =
        fleet.kubectl(0, &["logs", "-n", &ns, "web-1", "-c", "web", "--tail=3"])?;
    assert!(ok, "kubectl logs --tail: {err}");
    assert_eq!(
        lines(&out),
        ["web line 098", "web line 099", "web line 100"]
    );
    let (ok, out, err) = fleet.kubectl(
        0,
        &["logs", "-n", &ns, "web-1", "-c", "sidecar", "--tail=2"],
    )?;
    assert!(ok, "kubectl logs -c sidecar: {err}");
    assert_eq!(lines(&out), ["sidecar line 099", "sidecar line 100"]);
    // Without -c kubectl picks the default container; the whole history arrives.
    let (ok, out, err) = fleet.kubectl(0, &["logs", "-n", &ns, "web-1"])?;
    assert!(ok, "kubectl logs: {err}");
    assert_eq!(lines(&out).len(), LOG_HISTORY as usize);
    // --since: lines of the last five minutes (written 4m30s ... 30s ago).
    let (ok, out, err) =
        fleet.kubectl(0, &["logs", "-n", &ns, "web-1", "-c", "web", "--since=5m"])?;
    assert!(ok, "kubectl logs --since: {err}");
    assert_eq!(
        lines(&out),
        [
            "web line 096",
            "web line 097",
            "web line 098",
            "web line 099",
            "web line 100"
        ]
    );
    let (ok, out, err) = fleet.kubectl(
        0,
        &[
            "logs",
            "-n",
            &ns,
            "web-1",
            "-c",
            "web",
            "--tail=1",
            "--timestamps",
        ],
    )?;
    assert!(ok, "kubectl logs --timestamps: {err}");
    assert!(
        out.trim_end().ends_with("Z web line 100"),
        "timestamped line: {out}"
    );
    {
        let queries = endpoint.stats.queries.lock().unwrap();
        assert!(
            queries
                .iter()
                .any(|q| q.contains("sinceSeconds=300") && q.contains("container=web")),
            "the agent passes the options on: {queries:?}"
        );
    }

    // An untracked pod's logs are refused with a 403 Status, before the source is asked.
    let before = endpoint.requests();
    let (cert, key) = agent_identity(&fleet.pki, &fleet.agents[0].name)?;
    let (status, body) = proxy_get(
        &fleet,
        (&cert, &key),
        &format!("/api/v1/namespaces/{ns}/pods/untracked-1/log?container=web"),
        None,
    )
    .await?;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["kind"], "Status");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not managed by Argo CD"),
        "{body}"
    );
    let (ok, _, err) = fleet.kubectl(0, &["logs", "-n", &ns, "untracked-1", "-c", "web"])?;
    assert!(!ok && err.contains("not managed by Argo CD"), "{err}");
    // Agent 2's certificate reaches agent 2's cluster, where agent 1's pod does not exist.
    let (ok, _, err) = fleet.kubectl(1, &["logs", "-n", &ns, "web-1", "-c", "web"])?;
    assert!(
        !ok && err.contains("not found"),
        "agent 2 reading agent 1's pod: {err}"
    );
    let (cert2, key2) = agent_identity(&fleet.pki, &fleet.agents[1].name)?;
    let (status, body) = proxy_get(
        &fleet,
        (&cert2, &key2),
        &format!("/api/v1/namespaces/{ns}/pods/web-1/log?container=web"),
        None,
    )
    .await?;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        endpoint.requests(),
        before,
        "no refused request reached the source"
    );

    // -f: lines keep arriving; when kubectl goes away the source's stream is closed.
    let mut follow = tokio::process::Command::new(e2e::binaries::kubectl()?)
        .arg(format!("--kubeconfig={}", fleet.kubeconfigs[0].display()))
        .args(["logs", "-f", "-n", &ns, "web-1", "-c", "web", "--tail=1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let out = Arc::new(tokio::sync::Mutex::new(tokio::io::BufReader::new(
        follow.stdout.take().expect("piped"),
    )));
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    wait_until(
        "three live lines through kubectl logs -f",
        Duration::from_secs(60),
        || {
            let (out, seen) = (out.clone(), seen.clone());
            async move {
                use tokio::io::AsyncBufReadExt;
                let mut out = out.lock().await;
                let mut line = String::new();
                if let Ok(Ok(n)) =
                    tokio::time::timeout(Duration::from_millis(500), out.read_line(&mut line)).await
                {
                    anyhow::ensure!(n > 0, "kubectl logs -f ended");
                    seen.lock().unwrap().push(line.trim_end().to_string());
                }
                let live = seen
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|l| l.contains(" live "))
                    .count();
                Ok::<_, anyhow::Error>((live >= 3).then_some(()))
            }
        },
    )
    .await?;
    {
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen[0], "web line 100",
            "--tail=1 then the live lines: {seen:?}"
        );
        assert_eq!(&seen[1..4], ["web live 1", "web live 2", "web live 3"]);
    }
    assert_eq!(endpoint.stats.follows_open.load(Ordering::SeqCst), 1);
    follow.kill().await?;
    let killed = std::time::Instant::now();
    let stats = endpoint.stats.clone();
    wait_until(
        "the log source sees its follow stream closed",
        Duration::from_secs(10),
        || {
            let stats = stats.clone();
            async move {
                Ok::<_, anyhow::Error>(
                    (stats.follows_closed.load(Ordering::SeqCst) == 1
                        && stats.follows_open.load(Ordering::SeqCst) == 0)
                        .then_some(()),
                )
            }
        },
    )
    .await?;
    println!(
        "measurement: kubectl killed -> log source stream closed in {} ms",
        killed.elapsed().as_millis()
    );
    Ok(())
}

/// A JWT signed with the PEM private key `pem` (EC P-256 → ES256, RSA → RS512, as the principal).
fn sign_jwt(pem: &str, claims: &Value) -> anyhow::Result<String> {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let (alg, key) = match EncodingKey::from_ec_pem(pem.as_bytes()) {
        Ok(k) => (Algorithm::ES256, k),
        Err(_) => (Algorithm::RS512, EncodingKey::from_rsa_pem(pem.as_bytes())?),
    };
    Ok(jsonwebtoken::encode(&Header::new(alg), claims, &key)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_registered_cluster_is_reached_with_its_bearer_token_and_bad_tokens_get_401(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let fleet = LiveFleet::start_with(
        "live_self_registration",
        planes,
        FleetOptions {
            self_registered: vec![0],
            ..FleetOptions::default()
        },
    )
    .await?;
    let (agent1, agent2) = (fleet.agents[0].name.clone(), fleet.agents[1].name.clone());
    let secrets: Api<Secret> = Api::namespaced(planes.hub.client().await?, &fleet.argocd_ns);

    // Agent 1 connected without a cluster secret: the principal made one.
    let secret = secrets.get(&format!("cluster-{agent1}")).await?;
    let labels = secret.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["argocd.argoproj.io/secret-type"], "cluster");
    assert_eq!(labels["argocd-agent.argoproj-labs.io/agent-name"], agent1);
    assert_eq!(
        labels["argocd-agent.argoproj-labs.io/self-registered-cluster"],
        "true"
    );
    let data = secret.data.clone().unwrap_or_default();
    assert_eq!(
        String::from_utf8(data["server"].0.clone())?,
        format!(
            "https://127.0.0.1:{}?agentName={agent1}",
            fleet.principal.resource_proxy_port
        )
    );
    let config: Value = serde_json::from_slice(&data["config"].0)?;
    let token = config["bearerToken"]
        .as_str()
        .expect("bearer token")
        .to_string();
    let (shared_cert, shared_key) = {
        use base64::Engine;
        let b64 = |v: &Value| -> anyhow::Result<String> {
            Ok(String::from_utf8(
                base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap_or_default())?,
            )?)
        };
        let tls = &config["tlsClientConfig"];
        (b64(&tls["certData"])?, b64(&tls["keyData"])?)
    };
    let shared = secrets
        .get(SHARED_CLIENT_SECRET)
        .await?
        .data
        .unwrap_or_default();
    assert_eq!(
        shared_cert.as_bytes(),
        shared["tls.crt"].0,
        "the shared certificate"
    );

    // Agent 2's secret (made by argocd-agentctl) is left as it was.
    let principal_log = fleet.principal.process.log_path().to_path_buf();
    let agent2_line = format!("agent={agent2}");
    wait_until(
        "self-registration looked at agent 2's existing secret",
        Duration::from_secs(60),
        || {
            let (path, needle) = (principal_log.clone(), agent2_line.clone());
            async move {
                let text = std::fs::read_to_string(path)?;
                Ok::<_, anyhow::Error>(
                    text.lines()
                        .any(|l| l.contains(&needle) && l.contains("leaves it alone"))
                        .then_some(()),
                )
            }
        },
    )
    .await?;
    let secret2 = secrets.get(&format!("cluster-{agent2}")).await?;
    assert!(!secret2
        .metadata
        .labels
        .unwrap_or_default()
        .contains_key("argocd-agent.argoproj-labs.io/self-registered-cluster"));
    let config2: Value = serde_json::from_slice(&secret2.data.unwrap_or_default()["config"].0)?;
    assert!(config2.get("bearerToken").is_none(), "{config2}");

    // Real kubectl with the secret's token and shared certificate reads agent 1's Deployment.
    let ns = fleet.ctx.unique("guestbook");
    for (i, spoke) in planes.spokes.iter().enumerate() {
        let client = spoke.client().await?;
        ensure_namespace(&client, &ns).await?;
        let deploys: Api<DynamicObject> = Api::namespaced_with(client, &ns, &deployment_resource());
        deploys
            .create(
                &PostParams::default(),
                &deployment("web", &ns, true, &format!("spoke{}", i + 1)),
            )
            .await?;
        if i == 1 {
            deploys
                .create(
                    &PostParams::default(),
                    &deployment("only-on-2", &ns, true, "spoke2"),
                )
                .await?;
        }
    }
    let (ok, yaml, err) = fleet.kubectl(0, &["get", "deploy", "-n", &ns, "web", "-o", "yaml"])?;
    assert!(ok, "kubectl with the self-registered secret: {err}");
    let obj: Value = serde_norway::from_str(&yaml)?;
    assert_eq!(obj["metadata"]["annotations"]["marker"], "spoke1");
    // Agent 1's token cannot read what only agent 2's cluster has.
    let (ok, _, err) = fleet.kubectl(0, &["get", "deploy", "-n", &ns, "only-on-2"])?;
    assert!(!ok && err.contains("not found"), "{err}");

    // The token, not the certificate, names the agent: a valid token for agent 2 reaches agent 2.
    let jwt_key = std::fs::read_to_string(fleet.pki.dir.join("jwt.key"))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let claims = |sub: &str, aud: &str, exp: i64| {
        json!({"sub": sub, "iss": "argocd-agent-server", "aud": aud, "exp": exp,
            "iat": now - 60, "nbf": now - 60, "jti": uuid::Uuid::new_v4().to_string()})
    };
    const AUDIENCE: &str = "argocd-agent-server-resource-proxy";
    let only_on_2 = format!("/apis/apps/v1/namespaces/{ns}/deployments/only-on-2");
    let shared_identity = (shared_cert.as_str(), shared_key.as_str());
    let for_agent2 = sign_jwt(&jwt_key, &claims(&agent2, AUDIENCE, now + 300))?;
    let (status, body) = proxy_get(&fleet, shared_identity, &only_on_2, Some(&for_agent2)).await?;
    assert_eq!(status, 200, "{body}");
    let (status, body) = proxy_get(&fleet, shared_identity, &only_on_2, Some(&token)).await?;
    assert_eq!(status, 404, "agent 1's token on agent 2's object: {body}");

    // Forged (another key), expired and wrong-audience tokens: 401 with a Status body.
    let other_key = rcgen::KeyPair::generate()?.serialize_pem();
    let bad_tokens = [
        (
            "forged",
            sign_jwt(&other_key, &claims(&agent1, AUDIENCE, now + 300))?,
        ),
        (
            "expired",
            sign_jwt(&jwt_key, &claims(&agent1, AUDIENCE, now - 3600))?,
        ),
        (
            "wrong audience",
            sign_jwt(
                &jwt_key,
                &claims(&agent1, "argocd-agent-server-access", now + 300),
            )?,
        ),
    ];
    for (what, bad) in &bad_tokens {
        let (status, body) = proxy_get(&fleet, shared_identity, "/api", Some(bad)).await?;
        assert_eq!(status, 401, "{what} token: {body}");
        assert_eq!(body["kind"], "Status", "{what} token: {body}");
        assert_eq!(body["code"], 401, "{what} token: {body}");
    }

    // No token in the principal's log.
    let log = std::fs::read_to_string(fleet.principal.process.log_path())?;
    assert!(
        !log.contains(&token),
        "the principal logged the bearer token"
    );
    for (what, bad) in &bad_tokens {
        assert!(
            !log.contains(bad.as_str()),
            "the principal logged the {what} token"
        );
    }
    assert!(!log.contains("PRIVATE KEY"), "the principal logged a key");
    Ok(())
}
