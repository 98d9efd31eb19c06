//! The real test ground, each peer proven on its own and then together with ours: real Argo CD
//! (application-controller + repo-server with a password-protected Redis) syncing an app from a
//! local Git server on a spoke; then the interop matrix, every scenario run in every pairing of
//! {our, upstream} principal × {our, upstream} agent with the spoke's real Argo CD syncing from Git:
//! managed (hub → spoke: create, update, drift revert, refresh, delete with cascade, AppProject and
//! repository Secret, the GPG keys ConfigMap, resync after an agent restart, a sync and its
//! terminate requested with the `argocd` CLI through the hub's real argocd-server) and autonomous
//! (spoke → hub mirror: create, update, delete, with the real status); and the live view: the
//! resource proxy (kubectl discovery, version, logs and exec; our principal's web terminal caps)
//! and the Redis proxy (the hub's real argocd-server reading the resource tree). Nobody here
//! writes what Argo CD or an agent would write.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use e2e::argocd::{ArgoCd, RedisEndpoint};
use e2e::argocd_terminal::{check_shell_session, enable_exec, open_once_enabled, TerminalTarget};
use e2e::gateway::{
    agentctl, application_resource, appproject_resource, ensure_namespace, text, Agent, Pki,
};
use e2e::git_server::{demo_manifests, GitServer, PRESYNC_HOOK_JOB};
use e2e::http1_proxy::Http1Proxy;
use e2e::kubelet::FakeKubelet;
use e2e::redis::resp_exchange;
use e2e::scenario::{
    self, operation_state, operation_terminated, register_agent_cluster, wait_greeting,
    wait_synced, SYNC_WAIT,
};
use e2e::sides::{AnyAgent, AnyPrincipal, Mode, Side};
use e2e::{shared_planes, wait_until, ControlPlane, Redis, TestContext};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::{json, Value};

const IN_CLUSTER: &str = "https://kubernetes.default.svc";

/// The demo Application with an in-cluster destination namespace (the cluster that runs it).
fn demo_application(
    name: &str,
    namespace: &str,
    repo_url: &str,
    dest_namespace: &str,
) -> DynamicObject {
    scenario::demo_application(
        name,
        namespace,
        repo_url,
        json!({"server": IN_CLUSTER, "namespace": dest_namespace}),
    )
}

#[tokio::test]
async fn argocd_syncs_a_git_app_on_a_spoke() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let spoke = &planes.spokes[0];
    let ctx = TestContext::new("argocd_syncs_a_git_app_on_a_spoke")?;
    let git = GitServer::start(&ctx.unique("git"))?;
    let first = git.commit("apps", "demo", &demo_manifests("hello"), "demo v1")?;
    let ns = ctx.unique("argocd");
    let argocd = ArgoCd::start_spoke(&ctx.suffix, &ctx.dir, spoke, &ns, &[]).await?;
    let dest = ctx.unique("demo");
    ensure_namespace(&spoke.client().await?, &dest).await?;

    let apps: Api<DynamicObject> =
        Api::namespaced_with(spoke.client().await?, &ns, &application_resource());
    apps.create(
        &PostParams::default(),
        &demo_application("demo", &ns, &git.url("apps"), &dest),
    )
    .await?;
    wait_greeting(spoke, &dest, "hello")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd.log_tails(40)))?;
    wait_synced(
        &apps,
        "demo",
        &first,
        "demo Synced+Healthy at the first commit",
        || argocd.log_tails(20),
    )
    .await?;

    // A new commit is picked up and applied by the controller on its own (automated sync).
    let second = git.commit("apps", "demo", &demo_manifests("again"), "demo v2")?;
    wait_greeting(spoke, &dest, "again")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd.log_tails(40)))?;
    wait_synced(
        &apps,
        "demo",
        &second,
        "demo Synced+Healthy at the second commit",
        || argocd.log_tails(20),
    )
    .await?;
    Ok(())
}

// ---- the interop matrix ------------------------------------------------------------------------
//
// Every scenario below is written once as a function of (principal side, agent side, mode) and run
// in every cell of {our, upstream} principal × {our, upstream} agent by `cells!`. A cell starts
// its own principal, agent, Git server and (where the scenario syncs) the spoke's real Argo CD in
// namespaces of its own on the shared planes.

/// One cell of the matrix, running: hub namespaces (principal's, and the agent's = its name),
/// the principal, the spoke's Argo CD (optional) and the agent, a Git server with the demo app.
struct Cell {
    ctx: TestContext,
    pki: Pki,
    mode: Mode,
    /// The agent's name: its certificate CN and its hub namespace.
    name: String,
    principal_ns: String,
    spoke_ns: String,
    /// The spoke namespace the demo app deploys into.
    dest: String,
    spoke: &'static ControlPlane,
    hub_client: kube::Client,
    git: GitServer,
    /// The commit of the demo app's first version (path `demo`, greeting `v1`).
    first: String,
    argocd: Option<ArgoCd>,
    principal: AnyPrincipal,
    agent: AnyAgent,
    /// Applications in the agent's hub namespace.
    hub_apps: Api<DynamicObject>,
    /// Applications in the agent's Argo CD namespace on the spoke.
    spoke_apps: Api<DynamicObject>,
    /// Held while an upstream principal's resource proxy has the machine's one port for it.
    _resource_proxy_port: Option<e2e::upstream::FixedPortHold>,
    /// With [`Proxies::Redis`]: the hub's argocd-server, whose Redis is the principal's Redis
    /// proxy, and the password-protected hub Redis behind that proxy.
    hub_view: Option<HubView>,
    /// With [`CellOptions::http1_proxy`]: the HTTP/1.1-only nginx the agent reaches the
    /// principal through.
    http1_proxy: Option<Http1Proxy>,
}

/// How a cell is started beyond its sides and mode.
#[derive(Default)]
struct CellOptions<'a> {
    /// The spoke runs Argo CD (application-controller, repo-server, Redis).
    with_argocd: bool,
    /// Added to the agent's command line.
    agent_args: &'a [&'a str],
    /// Added to the principal's command line.
    principal_args: &'a [&'a str],
    /// The principal's live-view proxies the cell uses.
    proxies: Proxies,
    /// The agent reaches the principal through an HTTP/1.1-only nginx ([`Http1Proxy`]).
    http1_proxy: bool,
}

/// Which of the principal's live-view proxies a cell serves beyond the event stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Proxies {
    /// None: an upstream principal runs with both off.
    #[default]
    None,
    /// The resource proxy (see [`e2e::upstream::hold_resource_proxy_port`]).
    Resource,
    /// The Redis proxy in front of a password-protected hub Redis, with the hub's real
    /// argocd-server using it (see [`e2e::upstream::hold_redis_proxy_port`]); the agent reads the
    /// spoke Argo CD's password-protected Redis. And the resource proxy, through which that
    /// argocd-server reaches the agent's cluster (see [`Cell::register_cluster_on_hub`]).
    Redis,
}

/// How a cell's agent reaches its principal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    /// Straight, native gRPC.
    Http2,
    /// Both ends with `--enable-websocket`, through an HTTP/1.1-only nginx ([`Http1Proxy`]).
    WebSocketProxy,
}

impl Link {
    /// `options` with this link's flags and proxy.
    fn apply(self, options: CellOptions<'static>) -> CellOptions<'static> {
        match self {
            Link::Http2 => options,
            Link::WebSocketProxy => CellOptions {
                principal_args: &["--enable-websocket"],
                agent_args: &["--enable-websocket"],
                http1_proxy: true,
                ..options
            },
        }
    }
}

/// The hub side of a [`Proxies::Redis`] cell.
struct HubView {
    server: ArgoCd,
    hub_redis: Redis,
    /// Held while an upstream principal's Redis proxy has the machine's one port for it.
    _redis_proxy_port: Option<e2e::upstream::FixedPortHold>,
}

impl Cell {
    async fn start(
        scenario: &str,
        principal: Side,
        agent: Side,
        mode: Mode,
        with_argocd: bool,
    ) -> anyhow::Result<Cell> {
        Cell::start_with(scenario, principal, agent, mode, with_argocd, &[]).await
    }

    /// [`Cell::start`] with `agent_args` added to the agent's command line.
    async fn start_with(
        scenario: &str,
        principal: Side,
        agent: Side,
        mode: Mode,
        with_argocd: bool,
        agent_args: &[&str],
    ) -> anyhow::Result<Cell> {
        let options = CellOptions {
            with_argocd,
            agent_args,
            ..CellOptions::default()
        };
        Cell::start_full(scenario, principal, agent, mode, options).await
    }

    /// A managed cell without Argo CD whose principal serves the resource proxy: ours always does;
    /// an upstream principal gets it switched on (see [`e2e::upstream::hold_resource_proxy_port`]);
    /// the agent reaches the principal over `link`.
    async fn start_live(
        scenario: &str,
        principal: Side,
        agent: Side,
        link: Link,
    ) -> anyhow::Result<Cell> {
        let options = link.apply(CellOptions {
            proxies: Proxies::Resource,
            ..CellOptions::default()
        });
        Cell::start_full(scenario, principal, agent, Mode::Managed, options).await
    }

    /// A managed cell with the spoke's Argo CD and the hub's argocd-server reading through the
    /// principal's Redis proxy ([`Proxies::Redis`]).
    async fn start_hub_view(scenario: &str, principal: Side, agent: Side) -> anyhow::Result<Cell> {
        Cell::start_hub_view_in(scenario, principal, agent, Mode::Managed).await
    }

    /// [`Cell::start_hub_view`] with the agent in `mode`.
    async fn start_hub_view_in(
        scenario: &str,
        principal: Side,
        agent: Side,
        mode: Mode,
    ) -> anyhow::Result<Cell> {
        let options = CellOptions {
            with_argocd: true,
            proxies: Proxies::Redis,
            ..CellOptions::default()
        };
        Cell::start_full(scenario, principal, agent, mode, options).await
    }

