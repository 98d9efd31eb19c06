//! The live view user story with real Argo CD on both sides: the hub's argocd-server shows an
//! Application that runs on a spoke it cannot reach (resource tree, live manifests, sync and
//! health), through our principal's Redis proxy (argocd-server's Redis; the live-view keys are
//! answered from the agent's spoke Redis) and resource proxy (the hub cluster secret of the agent
//! points at it; the agent reads the spoke). And the user operates that Application from the hub
//! with the real `argocd` CLI and REST API — refresh, diff, manual sync, terminate a running
//! sync, a resource action, deleting one resource, managed resources and events, and cascade
//! delete — and each takes effect on the spoke.
//!
//! And the hub's answers equal the spoke's own: a second argocd-server run directly on the spoke
//! answers the same REST calls (Application, resource tree, managed resources, a live manifest, a
//! resource's events), compared field by field, and the test prints the p50/p99 of `argocd app
//! get` and of a resource-tree read on both, measured in the same run.
//!
//! Both Redis servers require a password, as Argo CD's default install configures them: the
//! spoke's real application-controller writes its cache into a password-protected Redis that our
//! agent reads with `--redis-password`; the hub Redis is protected too, and our principal reads
//! its password from a creds directory (the mounted `argocd-redis` secret) while argocd-server
//! authenticates to the proxy with `REDIS_PASSWORD`. Nobody here writes what Argo CD or an agent
//! would write: the hub is looked at with the real `argocd` CLI and REST API only.
//!
//! The clusters run no kubelet and no kube-controller-manager: a Deployment never reports a
//! rollout (it carries `argocd.argoproj.io/ignore-healthcheck` so the app stays Healthy), a Job
//! never completes (which keeps a PreSync hook, and so a sync, running until terminated), and
//! nothing garbage-collects (deletions use background propagation, which needs no collector).
//!
//! Our principal and agent run as the pods their Helm charts make (the pod runner), with the
//! charts' ServiceAccounts and RBAC. The pods' port forwards run on the test's runtime, so the
//! tests use a multi-threaded one: on a single thread a blocking call (a synchronous `argocd` CLI
//! run) would stall the very traffic it waits for.

use std::time::{Duration, Instant};

use argocd_agent_proto::event::{PRINCIPAL_UID_ANNOTATION, SOURCE_UID_ANNOTATION};
use e2e::argocd::{ArgoCd, RedisEndpoint};
use e2e::argocd_terminal::{
    check_shell_session, enable_exec, open_once_enabled, Terminal, TerminalTarget,
};
use e2e::binaries::workspace_root;
use e2e::gateway::{agentctl, application_resource, ensure_namespace, Pki};
use e2e::git_server::{demo_manifests, demo_pod, GitServer, PRESYNC_HOOK_JOB};
use e2e::helm::{create_principal_secrets, create_secret, installed_deployment, Helm, Release};
use e2e::kubelet::FakeKubelet;
use e2e::pod_runner::{Image, Pod, PodRunner};
use e2e::redis::resp_exchange;
use e2e::redis::TlsFiles;
use e2e::scenario::{
    demo_application, demo_config_uid, operation_state, operation_terminated, record_demo_event,
    sync_state, wait_synced, SYNC_WAIT,
};
use e2e::{shared_planes, wait_until, ControlPlane, Redis, TestContext};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{json, Value};

/// The greeting of the demo ConfigMap in Git, to recognise the spoke's live copy.
const GREETING: &str = "live-from-the-spoke";
/// The greeting of the next Git revision (synced manually from the hub).
const CHANGED_GREETING: &str = "changed-in-git";
/// Our principal ends a web terminal with no data either way for this long.
const TERMINAL_IDLE: Duration = Duration::from_secs(6);
/// Our charts, as users install them.
const PRINCIPAL_CHART: &str = "charts/argocd-agent-principal";
const AGENT_CHART: &str = "charts/argocd-agent-agent";
/// How long one CLI call that waits on the spoke may take.
const CLI_WAIT: Duration = Duration::from_secs(150);

/// A Deployment that needs no kubelet to be fine: its health is left out of the app's.
const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: demo-web
  annotations:
    argocd.argoproj.io/ignore-healthcheck: \"true\"
spec:
  replicas: 1
  selector:
    matchLabels:
      app: demo-web
  template:
    metadata:
      labels:
        app: demo-web
    spec:
      containers:
      - name: web
        image: registry.invalid/demo-web:1
";

/// The hub (our principal in front of a password Redis, real argocd-server) and the spoke (real
/// Argo CD, our managed agent) of one test, wired as the module docs say. Our principal and agent
/// are installed with their Helm charts and run by the pod runner as their pods, with their
/// ServiceAccounts' tokens: the RBAC the charts ship is the RBAC these tests exercise.
struct LiveView {
    agent_name: String,
    pki: Pki,
    git: GitServer,
    hub_password: String,
    /// Our principal's pod on the hub.
    principal: Pod,
    spoke_argocd: ArgoCd,
    /// Our agent's pod on the spoke.
    agent: Pod,
    server: ArgoCd,
    /// The Application's destination namespace on the spoke.
    dest: String,
    /// Applications in the agent's namespace on the hub.
    hub_apps: Api<DynamicObject>,
    /// The Application's name (distinct per test: Argo CD instances sharing a spoke cluster
    /// claim each other's resources when their Applications have the same name).
    app: String,
    spoke_client: kube::Client,
    _hub_redis: Redis,
    _ctx: TestContext,
}

/// What a test sets in the charts' values beyond what every live view test sets.
#[derive(Default)]
struct ChartValues {
    /// YAML lines added to the principal chart's values.
    principal: &'static str,
    /// YAML lines added to the agent chart's values.
    agent: &'static str,
    /// The hub Redis serves TLS only, as an Argo CD installed with Redis TLS: the principal chart's
    /// `redisProxy.tls` on (TLS to that Redis and on the proxy, from upstream's Secrets
    /// `argocd-redis-tls` and `argocd-redis-proxy-tls`), argocd-server with `--redis-use-tls`.
    hub_redis_tls: bool,
}