    async fn start_full(
        scenario: &str,
        principal: Side,
        agent: Side,
        mode: Mode,
        options: CellOptions<'_>,
    ) -> anyhow::Result<Cell> {
        let CellOptions {
            with_argocd,
            agent_args,
            principal_args: extra_principal_args,
            proxies,
            http1_proxy,
        } = options;
        let planes = shared_planes().await;
        // Managed cells on one spoke, autonomous ones on the other: spreads the Argo CD load.
        let (hub, spoke) = match mode {
            Mode::Managed => (&planes.hub, &planes.spokes[1]),
            Mode::Autonomous => (&planes.hub, &planes.spokes[0]),
        };
        let test = format!("{scenario}_{principal:?}_principal_{agent:?}_agent").to_lowercase();
        let ctx = TestContext::new(&test)?;
        let pki = Pki::create(&ctx.dir.join("pki"))?;
        let name = ctx.unique("agent");
        pki.issue_agent(&name)?;
        let git = GitServer::start(&ctx.unique("git"))?;
        let first = git.commit("apps", "demo", &demo_manifests("v1"), "demo v1")?;

        // Hub: the principal's namespace with the default project every agent gets, and the
        // agent's namespace holding its Applications (or their mirrors).
        let hub_client = hub.client().await?;
        let principal_ns = ctx.unique("hub-argocd");
        ensure_namespace(&hub_client, &principal_ns).await?;
        ensure_namespace(&hub_client, &name).await?;
        let projects: Api<DynamicObject> =
            Api::namespaced_with(hub_client.clone(), &principal_ns, &appproject_resource());
        projects
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                    "metadata": {"name": "default", "namespace": principal_ns},
                    "spec": {"sourceRepos": ["*"], "sourceNamespaces": ["*"],
                             "destinations": [{"server": "*", "namespace": "*", "name": "*"}],
                             "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]},
                }))?,
            )
            .await?;
        if mode == Mode::Autonomous {
            register_agent_cluster(&hub_client, &principal_ns, &name).await?;
        }

        let spoke_ns = ctx.unique("argocd");
        let argocd = if with_argocd {
            Some(ArgoCd::start_spoke(&ctx.suffix, &ctx.dir, spoke, &spoke_ns, &[]).await?)
        } else {
            None
        };
        let dest = ctx.unique("demo");
        ensure_namespace(&spoke.client().await?, &dest).await?;

        let (resource_proxy_port, mut principal_args) = match (principal, proxies) {
            // The resource proxy's port first, always: a Redis cell holds both.
            (Side::Upstream, Proxies::Resource | Proxies::Redis) => (
                Some(e2e::upstream::hold_resource_proxy_port().await?),
                e2e::upstream::resource_proxy_args(&pki),
            ),
            _ => (None, Vec::new()),
        };
        principal_args.extend(extra_principal_args.iter().map(|a| a.to_string()));
        let mut agent_args: Vec<String> = agent_args.iter().map(|a| a.to_string()).collect();
        let hub_redis = match proxies {
            Proxies::Redis => {
                let redis = Redis::start_as_hub(
                    &ctx.unique("hub-redis"),
                    &ctx.dir.join("hub-redis-creds"),
                )?;
                let port = match principal {
                    Side::Ours => {
                        principal_args.extend(redis.principal_flags());
                        None
                    }
                    Side::Upstream => {
                        principal_args.extend(e2e::upstream::redis_proxy_args(&redis));
                        Some(e2e::upstream::hold_redis_proxy_port().await?)
                    }
                };
                // Upstream's agent is given the spoke Redis by `AnyAgent::start`; ours by flags.
                let spoke_redis = argocd
                    .as_ref()
                    .and_then(ArgoCd::redis_endpoint)
                    .ok_or_else(|| anyhow::anyhow!("a Redis cell runs the spoke's Argo CD"))?;
                if agent == Side::Ours {
                    agent_args.push(format!("--redis-address={}", spoke_redis.address));
                    if let Some(password) = &spoke_redis.password {
                        agent_args.push(format!("--redis-password={password}"));
                    }
                }
                Some((redis, port))
            }
            Proxies::None | Proxies::Resource => None,
        };
        let agent_args: Vec<&str> = agent_args.iter().map(String::as_str).collect();
        let principal_args: Vec<&str> = principal_args.iter().map(String::as_str).collect();
        let principal = AnyPrincipal::start(
            principal,
            &ctx.suffix,
            &ctx.dir,
            hub,
            &pki,
            &principal_ns,
            &principal_args,
        )
        .await?;
        let http1_proxy = if http1_proxy {
            Some(Http1Proxy::start(&ctx.suffix, &ctx.dir, &principal.address(), &pki, &name).await?)
        } else {
            None
        };
        let agent = AnyAgent::start(
            agent,
            &name,
            &ctx.dir,
            spoke,
            &pki,
            &http1_proxy
                .as_ref()
                .map_or_else(|| principal.address(), Http1Proxy::address),
            mode,
            &spoke_ns,
            argocd.as_ref(),
            &agent_args,
        )
        .await?;
        let hub_view = match hub_redis {
            Some((redis, port)) => {
                let proxy = match &principal {
                    AnyPrincipal::Ours(p) => format!("127.0.0.1:{}", p.redis_proxy_port),
                    AnyPrincipal::Upstream(_) => {
                        format!("127.0.0.1:{}", e2e::upstream::REDIS_PROXY_PORT)
                    }
                };
                let server = ArgoCd::start_server(
                    &ctx.suffix,
                    &ctx.dir,
                    hub,
                    &principal_ns,
                    RedisEndpoint {
                        address: proxy,
                        password: redis.password.clone(),
                        tls_ca: None,
                    },
                )
                .await?;
                Some(HubView {
                    server,
                    hub_redis: redis,
                    _redis_proxy_port: port,
                })
            }
            None => None,
        };
        let hub_apps = Api::namespaced_with(hub_client.clone(), &name, &application_resource());
        let spoke_apps =
            Api::namespaced_with(spoke.client().await?, &spoke_ns, &application_resource());
        Ok(Cell {
            ctx,
            pki,
            mode,
            name,
            principal_ns,
            spoke_ns,
            dest,
            spoke,
            hub_client,
            git,
            first,
            argocd,
            principal,
            agent,
            hub_apps,
            spoke_apps,
            _resource_proxy_port: resource_proxy_port,
            hub_view,
            http1_proxy,
        })
    }

    /// The port of the principal's resource proxy on 127.0.0.1.
    fn resource_proxy_port(&self) -> anyhow::Result<u16> {
        Ok(match &self.principal {
            AnyPrincipal::Ours(principal) => principal.resource_proxy_port,
            AnyPrincipal::Upstream(_) => {
                anyhow::ensure!(
                    self._resource_proxy_port.is_some(),
                    "start the cell with Cell::start_live or Cell::start_hub_view: the upstream \
                     principal's resource proxy is off"
                );
                e2e::upstream::RESOURCE_PROXY_PORT
            }
        })
    }

    /// The agent's Argo CD cluster Secret on the hub, as `argocd-agentctl agent create` makes
    /// it: its server is the principal's resource proxy, which the hub argocd-server reaches the
    /// agent's cluster through (with the agent's client certificate).
    fn register_cluster_on_hub(&self, hub: &ControlPlane) -> anyhow::Result<()> {
        agentctl(&[
            "agent",
            "create",
            &self.name,
            "--dir",
            self.pki.dir.to_str().expect("utf-8 path"),
            "--kubeconfig",
            hub.kubeconfig.to_str().expect("utf-8 path"),
            "--resource-proxy-server",
            &format!("127.0.0.1:{}", self.resource_proxy_port()?),
            "--argocd-namespace",
            &self.principal_ns,
        ])?;
        Ok(())
    }

    /// Log tails of every process of the cell, for failure messages.
    fn logs(&self) -> String {
        format!(
            "--- principal ---\n{}\n--- agent ---\n{}\n{}{}{}",
            self.principal.process().log_tail(30),
            self.agent.process().log_tail(30),
            self.http1_proxy
                .as_ref()
                .map(|p| format!(
                    "--- nginx ---\n{}\n{}\n",
                    p.process.log_tail(10),
                    p.requests().join("\n")
                ))
                .unwrap_or_default(),
            self.argocd
                .as_ref()
                .map(|a| a.log_tails(10))
                .unwrap_or_default(),
            self.hub_view
                .as_ref()
                .map(|v| format!("\n--- hub argocd-server ---\n{}", v.server.log_tails(20)))
                .unwrap_or_default()
        )
    }

    /// The demo Application (path `demo` of the cell's Git repo into `dest`) in `namespace`.
    fn demo_app(&self, namespace: &str, finalizer: bool) -> DynamicObject {
        let mut app = demo_application("demo", namespace, &self.git.url("apps"), &self.dest);
        if finalizer {
            app.metadata.finalizers = Some(vec![BACKGROUND_CASCADE.to_string()]);
        }
        app
    }

    /// With an [`Http1Proxy`], waits until nginx logged each of `methods` as a WebSocket upgrade the
    /// principal switched (nginx writes a WebSocket's line when it closes); returns its log. Without
    /// one, nothing crossed a proxy and the log is empty.
    async fn wait_proxied(&self, methods: &[&str]) -> anyhow::Result<Vec<String>> {
        let Some(proxy) = &self.http1_proxy else {
            return Ok(Vec::new());
        };
        let lines: Vec<String> = methods
            .iter()
            .map(|m| format!("HTTP/1.1 GET {m} 101 upgrade=websocket"))
            .collect();
        wait_until("the calls in nginx's log", SYNC_WAIT, || async {
            let requests = proxy.requests();
            Ok::<_, anyhow::Error>(lines.iter().all(|l| requests.contains(l)).then_some(()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}: {lines:?}\n{}", self.logs()))?;
        let requests = proxy.requests();
        anyhow::ensure!(
            requests
                .iter()
                .all(|l| l.starts_with("HTTP/1.1 GET /") && l.ends_with(" 101 upgrade=websocket")),
            "only WebSocket upgrades crossed the proxy:\n{}",
            requests.join("\n")
        );
        Ok(requests)
    }

    /// Creates the demo Application in the agent's hub namespace and waits until the spoke's real
    /// Argo CD deployed it and its Synced status is on the hub (`what` names that wait).
    async fn create_and_sync_demo(&self, what: &str) -> anyhow::Result<()> {
        self.hub_apps
            .create(&PostParams::default(), &self.demo_app(&self.name, false))
            .await?;
        self.wait_greeting("v1").await?;
        self.wait_synced(&self.hub_apps, &self.first, what).await?;
        Ok(())
    }

    /// Starts one more agent of ours as the cell's agent (its certificate), managed, with a spoke
    /// namespace and files of its own named `label`, and `extra` flags.
    async fn another_agent_of_ours(&self, label: &str, extra: &[&str]) -> anyhow::Result<Agent> {
        let dir = self.ctx.dir.join(label);
        std::fs::create_dir_all(&dir)?;
        Agent::start(
            &self.name,
            &dir,
            self.spoke,
            &self.pki,
            &self.principal.address(),
            &self.ctx.unique(label),
            extra,
        )
        .await
    }

    /// Commits the demo app's second version under path `demo2` (greeting `v2`); returns the commit.
    fn commit_second_version(&self) -> anyhow::Result<String> {
        self.git
            .commit("apps", "demo2", &demo_manifests("v2"), "demo v2")
    }

    async fn wait_greeting(&self, greeting: &str) -> anyhow::Result<()> {
        wait_greeting(self.spoke, &self.dest, greeting)
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs()))
    }

    async fn wait_synced(
        &self,
        api: &Api<DynamicObject>,
        revision: &str,
        what: &str,
    ) -> anyhow::Result<Value> {
        wait_synced(api, "demo", revision, what, || self.logs()).await
    }

    /// Waits until the demo app in `api` has `value` at JSON `pointer`.
    async fn wait_field(
        &self,
        api: &Api<DynamicObject>,
        pointer: &str,
        value: &str,
        what: &str,
    ) -> anyhow::Result<Value> {
        wait_until(what, SYNC_WAIT, || async {
            let app = api
                .get_opt("demo")
                .await?
                .map(serde_json::to_value)
                .transpose()?;
            Ok::<_, anyhow::Error>(
                app.filter(|a| a.pointer(pointer).and_then(Value::as_str) == Some(value)),
            )
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs()))
    }

    /// Waits until the demo app is gone from `api`.
    async fn wait_app_gone(&self, api: &Api<DynamicObject>, what: &str) -> anyhow::Result<()> {
        wait_until(what, SYNC_WAIT, || async {
            Ok::<_, kube::Error>(api.get_opt("demo").await?.is_none().then_some(()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs()))
    }

    /// Runs the `argocd` CLI against the hub's argocd-server of a [`Proxies::Redis`] cell, logged
    /// in as admin; returns its stdout, failing with its output and the cell's logs.
    async fn hub_cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let view = self
            .hub_view
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("start the cell with Cell::start_hub_view"))?;
        view.server
            .cli_run(args, Duration::from_secs(60))
            .await
            .and_then(|run| run.success())
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs()))
    }

    /// Merge-patches the demo app in `api`; returns the object as written.
    async fn patch_app(&self, api: &Api<DynamicObject>, patch: Value) -> anyhow::Result<Value> {
        Ok(serde_json::to_value(
            api.patch("demo", &PatchParams::default(), &Patch::Merge(patch))
                .await?,
        )?)
    }

    /// Creates an AppProject on the hub for the cell's agent (its namespace as source namespace,
    /// its name as destination) and waits until it is on the spoke; returns its name.
    async fn hub_project_on_the_spoke(&self) -> anyhow::Result<String> {
        let project = self.ctx.unique("proj");
        let projects: Api<DynamicObject> = Api::namespaced_with(
            self.hub_client.clone(),
            &self.principal_ns,
            &appproject_resource(),
        );
        projects
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                    "metadata": {"name": project, "namespace": self.principal_ns},
                    "spec": {"sourceRepos": ["*"], "sourceNamespaces": [self.name],
                             "destinations": [{"name": self.name, "namespace": "*"}]},
                }))?,
            )
            .await?;
        let spoke_projects: Api<DynamicObject> = Api::namespaced_with(
            self.spoke.client().await?,
            &self.spoke_ns,
            &appproject_resource(),
        );
        wait_until("the hub AppProject on the spoke", SYNC_WAIT, || async {
            spoke_projects.get_opt(&project).await
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs()))?;
        Ok(project)
    }

    /// Creates the Secret `name` labelled `argocd.argoproj.io/secret-type: <secret_type>` with
    /// `string_data` in the principal's namespace; returns the hub's Secrets there.
    async fn hub_repository_secret(
        &self,
        name: &str,
        secret_type: &str,
        string_data: Value,
    ) -> anyhow::Result<Api<Secret>> {
        let secrets: Api<Secret> = Api::namespaced(self.hub_client.clone(), &self.principal_ns);
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": name, "labels": {SECRET_TYPE_LABEL: secret_type}},
                    "stringData": string_data,
                }))?,
            )
            .await?;
        Ok(secrets)
    }

    /// Waits until the spoke's copy of the Secret `name` has `value` under `key`, then checks it
    /// keeps the `secret-type` label `secret_type`.
    async fn wait_spoke_secret(
        &self,
        name: &str,
        secret_type: &str,
        key: &str,
        value: &str,
        what: &str,
    ) -> anyhow::Result<Secret> {
        let spoke_secrets: Api<Secret> =
            Api::namespaced(self.spoke.client().await?, &self.spoke_ns);
        let copy = wait_until(what, SYNC_WAIT, || async {
            let copy = spoke_secrets.get_opt(name).await?;
            Ok::<_, kube::Error>(copy.filter(|c| {
                c.data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|b| b.0.as_slice())
                    == Some(value.as_bytes())
            }))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs()))?;
        let label = copy.labels().get(SECRET_TYPE_LABEL);
        anyhow::ensure!(
            label.map(String::as_str) == Some(secret_type),
            "the spoke copy of {name} keeps the label {SECRET_TYPE_LABEL}: {secret_type}: {label:?}"
        );
        Ok(copy)
    }

    /// Waits until the spoke's copy of the Secret `name` is gone.
    async fn wait_spoke_secret_gone(&self, name: &str, what: &str) -> anyhow::Result<()> {
        let spoke_secrets: Api<Secret> =
            Api::namespaced(self.spoke.client().await?, &self.spoke_ns);
        wait_until(what, SYNC_WAIT, || async {
            Ok::<_, kube::Error>(spoke_secrets.get_opt(name).await?.is_none().then_some(()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs()))
    }
}

/// The finalizer that makes Argo CD delete an Application's resources (background cascade)
/// before the Application itself.
const BACKGROUND_CASCADE: &str = "resources-finalizer.argocd.argoproj.io/background";
const REFRESH_ANNOTATION: &str = "argocd.argoproj.io/refresh";
/// The label that makes a Secret an Argo CD repository (`repository`) or credential template
/// (`repo-creds`).
const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";

/// Runs `$scenario(principal, agent, mode)` in the four cells, one test each, named
/// `<test>_<principal>_principal_<agent>_agent`; attributes before a cell apply to its test.
macro_rules! cells {
    ($scenario:ident, $mode:expr, {$($(#[$attr:meta])* $test:ident: $p:ident, $a:ident;)*}) => {
        $(
            $(#[$attr])*
            #[tokio::test]
            async fn $test() -> anyhow::Result<()> {
                $scenario(Side::$p, Side::$a, $mode).await
            }
        )*
    };
}

// ---- managed: the hub owns the Application ------------------------------------------------------

/// An Application created on the hub reaches the spoke, where the real Argo CD syncs it, and its
/// real status comes back; a new path set on the hub reaches the spoke and is synced; an edit of
/// the spoke's copy is reverted to the hub's spec; a hard refresh requested on the hub reaches
/// the spoke's Application.
async fn managed_app_lifecycle(principal: Side, agent: Side, mode: Mode) -> anyhow::Result<()> {
    let cell = Cell::start("managed_lifecycle", principal, agent, mode, true).await?;
    let (hub_apps, spoke_apps) = (&cell.hub_apps, &cell.spoke_apps);

    // Create on the hub → spoke → synced by Argo CD → status on the hub.
    hub_apps
        .create(&PostParams::default(), &cell.demo_app(&cell.name, false))
        .await?;
    cell.wait_greeting("v1").await?;
    cell.wait_synced(
        hub_apps,
        &cell.first,
        "the spoke's real Synced+Healthy status on the hub Application",
    )
    .await?;

    // Update from the hub: a new path.
    let second = cell.commit_second_version()?;
    cell.patch_app(hub_apps, json!({"spec": {"source": {"path": "demo2"}}}))
        .await?;
    cell.wait_field(
        spoke_apps,
        "/spec/source/path",
        "demo2",
        "the hub's new path on the spoke Application",
    )
    .await?;
    cell.wait_greeting("v2").await?;
    cell.wait_synced(
        hub_apps,
        &second,
        "the hub Application Synced at the new path",
    )
    .await?;

    // Drift: an edit of the spoke's copy is reverted to the hub's spec.
    let drifted = cell
        .patch_app(spoke_apps, json!({"spec": {"source": {"path": "drifted"}}}))
        .await?;
    anyhow::ensure!(drifted.pointer("/spec/source/path") == Some(&json!("drifted")));
    cell.wait_field(
        spoke_apps,
        "/spec/source/path",
        "demo2",
        "the spoke edit reverted to the hub's path",
    )
    .await?;

    // Refresh requested on the hub reaches the spoke's Application (where Argo CD consumes it).
    // Upstream's principal removes the hub's refresh annotation whenever a status-update without
    // it arrives (UpdateStatus, internal/manager/application/application.go:559-607), so a
    // status-update crossing the request can clear it before it is forwarded; like a user, the
    // test asks again when the hub annotation vanished without reaching the spoke.
    let seen = watch_for_annotation(spoke_apps.clone(), REFRESH_ANNOTATION).await?;
    let requests = std::sync::atomic::AtomicUsize::new(0);
    wait_until(
        "the hub's refresh annotation on the spoke Application",
        SYNC_WAIT,
        || async {
            if seen.observed() {
                return Ok::<_, anyhow::Error>(Some(()));
            }
            let hub = hub_apps.get("demo").await?;
            if !hub.annotations().contains_key(REFRESH_ANNOTATION) {
                requests.fetch_add(1, Ordering::SeqCst);
                cell.patch_app(
                    hub_apps,
                    json!({"metadata": {"annotations": {REFRESH_ANNOTATION: "hard"}}}),
                )
                .await?;
            }
            Ok(None)
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;
    eprintln!(
        "[e2e] {}: refresh reached the spoke after {} request(s)",
        cell.ctx.name,
        requests.load(Ordering::SeqCst)
    );
    wait_until(
        "the spoke's Argo CD to consume the refresh",
        SYNC_WAIT,
        || async {
            Ok::<_, kube::Error>(
                (!spoke_apps
                    .get("demo")
                    .await?
                    .annotations()
                    .contains_key(REFRESH_ANNOTATION))
                .then_some(()),
            )
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;

    Ok(())
}

cells!(managed_app_lifecycle, Mode::Managed, {
    managed_app_lifecycle_ours_principal_ours_agent: Ours, Ours;
    managed_app_lifecycle_ours_principal_upstream_agent: Ours, Upstream;
    managed_app_lifecycle_upstream_principal_ours_agent: Upstream, Ours;
    managed_app_lifecycle_upstream_principal_upstream_agent: Upstream, Upstream;
});

/// Deleting a hub Application that carries Argo CD's background-cascade finalizer deletes the
/// spoke's copy, whose finalizer makes the spoke's Argo CD delete the deployed resources, and
/// then the hub's Application.
async fn managed_app_delete_cascades(
    principal: Side,
    agent: Side,
    mode: Mode,
) -> anyhow::Result<()> {
    let cell = Cell::start("managed_delete", principal, agent, mode, true).await?;
    // Upstream's agent deletes the spoke copy with `propagationPolicy: Foreground`
    // (internal/manager/application/application.go:375): the `foregroundDeletion` finalizer that
    // puts on it is removed only by kube-controller-manager's garbage collector, which every real
    // cluster runs (ours deletes in the background and needs none).
    cell.spoke.run_garbage_collector().await?;
    let (hub_apps, spoke_apps) = (&cell.hub_apps, &cell.spoke_apps);
    hub_apps
        .create(&PostParams::default(), &cell.demo_app(&cell.name, true))
        .await?;
    cell.wait_greeting("v1").await?;
    cell.wait_synced(hub_apps, &cell.first, "the hub Application Synced")
        .await?;

    // Delete on the hub: the spoke's Argo CD cascades, then both Applications go.
    hub_apps.delete("demo", &Default::default()).await?;
    cell.wait_app_gone(spoke_apps, "the spoke Application deleted")
        .await?;
    let cms: Api<ConfigMap> = Api::namespaced(cell.spoke.client().await?, &cell.dest);
    wait_until(
        "Argo CD's cascade to delete demo-config on the spoke",
        SYNC_WAIT,
        || async {
            Ok::<_, kube::Error>(cms.get_opt("demo-config").await?.is_none().then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;
    cell.wait_app_gone(hub_apps, "the hub Application gone once the spoke's is")
        .await?;
    Ok(())
}

cells!(managed_app_delete_cascades, Mode::Managed, {
    managed_app_delete_cascades_ours_principal_ours_agent: Ours, Ours;
    managed_app_delete_cascades_ours_principal_upstream_agent: Ours, Upstream;
    managed_app_delete_cascades_upstream_principal_ours_agent: Upstream, Ours;
    managed_app_delete_cascades_upstream_principal_upstream_agent: Upstream, Upstream;
});

/// An AppProject created on the hub for the agent reaches its spoke, and so does a repository
/// Secret scoped to that project; a change and the deletion of that Secret while the agent is
/// down reach the spoke through the resync after the agent's restart.
async fn managed_project_and_repository(
    principal: Side,
    agent: Side,
    mode: Mode,
) -> anyhow::Result<()> {
    let cell = Cell::start("managed_project_repo", principal, agent, mode, false).await?;
    let project = cell.hub_project_on_the_spoke().await?;
    let repo = cell.ctx.unique("repo");
    let url = cell.git.url("apps");
    let secrets = cell
        .hub_repository_secret(
            &repo,
            "repository",
            json!({"type": "git", "url": url, "project": project}),
        )
        .await?;
    cell.wait_spoke_secret(
        &repo,
        "repository",
        "url",
        &url,
        "the hub repository Secret on the spoke",
    )
    .await?;

    // Changed on the hub while the agent was down: the resync after its restart, which names
    // repository Secrets by upstream's resync kind `Repository`, brings the new URL.
    let mut cell = cell;
    cell.agent.process_mut().kill();
    let moved = format!("{}-moved", cell.git.url("apps"));
    secrets
        .patch(
            &repo,
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"url": moved}})),
        )
        .await?;
    cell.agent.process_mut().start_again()?;
    cell.wait_spoke_secret(
        &repo,
        "repository",
        "url",
        &moved,
        "the URL changed while the agent was down on the spoke",
    )
    .await?;

    // Deleted on the hub while the agent was down: the resync removes the spoke's copy.
    cell.agent.process_mut().kill();
    secrets.delete(&repo, &Default::default()).await?;
    cell.agent.process_mut().start_again()?;
    cell.wait_spoke_secret_gone(
        &repo,
        "the Secret deleted while the agent was down gone from the spoke",
    )
    .await
}

cells!(managed_project_and_repository, Mode::Managed, {
    managed_project_and_repository_ours_principal_ours_agent: Ours, Ours;
    managed_project_and_repository_ours_principal_upstream_agent: Ours, Upstream;
    managed_project_and_repository_upstream_principal_ours_agent: Upstream, Ours;
    managed_project_and_repository_upstream_principal_upstream_agent: Upstream, Upstream;
});

/// A credential template (a Secret labelled `argocd.argoproj.io/secret-type: repo-creds`: a URL
/// prefix and the credentials Argo CD uses for every repository under it) created on the hub and
/// scoped to a project of the agent reaches its spoke with its label; a new password set on the
/// hub follows; deleting it on the hub removes the spoke's copy.
async fn managed_repo_creds(principal: Side, agent: Side, mode: Mode) -> anyhow::Result<()> {
    const TYPE: &str = "repo-creds";
    let cell = Cell::start("managed_repo_creds", principal, agent, mode, false).await?;
    let project = cell.hub_project_on_the_spoke().await?;
    let creds = cell.ctx.unique("creds");
    let prefix = format!("git://127.0.0.1:{}/", cell.git.port);
    let secrets = cell
        .hub_repository_secret(
            &creds,
            TYPE,
            json!({"type": "git", "url": prefix, "project": project,
                   "username": "deploy", "password": "first"}),
        )
        .await?;
    let copy = cell
        .wait_spoke_secret(
            &creds,
            TYPE,
            "password",
            "first",
            "the hub's credential template on the spoke",
        )
        .await?;
    let field = |key: &str| {
        copy.data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    anyhow::ensure!(
        field("url").as_deref() == Some(prefix.as_str())
            && field("username").as_deref() == Some("deploy"),
        "the spoke copy has the hub's URL prefix and username: {:?} {:?}",
        field("url"),
        field("username")
    );

    let password = |p: &str| Patch::Merge(json!({"stringData": {"password": p}}));
    let updated = secrets
        .patch(&creds, &PatchParams::default(), &password("second"))
        .await?;
    if agent == Side::Upstream && updated.resource_version() == copy.resource_version() {
        // Upstream's agent (v0.9.0 agent/inbound.go updateRepository) drops an update whose hub
        // resourceVersion equals that of its own last write on the spoke (IsChangeIgnored
        // compares versions of two clusters); the user's next change gets through.
        eprintln!(
            "[e2e] hub resourceVersion {:?} equals the spoke copy's: upstream's agent drops it; changing the hub again",
            updated.resource_version()
        );
        secrets
            .patch(
                &creds,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"e2e.argocd-agent/nudge": "1"}}}),
                ),
            )
            .await?;
    }
    cell.wait_spoke_secret(
        &creds,
        TYPE,
        "password",
        "second",
        "the hub's new password on the spoke",
    )
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}\nhub resourceVersion of the update {:?}, the spoke copy's before it {:?}",
            updated.resource_version(),
            copy.resource_version()
        )
    })?;

    secrets.delete(&creds, &Default::default()).await?;
    cell.wait_spoke_secret_gone(
        &creds,
        "the spoke copy gone after the hub deleted the template",
    )
    .await
}

cells!(managed_repo_creds, Mode::Managed, {
    managed_repo_creds_ours_principal_ours_agent: Ours, Ours;
    managed_repo_creds_ours_principal_upstream_agent: Ours, Upstream;
    managed_repo_creds_upstream_principal_ours_agent: Upstream, Ours;
    managed_repo_creds_upstream_principal_upstream_agent: Upstream, Upstream;
});

/// The hub's GPG keys ConfigMap (`argocd-gpg-keys-cm` in the principal's namespace) reaches the
/// managed agent's Argo CD namespace, replacing the empty one an Argo CD install ships there, with
/// the hub object's uid as source; a key added on the hub follows; labelled skip-sync on the hub
/// (our principal) it leaves the spoke and comes back once unlabelled; deleting it on the hub
/// removes the spoke's copy.
async fn managed_gpg_keys(principal: Side, agent: Side, mode: Mode) -> anyhow::Result<()> {
    const NAME: &str = "argocd-gpg-keys-cm";
    let cell = Cell::start("managed_gpg_keys", principal, agent, mode, false).await?;
    let spoke: Api<ConfigMap> = Api::namespaced(cell.spoke.client().await?, &cell.spoke_ns);
    let hub: Api<ConfigMap> = Api::namespaced(cell.hub_client.clone(), &cell.principal_ns);
    let config_map = |namespace: &str, data: Value| -> anyhow::Result<ConfigMap> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": NAME, "namespace": namespace},
            "data": data,
        }))?)
    };
    // What an Argo CD install leaves on the spoke: the ConfigMap, empty.
    spoke
        .create(
            &PostParams::default(),
            &config_map(&cell.spoke_ns, json!({}))?,
        )
        .await?;
    let data = |cm: &ConfigMap| cm.data.clone().unwrap_or_default();
    let wait_data = |want: Value, what: &'static str| {
        let spoke = spoke.clone();
        async move {
            let want: std::collections::BTreeMap<String, String> = serde_json::from_value(want)?;
            wait_until(what, SYNC_WAIT, || async {
                Ok::<_, kube::Error>(spoke.get_opt(NAME).await?.filter(|cm| data(cm) == want))
            })
            .await
        }
    };

    let first = json!({"4AEE18F83AFDEB23": "-----BEGIN PGP PUBLIC KEY BLOCK-----\nfirst\n"});
    let created = hub
        .create(
            &PostParams::default(),
            &config_map(&cell.principal_ns, first.clone())?,
        )
        .await?;
    let copy = wait_data(first.clone(), "the hub's GPG keys on the spoke")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;
    assert_eq!(
        copy.annotations().get("argocd.argoproj.io/source-uid"),
        created.metadata.uid.as_ref(),
        "the spoke copy names the hub ConfigMap as its source"
    );

    // A key slipped in on the spoke is reverted to the hub's keys.
    spoke
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"FFFFFFFFFFFFFFFF": "local"}})),
        )
        .await?;
    wait_data(first.clone(), "the spoke's own key reverted")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;

    let second = json!({"4AEE18F83AFDEB23": "-----BEGIN PGP PUBLIC KEY BLOCK-----\nfirst\n",
                        "D2F2C5D1A8B1E3F4": "-----BEGIN PGP PUBLIC KEY BLOCK-----\nsecond\n"});
    hub.patch(
        NAME,
        &PatchParams::default(),
        &Patch::Merge(json!({"data": second})),
    )
    .await?;
    if agent == Side::Upstream {
        // Upstream's agent (v0.9.0 agent/inbound.go updateGPGKey) drops an update whose hub
        // resourceVersion equals the resourceVersion of its own last write on the spoke
        // (IsChangeIgnored compares versions of two clusters); on planes of like age that
        // happens. Once the update is known dropped, another hub change gets the keys there.
        let follow = || async {
            let want: std::collections::BTreeMap<String, String> =
                serde_json::from_value(second.clone()).expect("string map");
            wait_until(
                "the key added on the hub on the spoke",
                Duration::from_secs(15),
                || async {
                    Ok::<_, kube::Error>(spoke.get_opt(NAME).await?.filter(|cm| data(cm) == want))
                },
            )
            .await
        };
        if follow().await.is_err() {
            eprintln!("[e2e] upstream agent dropped the hub's update (resourceVersion clash); changing the hub object again");
            hub.patch(
                NAME,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"e2e.argocd-agent/nudge": "1"}}}),
                ),
            )
            .await?;
        }
    }
    wait_data(second.clone(), "the key added on the hub on the spoke")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;

    if principal == Side::Ours {
        // Labelled skip-sync on the hub: no longer synced, so the agents delete their copy (as
        // upstream); unlabelled, it comes back.
        let label = |value: Option<&str>| {
            Patch::Merge(json!({"metadata": {"labels": {
                argocd_agent_kube::skip_sync::SKIP_SYNC_LABEL: value}}}))
        };
        hub.patch(NAME, &PatchParams::default(), &label(Some("true")))
            .await?;
        wait_until(
            "the spoke copy gone once the hub's GPG keys are labelled skip-sync",
            SYNC_WAIT,
            || async { Ok::<_, kube::Error>(spoke.get_opt(NAME).await?.is_none().then_some(())) },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;
        hub.patch(NAME, &PatchParams::default(), &label(None))
            .await?;
        wait_data(
            second,
            "the GPG keys back on the spoke once the label is gone",
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;
    }

    hub.delete(NAME, &Default::default()).await?;
    wait_until(
        "the spoke copy gone after the hub deleted its GPG keys",
        SYNC_WAIT,
        || async { Ok::<_, kube::Error>(spoke.get_opt(NAME).await?.is_none().then_some(())) },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;
    Ok(())
}

cells!(managed_gpg_keys, Mode::Managed, {
    managed_gpg_keys_ours_principal_ours_agent: Ours, Ours;
    managed_gpg_keys_ours_principal_upstream_agent: Ours, Upstream;
    managed_gpg_keys_upstream_principal_ours_agent: Upstream, Ours;
    managed_gpg_keys_upstream_principal_upstream_agent: Upstream, Upstream;
});

/// Which process of a managed cell is killed while the hub Application changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Down {
    Agent,
    Principal,
}

/// `down` is killed, the hub Application changes meanwhile, and after it starts again the spoke
/// converges to the hub's spec and the hub gets the new status.
async fn managed_resync_after_restart(
    down: Down,
    principal: Side,
    agent: Side,
    mode: Mode,
) -> anyhow::Result<()> {
    let scenario = match down {
        Down::Agent => "managed_restart",
        Down::Principal => "managed_principal_restart",
    };
    let mut cell = Cell::start(scenario, principal, agent, mode, true).await?;
    cell.create_and_sync_demo("the hub Application Synced")
        .await?;

    match down {
        Down::Agent => cell.agent.process_mut().kill(),
        Down::Principal => cell.principal.process_mut().kill(),
    }
    let second = cell.commit_second_version()?;
    cell.patch_app(
        &cell.hub_apps,
        json!({"spec": {"source": {"path": "demo2"}}}),
    )
    .await?;
    match down {
        Down::Agent => cell.agent.process_mut().start_again()?,
        Down::Principal => cell.principal.restart().await?,
    }

    cell.wait_field(
        &cell.spoke_apps,
        "/spec/source/path",
        "demo2",
        &format!("the path set while the {down:?} was down on the spoke"),
    )
    .await?;
    cell.wait_greeting("v2").await?;
    cell.wait_synced(
        &cell.hub_apps,
        &second,
        &format!("the hub Application Synced at the path set while the {down:?} was down"),
    )
    .await?;
    Ok(())
}

/// The agent is killed, the hub Application changes while it is down, and after it starts again
/// the spoke converges to the hub's spec and the hub gets the new status.
async fn managed_resync_after_agent_restart(
    principal: Side,
    agent: Side,
    mode: Mode,
) -> anyhow::Result<()> {
    managed_resync_after_restart(Down::Agent, principal, agent, mode).await
}

/// The principal is killed, the hub Application changes while it is down, and after it starts
/// again (the agent reconnecting by itself) the spoke converges to the hub's spec and the hub gets
/// the new status.
async fn managed_resync_after_principal_restart(
    principal: Side,
    agent: Side,
    mode: Mode,
) -> anyhow::Result<()> {
    managed_resync_after_restart(Down::Principal, principal, agent, mode).await
}

cells!(managed_resync_after_principal_restart, Mode::Managed, {
    managed_resync_after_principal_restart_ours_principal_ours_agent: Ours, Ours;
    managed_resync_after_principal_restart_ours_principal_upstream_agent: Ours, Upstream;
    managed_resync_after_principal_restart_upstream_principal_ours_agent: Upstream, Ours;
    managed_resync_after_principal_restart_upstream_principal_upstream_agent: Upstream, Upstream;
});

cells!(managed_resync_after_agent_restart, Mode::Managed, {
    managed_resync_after_agent_restart_ours_principal_ours_agent: Ours, Ours;
    managed_resync_after_agent_restart_ours_principal_upstream_agent: Ours, Upstream;
    managed_resync_after_agent_restart_upstream_principal_ours_agent: Upstream, Ours;
    managed_resync_after_agent_restart_upstream_principal_upstream_agent: Upstream, Upstream;
});

/// A refresh requested on the hub with the real `argocd` CLI (`argocd app get <agent>/demo
/// --refresh`, which returns once the spoke refreshed; see the exception below), then a sync
/// (`argocd app sync <agent>/demo --async --revision <commit>`), both against the hub's real
/// argocd-server, deployed as upstream documents it: Applications in any namespace, its Redis the
/// principal's Redis proxy. The sync of the Application, without automated sync, runs on the
/// spoke's real Argo CD, held up by a PreSync hook that never
/// completes, and the hub shows it Running at that commit; `argocd app terminate-op <agent>/demo`
/// reaches the spoke, whose Argo CD ends the operation terminated; the hub shows that, its
/// `.operation` gone. argocd-server writes both requests on the hub Application itself (an
/// Update of the whole object: `.operation` for the sync, `status.operationState.phase:
/// Terminating` for the terminate, each after its RBAC and AppProject checks) and reads no
/// cluster for either, so the agent's cluster Secret is not needed; a commit SHA as revision is
/// taken as is, without asking repo-server. Managed: the Application is created on the hub;
/// autonomous: on the spoke, and the hub's requests go to its mirror (project
/// `<agent>-default`).
async fn sync_and_terminate_from_the_hub(
    principal: Side,
    agent: Side,
    mode: Mode,
) -> anyhow::Result<()> {
    let scenario = match mode {
        Mode::Managed => "managed_sync_terminate",
        Mode::Autonomous => "autonomous_sync_terminate",
    };
    let cell = Cell::start_hub_view_in(scenario, principal, agent, mode).await?;
    let mut files = demo_manifests("v1");
    files.push(("presync-job.yaml", PRESYNC_HOOK_JOB.to_string()));
    let revision = cell
        .git
        .commit("apps", "hooked", &files, "demo with a PreSync hook")?;
    let (owner, other, namespace, what) = match mode {
        Mode::Managed => (
            &cell.hub_apps,
            &cell.spoke_apps,
            &cell.name,
            "the manually synced Application on the spoke",
        ),
        Mode::Autonomous => (
            &cell.spoke_apps,
            &cell.hub_apps,
            &cell.spoke_ns,
            "the hub mirror of the manually synced spoke Application",
        ),
    };
    let mut app = cell.demo_app(namespace, false);
    app.data["spec"]["source"]["path"] = json!("hooked");
    app.data["spec"]["syncPolicy"] = json!({"syncOptions": ["PrunePropagationPolicy=background"]});
    owner.create(&PostParams::default(), &app).await?;
    cell.wait_field(other, "/spec/source/path", "hooked", what)
        .await?;

    let app_ref = format!("{}/demo", cell.name);
    // `argocd app get --refresh` writes the refresh annotation on the hub Application and returns
    // once it is gone again: the spoke's Argo CD refreshed and that reached the hub. Not asked of
    // an autonomous upstream agent: its `UpdateOperation` (v0.9.0,
    // internal/manager/application) turns the request into a JSON patch adding the annotation
    // under `/metadata/annotations`, which the apiserver refuses ("the server rejected our
    // request") for a spoke Application without annotations, like this one; the agent never
    // ACKs the event, so every later event about the Application waits behind it, under either
    // principal (PROTOCOL.md, note 13).
    if mode == Mode::Managed || agent == Side::Ours {
        let refreshed = cell.hub_cli(&["app", "get", &app_ref, "--refresh"]).await?;
        anyhow::ensure!(refreshed.contains("hooked"), "{refreshed}");
    }
    cell.hub_cli(&["app", "sync", &app_ref, "--async", "--revision", &revision])
        .await?;
    let jobs: Api<Job> = Api::namespaced(cell.spoke.client().await?, &cell.dest);
    let last_hub = std::sync::Mutex::new(Value::Null);
    wait_until(
        "the hub's sync running on the spoke (hook Job created), seen on the hub",
        SYNC_WAIT,
        || async {
            let hook = jobs.get_opt("demo-presync").await?;
            let hub = cell.hub_apps.get_opt("demo").await?;
            let hub = serde_json::to_value(hub)?;
            let running = operation_state(&hub).0 == "Running"
                && hub.pointer("/status/operationState/operation/sync/revision")
                    == Some(&json!(revision));
            *last_hub.lock().expect("not poisoned") = hub;
            Ok::<_, anyhow::Error>((hook.is_some() && running).then_some(()))
        },
    )
    .await
    .map_err(|e| {
        let hub = last_hub.lock().expect("not poisoned");
        anyhow::anyhow!("{e}\nlast hub Application: {hub}\n{}", cell.logs())
    })?;

    cell.hub_cli(&["app", "terminate-op", &app_ref]).await?;
    wait_until(
        "the spoke's and the hub's operation to end terminated, the hub's .operation gone",
        SYNC_WAIT,
        || async {
            let spoke = serde_json::to_value(cell.spoke_apps.get_opt("demo").await?)?;
            let hub = serde_json::to_value(cell.hub_apps.get_opt("demo").await?)?;
            let done = operation_terminated(&spoke)
                && operation_terminated(&hub)
                && hub.get("operation").is_none();
            *last_hub.lock().expect("not poisoned") = hub;
            Ok::<_, anyhow::Error>(done.then_some(()))
        },
    )
    .await
    .map_err(|e| {
        let hub = last_hub.lock().expect("not poisoned");
        anyhow::anyhow!("{e}\nlast hub Application: {hub}\n{}", cell.logs())
    })?;
    Ok(())
}

// Each cell runs the spoke's Argo CD and the hub's argocd-server; an upstream principal's Redis
// proxy holds the machine's port 6379, so those cells run one at a time.
cells!(sync_and_terminate_from_the_hub, Mode::Managed, {
    managed_sync_and_terminate_ours_principal_ours_agent: Ours, Ours;
    managed_sync_and_terminate_ours_principal_upstream_agent: Ours, Upstream;
    managed_sync_and_terminate_upstream_principal_ours_agent: Upstream, Ours;
    managed_sync_and_terminate_upstream_principal_upstream_agent: Upstream, Upstream;
});

cells!(sync_and_terminate_from_the_hub, Mode::Autonomous, {
    autonomous_sync_and_terminate_ours_principal_ours_agent: Ours, Ours;
    autonomous_sync_and_terminate_ours_principal_upstream_agent: Ours, Upstream;
    autonomous_sync_and_terminate_upstream_principal_ours_agent: Upstream, Ours;
    autonomous_sync_and_terminate_upstream_principal_upstream_agent: Upstream, Upstream;
});

// ---- autonomous: the spoke owns the Application -------------------------------------------------

/// An Application created on the spoke is synced by the spoke's real Argo CD and mirrored on the
/// hub in the agent's namespace (same name, project `<agent>-<project>`, destination named after
/// the agent) with its real status; a new path set on the spoke reaches the mirror with the new
/// status; deleting the spoke's Application removes the mirror.
async fn autonomous_app_lifecycle(principal: Side, agent: Side, mode: Mode) -> anyhow::Result<()> {
    let cell = Cell::start("autonomous_lifecycle", principal, agent, mode, true).await?;
    let (hub_apps, spoke_apps) = (&cell.hub_apps, &cell.spoke_apps);
    assert_eq!(cell.mode, Mode::Autonomous);

    spoke_apps
        .create(
            &PostParams::default(),
            &cell.demo_app(&cell.spoke_ns, false),
        )
        .await?;
    cell.wait_greeting("v1").await?;
    let mirror = cell
        .wait_synced(
            hub_apps,
            &cell.first,
            "the spoke's real Synced+Healthy status on the hub mirror",
        )
        .await?;
    let text = |p: &str| {
        mirror
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let expected_project = format!("{}-default", cell.name);
    anyhow::ensure!(
        text("/spec/project") == expected_project,
        "mirror project: {}",
        text("/spec/project")
    );
    anyhow::ensure!(
        text("/spec/destination/name") == cell.name,
        "mirror destination: {}",
        mirror["spec"]["destination"]
    );
    anyhow::ensure!(text("/spec/source/path") == "demo");

    // Update on the spoke.
    let second = cell.commit_second_version()?;
    cell.patch_app(spoke_apps, json!({"spec": {"source": {"path": "demo2"}}}))
        .await?;
    cell.wait_greeting("v2").await?;
    cell.wait_field(
        hub_apps,
        "/spec/source/path",
        "demo2",
        "the spoke's new path on the hub mirror",
    )
    .await?;
    cell.wait_synced(hub_apps, &second, "the mirror Synced at the new path")
        .await?;

    // Delete on the spoke.
    spoke_apps.delete("demo", &Default::default()).await?;
    cell.wait_app_gone(spoke_apps, "the spoke Application deleted")
        .await?;
    cell.wait_app_gone(hub_apps, "the hub mirror removed")
        .await?;
    Ok(())
}

cells!(autonomous_app_lifecycle, Mode::Autonomous, {
    autonomous_app_lifecycle_ours_principal_ours_agent: Ours, Ours;
    autonomous_app_lifecycle_ours_principal_upstream_agent: Ours, Upstream;
    autonomous_app_lifecycle_upstream_principal_ours_agent: Upstream, Ours;
    autonomous_app_lifecycle_upstream_principal_upstream_agent: Upstream, Upstream;
});

/// Who is restarted in [`autonomous_restart_resends_only_what_changed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Restarted {
    /// The agent alone, the principal keeps running: an intermittently connected site.
    AgentAlone,
    /// The principal too, before the agent comes back.
    AgentAndPrincipal,
}

/// Behind upstream's principal, whose resync compares spec checksums only: our agent restarted
/// with nothing changed sends no object at all in answer to the resync (it used to send every
/// one at every resync, its own checksum never equal to upstream's), and restarted after one
/// Application's status changed while it was down sends that one only, whose status then reaches
/// the hub mirror; a change after the restart reaches the mirror too. Restarted alone, our agent
/// asks for the resync itself (upstream's principal resyncs an agent on connect only once per
/// principal process) on a stream whose response headers upstream's principal sends only with
/// its first message (PROTOCOL.md note 10); restarted with the principal, the principal asks.
/// The spoke statuses are written by the test: real Argo CD rewrites status on its own clock,
/// and the counts need statuses changed on cue.
async fn autonomous_restart_resends_only_what_changed(restarted: Restarted) -> anyhow::Result<()> {
    let mut cell = Cell::start(
        "autonomous_restart",
        Side::Upstream,
        Side::Ours,
        Mode::Autonomous,
        false,
    )
    .await?;
    let names = ["steady", "changing"];
    for name in names {
        cell.spoke_apps
            .create(
                &PostParams::default(),
                &e2e::gateway::application(name, &cell.spoke_ns, "v1"),
            )
            .await?;
    }
    let health = |h: &str| json!({"status": {"health": {"status": h}}});
    for name in names {
        cell.spoke_apps
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(health("Healthy")),
            )
            .await?;
    }
    let logs = |cell: &Cell| cell.logs();
    let mirror_health = |cell: &Cell, name: &'static str, h: &'static str| {
        let api = cell.hub_apps.clone();
        async move {
            wait_until(
                &format!("hub mirror {name} with health {h}"),
                SYNC_WAIT,
                || async {
                    let app = api
                        .get_opt(name)
                        .await?
                        .map(serde_json::to_value)
                        .transpose()?;
                    Ok::<_, anyhow::Error>(app.filter(|a| {
                        a.pointer("/status/health/status").and_then(Value::as_str) == Some(h)
                    }))
                },
            )
            .await
        }
    };
    for name in names {
        mirror_health(&cell, name, "Healthy")
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", logs(&cell)))?;
    }

    // Restarted with nothing changed, then with one status changed while it was down.
    for changed in [None, Some("changing")] {
        // Killed only once everything it queued was ACKed: a restored queue would be resent.
        let AnyAgent::Ours(agent) = &cell.agent else {
            unreachable!("our agent")
        };
        let port = agent.ops_port;
        wait_until("the agent's outbox drained", SYNC_WAIT, || async {
            let scrape = e2e::metrics::Scrape::of(port).await?;
            let queued = scrape.sample("argocd_agent_outbox_resources", &[]);
            Ok::<_, anyhow::Error>((queued == Some(0.0)).then_some(()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", logs(&cell)))?;
        cell.agent.process_mut().kill();
        if let Some(name) = changed {
            cell.spoke_apps
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(health("Degraded")),
                )
                .await?;
        }
        if restarted == Restarted::AgentAndPrincipal {
            cell.principal.restart().await?;
        }
        cell.agent.process_mut().start_again()?;
        let AnyAgent::Ours(agent) = &cell.agent else {
            unreachable!("our agent")
        };
        let port = agent.ops_port;
        // Settled: the resync asked about both mirrors and everything the agent queued was ACKed.
        wait_until("the principal's resync answered", SYNC_WAIT, || async {
            let scrape = e2e::metrics::Scrape::of(port).await?;
            let asked = scrape.baseline(
                "agent_events_received_total",
                &[("event_type", "request-update")],
            );
            let queued = scrape.baseline("argocd_agent_outbox_resources", &[]);
            Ok::<_, anyhow::Error>((asked >= names.len() as f64 && queued == 0.0).then_some(()))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", logs(&cell)))?;
        if let Some(name) = changed {
            mirror_health(&cell, name, "Degraded").await.map_err(|e| {
                anyhow::anyhow!(
                    "the status set while the agent was down: {e}\n{}",
                    logs(&cell)
                )
            })?;
        }
        let scrape = e2e::metrics::Scrape::of(port).await?;
        let sent: f64 = ["create", "spec-update"]
            .iter()
            .map(|t| scrape.baseline("agent_events_sent_total", &[("event_type", t)]))
            .sum();
        anyhow::ensure!(
            sent == changed.iter().count() as f64,
            "after a restart with {changed:?} changed our agent sent {sent} objects\n{}",
            logs(&cell)
        );
    }

    // The stream after the restart carries later changes too.
    cell.spoke_apps
        .patch(
            "steady",
            &PatchParams::default(),
            &Patch::Merge(health("Progressing")),
        )
        .await?;
    mirror_health(&cell, "steady", "Progressing")
        .await
        .map_err(|e| anyhow::anyhow!("a change after the restart: {e}\n{}", logs(&cell)))?;
    Ok(())
}

#[tokio::test]
async fn autonomous_restart_resends_only_what_changed_upstream_principal_ours_agent_restarted_alone_with_status_written_by_the_test(
) -> anyhow::Result<()> {
    autonomous_restart_resends_only_what_changed(Restarted::AgentAlone).await
}

#[tokio::test]
async fn autonomous_restart_resends_only_what_changed_upstream_principal_ours_agent_restarted_with_the_principal_with_status_written_by_the_test(
) -> anyhow::Result<()> {
    autonomous_restart_resends_only_what_changed(Restarted::AgentAndPrincipal).await
}

// ---- live view through the resource proxy: pod logs and exec -------------------------------------
//
// The spoke's real apiserver serves `pods/log` from a fake kubelet (`e2e::kubelet`), so each agent
// reads logs the way it does in production and pushes them over `LogStreamService.StreamLogs`,
// which it opens to its principal per request.

/// A pod of the demo app (tracked by Argo CD's label and annotation, as both agents require) on
/// node `node`, with containers `web` and `sidecar`.
fn tracked_pod(namespace: &str, node: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "web-1", "namespace": namespace,
            "labels": {"app.kubernetes.io/instance": "demo"},
            "annotations": {"argocd.argoproj.io/tracking-id":
                format!("demo:/Pod:{namespace}/web-1")}},
        "spec": {"nodeName": node, "automountServiceAccountToken": false,
            "containers": [{"name": "web", "image": "nginx"},
                           {"name": "sidecar", "image": "busybox"}]},
    }))?)
}