/// `helm install` of our `chart` as release `release` in `namespace` on `plane`, then the
/// Deployment it created run by the pod runner (reaching the host ports `egress`); waits until the
/// pod is Ready.
async fn install_and_run(
    ctx: &TestContext,
    plane: &ControlPlane,
    (chart, release, namespace): (&str, &str, &str),
    values: &str,
    egress: &[u16],
) -> anyhow::Result<Pod> {
    let client = plane.client().await?;
    Helm::new(&ctx.dir, Some(&plane.kubeconfig))?.install(&Release::new(
        release,
        namespace,
        workspace_root().join(chart),
        values,
    ))?;
    let (deployment, _) = installed_deployment(&client, namespace).await?;
    let mut pods = PodRunner::new(plane, &ctx.dir, Image::ours()?)
        .await?
        .run_deployment(namespace, &deployment, egress)
        .await?;
    anyhow::ensure!(pods.len() == 1, "{chart}: {} pods", pods.len());
    let pod = pods.remove(0);
    pod.wait_ready(Duration::from_secs(60)).await?;
    Ok(pod)
}

/// The host port forwarded to `pod`'s container port `name`.
fn pod_port(pod: &Pod, name: &str) -> u16 {
    pod.port(name)
        .unwrap_or_else(|| panic!("pod {} has no port {name}", pod.name))
}

/// Log filter of our pods: debug for our code, quiet for the libraries.
const LOG_LEVEL: &str = "debug,kube_client=warn,hyper=info,h2=info,tower=info,rustls=info";

impl LiveView {
    async fn start(test: &str, app: &str) -> anyhow::Result<LiveView> {
        LiveView::start_with(test, app, ChartValues::default()).await
    }

    /// [`LiveView::start`] with `values` added to the charts'.
    async fn start_with(test: &str, app: &str, values: ChartValues) -> anyhow::Result<LiveView> {
        let planes = shared_planes().await;
        let (hub, spoke) = (&planes.hub, &planes.spokes[0]);
        let ctx = TestContext::new(test)?;
        let pki = Pki::create(&ctx.dir.join("pki"))?;
        let agent_name = ctx.unique("agent");
        pki.issue_agent(&agent_name)?;
        let git = GitServer::start(&ctx.unique("git"))?;

        // Hub: a password-protected Redis, and our principal installed by its chart in front of
        // it, reading the password from Argo CD's `argocd-redis` Secret as the chart wires it.
        let hub_password = format!("hub-{}", uuid::Uuid::new_v4().simple());
        let (principal_cert, principal_key) =
            (pki.dir.join("principal.crt"), pki.dir.join("principal.key"));
        let hub_redis = match values.hub_redis_tls {
            // The fleet CA's localhost/127.0.0.1 certificate serves for the hub Redis and the proxy.
            true => Redis::start_tls(
                &ctx.unique("hub-redis"),
                TlsFiles {
                    cert: &principal_cert,
                    key: &principal_key,
                    ca: &pki.ca(),
                },
                Some(&hub_password),
            )?,
            false => Redis::start_with_password(&ctx.unique("hub-redis"), &hub_password)?,
        };
        let principal_ns = ctx.unique("hub-argocd");
        let hub_client = hub.client().await?;
        ensure_namespace(&hub_client, &agent_name).await?;
        ensure_namespace(&hub_client, &principal_ns).await?;
        let password_file = ctx.dir.join("hub-redis-auth");
        std::fs::write(&password_file, &hub_password)?;
        create_principal_secrets(&hub_client, &principal_ns, &pki, false).await?;
        let redis_tls_values = match values.hub_redis_tls {
            true => {
                create_secret(
                    &hub_client,
                    &principal_ns,
                    "argocd-redis-tls",
                    "Opaque",
                    &[("ca.crt", pki.ca())],
                )
                .await?;
                create_secret(
                    &hub_client,
                    &principal_ns,
                    "argocd-redis-proxy-tls",
                    "kubernetes.io/tls",
                    &[("tls.crt", principal_cert), ("tls.key", principal_key)],
                )
                .await?;
                ", tls: {enabled: true}"
            }
            false => "",
        };
        create_secret(
            &hub_client,
            &principal_ns,
            "argocd-redis",
            "Opaque",
            &[("auth", password_file)],
        )
        .await?;
        let principal = install_and_run(
            &ctx,
            hub,
            (PRINCIPAL_CHART, &ctx.unique("hub"), &principal_ns),
            &format!(
                "replicaCount: 1\nha: {{enabled: false}}\noperator: {{enabled: false}}\n\
                 service: {{type: ClusterIP}}\n\
                 redisProxy: {{redisServerAddress: \"{}\"{redis_tls_values}}}\n\
                 principal:\n  logFormat: text\n  logLevel: \"{LOG_LEVEL}\"\n  extraEnv:\n  \
                 - {{name: ARGOCD_PRINCIPAL_TERMINAL_IDLE_TIMEOUT, value: \"{}s\"}}\n{}",
                hub_redis.address(),
                TERMINAL_IDLE.as_secs(),
                values.principal,
            ),
            &[hub_redis.port],
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
            &format!("127.0.0.1:{}", pod_port(&principal, "resource-proxy")),
            "--argocd-namespace",
            &principal_ns,
        ])?;