impl Cell {
    /// A kubeconfig for the principal's resource proxy at `port` as the cluster of this cell's
    /// agent: the agent's client certificate names it, as the hub's cluster Secret does.
    fn proxy_kubeconfig(&self, port: u16) -> anyhow::Result<PathBuf> {
        let (cert, key) = self.pki.agent_files(&self.name);
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
            "clusters": [{"name": "proxy", "cluster": {"server": format!("https://127.0.0.1:{port}"),
                "certificate-authority": self.pki.ca()}}],
            "users": [{"name": "argocd", "user": {"client-certificate": cert, "client-key": key}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "argocd"}}],
        });
        let path = self.ctx.dir.join(format!("proxy-{}.kubeconfig", self.name));
        std::fs::write(&path, serde_norway::to_string(&kubeconfig)?)?;
        Ok(path)
    }

    /// Runs kubectl with `kubeconfig`; returns (success, stdout, stderr).
    fn kubectl(&self, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
        e2e::binaries::run_kubectl(kubeconfig, &self.ctx.dir.join("kube-cache"), args)
    }

    /// Starts a fake kubelet for the cell's spoke and a tracked pod `web-1` on it in `dest`, with
    /// the `argocd-cm` both agents read their tracking settings from; once the pod can be read
    /// through the principal's resource proxy (the agent is connected), returns the kubelet and
    /// the proxy's kubeconfig.
    async fn pod_on_fake_kubelet(&self) -> anyhow::Result<(FakeKubelet, PathBuf)> {
        let proxy_port = self.resource_proxy_port()?;
        let kubelet = FakeKubelet::start(self.spoke, &self.ctx.unique("node")).await?;
        let spoke = self.spoke.client().await?;
        Api::<ConfigMap>::namespaced(spoke.clone(), &self.spoke_ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "argocd-cm",
                        "labels": {"app.kubernetes.io/part-of": "argocd"}},
                }))?,
            )
            .await?;
        // No controller-manager creates the namespace's default ServiceAccount.
        Api::<ServiceAccount>::namespaced(spoke.clone(), &self.dest)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "default"}}))?,
            )
            .await?;
        Api::<Pod>::namespaced(spoke, &self.dest)
            .create(
                &PostParams::default(),
                &tracked_pod(&self.dest, &kubelet.node)?,
            )
            .await?;
        let kubeconfig = self.proxy_kubeconfig(proxy_port)?;
        let last_error = std::sync::Mutex::new(String::new());
        wait_until(
            "the pod read through the resource proxy",
            Duration::from_secs(60),
            || async {
                let (ok, _, err) =
                    self.kubectl(&kubeconfig, &["get", "pod", "-n", &self.dest, "web-1"])?;
                *last_error.lock().unwrap() = err;
                Ok::<_, anyhow::Error>(ok.then_some(()))
            },
        )
        .await
        .map_err(|e| {
            let kubectl = last_error.lock().unwrap();
            anyhow::anyhow!("{e}\nkubectl: {kubectl}\n{}", self.logs())
        })?;
        Ok((kubelet, kubeconfig))
    }
}

/// The `gitVersion` upstream v0.9.0's principal answers `/version` with (`proxyVersion`,
/// principal/server.go), for every agent.
const UPSTREAM_STAND_IN_VERSION: &str = "1.28.5+argocd-agent";

/// `kubectl version` and `kubectl logs` through the principal's resource proxy reads the real apiserver's `pods/log` of
/// a pod on the agent's cluster: the tail of a container, another container, with and without
/// timestamps, an error for a container the pod lacks, and `-f` with live lines, after which the
/// kubelet sees its stream closed once kubectl is gone. Both agents push the logs over
/// `StreamLogs` and always ask the kubelet for timestamps: our principal removes them unless
/// asked; upstream's principal passes them on (its own behaviour with its own agent), so there
/// each line's text is compared after its timestamp.
async fn pod_logs_through_the_principal(
    principal: Side,
    agent: Side,
    link: Link,
) -> anyhow::Result<()> {
    let cell = Cell::start_live("pod_logs", principal, agent, link).await?;
    let (kubelet, kubeconfig) = cell.pod_on_fake_kubelet().await?;
    let ns = cell.dest.as_str();
    let kubectl = |args: &[&str]| cell.kubectl(&kubeconfig, args);
    let fail = |what: &str, err: &str| anyhow::anyhow!("{what}: {err}\n{}", cell.logs());
    let stamped_always = principal == Side::Upstream;
    // The text of each line: after its timestamp where the principal always passes them on.
    let texts = |out: &str| -> Vec<String> {
        out.lines()
            .map(|l| match (stamped_always, l.split_once(' ')) {
                (true, Some((stamp, text))) if stamp.ends_with('Z') => text.to_string(),
                _ => l.to_string(),
            })
            .collect()
    };

    // `kubectl version` (what argocd-server reads as the cluster's version): the spoke
    // apiserver's own where the agent can tell it (ours reads the spoke's `/version`); upstream's
    // principal answers `/version` itself with a fixed stand-in, and ours answers the same for a
    // Go agent, which cannot tell it (it answers `/version` with the API group list).
    let (ok, out, err) = kubectl(&["version", "-o", "json"])?;
    anyhow::ensure!(ok, fail("kubectl version", &err));
    let version: Value = serde_json::from_str(&out)?;
    let server_version = text(&version, "/serverVersion/gitVersion");
    let expected = match (principal, agent) {
        (Side::Ours, Side::Ours) => {
            cell.spoke
                .client()
                .await?
                .apiserver_version()
                .await?
                .git_version
        }
        _ => UPSTREAM_STAND_IN_VERSION.to_string(),
    };
    assert_eq!(server_version, expected, "{out}");

    let (ok, out, err) = kubectl(&["logs", "-n", ns, "web-1", "-c", "web", "--tail=3"])?;
    anyhow::ensure!(ok, fail("kubectl logs --tail=3", &err));
    assert_eq!(
        texts(&out),
        ["web line 018", "web line 019", "web line 020"]
    );
    assert!(
        kubelet
            .last_query()
            .is_some_and(|q| q.contains("tailLines=3")),
        "the kubelet was asked for the tail: {:?}",
        kubelet.last_query()
    );
    let (ok, out, err) = kubectl(&["logs", "-n", ns, "web-1", "-c", "sidecar", "--tail=1"])?;
    anyhow::ensure!(ok, fail("kubectl logs -c sidecar", &err));
    assert_eq!(texts(&out), ["sidecar line 020"]);

    let (ok, out, err) = kubectl(&[
        "logs",
        "-n",
        ns,
        "web-1",
        "-c",
        "web",
        "--tail=2",
        "--timestamps",
    ])?;
    anyhow::ensure!(ok, fail("kubectl logs --timestamps", &err));
    let stamped: Vec<(&str, &str)> = out.lines().filter_map(|l| l.split_once(' ')).collect();
    assert_eq!(
        stamped.iter().map(|(_, text)| *text).collect::<Vec<_>>(),
        ["web line 019", "web line 020"],
        "{out}"
    );
    for (stamp, _) in &stamped {
        assert!(
            stamp.len() >= 20 && stamp.as_bytes()[10] == b'T' && stamp.ends_with('Z'),
            "an RFC 3339 timestamp: {stamp}"
        );
    }

    let (ok, _, err) = kubectl(&["logs", "-n", ns, "web-1", "-c", "nope"])?;
    anyhow::ensure!(
        !ok && err.contains("nope"),
        fail("a missing container is an error", &err)
    );

    // -f: live lines arrive; when kubectl goes away, the kubelet's stream is closed.
    let out_path = cell.ctx.dir.join("follow.out");
    let mut follow = tokio::process::Command::new(e2e::binaries::kubectl()?)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["logs", "-f", "-n", ns, "web-1", "-c", "web", "--tail=1"])
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    wait_until(
        "three live lines through kubectl logs -f",
        Duration::from_secs(60),
        || async {
            let text = std::fs::read_to_string(&out_path)?;
            Ok::<_, anyhow::Error>(text.contains("web live 3\n").then_some(text))
        },
    )
    .await
    .map_err(|e| fail("kubectl logs -f", &e.to_string()))
    .map(|text| {
        assert_eq!(
            texts(&text)[..4],
            ["web line 020", "web live 1", "web live 2", "web live 3"]
        );
    })?;
    assert_eq!(kubelet.stats.follows_open.load(Ordering::SeqCst), 1);
    follow.kill().await?;
    let stats = kubelet.stats.clone();
    wait_until(
        "the kubelet sees its follow stream closed",
        Duration::from_secs(30),
        || async {
            Ok::<_, anyhow::Error>(
                (stats.follows_closed.load(Ordering::SeqCst) == 1
                    && stats.follows_open.load(Ordering::SeqCst) == 0)
                    .then_some(()),
            )
        },
    )
    .await
    .map_err(|e| fail("the follow stream is closed", &e.to_string()))?;
    // Over WebSocket, each StreamLogs call and the RefreshToken that precedes it crossed nginx.
    cell.wait_proxied(&[
        REFRESH_TOKEN,
        "/principal.apis.logstreamapi.LogStreamService/StreamLogs",
    ])
    .await?;
    Ok(())
}

#[tokio::test]
async fn pod_logs_through_our_principal_ours_agent() -> anyhow::Result<()> {
    pod_logs_through_the_principal(Side::Ours, Side::Ours, Link::Http2).await
}

/// The same with our agent's `StreamLogs` calls carried as gRPC over WebSocket through an
/// HTTP/1.1-only proxy.
#[tokio::test]
async fn pod_logs_over_websocket_through_an_http1_only_proxy_ours_principal_ours_agent(
) -> anyhow::Result<()> {
    pod_logs_through_the_principal(Side::Ours, Side::Ours, Link::WebSocketProxy).await
}

#[tokio::test]
async fn pod_logs_through_our_principal_upstream_agent() -> anyhow::Result<()> {
    pod_logs_through_the_principal(Side::Ours, Side::Upstream, Link::Http2).await
}

#[tokio::test]
async fn pod_logs_through_upstream_principal_ours_agent() -> anyhow::Result<()> {
    pod_logs_through_the_principal(Side::Upstream, Side::Ours, Link::Http2).await
}

#[tokio::test]
async fn pod_logs_through_upstream_principal_upstream_agent() -> anyhow::Result<()> {
    pod_logs_through_the_principal(Side::Upstream, Side::Upstream, Link::Http2).await
}