        // Spoke: real Argo CD with its password-protected Redis, and our agent installed by its
        // chart beside it, reading that Redis with the password from `argocd-redis`.
        let spoke_ns = ctx.unique("argocd");
        let spoke_argocd =
            ArgoCd::start_spoke(&ctx.suffix, &ctx.dir, spoke, &spoke_ns, &[]).await?;
        let spoke_redis = spoke_argocd
            .redis
            .as_ref()
            .expect("a spoke Argo CD has a Redis");
        let dest = ctx.unique("demo");
        let spoke_client = spoke.client().await?;
        ensure_namespace(&spoke_client, &dest).await?;
        let (cert, key) = pki.agent_files(&agent_name);
        create_secret(
            &spoke_client,
            &spoke_ns,
            "argocd-agent-client-tls",
            "kubernetes.io/tls",
            &[("tls.crt", cert), ("tls.key", key)],
        )
        .await?;
        create_secret(
            &spoke_client,
            &spoke_ns,
            "argocd-agent-ca",
            "Opaque",
            &[("ca.crt", pki.ca())],
        )
        .await?;
        let grpc_port = pod_port(&principal, "grpc");
        let agent = install_and_run(
            &ctx,
            spoke,
            (AGENT_CHART, &ctx.unique("spoke"), &spoke_ns),
            &format!(
                "agent:\n  serverAddress: \"127.0.0.1:{grpc_port}\"\n  tlsServerName: localhost\n  \
                 redisAddress: \"{}\"\n  reconnectBackoffMax: 2s\n  logFormat: text\n  \
                 logLevel: \"{LOG_LEVEL}\"\nqueue: {{persistence: {{enabled: false}}}}\n{}",
                spoke_redis.address(),
                values.agent,
            ),
            &[grpc_port, spoke_redis.port],
        )
        .await?;
        let metrics = pod_port(&agent, "metrics");
        wait_until(
            &format!("agent {agent_name} connected"),
            Duration::from_secs(60),
            || async move {
                Ok::<_, anyhow::Error>(e2e::metrics::agent_connected(metrics).await?.then_some(()))
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", agent.log_tail(30)))?;

        // Hub: real argocd-server whose Redis is our Redis proxy, with the hub Redis password.
        let server = ArgoCd::start_server(
            &ctx.suffix,
            &ctx.dir,
            hub,
            &principal_ns,
            RedisEndpoint {
                address: format!("127.0.0.1:{}", pod_port(&principal, "redis-proxy")),
                password: Some(hub_password.clone()),
                tls_ca: values.hub_redis_tls.then(|| pki.ca()),
            },
        )
        .await?;
        let hub_apps = Api::namespaced_with(hub_client, &agent_name, &application_resource());
        Ok(LiveView {
            agent_name,
            pki,
            git,
            hub_password,
            principal,
            spoke_argocd,
            agent,
            server,
            dest,
            hub_apps,
            app: app.to_string(),
            spoke_client,
            _hub_redis: hub_redis,
            _ctx: ctx,
        })
    }

    fn logs(&self) -> String {
        format!(
            "--- principal ---\n{}\n--- agent ---\n{}\n--- spoke argocd ---\n{}\n--- hub argocd ---\n{}",
            self.principal.log_tail(30),
            self.agent.log_tail(30),
            self.spoke_argocd.log_tails(15),
            self.server.log_tails(30)
        )
    }

    /// `<agent>/<app>`, the Application as the CLI names it.
    fn app_ref(&self) -> String {
        format!("{}/{}", self.agent_name, self.app)
    }

    /// The user's Application on the hub, destined for the agent's cluster, synced
    /// automatically; waits until the hub shows it Synced and Healthy at `revision`.
    async fn create_demo_app(&self, revision: &str) -> anyhow::Result<()> {
        self.hub_apps
            .create(
                &PostParams::default(),
                &demo_application(
                    &self.app,
                    &self.agent_name,
                    &self.git.url("apps"),
                    json!({"name": self.agent_name, "namespace": self.dest}),
                ),
            )
            .await?;
        wait_synced(
            &self.hub_apps,
            &self.app,
            revision,
            "the spoke's Synced+Healthy status on the hub Application",
            || self.logs(),
        )
        .await?;
        Ok(())
    }

    /// The spoke's copy of the Application.
    async fn spoke_app(&self) -> anyhow::Result<Option<Value>> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.spoke_client.clone(),
            &self.spoke_argocd.namespace,
            &application_resource(),
        );
        Ok(api
            .get_opt(&self.app)
            .await?
            .map(serde_json::to_value)
            .transpose()?)
    }

    async fn hub_app(&self) -> anyhow::Result<Option<Value>> {
        Ok(self
            .hub_apps
            .get_opt(&self.app)
            .await?
            .map(serde_json::to_value)
            .transpose()?)
    }

    /// Runs the CLI, waiting at most [`CLI_WAIT`]; fails with the CLI's output and the logs.
    async fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        self.server
            .cli_run(args, CLI_WAIT)
            .await
            .and_then(|run| run.success())
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_argocd_shows_tree_and_live_manifests_of_an_app_on_a_spoke_it_cannot_reach(
) -> anyhow::Result<()> {
    let lv = LiveView::start("real_live_view", "demo").await?;
    let LiveView {
        agent_name,
        dest,
        server,
        principal,
        hub_password,
        ..
    } = &lv;
    let logs = || lv.logs();
    let revision = lv
        .git
        .commit("apps", "demo", &demo_manifests(GREETING), "demo")?;
    lv.create_demo_app(&revision).await?;
    // The spoke's own view, to compare the hub's with.
    let spoke_cm = Api::<ConfigMap>::namespaced(lv.spoke_client.clone(), dest)
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
    for expected in ["Synced", "Healthy", "demo-config", "demo-secret", dest] {
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
    e2e::scenario::assert_demo_tree(&tree, &spoke_uid, dest);

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

    // With the RBAC the chart ships (get on every kind, cluster-wide), the hub still sees only
    // what Argo CD tracks. Asked of the resource proxy directly, with the credentials argocd-server
    // uses: a tracked object is served (the positive control), and untracked ones — a ConfigMap
    // beside the app's, the spoke Argo CD's Redis password, a cluster-scoped Namespace — are
    // refused by the agent, saying why, though its ServiceAccount could read them.
    let untracked: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "untracked-config"}, "data": {"note": "not for the hub"},
    }))?;
    Api::<ConfigMap>::namespaced(lv.spoke_client.clone(), dest)
        .create(&PostParams::default(), &untracked)
        .await?;
    let proxy = lv.proxy_client().await?;
    let proxied_cms = Api::<ConfigMap>::namespaced(proxy.clone(), dest);
    let seen = proxied_cms.get("demo-config").await?;
    assert_eq!(seen.metadata.uid.as_deref(), Some(spoke_uid.as_str()));
    let refusals = [
        (
            "an untracked ConfigMap",
            proxied_cms.get("untracked-config").await.map(|_| ()),
        ),
        (
            "the spoke Argo CD's Redis password Secret",
            Api::<Secret>::namespaced(proxy.clone(), &lv.spoke_argocd.namespace)
                .get("argocd-redis")
                .await
                .map(|_| ()),
        ),
        (
            "the app's destination Namespace",
            Api::<Namespace>::all(proxy.clone())
                .get(dest)
                .await
                .map(|_| ()),
        ),
    ];
    for (what, result) in refusals {
        match result {
            Err(kube::Error::Api(status)) => assert!(
                status.code == 403 && status.message.contains("not managed by Argo CD"),
                "{what}: {status:?}"
            ),
            other => panic!("{what} through the resource proxy: {other:?}"),
        }
    }

    // Without the chart's `liveView.write` (off by default), even a tracked object cannot be
    // changed from the hub: the spoke apiserver refuses the agent's ServiceAccount.
    let patch = kube::api::Patch::Merge(json!({"data": {"greeting": "changed-from-the-hub"}}));
    match proxied_cms
        .patch("demo-config", &kube::api::PatchParams::default(), &patch)
        .await
    {
        Err(kube::Error::Api(status)) => assert!(
            status.code == 403 && status.message.contains("cannot patch resource"),
            "{status:?}"
        ),
        other => panic!("a patch without liveView.write: {other:?}"),
    }

    // The proxy is no way around the hub Redis password: without it, neither the hub's keys nor
    // the agent's cache are served.
    let mut raw =
        tokio::net::TcpStream::connect(("127.0.0.1", pod_port(principal, "redis-proxy"))).await?;
    let tree_key = format!("app|resources-tree|{agent_name}_demo|1.8.3");
    let reply = resp_exchange(&mut raw, &["GET", &tree_key]).await?;
    assert!(reply.starts_with("-NOAUTH"), "{reply}");
    let reply = resp_exchange(&mut raw, &["AUTH", "not-the-password"]).await?;
    assert!(reply.starts_with("-WRONGPASS"), "{reply}");
    let reply = resp_exchange(&mut raw, &["PING"]).await?;
    assert!(reply.starts_with("-NOAUTH"), "{reply}");
    assert_eq!(
        resp_exchange(&mut raw, &["AUTH", hub_password]).await?,
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

/// An Argo CD whose Redis runs TLS (argocd-server `--redis-use-tls --redis-ca-certificate`, the
/// hub Redis serving TLS only): argocd-server reaches our Redis proxy over TLS and the proxy the
/// hub Redis over TLS, and the spoke's resource tree still arrives through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_argocd_with_redis_tls_reads_the_spoke_tree_through_our_tls_redis_proxy(
) -> anyhow::Result<()> {
    let lv = LiveView::start_with(
        "real_redis_tls",
        "tls",
        ChartValues {
            hub_redis_tls: true,
            ..ChartValues::default()
        },
    )
    .await?;
    let logs = || lv.logs();
    let revision = lv
        .git
        .commit("apps", "demo", &demo_manifests(GREETING), "demo")?;
    // Synced+Healthy on the hub: argocd-server and the principal both read and write the hub
    // Redis through TLS for this (app state cache, cluster info).
    lv.create_demo_app(&revision).await?;
    let spoke_uid = Api::<ConfigMap>::namespaced(lv.spoke_client.clone(), &lv.dest)
        .get("demo-config")
        .await?
        .metadata
        .uid
        .expect("a live object has a uid");

    // The proxy speaks TLS only: a plaintext client gets no Redis reply.
    let proxy_port = pod_port(&lv.principal, "redis-proxy");
    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", proxy_port)).await?;
    let plain_reply = resp_exchange(&mut plain, &["PING"]).await;
    assert!(
        !matches!(&plain_reply, Ok(r) if r.starts_with('+') || r.starts_with('-')),
        "the TLS Redis proxy answered a plaintext client: {plain_reply:?}"
    );

    // The resource tree the UI reads, answered by the agent from the spoke's Redis and carried
    // over both TLS legs (the first read may race the spoke controller's first cache write).
    let token = lv.server.session_token().await?;
    let path = format!(
        "/api/v1/applications/{}/resource-tree?appNamespace={}",
        lv.app, lv.agent_name
    );
    let tree = wait_until(
        "the resource tree through the TLS Redis proxy",
        Duration::from_secs(60),
        || async {
            let (status, body) = lv.server.api_get(&path, &token).await?;
            Ok::<_, anyhow::Error>(
                (status == 200 && body.contains("demo-config"))
                    .then(|| serde_json::from_str::<Value>(&body))
                    .transpose()?,
            )
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    e2e::scenario::assert_demo_tree(&tree, &spoke_uid, &lv.dest);
    let resources = lv.cli(&["app", "resources", &lv.app_ref()]).await?;
    assert!(resources.contains("demo-secret"), "{resources}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_argocd_refreshes_diffs_syncs_terminates_acts_on_and_deletes_an_app_on_a_spoke(
) -> anyhow::Result<()> {
    let started = Instant::now();
    // Resource actions and delete-resource change objects on the spoke: the chart's write grant.
    let lv = LiveView::start_with(
        "real_live_ops",
        "ops",
        ChartValues {
            principal: "",
            agent: "liveView: {write: true}\n",
            ..ChartValues::default()
        },
    )
    .await?;
    let (agent_name, dest, server) = (&lv.agent_name, &lv.dest, &lv.server);
    let logs = || lv.logs();
    let files = |greeting: &str, hook: bool| {
        let mut files = demo_manifests(greeting);
        files.push(("deployment.yaml", DEPLOYMENT.to_string()));
        if hook {
            files.push(("presync-job.yaml", PRESYNC_HOOK_JOB.to_string()));
        }
        files
    };
    let rev1 = lv
        .git
        .commit("apps", "demo", &files(GREETING, false), "demo")?;
    lv.create_demo_app(&rev1).await?;
    let app_ref = lv.app_ref();
    let spoke_cms = Api::<ConfigMap>::namespaced(lv.spoke_client.clone(), dest);
    let spoke_uid = demo_config_uid(&lv.spoke_client, dest).await?;
    let token = server.session_token().await?;

    // Managed resources, as the UI's diff view reads them: live and target state of each
    // resource, computed by the spoke's controller and read through the Redis proxy.
    let (status, body) = server
        .api_get(
            &format!("/api/v1/applications/ops/managed-resources?appNamespace={agent_name}"),
            &token,
        )
        .await?;
    assert_eq!(status, 200, "managed-resources: {body}\n{}", logs());
    let managed: Value = serde_json::from_str(&body)?;
    let items = managed["items"].as_array().cloned().unwrap_or_default();
    let cm = items
        .iter()
        .find(|i| i["kind"] == "ConfigMap" && i["name"] == "demo-config")
        .unwrap_or_else(|| panic!("no demo-config in {managed}"));
    let live_state = cm["liveState"].as_str().unwrap_or_default();
    assert!(
        live_state.contains(&spoke_uid) && live_state.contains(GREETING),
        "{cm}"
    );
    assert!(
        items
            .iter()
            .any(|i| i["kind"] == "Deployment" && i["name"] == "demo-web"),
        "{managed}"
    );

    // Sync policy manual from the hub, in force on the spoke before Git changes.
    lv.cli(&["app", "set", &app_ref, "--sync-policy", "none"])
        .await?;
    wait_until(
        "the spoke's copy of the Application to sync manually",
        Duration::from_secs(60),
        || async {
            let app = lv.spoke_app().await?;
            Ok::<_, anyhow::Error>(
                app.filter(|a| a.pointer("/spec/syncPolicy/automated").is_none())
                    .map(|_| ()),
            )
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;

    // A change in Git; `argocd app get --refresh` returns once the hub's refresh request was
    // carried out on the spoke (argocd-server waits for the refresh annotation to go away).
    let rev2 = lv
        .git
        .commit("apps", "demo", &files(CHANGED_GREETING, false), "greeting")?;
    let refresh_started = Instant::now();
    let got = lv.cli(&["app", "get", &app_ref, "--refresh"]).await?;
    println!(
        "hub `argocd app get --refresh`: {:?}",
        refresh_started.elapsed()
    );
    assert!(got.contains("demo-config"), "{got}");
    wait_until(
        "the hub to show the Git change OutOfSync",
        SYNC_WAIT,
        || async {
            let app = lv.hub_app().await?.unwrap_or_default();
            let (sync, _, rev) = sync_state(&app);
            Ok::<_, anyhow::Error>((sync == "OutOfSync" && rev == rev2).then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    let greeting = |cm: ConfigMap| cm.data.unwrap_or_default().get("greeting").cloned();
    assert_eq!(
        greeting(spoke_cms.get("demo-config").await?).as_deref(),
        Some(GREETING),
        "a manual app is not synced by itself"
    );

    // `argocd app diff`: exit code 1 and the change (live on the spoke against Git).
    let diff = server.cli_run(&["app", "diff", &app_ref], CLI_WAIT).await?;
    assert_eq!(diff.code, Some(1), "{diff:?}\n{}", logs());
    assert!(
        diff.stdout.contains(GREETING) && diff.stdout.contains(CHANGED_GREETING),
        "{diff:?}"
    );

    // `argocd app sync`: the new revision is synced on the spoke and the hub shows it.
    lv.cli(&["app", "sync", &app_ref, "--timeout", "120"])
        .await?;
    wait_synced(
        &lv.hub_apps,
        "ops",
        &rev2,
        "the manual sync on the hub",
        logs,
    )
    .await?;
    assert_eq!(
        greeting(spoke_cms.get("demo-config").await?).as_deref(),
        Some(CHANGED_GREETING)
    );
    let spoke_app = lv.spoke_app().await?.unwrap_or_default();
    assert_eq!(
        spoke_app
            .pointer("/status/operationState/syncResult/revision")
            .and_then(Value::as_str),
        Some(rev2.as_str()),
        "{spoke_app}"
    );

    // Events: the Application's (argocd-server records the user's sync on the hub) and one
    // resource's, listed on the spoke through the resource proxy. Nothing on these clusters
    // emits events about a ConfigMap, so the test writes one as any controller would.
    let (status, body) = server
        .api_get(
            &format!("/api/v1/applications/ops/events?appNamespace={agent_name}"),
            &token,
        )
        .await?;
    assert_eq!(status, 200, "app events: {body}\n{}", logs());
    assert!(body.contains("initiated sync"), "{body}");
    record_demo_event(&lv.spoke_client, dest, "demo-config.e2e", &spoke_uid).await?;
    let (status, body) = server
        .api_get(
            &format!(
                "/api/v1/applications/ops/events?appNamespace={agent_name}\
                 &resourceNamespace={dest}&resourceName=demo-config&resourceUID={spoke_uid}"
            ),
            &token,
        )
        .await?;
    assert_eq!(status, 200, "resource events: {body}\n{}", logs());
    assert!(body.contains("GreetingRead"), "{body}");

    // `argocd app terminate-op`: a sync held up by a PreSync hook that never completes, ended
    // from the hub; the spoke's operation ends terminated and the hub shows it.
    lv.git
        .commit("apps", "demo", &files(CHANGED_GREETING, true), "hook")?;
    lv.cli(&["app", "sync", &app_ref, "--async"]).await?;
    let spoke_jobs = Api::<Job>::namespaced(lv.spoke_client.clone(), dest);
    wait_until(
        "the sync to run on the spoke, waiting for its hook",
        SYNC_WAIT,
        || async {
            let hook = spoke_jobs.get_opt("demo-presync").await?;
            let hub = lv.hub_app().await?.unwrap_or_default();
            Ok::<_, anyhow::Error>(
                (hook.is_some() && operation_state(&hub).0 == "Running").then_some(()),
            )
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    lv.cli(&["app", "terminate-op", &app_ref]).await?;
    wait_until(
        "the spoke's and the hub's operation to end terminated",
        SYNC_WAIT,
        || async {
            let spoke = lv.spoke_app().await?.unwrap_or_default();
            let hub = lv.hub_app().await?.unwrap_or_default();
            Ok::<_, anyhow::Error>(
                (operation_terminated(&spoke) && operation_terminated(&hub)).then_some(()),
            )
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;

    // A resource action: `restart` patches the spoke's Deployment through the resource proxy.
    let deployments = Api::<Deployment>::namespaced(lv.spoke_client.clone(), dest);
    lv.cli(&[
        "app",
        "actions",
        "run",
        &app_ref,
        "restart",
        "--kind",
        "Deployment",
        "--resource-name",
        "demo-web",
    ])
    .await?;
    let restarted = deployments
        .get("demo-web")
        .await?
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    assert!(
        restarted.contains_key("kubectl.kubernetes.io/restartedAt"),
        "{restarted:?}"
    );

    // `argocd app delete-resource`: one resource deleted on the spoke through the resource proxy
    // (`--force` = background propagation; the default, foreground, waits for a garbage
    // collector these clusters do not run).
    lv.cli(&[
        "app",
        "delete-resource",
        &app_ref,
        "--kind",
        "ServiceAccount",
        "--resource-name",
        "demo",
        "--force",
    ])
    .await?;
    let service_accounts = Api::<ServiceAccount>::namespaced(lv.spoke_client.clone(), dest);
    wait_until(
        "the ServiceAccount to be gone from the spoke",
        Duration::from_secs(30),
        || async {
            Ok::<_, anyhow::Error>(
                service_accounts
                    .get_opt("demo")
                    .await?
                    .is_none()
                    .then_some(()),
            )
        },
    )
    .await?;

    // `argocd app delete --cascade`: the spoke's resources and Application go, then the hub's.
    lv.cli(&[
        "app",
        "delete",
        &app_ref,
        "--cascade",
        "--propagation-policy",
        "background",
        "--yes",
    ])
    .await?;
    wait_until(
        "the app and its resources to be gone from spoke and hub",
        SYNC_WAIT,
        || async {
            let gone = spoke_cms.get_opt("demo-config").await?.is_none()
                && deployments.get_opt("demo-web").await?.is_none()
                && lv.spoke_app().await?.is_none()
                && lv.hub_app().await?.is_none();
            Ok::<_, anyhow::Error>(gone.then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    println!("hub operations on a spoke's app: {:?}", started.elapsed());
    Ok(())
}

// The web terminal. Exec runs for real from argocd-server to the spoke's real kube-apiserver:
// argocd-server's client-go WebSocket executor → our principal's resource proxy
// (`pods/{pod}/exec`, `v5.channel.k8s.io`) → `TerminalStreamService.StreamTerminal` → our agent →
// the spoke apiserver's `pods/{pod}/exec` → a kubelet. The one stand-in is that kubelet
// (`e2e::kubelet`: the planes run none): it runs the shell as a host process instead of in a
// container, and reports the pod Running, as a kubelet writes.

impl LiveView {
    /// A client of our principal's resource proxy as the agent's cluster, authenticated as the
    /// hub's cluster Secret is (the agent's client certificate): what argocd-server uses.
    async fn proxy_client(&self) -> anyhow::Result<kube::Client> {
        let (cert, key) = self.pki.agent_files(&self.agent_name);
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
            "clusters": [{"name": "proxy", "cluster": {
                "server": format!(
                    "https://127.0.0.1:{}",
                    pod_port(&self.principal, "resource-proxy")
                ),
                "certificate-authority": self.pki.ca()}}],
            "users": [{"name": "argocd", "user": {"client-certificate": cert, "client-key": key}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "argocd"}}],
        });
        let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }
}

/// `argocd app logs` on the hub shows the log of a pod of an app on the spoke, and with `--follow`
/// the lines written while it runs, until the CLI is stopped (which ends the follow on the spoke).
/// The hub's
/// argocd-server opens a web terminal into that pod: a command's
/// output comes back, stderr too, a resize reaches the kubelet, and closing the browser's socket
/// ends the shell on the spoke. A terminal left idle is ended by our principal (and its shell).
/// An exec into a pod Argo CD does not manage, asked of the resource proxy directly, is refused
/// (403, the agent's read of the pod) before any kubelet sees it; with the agent gone, the
/// principal refuses at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_app_logs_and_web_terminal_reach_a_pod_on_the_spoke_through_our_principal_and_agent(
) -> anyhow::Result<()> {
    // Access tokens last 2 s: the agent's stream outlives its token long before the first
    // terminal opens, so each StreamTerminal call needs a token refreshed for it.
    let mut lv = LiveView::start_with(
        "real_terminal",
        "term",
        ChartValues {
            principal: "  accessTokenLifetime: 2s\n",
            agent: "terminal: {enabled: true}\n",
            ..ChartValues::default()
        },
    )
    .await?;
    let planes = shared_planes().await;
    let kubelet = FakeKubelet::start(&planes.spokes[0], &lv._ctx.unique("node")).await?;
    let mut files = demo_manifests(GREETING);
    files.push(("pod.yaml", demo_pod("web-1", &kubelet.node)));
    let revision = lv.git.commit("apps", "demo", &files, "demo with a pod")?;
    lv.create_demo_app(&revision).await?;
    kubelet
        .report_running(&lv.spoke_client, &lv.dest, "web-1")
        .await?;

    // `argocd app logs` on the hub: argocd-server reads the pod's log through our principal's
    // resource proxy and our agent's StreamLogs call (with the timestamps it asks for, which it
    // removes for the CLI).
    let app_ref = lv.app_ref();
    let logs = lv
        .cli(&[
            "app", "logs", &app_ref, "--kind", "Pod", "--name", "web-1", "-c", "web", "--tail", "2",
        ])
        .await?;
    assert_eq!(
        logs.lines().collect::<Vec<_>>(),
        ["web line 019", "web line 020"],
        "{logs}"
    );
    assert!(
        kubelet
            .last_query()
            .is_some_and(|q| q.contains("tailLines=2") && q.contains("timestamps=true")),
        "{:?}",
        kubelet.last_query()
    );

    // `argocd app logs --follow` on the hub: the history, then the lines the container writes
    // while the user watches; stopping the CLI ends the follow at the spoke's kubelet.
    let mut follow = lv
        .server
        .cli_command(&[
            "app", "logs", &app_ref, "--kind", "Pod", "--name", "web-1", "-c", "web", "--tail",
            "1", "--follow",
        ])?
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut followed = tokio::io::BufReader::new(follow.stdout.take().expect("piped stdout"));
    let mut seen = Vec::new();
    let wait = Duration::from_secs(30);
    let picked_up = tokio::time::timeout(wait, async {
        use tokio::io::AsyncBufReadExt;
        let mut line = String::new();
        while followed.read_line(&mut line).await? > 0 {
            seen.push(line.trim_end().to_string());
            line.clear();
            if seen.iter().any(|l| l == "web live 3") {
                return Ok::<_, anyhow::Error>(());
            }
        }
        anyhow::bail!("the CLI ended its follow by itself")
    })
    .await;
    if !matches!(picked_up, Ok(Ok(()))) {
        let _ = follow.kill().await;
        let out = follow.wait_with_output().await?;
        anyhow::bail!(
            "{picked_up:?}: `argocd app logs --follow` printed {seen:?} ({})\n{}",
            String::from_utf8_lossy(&out.stderr),
            lv.logs()
        );
    }
    assert_eq!(
        seen[..2],
        ["web line 020", "web live 1"],
        "the last line of history, then the new ones: {seen:?}"
    );
    assert_eq!(
        kubelet
            .stats
            .follows_open
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    follow.kill().await?;
    wait_until(
        "the follow to end at the spoke's kubelet after the CLI stopped",
        wait,
        || async {
            use std::sync::atomic::Ordering::SeqCst;
            let stats = &kubelet.stats;
            Ok::<_, anyhow::Error>(
                (stats.follows_closed.load(SeqCst) == 1 && stats.follows_open.load(SeqCst) == 0)
                    .then_some(()),
            )
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", lv.logs()))?;

    enable_exec(&planes.hub.client().await?, &lv.server).await?;
    let token = lv.server.session_token().await?;
    let port = lv.server.server_port.expect("argocd-server has a port");
    let target = TerminalTarget {
        pod: "web-1".into(),
        container: "web".into(),
        namespace: lv.dest.clone(),
        app: lv.app.clone(),
        app_namespace: lv.agent_name.clone(),
        project: "default".into(),
        shell: "bash".into(),
    };
    let mut term = open_once_enabled(port, &token, &target)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", lv.logs()))?;
    check_shell_session(&mut term, &kubelet, &target, wait)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", lv.logs()))?;

    // The browser goes away: the shell on the spoke ends (argocd-server types Ctrl-D, then ends
    // its stdin).
    term.close().await;
    kubelet
        .wait_execs_ended(1, "the shell ended after the browser left", wait)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", lv.logs()))?;

    // Idle: after the last output, nothing either way; the principal ends the session.
    let mut term = Terminal::open(port, &token, &target).await?;
    term.input("echo still-here\n").await?;
    term.read_until("still-here", wait).await?;
    let quiet_since = Instant::now();
    term.wait_closed(TERMINAL_IDLE + wait).await?;
    let quiet = quiet_since.elapsed();
    assert!(
        quiet >= TERMINAL_IDLE - Duration::from_millis(500),
        "closed after {quiet:?}, before the idle timeout {TERMINAL_IDLE:?}"
    );
    kubelet
        .wait_execs_ended(2, "the idle shell ended on the spoke", wait)
        .await?;
    assert!(
        kubelet
            .stats
            .execs_killed
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 1,
        "the idle shell was killed: its session ended with the process still running"
    );

    // A pod Argo CD does not manage, in the same namespace: the agent refuses the exec.
    let stray: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(serde_norway::from_str::<Value>(&demo_pod(
            "stray-1",
            &kubelet.node,
        ))?)?;
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(lv.spoke_client.clone(), &lv.dest)
        .create(&PostParams::default(), &stray)
        .await?;
    kubelet
        .report_running(&lv.spoke_client, &lv.dest, "stray-1")
        .await?;
    let proxy = lv.proxy_client().await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(proxy, &lv.dest);
    let params = kube::api::AttachParams::default()
        .container("web")
        .stdout(true)
        .stderr(false);
    let refused = match pods
        .exec("stray-1", ["sh", "-c", "echo leaked"], &params)
        .await
    {
        Ok(_) => anyhow::bail!("an exec into a pod Argo CD does not manage was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        refused.contains("not managed by Argo CD") && refused.contains("403"),
        "the refusal says why: {refused}"
    );
    assert_eq!(
        kubelet.stats.execs.lock().unwrap().len(),
        2,
        "no exec reached the kubelet for the stray pod"
    );

    // The agent is gone: the resource proxy refuses the exec before upgrading.
    lv.agent.process.stop();
    // (While its stream is going down, an exec may still be sent and fail otherwise.)
    let last = std::sync::Mutex::new(String::new());
    wait_until(
        "the exec refused as the agent is not connected",
        wait,
        || async {
            let e = match pods.exec("web-1", ["true"], &params).await {
                Err(e) => e.to_string(),
                Ok(_) => "the exec was accepted".to_string(),
            };
            let refused = e.contains("not connected");
            *last.lock().unwrap() = e;
            Ok::<_, anyhow::Error>(refused.then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: {}", last.lock().unwrap()))?;
    Ok(())
}

// The hub's view against the spoke's own. A second argocd-server runs on the spoke, on the spoke's
// own Argo CD (its Redis, its namespace, the Application's spoke copy): what a user of that cluster
// would see without us. Both servers are asked the same questions through the same REST API and
// their answers compared field by field.

/// The fields of two answers that differ: the JSON patch operations turning `spoke` into `hub`,
/// each with the spoke's value at its path (empty: the same).
fn differences(spoke: &Value, hub: &Value) -> Vec<String> {
    json_patch::diff(spoke, hub)
        .0
        .iter()
        .map(|op| {
            let op = serde_json::to_value(op).unwrap_or_default();
            let path = op["path"].as_str().unwrap_or_default();
            format!(
                "{op} (spoke: {})",
                spoke.pointer(path).unwrap_or(&Value::Null)
            )
        })
        .collect()
}

/// What must differ between the hub's and the spoke's answer about the same Application, removed:
/// - the object's identity and bookkeeping in `metadata` (`namespace`, `uid`, `resourceVersion`,
///   `generation`, `creationTimestamp`, `managedFields`): the hub's Application and its spoke copy
///   are two objects in two apiservers, written by different managers;
/// - the annotations `argocd.argoproj.io/source-uid` and `argocd.argoproj.io/principal-uid`, which
///   the agent puts on the spoke copy to name the hub object and the principal it copies from
///   (upstream's protocol);
/// - `spec.destination`: the hub's Application targets the agent's cluster by name, the spoke copy
///   the spoke's own in-cluster server (the agent rewrites it so: destination mapping).
///
/// `status` is compared whole: the hub's is the spoke's, as the agent sent it.
fn comparable_application(app: &Value) -> Value {
    let mut app = app.clone();
    if let Some(meta) = app.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in [
            "namespace",
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "managedFields",
        ] {
            meta.remove(field);
        }
        if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.remove(SOURCE_UID_ANNOTATION);
            annotations.remove(PRINCIPAL_UID_ANNOTATION);
            if annotations.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    if let Some(spec) = app.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("destination");
    }
    app
}

/// Makes one kind of answer comparable between hub and spoke.
type Comparable = fn(&Value) -> Value;

/// `GET /api/v1/applications/<app><path>` of `server` for the Application in `namespace`, as JSON.
async fn ask_about(
    server: &ArgoCd,
    token: &str,
    namespace: &str,
    app: &str,
    path: &str,
) -> anyhow::Result<Value> {
    let sep = if path.contains('?') { '&' } else { '?' };
    let url = format!("/api/v1/applications/{app}{path}{sep}appNamespace={namespace}");
    let (status, body) = server.api_get(&url, token).await?;
    anyhow::ensure!(status == 200, "GET {url}: {status} {body}");
    Ok(serde_json::from_str(&body)?)
}

/// The nearest-rank p50 and p99 of `samples`, for printing.
fn p50_p99(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (
        e2e::bench::percentile(&samples, 0.5),
        e2e::bench::percentile(&samples, 0.99),
    )
}

/// The hub's argocd-server, through our principal and agent, answers for an Application on the
/// spoke what the spoke's own argocd-server answers: the Application (sync, health, resources,
/// operation), its resource tree, managed resources (live and target state), a live manifest and
/// a resource's events — equal field by field, but for what must differ (see
/// [`comparable_application`]); and `argocd app manifests --source live` and `argocd app
/// resources` print the same text. Prints the p50/p99 of a hub `argocd app get` and resource-tree
/// read against the same calls on the spoke's own server, measured in this run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_argocd_answers_about_an_app_what_the_spokes_own_argocd_server_answers(
) -> anyhow::Result<()> {
    let lv = LiveView::start("real_live_same", "same").await?;
    let revision = lv
        .git
        .commit("apps", "demo", &demo_manifests(GREETING), "demo")?;
    lv.create_demo_app(&revision).await?;
    let planes = shared_planes().await;
    let spoke_server = ArgoCd::start_server(
        &format!("{}-spoke", lv._ctx.suffix),
        &lv._ctx.dir,
        &planes.spokes[0],
        &lv.spoke_argocd.namespace,
        lv.spoke_argocd
            .redis_endpoint()
            .expect("a spoke Argo CD has a Redis"),
    )
    .await?;
    let (hub_token, spoke_token) = (
        lv.server.session_token().await?,
        spoke_server.session_token().await?,
    );
    let (agent_name, dest, app) = (&lv.agent_name, &lv.dest, &lv.app);
    let spoke_ns = &lv.spoke_argocd.namespace;
    let uid = demo_config_uid(&lv.spoke_client, dest).await?;
    record_demo_event(&lv.spoke_client, dest, "demo-config.same", &uid).await?;

    // (what, path after /api/v1/applications/<app>, how to make an answer comparable)
    let resource_query =
        format!("namespace={dest}&resourceName=demo-config&version=v1&kind=ConfigMap&group=");
    let questions: [(&str, String, Comparable); 5] = [
        ("the Application", String::new(), comparable_application),
        ("the resource tree", "/resource-tree".into(), Value::clone),
        (
            "the managed resources",
            "/managed-resources".into(),
            Value::clone,
        ),
        (
            "a live manifest",
            format!("/resource?{resource_query}"),
            Value::clone,
        ),
        (
            "a resource's events",
            format!("/events?resourceNamespace={dest}&resourceName=demo-config&resourceUID={uid}"),
            Value::clone,
        ),
    ];
    let ask = |server, token, namespace, path| ask_about(server, token, namespace, app, path);
    for (what, path, comparable) in &questions {
        // The hub's status is a copy that follows the spoke's: wait until they agree.
        let last = std::sync::Mutex::new(Vec::new());
        let agreed = wait_until(
            &format!("the hub and the spoke to agree on {what}"),
            Duration::from_secs(60),
            || async {
                let spoke = comparable(&ask(&spoke_server, &spoke_token, spoke_ns, path).await?);
                let hub = comparable(&ask(&lv.server, &hub_token, agent_name, path).await?);
                let diff = differences(&spoke, &hub);
                let same = diff.is_empty();
                *last.lock().unwrap() = diff;
                Ok::<_, anyhow::Error>(same.then_some(spoke))
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}: {:#?}\n{}", last.lock().unwrap(), lv.logs()))?;
        // Not two empty answers: the positive control.
        let text = agreed.to_string();
        assert!(
            text.contains("demo-config") || text.contains(GREETING),
            "{what}: {agreed}"
        );
    }

    // What the CLI prints from those answers: the live manifests and the resource list, the same
    // text on both servers.
    for (command, flags) in [
        ("manifests", &["--source", "live"][..]),
        ("resources", &[][..]),
    ] {
        let mut printed = Vec::new();
        for (server, namespace) in [(&spoke_server, spoke_ns), (&lv.server, agent_name)] {
            let app_ref = format!("{namespace}/{app}");
            let mut args = vec!["app", command, app_ref.as_str()];
            args.extend(flags);
            printed.push(server.cli_run(&args, CLI_WAIT).await?.success()?);
        }
        assert!(printed[0].contains("demo-config"), "{}", printed[0]);
        assert_eq!(
            printed[1], printed[0],
            "`argocd app {command}` on the hub and on the spoke"
        );
    }

    // Timings, one run, hub against spoke: `argocd app get` (the CLI's whole round trip) and the
    // resource-tree read.
    const CALLS: usize = 50;
    let mut report = Vec::new();
    for (side, server, token, namespace) in [
        ("spoke", &spoke_server, &spoke_token, spoke_ns),
        ("hub", &lv.server, &hub_token, agent_name),
    ] {
        let app_ref = format!("{namespace}/{app}");
        let (mut gets, mut trees) = (Vec::new(), Vec::new());
        for _ in 0..CALLS {
            let started = Instant::now();
            server
                .cli_run(&["app", "get", &app_ref], CLI_WAIT)
                .await?
                .success()?;
            gets.push(started.elapsed());
            let started = Instant::now();
            ask(server, token, namespace, "/resource-tree").await?;
            trees.push(started.elapsed());
        }
        let (get50, get99) = p50_p99(gets);
        let (tree50, tree99) = p50_p99(trees);
        report.push(format!(
            "{side}: `argocd app get` p50 {get50:?} p99 {get99:?}; resource-tree p50 {tree50:?} \
             p99 {tree99:?} (n={CALLS} each)"
        ));
    }
    println!("hub (through our principal and agent) against the spoke's own argocd-server:");
    for line in report {
        println!("  {line}");
    }
    Ok(())
}