/// `kubectl exec` (client-go's WebSocket executor, `v5.channel.k8s.io`) through the principal's
/// resource proxy into a tracked pod of the agent's cluster: the agent opens
/// `TerminalStreamService.StreamTerminal` and execs through the spoke's real apiserver, whose fake
/// kubelet runs the command (the one stand-in: a host process instead of a container). Stdin goes
/// in and is closed, output and the exit status come back. An exec into a pod Argo CD does not
/// manage is refused by our principal, which reads the pod through the agent first (403;
/// upstream's Go agent itself would exec into any pod its ServiceAccount reaches); no exec reaches
/// the kubelet. Through upstream's principal, which asks for a TTY and ends the WebSocket without
/// an exit status, the command's output comes back, and our agent refuses the untracked pod
/// itself (upstream's principal asks the agent without reading the pod).
async fn exec_through_the_principal(
    principal: Side,
    agent: Side,
    link: Link,
) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let cell = Cell::start_live("exec", principal, agent, link).await?;
    let (kubelet, kubeconfig) = cell.pod_on_fake_kubelet().await?;
    let ns = cell.dest.as_str();
    // Upstream's principal runs every session with a TTY (it serves Argo CD's web terminal), on
    // which kubectl's closing of stdin is no end of input: there the command ends by itself.
    let script = match principal {
        Side::Ours => "read line; echo got-$line-$((6*7)); echo oops >&2; cat >/dev/null; exit 3",
        Side::Upstream => "read line; echo got-$line-$((6*7)); echo oops >&2; exit 3",
    };
    let exec = |pod: &str| {
        tokio::process::Command::new(e2e::binaries::kubectl().expect("kubectl"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["exec", "-i", "-n", ns, pod, "-c", "web", "--", "sh", "-c"])
            .arg(script)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
    };
    let marker = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let mut child = exec("web-1")?;
    let mut stdin = child.stdin.take().expect("piped");
    stdin.write_all(format!("{marker}\n").as_bytes()).await?;
    // Stdin is closed only once the line was answered: upstream's Go agent may drop stdin that
    // arrives together with its close (its reader picks either at random).
    let mut stdout_pipe = child.stdout.take().expect("piped");
    let mut seen = Vec::new();
    let answer = format!("got-{marker}-42");
    tokio::time::timeout(Duration::from_secs(60), async {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains(&answer) {
            match stdout_pipe.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("no {answer:?} from kubectl exec\n{}", cell.logs()))?;
    // With upstream's principal stdin stays open until kubectl ended (the command ends by itself
    // there): a client message reaching upstream's v0.9.0 principal as it ends the session
    // crashes it (its WebSocket reader sends on the agent channel just closed; PROTOCOL.md (9)).
    let open_stdin = match principal {
        Side::Ours => {
            drop(stdin);
            None
        }
        Side::Upstream => Some(stdin),
    };
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .map_err(|_| anyhow::anyhow!("kubectl exec did not end\n{}", cell.logs()))??;
    drop(open_stdin);
    seen.extend_from_slice(&out.stdout);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&seen).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    let printed = format!("{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("got-{marker}-42")),
        "the command's output: {stdout:?} / {stderr:?}\n{}",
        cell.logs()
    );
    // Ours keeps stderr apart. Upstream's agent sends stderr as stdout, from the stdout and stderr
    // copiers at once on one gRPC stream (grpc-go does not allow concurrent sends): its stderr line
    // was seen lost (PROTOCOL.md (8)), so it is not asserted there.
    let execs = kubelet.stats.execs.lock().unwrap().clone();
    assert_eq!(execs.len(), 1, "{execs:?}");
    assert_eq!(execs[0].target, format!("{ns}/web-1/web"));
    match principal {
        Side::Ours => {
            if agent == Side::Ours {
                assert!(stderr.contains("oops"), "{printed}");
            }
            assert!(!out.status.success(), "the command exited 3: {printed}");
            // Ours passes the kubelet's Status message on; the Go agent sends client-go's text.
            assert!(
                stderr.contains("exit status 3") || stderr.contains("exit code 3"),
                "the exit status came back: {stderr}"
            );
            assert!(!execs[0].tty);
        }
        Side::Upstream => {
            // With a TTY there is no stderr stream (a real PTY merges it into stdout; the fake
            // kubelet has none, so it is not asserted); upstream's principal closes the
            // WebSocket without an exit status (1006), which kubectl reports as a failure.
            assert!(execs[0].tty, "upstream's principal asks for a TTY");
            assert!(!out.status.success(), "{printed}");
        }
    }

    // A pod Argo CD does not manage: refused before any exec. Not with upstream's principal and
    // agent together: neither checks (upstream's Go agent execs into any pod its ServiceAccount
    // reaches, and upstream's principal asks it without reading the pod first).
    if (principal, agent) == (Side::Upstream, Side::Upstream) {
        return Ok(());
    }
    let spoke = cell.spoke.client().await?;
    let mut stray = tracked_pod(ns, &kubelet.node)?;
    stray.metadata.name = Some("stray-1".into());
    stray.metadata.labels = None;
    stray.metadata.annotations = None;
    Api::<Pod>::namespaced(spoke, ns)
        .create(&PostParams::default(), &stray)
        .await?;
    // Asked directly (kubectl would read the pod first and be refused by that read): the
    // principal's read of the pod through the agent refuses the exec.
    let kubeconfig = kube::config::Kubeconfig::read_from(&kubeconfig)?;
    let proxy = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?,
    )?;
    let params = kube::api::AttachParams::default()
        .container("web")
        .stdout(true)
        .stderr(false);
    let exec = Api::<Pod>::namespaced(proxy, ns)
        .exec("stray-1", ["sh", "-c", "echo leaked"], &params)
        .await;
    match (principal, exec) {
        // Our principal reads the pod through the agent first, which refuses (403; upstream's
        // agent answers with a body that is no Kubernetes `Status`).
        (Side::Ours, Ok(_)) => {
            anyhow::bail!("an exec into a pod Argo CD does not manage was accepted")
        }
        (Side::Ours, Err(refused)) => assert!(
            refused.to_string().contains("code: 403"),
            "refused as the agent refuses to read the pod: {refused}\n{}",
            cell.logs()
        ),
        // Upstream's principal upgrades the WebSocket before its agent is asked; our agent
        // refuses the session (`error` on its StreamTerminal call, sent without waiting for the
        // principal's response headers: grpc-go sends those only with its first message, which a
        // client sending nothing never causes, and the session hung until then), and upstream's
        // principal ends the session and drops the connection without a WebSocket close (its
        // text frame with the refusal races its own cleanup and is lost, as with its own agent).
        // The exec ends without an exit status (kube-rs's reader of such a stream never sees its
        // end, so the end is awaited with `join`).
        (Side::Upstream, Err(e)) => anyhow::bail!(
            "upstream's principal refused the upgrade: {:#}\n{}",
            anyhow::Error::from(e),
            cell.logs()
        ),
        (Side::Upstream, Ok(mut process)) => {
            let status = process.take_status().expect("the status, once");
            let ended = tokio::time::timeout(Duration::from_secs(30), process.join())
                .await
                .map_err(|_| anyhow::anyhow!("the refused exec did not end\n{}", cell.logs()))?;
            let status = tokio::time::timeout(Duration::from_secs(5), status).await?;
            assert!(
                status.is_none(),
                "no exit status from a refused exec: {status:?} ({ended:?})"
            );
        }
    }
    assert_eq!(
        kubelet.stats.execs.lock().unwrap().len(),
        1,
        "no exec reached the kubelet"
    );
    // Over WebSocket, each StreamTerminal call and the RefreshToken that precedes it crossed nginx.
    cell.wait_proxied(&[
        REFRESH_TOKEN,
        "/terminalstreamapi.TerminalStreamService/StreamTerminal",
    ])
    .await?;
    Ok(())
}

#[tokio::test]
async fn exec_through_our_principal_ours_agent() -> anyhow::Result<()> {
    exec_through_the_principal(Side::Ours, Side::Ours, Link::Http2).await
}

/// The same with our agent's `StreamTerminal` call carried as gRPC over WebSocket through an
/// HTTP/1.1-only proxy.
#[tokio::test]
async fn exec_over_websocket_through_an_http1_only_proxy_ours_principal_ours_agent(
) -> anyhow::Result<()> {
    exec_through_the_principal(Side::Ours, Side::Ours, Link::WebSocketProxy).await
}

#[tokio::test]
async fn exec_through_our_principal_upstream_agent() -> anyhow::Result<()> {
    exec_through_the_principal(Side::Ours, Side::Upstream, Link::Http2).await
}

#[tokio::test]
async fn exec_through_upstream_principal_ours_agent() -> anyhow::Result<()> {
    exec_through_the_principal(Side::Upstream, Side::Ours, Link::Http2).await
}

/// Upstream's own pair, the baseline of the matrix. Its principal tears a session down as soon as
/// its agent's side ends and can drop output not yet written to the WebSocket (kubectl sees close
/// 1006 and no output; PROTOCOL.md (9)): a race inside upstream, seen once in a full suite run on
/// 2026-11-25. Exactly that symptom is retried once, and said so; any other failure is not.
#[tokio::test]
async fn exec_through_upstream_principal_upstream_agent() -> anyhow::Result<()> {
    let first = tokio::spawn(exec_through_the_principal(
        Side::Upstream,
        Side::Upstream,
        Link::Http2,
    ))
    .await;
    match first {
        Ok(result) => result,
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or_default();
            if !message.contains("close 1006") {
                std::panic::resume_unwind(payload);
            }
            eprintln!(
                "[real_peers] upstream's pair dropped the exec output (close 1006); retrying once"
            );
            exec_through_the_principal(Side::Upstream, Side::Upstream, Link::Http2).await
        }
        Err(e) => Err(e.into()),
    }
}

/// Our principal holds at most `--terminal-max-sessions-per-agent` web terminal sessions of an
/// agent open at once: with the cap at 1, a `kubectl exec` while another session is open is
/// refused before the agent is asked (kubectl shows the refusal naming the flag; the kubelet sees
/// no second exec), and once the first session ended another is accepted. The principal's
/// metrics follow: the open session, the refusal and the finished session by outcome.
async fn terminal_sessions_over_the_cap_are_refused(agent: Side) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let options = CellOptions {
        proxies: Proxies::Resource,
        principal_args: &["--terminal-max-sessions-per-agent=1"],
        ..CellOptions::default()
    };
    let cell = Cell::start_full("terminal_cap", Side::Ours, agent, Mode::Managed, options).await?;
    let (kubelet, kubeconfig) = cell.pod_on_fake_kubelet().await?;
    let AnyPrincipal::Ours(principal) = &cell.principal else {
        anyhow::bail!("the cap is our principal's");
    };
    // (open, refused_limit, finished); a series not exposed yet reads 0, and both families are
    // checked to be declared once each has a sample (below), so a misspelt name fails the test.
    let agent_label = ("agent_name", cell.name.as_str());
    let scrape = || async {
        let scrape = e2e::metrics::Scrape::of(principal.ops_port).await?;
        let outcome = |o| {
            scrape.baseline(
                "argocd_principal_terminal_sessions",
                &[agent_label, ("outcome", o)],
            )
        };
        anyhow::Ok((
            scrape.baseline("argocd_principal_terminal_sessions_open", &[agent_label]),
            outcome("refused_limit"),
            outcome("finished"),
        ))
    };
    let ns = cell.dest.as_str();

    // The first session stays open until its stdin is closed.
    let mut first = tokio::process::Command::new(e2e::binaries::kubectl()?)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["exec", "-i", "-n", ns, "web-1", "-c", "web", "--"])
        .args([
            "sh",
            "-c",
            "echo first-open; cat >/dev/null; echo first-done",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdin = first.stdin.take().expect("piped");
    let mut stdout = first.stdout.take().expect("piped");
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&seen).contains("first-open") {
            match stdout.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("the first session did not start\n{}", cell.logs()))?;
    assert_eq!(scrape().await?, (1.0, 0.0, 0.0), "one session open");

    // The second is refused while the first is open; its agent is never asked.
    let (ok, out, err) = cell.kubectl(
        &kubeconfig,
        &[
            "exec", "-n", ns, "web-1", "-c", "web", "--", "echo", "second",
        ],
    )?;
    assert!(
        !ok && err.contains("--terminal-max-sessions-per-agent") && !out.contains("second"),
        "the second session refused naming the cap: {out:?} / {err:?}\n{}",
        cell.logs()
    );
    assert_eq!(
        kubelet.stats.execs.lock().unwrap().len(),
        1,
        "no second exec"
    );
    assert_eq!(scrape().await?, (1.0, 1.0, 0.0), "the refusal counted");

    // The first ends when its stdin is closed; then another session is accepted.
    let mut stdin = stdin;
    stdin.shutdown().await?;
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(60), first.wait())
        .await
        .map_err(|_| anyhow::anyhow!("the first session did not end\n{}", cell.logs()))??;
    stdout.read_to_end(&mut seen).await?;
    assert!(
        String::from_utf8_lossy(&seen).contains("first-done"),
        "{status}: {}",
        String::from_utf8_lossy(&seen)
    );
    let ended = wait_until(
        "the first session counted as finished and no longer open",
        Duration::from_secs(30),
        || async { Ok::<_, anyhow::Error>((scrape().await? == (0.0, 1.0, 1.0)).then_some(())) },
    )
    .await;
    if let Err(e) = ended {
        let series = terminal_series(principal.ops_port).await;
        anyhow::bail!("{e}: {series:?}\n{}", cell.logs());
    }
    let (ok, out, err) = cell.kubectl(
        &kubeconfig,
        &[
            "exec", "-n", ns, "web-1", "-c", "web", "--", "echo", "third",
        ],
    )?;
    assert!(
        ok && out.contains("third"),
        "accepted again: {out:?} / {err:?}"
    );
    assert_eq!(kubelet.stats.execs.lock().unwrap().len(), 2);
    let declared = e2e::metrics::Scrape::of(principal.ops_port).await?;
    for family in [
        "argocd_principal_terminal_sessions_open",
        "argocd_principal_terminal_sessions",
    ] {
        declared.value(family, &[agent_label])?;
    }
    Ok(())
}

/// The principal's terminal metrics as exposed, for failure messages.
async fn terminal_series(port: u16) -> Vec<(Vec<(String, String)>, f64)> {
    match e2e::metrics::Scrape::of(port).await {
        Ok(s) => [
            s.series("argocd_principal_terminal_sessions_open"),
            s.series("argocd_principal_terminal_sessions"),
        ]
        .concat(),
        Err(_) => Vec::new(),
    }
}

#[tokio::test]
async fn terminal_sessions_over_the_cap_are_refused_on_our_principal_ours_agent(
) -> anyhow::Result<()> {
    terminal_sessions_over_the_cap_are_refused(Side::Ours).await
}

#[tokio::test]
async fn terminal_sessions_over_the_cap_are_refused_on_our_principal_upstream_agent(
) -> anyhow::Result<()> {
    terminal_sessions_over_the_cap_are_refused(Side::Upstream).await
}

// ---- live view through the Redis proxy: the resource tree ----------------------------------------

/// The hub's real argocd-server reads a spoke Application's resource tree and managed resources
/// (the live-view keys the spoke's real application-controller caches in its password-protected
/// Redis) through the principal's Redis proxy, which is argocd-server's Redis in front of the
/// password-protected hub Redis: the proxy asks the agent, which answers from the spoke's Redis.
/// The nodes are the spoke's live objects, recognised by their uids on the spoke, which nothing on
/// the hub knows. Autonomous: the same reads of the hub mirror of an Application created on the
/// spoke (the cluster-version probe and the tree watch are the managed cells').
async fn hub_reads_the_resource_tree_through_the_redis_proxy(
    principal: Side,
    agent: Side,
    mode: Mode,
) -> anyhow::Result<()> {
    let scenario = match mode {
        Mode::Managed => "redis_tree",
        Mode::Autonomous => "autonomous_redis_tree",
    };
    let cell = Cell::start_hub_view_in(scenario, principal, agent, mode).await?;
    let view = cell.hub_view.as_ref().expect("a hub view cell");
    let server = &view.server;
    let (owner, namespace) = match mode {
        Mode::Managed => (&cell.hub_apps, &cell.name),
        Mode::Autonomous => (&cell.spoke_apps, &cell.spoke_ns),
    };
    owner
        .create(&PostParams::default(), &cell.demo_app(namespace, false))
        .await?;
    cell.wait_greeting("v1").await?;
    cell.wait_synced(&cell.hub_apps, &cell.first, "the hub Application Synced")
        .await?;
    let spoke_uid = e2e::scenario::demo_config_uid(&cell.spoke.client().await?, &cell.dest).await?;

    let token = server.session_token().await?;
    let get = |what: &'static str| {
        let (server, token) = (server, token.clone());
        let path = format!(
            "/api/v1/applications/demo/{what}?appNamespace={}",
            cell.name
        );
        async move {
            let (status, body) = server.api_get(&path, &token).await?;
            anyhow::Ok((status == 200).then_some(body))
        }
    };
    // The first read may come before the controller's first cache write: asked again until then.
    let tree: Value = wait_until(
        "the resource tree through the Redis proxy",
        Duration::from_secs(90),
        || async {
            Ok::<_, anyhow::Error>(
                get("resource-tree")
                    .await?
                    .map(|body| serde_json::from_str::<Value>(&body))
                    .transpose()?
                    .filter(|tree| tree["nodes"].as_array().is_some_and(|n| !n.is_empty())),
            )
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;
    e2e::scenario::assert_demo_tree(&tree, &spoke_uid, &cell.dest);

    // Managed resources (the other live-view key): the spoke's live ConfigMap as its Argo CD saw it.
    let body = get("managed-resources")
        .await?
        .ok_or_else(|| anyhow::anyhow!("managed-resources refused\n{}", cell.logs()))?;
    let managed: Value = serde_json::from_str(&body)?;
    let live = managed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["kind"] == "ConfigMap" && r["name"] == "demo-config")
        .and_then(|r| r["liveState"].as_str())
        .map(serde_json::from_str::<Value>)
        .transpose()?
        .unwrap_or_else(|| panic!("no live demo-config in {managed}"));
    assert_eq!(live["metadata"]["uid"], spoke_uid.as_str(), "{live}");
    assert_eq!(live["data"]["greeting"], "v1", "{live}");

    // Nothing on the hub holds those keys: the hub Redis behind the proxy has none.
    let mut hub = tokio::net::TcpStream::connect(view.hub_redis.address()).await?;
    let password = view
        .hub_redis
        .password
        .as_deref()
        .expect("password-protected");
    assert_eq!(
        resp_exchange(&mut hub, &["AUTH", password]).await?,
        "+OK\r\n"
    );
    let keys = resp_exchange(&mut hub, &["KEYS", "app|*"]).await?;
    assert_eq!(keys, "*0\r\n", "live-view keys in the hub Redis: {keys}");
    if mode == Mode::Autonomous {
        return Ok(());
    }

    // argocd-server's read of the agent's cluster version: an Application destined to the agent's
    // cluster (its cluster Secret names our resource proxy; the Application stays on the hub, in
    // argocd-server's namespace) is validated against that cluster's `/version` and API list.
    // Our principal answers `/version` for a Go agent with upstream's stand-in (the Go agent
    // answers it with the API group list, which Argo CD cannot parse as a version); upstream's
    // principal answers it with that stand-in itself.
    cell.register_cluster_on_hub(&shared_planes().await.hub)?;
    let repo = cell.git.url("apps");
    server
        .cli(&[
            "app",
            "create",
            "version-probe",
            "--repo",
            &repo,
            "--path",
            "demo",
            "--dest-name",
            &cell.name,
            "--dest-namespace",
            &cell.dest,
            "--project",
            "default",
        ])
        .map_err(|e| {
            anyhow::anyhow!(
                "argocd app create against the agent's cluster: {e}\n{}",
                cell.logs()
            )
        })?;

    // Watching the tree: argocd-server SUBSCRIBEs to the app's channel through the proxy (the
    // agent subscribes on the spoke Redis) and sends the tree again on each message there, which
    // the spoke's controller publishes after each reconciliation; a refresh asked on the hub makes
    // one (asked again while the hub shows no pending request: the subscription may not be up yet,
    // and an upstream principal may drop the request, see PROTOCOL.md (1)).
    let watch = TreeWatch::open(server, &cell.name, &token).await?;
    wait_until(
        "a resource tree update through the subscription",
        SYNC_WAIT,
        || async {
            let received = watch.received();
            if received.contains("\"result\"") && received.contains("demo-config") {
                return Ok::<_, anyhow::Error>(Some(()));
            }
            let hub = cell.hub_apps.get("demo").await?;
            if !hub.annotations().contains_key(REFRESH_ANNOTATION) {
                cell.patch_app(
                    &cell.hub_apps,
                    json!({"metadata": {"annotations": {REFRESH_ANNOTATION: "normal"}}}),
                )
                .await?;
            }
            Ok(None)
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nstream: {}\n{}", watch.received(), cell.logs()))?;
    Ok(())
}

/// argocd-server's resource tree stream (`/api/v1/stream/applications/demo/resource-tree`) of the
/// demo app in an agent's namespace, read as it arrives.
struct TreeWatch {
    received: Arc<std::sync::Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TreeWatch {
    async fn open(server: &ArgoCd, namespace: &str, token: &str) -> anyhow::Result<TreeWatch> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let port = server.server_port.expect("an argocd-server");
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        conn.write_all(
            format!(
                "GET /api/v1/stream/applications/demo/resource-tree?appNamespace={namespace} \
                 HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
        let received = Arc::new(std::sync::Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let received = received.clone();
            async move {
                let mut buf = [0u8; 8192];
                while let Ok(n @ 1..) = conn.read(&mut buf).await {
                    received.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            }
        });
        Ok(TreeWatch { received, task })
    }

    /// Everything the stream carried so far, as text.
    fn received(&self) -> String {
        String::from_utf8_lossy(&self.received.lock().unwrap()).into_owned()
    }
}

impl Drop for TreeWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// Each cell runs the spoke's Argo CD and the hub's argocd-server; an upstream principal's Redis
// proxy holds the machine's port 6379, so those cells run one at a time.
cells!(hub_reads_the_resource_tree_through_the_redis_proxy, Mode::Managed, {
    redis_proxy_resource_tree_ours_principal_ours_agent: Ours, Ours;
    redis_proxy_resource_tree_ours_principal_upstream_agent: Ours, Upstream;
    redis_proxy_resource_tree_upstream_principal_ours_agent: Upstream, Ours;
    redis_proxy_resource_tree_upstream_principal_upstream_agent: Upstream, Upstream;
});

cells!(hub_reads_the_resource_tree_through_the_redis_proxy, Mode::Autonomous, {
    autonomous_redis_proxy_resource_tree_ours_principal_ours_agent: Ours, Ours;
    autonomous_redis_proxy_resource_tree_ours_principal_upstream_agent: Ours, Upstream;
    autonomous_redis_proxy_resource_tree_upstream_principal_ours_agent: Upstream, Ours;
    autonomous_redis_proxy_resource_tree_upstream_principal_upstream_agent: Upstream, Upstream;
});

/// The hub's real argocd-server opens a web terminal into a pod of an Application on the spoke
/// (the pod is in the app's resource tree, read through the Redis proxy; the exec goes through
/// the resource proxy to the agent's `StreamTerminal`): a command's output comes back, stderr
/// too (the web terminal runs with a TTY), a resize reaches the kubelet, and closing the
/// browser's socket ends the shell on the spoke. With the agent gone, the resource proxy
/// refuses an exec.
async fn hub_web_terminal_reaches_a_pod_on_the_spoke(
    principal: Side,
    agent: Side,
    _mode: Mode,
) -> anyhow::Result<()> {
    let mut cell = Cell::start_hub_view("web_terminal", principal, agent).await?;
    let hub = &shared_planes().await.hub;
    let kubelet = FakeKubelet::start(cell.spoke, &cell.ctx.unique("node")).await?;
    let mut files = demo_manifests("v1");
    files.push((
        "pod.yaml",
        e2e::git_server::demo_pod("web-1", &kubelet.node),
    ));
    let revision = cell.git.commit("apps", "demo", &files, "demo with a pod")?;
    // Destined to the agent's cluster by name: argocd-server reaches the pod through the cluster
    // Secret's server, the principal's resource proxy (each agent maps it to its own cluster).
    cell.register_cluster_on_hub(hub)?;
    let app = scenario::demo_application(
        "demo",
        &cell.name,
        &cell.git.url("apps"),
        json!({"name": cell.name, "namespace": cell.dest}),
    );
    cell.hub_apps.create(&PostParams::default(), &app).await?;
    cell.wait_synced(&cell.hub_apps, &revision, "the hub Application Synced")
        .await?;
    let spoke = cell.spoke.client().await?;
    kubelet.report_running(&spoke, &cell.dest, "web-1").await?;
    let view = cell.hub_view.as_ref().expect("a hub view cell");
    enable_exec(&hub.client().await?, &view.server).await?;
    let token = view.server.session_token().await?;
    let port = view.server.server_port.expect("argocd-server has a port");
    let target = TerminalTarget {
        pod: "web-1".into(),
        container: "web".into(),
        namespace: cell.dest.clone(),
        app: "demo".into(),
        app_namespace: cell.name.clone(),
        project: "default".into(),
        shell: "bash".into(),
    };
    let wait = Duration::from_secs(30);
    let mut term = open_once_enabled(port, &token, &target)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;
    check_shell_session(&mut term, &kubelet, &target, wait)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;

    // The browser goes away: the shell on the spoke ends.
    term.close().await;
    kubelet
        .wait_execs_ended(1, "the shell ended after the browser left", wait)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;

    // The agent is gone: the resource proxy refuses an exec, as argocd-server asks for it (the
    // principal knows the agent is not connected once its stream ended).
    cell.agent.process_mut().stop();
    let kubeconfig = cell.proxy_kubeconfig(cell.resource_proxy_port()?)?;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig)?,
        &Default::default(),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(kube::Client::try_from(config)?, &cell.dest);
    let params = kube::api::AttachParams::default()
        .container("web")
        .stdout(true)
        .stderr(false);
    let last = std::sync::Mutex::new(String::new());
    wait_until(
        "an exec refused as the agent is not connected",
        wait,
        || async {
            let refusal = match pods.exec("web-1", ["true"], &params).await {
                Ok(_) => "the exec was accepted".to_string(),
                Err(e) => e.to_string(),
            };
            let refused = refusal_names_the_absent_agent(principal, &refusal);
            *last.lock().unwrap() = refusal;
            Ok::<_, anyhow::Error>(refused.then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: {}\n{}", last.lock().unwrap(), cell.logs()))?;
    assert_eq!(
        kubelet.stats.execs.lock().unwrap().len(),
        1,
        "no exec reached the kubelet without the agent"
    );
    Ok(())
}

/// Whether `refusal` (kube-rs's error) is the principal's refusal of an exec for an agent that
/// is not connected, before any upgrade: ours says so in a 502 `Status`; upstream's answers 502
/// with no body.
fn refusal_names_the_absent_agent(principal: Side, refusal: &str) -> bool {
    match principal {
        Side::Ours => refusal.contains("not connected") && refusal.contains("502"),
        Side::Upstream => refusal.contains("502"),
    }
}

// Each cell runs the spoke's Argo CD and the hub's argocd-server; an upstream principal's
// proxies hold the machine's ports 9090 and 6379, so those cells run one at a time.
cells!(hub_web_terminal_reaches_a_pod_on_the_spoke, Mode::Managed, {
    hub_web_terminal_ours_principal_ours_agent: Ours, Ours;
    hub_web_terminal_ours_principal_upstream_agent: Ours, Upstream;
    hub_web_terminal_upstream_principal_ours_agent: Upstream, Ours;
    hub_web_terminal_upstream_principal_upstream_agent: Upstream, Upstream;
});

// ---- gzip on the wire -----------------------------------------------------------------------------

/// An agent started with `--enable-compression` (gzip on every call, upstream's flag) works with
/// either principal: an Application created on the hub is synced by the spoke's real Argo CD and
/// its status comes back.
async fn compressed_agent_syncs_an_app(
    principal: Side,
    agent: Side,
    mode: Mode,
) -> anyhow::Result<()> {
    let cell = Cell::start_with(
        "gzip",
        principal,
        agent,
        mode,
        true,
        &["--enable-compression"],
    )
    .await?;
    cell.create_and_sync_demo("the Application Synced with a gzip-compressing agent")
        .await
}

cells!(compressed_agent_syncs_an_app, Mode::Managed, {
    compressed_agent_syncs_an_app_ours_principal_ours_agent: Ours, Ours;
    compressed_agent_syncs_an_app_ours_principal_upstream_agent: Ours, Upstream;
    compressed_agent_syncs_an_app_upstream_principal_ours_agent: Upstream, Ours;
    compressed_agent_syncs_an_app_upstream_principal_upstream_agent: Upstream, Upstream;
});

// ---- gRPC over WebSocket through an HTTP/1.1-only proxy (--enable-websocket) -------------------
//
// Between agent and principal a real nginx that speaks only HTTP/1.1 (no h2 in its ALPN) and
// passes WebSocket upgrades, re-encrypting with the agent's certificate as upstream's own e2e
// proxy does ([`Http1Proxy`]). Upstream's agent cannot take part: its WebSocket transport,
// golang.stackrox.io/grpc-http1, is refused by the module proxy here (e2e/peers/agent).

/// The path of the `RefreshToken` call.
const REFRESH_TOKEN: &str = "/authapi.Authentication/RefreshToken";

/// The agent's ops port (our agent only).
fn our_agent_port(cell: &Cell) -> u16 {
    match &cell.agent {
        AnyAgent::Ours(a) => a.ops_port,
        AnyAgent::Upstream(_) => unreachable!("the WebSocket cells run our agent"),
    }
}

/// Waits until our agent's connection gauge reads `connected`.
async fn wait_agent_connection(cell: &Cell, connected: bool, what: &str) -> anyhow::Result<()> {
    let port = our_agent_port(cell);
    wait_until(what, SYNC_WAIT, || async move {
        let now = e2e::metrics::agent_connected(port).await.unwrap_or(false);
        Ok::<_, anyhow::Error>((now == connected).then_some(()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))
}

/// Both ends with `--enable-websocket` and only an HTTP/1.1 proxy between them: an Application
/// created on the hub is synced by the spoke's real Argo CD and its status comes back, every call
/// having crossed nginx as a WebSocket upgrade; when the proxy dies the agent's stream breaks, it
/// reconnects once the proxy is back — refreshing its expired access token over WebSocket rather
/// than logging in again — and a later change syncs too.
#[tokio::test]
async fn websocket_through_an_http1_only_proxy_syncs_an_app_and_reconnects_ours_principal_ours_agent(
) -> anyhow::Result<()> {
    let options = CellOptions {
        // Shorter than the agent's 30 s expiry margin: every reconnect refreshes the token.
        principal_args: &["--enable-websocket", "--access-token-lifetime=20s"],
        ..Link::WebSocketProxy.apply(CellOptions {
            with_argocd: true,
            ..CellOptions::default()
        })
    };
    let mut cell =
        Cell::start_full("websocket", Side::Ours, Side::Ours, Mode::Managed, options).await?;
    cell.create_and_sync_demo("the Application Synced through the HTTP/1.1-only proxy")
        .await?;
    // The calls made before the stream opened crossed nginx, each an HTTP/1.1 upgrade switched
    // by the principal; nothing else crossed it.
    cell.wait_proxied(&[
        "/versionapi.Version/Version",
        "/authapi.Authentication/Authenticate",
    ])
    .await?;

    // The proxy dies: the stream breaks; back on the same port, the agent reconnects through it.
    let proxy = cell.http1_proxy.as_mut().expect("a proxy cell");
    proxy.process.kill();
    wait_agent_connection(&cell, false, "the agent noticed the proxy is gone").await?;
    let proxy = cell.http1_proxy.as_mut().expect("a proxy cell");
    proxy.process.start_again()?;
    proxy.wait_listening().await?;
    wait_agent_connection(&cell, true, "the agent reconnected through the proxy").await?;

    // A change after the reconnect reaches the spoke and is synced.
    let second = cell.commit_second_version()?;
    cell.patch_app(
        &cell.hub_apps,
        json!({"spec": {"source": {"path": "demo2"}}}),
    )
    .await?;
    cell.wait_greeting("v2").await?;
    cell.wait_synced(
        &cell.hub_apps,
        &second,
        "the hub Application Synced at the new path after the reconnect",
    )
    .await?;
    // The reconnect refreshed the token over WebSocket; had RefreshToken failed there, the agent
    // would have logged in again.
    let requests = cell.wait_proxied(&[REFRESH_TOKEN]).await?;
    let logins = requests
        .iter()
        .filter(|l| l.contains(" /authapi.Authentication/Authenticate "))
        .count();
    anyhow::ensure!(
        logins == 1,
        "{logins} logins, one expected:\n{}",
        requests.join("\n")
    );
    Ok(())
}

/// Without `--enable-websocket`, an agent behind the same proxy cannot connect (the proxy offers
/// no HTTP/2) and says what to do: a refusal naming the flag, logged and in its readiness, never
/// a connection.
#[tokio::test]
async fn without_enable_websocket_our_agent_behind_an_http1_only_proxy_fails_naming_the_flag(
) -> anyhow::Result<()> {
    let options = CellOptions {
        principal_args: &["--enable-websocket"],
        http1_proxy: true,
        ..CellOptions::default()
    };
    let cell = Cell::start_full(
        "websocket_missing",
        Side::Ours,
        Side::Ours,
        Mode::Managed,
        options,
    )
    .await?;
    let hint = "start the principal and this agent with --enable-websocket";
    wait_until("the agent's refusal naming the flag", SYNC_WAIT, || async {
        Ok::<_, anyhow::Error>(cell.agent.process().log().contains(hint).then_some(()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;
    let port = our_agent_port(&cell);
    let (status, body) = e2e::gateway::http_get(port, "/readyz").await?;
    anyhow::ensure!(
        status == 503 && body.contains("--enable-websocket"),
        "readiness says why: {status} {body}"
    );
    anyhow::ensure!(
        !e2e::metrics::agent_connected(port).await?,
        "never connected:\n{}",
        cell.logs()
    );
    // Positive control: the same principal, straight (HTTP/2 on the same port), serves the same
    // kind of agent; so the proxy is what stands in the way.
    cell.another_agent_of_ours("direct", &[])
        .await?
        .wait_connected()
        .await?;
    Ok(())
}

/// A cell whose principal (`principal`'s side) runs with `--enable-websocket` and whose agent
/// (`agent`'s side, without the flag) is straight on it, with the demo Application synced by the
/// spoke's real Argo CD over HTTP/2.
async fn synced_over_http2_beside_websocket(
    scenario: &str,
    principal: Side,
    agent: Side,
) -> anyhow::Result<Cell> {
    let options = CellOptions {
        with_argocd: true,
        principal_args: &["--enable-websocket"],
        ..CellOptions::default()
    };
    let cell = Cell::start_full(scenario, principal, agent, Mode::Managed, options).await?;
    cell.create_and_sync_demo(&format!(
        "the Application of the {agent:?} agent Synced over HTTP/2 on the {principal:?} \
         principal with --enable-websocket"
    ))
    .await?;
    Ok(cell)
}

/// Upstream's Go agent without the flag on our principal with it: `--enable-websocket` keeps
/// native gRPC on the same port (as upstream's downgrading handler does), so its Application syncs.
#[tokio::test]
async fn upstream_agent_over_http2_on_our_principal_with_enable_websocket() -> anyhow::Result<()> {
    synced_over_http2_beside_websocket("websocket_native", Side::Ours, Side::Upstream).await?;
    Ok(())
}

/// Our agent with `--enable-websocket` on upstream's principal with it: that principal serves
/// HTTP/1.1 only through grpc-http1, which this build of it lacks (the module proxy refuses the
/// module; e2e/peers/agent's stand-in answers 501), so the agent fails and quotes the answer; and
/// without the flag our agent syncs on that same principal over HTTP/2, which upstream's
/// downgrading handler still serves.
#[tokio::test]
async fn our_agent_on_upstream_principal_with_enable_websocket_http2_syncs_and_websocket_quotes_the_refusal(
) -> anyhow::Result<()> {
    let cell = synced_over_http2_beside_websocket("websocket_upstream", Side::Upstream, Side::Ours)
        .await?;
    let ws_agent = cell
        .another_agent_of_ours("ws", &["--enable-websocket"])
        .await?;
    let quoted = "HTTP 501 Not Implemented: gRPC over HTTP/1 is not available in this build";
    wait_until(
        "our WebSocket agent quoting the refusal",
        SYNC_WAIT,
        || async { Ok::<_, anyhow::Error>(ws_agent.process.log().contains(quoted).then_some(())) },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", ws_agent.process.log_tail(30)))?;
    Ok(())
}

// ---- a mixed fleet: Go and Rust agents on one principal of ours ----------------------------------

/// A second agent joining a cell's principal from another spoke, with its own spoke Argo CD.
struct Member {
    name: String,
    /// The spoke namespace its demo app deploys into.
    dest: String,
    spoke: &'static ControlPlane,
    argocd: ArgoCd,
    agent: AnyAgent,
    hub_apps: Api<DynamicObject>,
    spoke_apps: Api<DynamicObject>,
}

impl Cell {
    /// Starts a `side` agent on `spoke` (with its own Argo CD) against this cell's principal, in
    /// the cell's mode.
    async fn join(&self, side: Side, spoke: &'static ControlPlane) -> anyhow::Result<Member> {
        let name = self.ctx.unique("agent-b");
        self.pki.issue_agent(&name)?;
        ensure_namespace(&self.hub_client, &name).await?;
        let spoke_ns = self.ctx.unique("argocd-b");
        let argocd = ArgoCd::start_spoke(
            &format!("{}-b", self.ctx.suffix),
            &self.ctx.dir,
            spoke,
            &spoke_ns,
            &[],
        )
        .await?;
        let dest = self.ctx.unique("demo-b");
        ensure_namespace(&spoke.client().await?, &dest).await?;
        let agent = AnyAgent::start(
            side,
            &name,
            &self.ctx.dir,
            spoke,
            &self.pki,
            &self.principal.address(),
            self.mode,
            &spoke_ns,
            Some(&argocd),
            &[],
        )
        .await?;
        Ok(Member {
            hub_apps: Api::namespaced_with(self.hub_client.clone(), &name, &application_resource()),
            spoke_apps: Api::namespaced_with(
                spoke.client().await?,
                &spoke_ns,
                &application_resource(),
            ),
            name,
            dest,
            spoke,
            argocd,
            agent,
        })
    }
}

/// Namespaces of the resources an Application's status lists.
fn status_resource_namespaces(app: &Value) -> Vec<String> {
    app.pointer("/status/resources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r["namespace"].as_str().map(str::to_string))
        .collect()
}

/// One principal of ours serving an upstream Go agent and one of ours at once, as a fleet
/// migrating one cluster at a time would: an Application of the same name in each agent's hub
/// namespace is synced on that agent's spoke only and each hub Application gets its own spoke's
/// status; a change and a delete of ours leave the Go agent's Application alone.
#[tokio::test]
async fn mixed_fleet_go_and_rust_agents_on_our_principal() -> anyhow::Result<()> {
    let go = Cell::start(
        "mixed_fleet",
        Side::Ours,
        Side::Upstream,
        Mode::Managed,
        true,
    )
    .await?;
    let rust = go
        .join(Side::Ours, &shared_planes().await.spokes[0])
        .await?;
    let logs = || {
        format!(
            "{}\n--- our agent ---\n{}\n{}",
            go.logs(),
            rust.agent.process().log_tail(30),
            rust.argocd.log_tails(10)
        )
    };
    let rust_repo = go.git.url("rust-apps");
    let rust_first = go
        .git
        .commit("rust-apps", "demo", &demo_manifests("rust v1"), "rust v1")?;
    go.hub_apps
        .create(&PostParams::default(), &go.demo_app(&go.name, false))
        .await?;
    rust.hub_apps
        .create(
            &PostParams::default(),
            &demo_application("demo", &rust.name, &rust_repo, &rust.dest),
        )
        .await?;

    go.wait_greeting("v1").await?;
    wait_greeting(rust.spoke, &rust.dest, "rust v1")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    let go_app = go
        .wait_synced(&go.hub_apps, &go.first, "the Go agent's Application Synced")
        .await?;
    let rust_app = wait_synced(
        &rust.hub_apps,
        "demo",
        &rust_first,
        "our agent's Application Synced",
        logs,
    )
    .await?;
    for (app, dest, who) in [(&go_app, &go.dest, "Go"), (&rust_app, &rust.dest, "our")] {
        let namespaces = status_resource_namespaces(app);
        anyhow::ensure!(
            !namespaces.is_empty() && namespaces.iter().all(|n| n == dest),
            "the {who} agent's hub status lists its own spoke's resources only: {namespaces:?}"
        );
    }
    for (apps, repo, who) in [
        (&go.spoke_apps, go.git.url("apps"), "Go"),
        (&rust.spoke_apps, rust_repo.clone(), "our"),
    ] {
        let on_spoke: Vec<(String, String)> = apps
            .list(&Default::default())
            .await?
            .into_iter()
            .map(|a| {
                let v = serde_json::to_value(&a).unwrap_or_default();
                (a.name_any(), text(&v, "/spec/source/repoURL"))
            })
            .collect();
        anyhow::ensure!(
            on_spoke == [("demo".to_string(), repo.clone())],
            "the {who} agent's spoke holds its own Application only: {on_spoke:?}"
        );
    }

    // A new path for our agent's Application reaches its spoke only.
    let rust_second = go
        .git
        .commit("rust-apps", "demo2", &demo_manifests("rust v2"), "rust v2")?;
    go.patch_app(
        &rust.hub_apps,
        json!({"spec": {"source": {"path": "demo2"}}}),
    )
    .await?;
    wait_greeting(rust.spoke, &rust.dest, "rust v2")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    wait_synced(
        &rust.hub_apps,
        "demo",
        &rust_second,
        "our agent's Application Synced at the new path",
        logs,
    )
    .await?;
    let go_spoke_app = serde_json::to_value(go.spoke_apps.get("demo").await?)?;
    anyhow::ensure!(
        text(&go_spoke_app, "/spec/source/path") == "demo",
        "the Go agent's spoke Application keeps its path"
    );
    let (sync, health, revision) =
        scenario::sync_state(&serde_json::to_value(go.hub_apps.get("demo").await?)?);
    anyhow::ensure!(
        (sync.as_str(), health.as_str(), revision.as_str())
            == ("Synced", "Healthy", go.first.as_str()),
        "the Go agent's hub status is unchanged: {sync} {health} {revision}\n{}",
        logs()
    );

    // Deleting our agent's Application leaves the Go agent's in place.
    rust.hub_apps.delete("demo", &Default::default()).await?;
    go.wait_app_gone(&rust.spoke_apps, "our agent's spoke Application deleted")
        .await?;
    anyhow::ensure!(go.hub_apps.get_opt("demo").await?.is_some());
    anyhow::ensure!(go.spoke_apps.get_opt("demo").await?.is_some());
    Ok(())
}

// ---- observing a transient state ----------------------------------------------------------------

/// Whether a watch saw an annotation on some version of the demo Application.
struct AnnotationWatch {
    seen: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl AnnotationWatch {
    fn observed(&self) -> bool {
        self.seen.load(Ordering::SeqCst)
    }
}

impl Drop for AnnotationWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches the demo Application in `api` and records whether any version of it carries
/// `annotation` (a refresh request lives only until Argo CD consumes it, so polling could miss
/// it); returns once the watch is established.
async fn watch_for_annotation(
    api: Api<DynamicObject>,
    annotation: &'static str,
) -> anyhow::Result<AnnotationWatch> {
    let seen = Arc::new(AtomicBool::new(false));
    let listed = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn({
        let (seen, listed) = (seen.clone(), listed.clone());
        async move {
            let config = watcher::Config::default().fields("metadata.name=demo");
            let mut events = watcher(api, config).boxed();
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(watcher::Event::InitDone) => listed.store(true, Ordering::SeqCst),
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o))
                        if o.annotations().contains_key(annotation) =>
                    {
                        seen.store(true, Ordering::SeqCst)
                    }
                    _ => {}
                }
            }
        }
    });
    wait_until("the spoke watch listed", SYNC_WAIT, || async {
        Ok::<_, anyhow::Error>(listed.load(Ordering::SeqCst).then_some(()))
    })
    .await?;
    Ok(AnnotationWatch { seen, task })
}
