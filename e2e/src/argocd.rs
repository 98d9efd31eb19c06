//! Real Argo CD (the multi-call binary `hack/peers.sh` builds from Argo CD's Go module) run as local
//! processes the way Argo CD's own local development mode runs it (its Procfile:
//! `ARGOCD_FAKE_IN_CLUSTER=true`, one process per component, `KUBECONFIG` naming the cluster that
//! is "in-cluster"):
//! - on a spoke, [`ArgoCd::start_spoke`]: application-controller + repo-server + a Redis protected
//!   by a password, as Argo CD's default install configures it (secret `argocd-redis`, key `auth`);
//! - on the hub, [`ArgoCd::start_server`]: argocd-server (API, CLI and UI) and a repo-server (as
//!   upstream argocd-agent's hub runs them), their Redis address and password chosen by the caller
//!   (the principal's Redis proxy in front of the hub Redis, as upstream argocd-agent documents);
//!   and [`ArgoCd::start_applicationset_controller`], which generates hub Applications.
//!
//! Owns the objects Argo CD needs in its namespace before it starts (labelled `argocd-cm`,
//! `argocd-rbac-cm`, `argocd-secret` with a bcrypt admin password, `argocd-redis`, the `default`
//! AppProject open to every namespace), the `argocd` CLI bound to one server and config file, and
//! the server's REST API with an admin session token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use crate::binaries::Peer;
use crate::control_plane::ControlPlane;
use crate::gateway::{appproject_resource, ensure_namespace, wait_http_ok};
use crate::ports::free_port;
use crate::process::{temp_dir, ManagedProcess, ProcessSpec};
use crate::redis::Redis;
use crate::wait_until;

/// The admin password every test Argo CD is given.
pub const ADMIN_PASSWORD: &str = "e2e-admin-password";
/// How often Argo CD re-reads Git and compares (Argo CD's default is 3 minutes).
const RECONCILIATION: &str = "15s";
/// Field manager for what the harness writes in Argo CD's namespace.
const MANAGER: &str = "e2e-argocd";

/// Argo CD components running against one control plane.
pub struct ArgoCd {
    /// Argo CD's namespace on the plane.
    pub namespace: String,
    /// The Redis the components use (owned when started here).
    pub redis: Option<Redis>,
    /// repo-server's gRPC port.
    pub repo_server_port: Option<u16>,
    /// argocd-server's API/UI port (hub), plaintext on 127.0.0.1.
    pub server_port: Option<u16>,
    dir: PathBuf,
    /// Where repo-server looks for config management plugins' sockets (when one runs).
    plugin_sockets: Option<PathBuf>,
    processes: Vec<ManagedProcess>,
}

/// Where a component finds Redis.
#[derive(Clone, Debug)]
pub struct RedisEndpoint {
    /// `host:port`.
    pub address: String,
    /// AUTH password, if the server requires one.
    pub password: Option<String>,
    /// The CA its certificate chains to, when it serves TLS only: the components then connect
    /// with Argo CD's `--redis-use-tls --redis-ca-certificate`.
    pub tls_ca: Option<PathBuf>,
}

impl ArgoCd {
    /// Starts a spoke's Argo CD: a password-protected Redis, repo-server and application-controller
    /// managing the plane itself as the in-cluster destination, with Applications in `namespace`
    /// (and, with `app_namespaces`, in the namespaces matching those patterns too).
    pub async fn start_spoke(
        name: &str,
        dir: &Path,
        plane: &ControlPlane,
        namespace: &str,
        app_namespaces: &[&str],
    ) -> anyhow::Result<ArgoCd> {
        let dir = dir.join(format!("argocd-{name}"));
        std::fs::create_dir_all(&dir)?;
        let password = format!("redis-{}", uuid::Uuid::new_v4().simple());
        let redis = Redis::start_with_password(&format!("argocd-{name}"), &password)?;
        let endpoint = RedisEndpoint {
            address: redis.address(),
            password: Some(password),
            tls_ca: None,
        };
        prepare_namespace(plane, namespace, &endpoint).await?;
        let repo_server_port = free_port();
        let (repo_server, plugin_sockets) =
            repo_server(&dir, name, plane, &endpoint, repo_server_port)?;
        let repo_server = ManagedProcess::spawn(repo_server)?;
        let controller = component(
            &dir,
            "argocd-application-controller",
            name,
            plane,
            &endpoint,
        )?
        .arg(format!("--kubeconfig={}", plane.kubeconfig.display()))
        .arg(format!("--namespace={namespace}"))
        .arg(format!("--repo-server=127.0.0.1:{repo_server_port}"))
        .arg(format!("--metrics-port={}", free_port()))
        .args(["--app-resync-jitter", "0"])
        .args(["--self-heal-timeout-seconds", "2"]);
        let controller = if app_namespaces.is_empty() {
            controller
        } else {
            controller.arg(format!(
                "--application-namespaces={}",
                app_namespaces.join(",")
            ))
        };
        let controller = ManagedProcess::spawn(controller)?;
        Ok(ArgoCd {
            namespace: namespace.to_string(),
            redis: Some(redis),
            repo_server_port: Some(repo_server_port),
            server_port: None,
            dir,
            plugin_sockets: Some(plugin_sockets),
            processes: vec![repo_server, controller],
        })
    }

    /// Starts argocd-server on `plane` (API and CLI on a plaintext port) and the repo-server it
    /// validates sources with (upstream argocd-agent's hub runs both), with Redis at `redis` and
    /// Applications read from every namespace; waits for `/healthz`.
    pub async fn start_server(
        name: &str,
        dir: &Path,
        plane: &ControlPlane,
        namespace: &str,
        redis: RedisEndpoint,
    ) -> anyhow::Result<ArgoCd> {
        let dir = dir.join(format!("argocd-server-{name}"));
        std::fs::create_dir_all(&dir)?;
        prepare_namespace(plane, namespace, &redis).await?;
        let repo_server_port = free_port();
        let (repo_server, plugin_sockets) =
            repo_server(&dir, name, plane, &redis, repo_server_port)?;
        let repo_server = ManagedProcess::spawn(repo_server)?;
        let port = free_port();
        let spec = component(&dir, "argocd-server", name, plane, &redis)?
            .arg(format!("--kubeconfig={}", plane.kubeconfig.display()))
            .arg(format!("--namespace={namespace}"))
            .args(["--insecure", "--address", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .args(["--metrics-address", "127.0.0.1", "--metrics-port"])
            .arg(free_port().to_string())
            .arg(format!("--repo-server=127.0.0.1:{repo_server_port}"))
            .arg("--application-namespaces=*");
        let server = ManagedProcess::spawn(spec)?;
        let argocd = ArgoCd {
            namespace: namespace.to_string(),
            redis: None,
            repo_server_port: Some(repo_server_port),
            server_port: Some(port),
            dir,
            plugin_sockets: Some(plugin_sockets),
            processes: vec![repo_server, server],
        };
        wait_http_ok(port, "/healthz", Duration::from_secs(60))
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd.log_tails(30)))?;
        Ok(argocd)
    }

    /// Starts Argo CD's real `argocd-cmp-server` beside this instance's repo-server, as the
    /// documented sidecar: the config management plugin `config` (a `plugin.yaml` file), its
    /// generate command found on `path` (prepended to `PATH`); waits until the plugin's socket is
    /// where repo-server looks for it.
    pub async fn start_plugin(&mut self, config: &Path, path: &Path) -> anyhow::Result<()> {
        let sockets = self
            .plugin_sockets
            .clone()
            .ok_or_else(|| anyhow::anyhow!("no repo-server runs here to use a plugin"))?;
        let own = self.dir.join("argocd-cmp-server");
        let config_dir = own.join("config");
        for sub in ["tmp", "config"] {
            std::fs::create_dir_all(own.join(sub))?;
        }
        std::fs::copy(config, config_dir.join("plugin.yaml"))?;
        let search = std::env::join_paths(std::iter::once(path.to_path_buf()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))?;
        let spec = ProcessSpec::new(
            format!("argocd-cmp-server-{}", self.namespace),
            Peer::ArgoCd.binary("argocd-cmp-server")?,
            self.dir.join("argocd-cmp-server.log"),
        )
        .arg("--config-dir-path")
        .arg(&config_dir)
        .args(["--loglevel", "info", "--logformat", "text"])
        .env("ARGOCD_PLUGINSOCKFILEPATH", &sockets)
        .env("PATH", search)
        .env("TMPDIR", own.join("tmp"));
        self.processes.push(ManagedProcess::spawn(spec)?);
        wait_until(
            "the config management plugin's socket",
            Duration::from_secs(60),
            || async {
                let found = std::fs::read_dir(&sockets)?
                    .flatten()
                    .any(|e| e.path().extension().is_some_and(|x| x == "sock"));
                Ok::<_, std::io::Error>(found.then_some(()))
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", self.log_tails(20)))
    }

    /// Starts the ApplicationSet controller on `plane` for ApplicationSets in `namespace` (Argo
    /// CD's objects prepared there as for the other components; the multi-call binary run under
    /// that name); waits until its metrics server answers. No repo-server: list generators need none.
    /// Progressive syncs are enabled (`--enable-progressive-syncs`), so a `RollingSync` strategy is
    /// honoured; an ApplicationSet without one behaves as without the flag.
    pub async fn start_applicationset_controller(
        name: &str,
        dir: &Path,
        plane: &ControlPlane,
        namespace: &str,
    ) -> anyhow::Result<ArgoCd> {
        const COMPONENT: &str = "argocd-applicationset-controller";
        let dir = dir.join(format!("argocd-appset-{name}"));
        std::fs::create_dir_all(&dir)?;
        let no_redis = RedisEndpoint {
            address: String::new(),
            password: None,
            tls_ca: None,
        };
        prepare_namespace(plane, namespace, &no_redis).await?;
        let metrics = free_port();
        let spec = ProcessSpec::new(
            format!("{COMPONENT}-{name}"),
            Peer::ArgoCd.binary("argocd")?,
            dir.join(format!("{COMPONENT}.log")),
        )
        .env("ARGOCD_BINARY_NAME", COMPONENT)
        .env("KUBECONFIG", &plane.kubeconfig)
        .arg(format!("--kubeconfig={}", plane.kubeconfig.display()))
        .arg(format!("--namespace={namespace}"))
        .arg("--enable-progressive-syncs")
        .args(["--loglevel", "info", "--logformat", "text"])
        .arg(format!("--metrics-addr=127.0.0.1:{metrics}"))
        .arg(format!("--probe-addr=127.0.0.1:{}", free_port()))
        .arg(format!("--webhook-addr=127.0.0.1:{}", free_port()));
        let controller = ManagedProcess::spawn(spec)?;
        let argocd = ArgoCd {
            namespace: namespace.to_string(),
            redis: None,
            repo_server_port: None,
            server_port: None,
            dir,
            plugin_sockets: None,
            processes: vec![controller],
        };
        // Its metrics server starts with the manager (the probe server answers no path by default).
        wait_http_ok(metrics, "/metrics", Duration::from_secs(60))
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd.log_tails(30)))?;
        Ok(argocd)
    }

    /// The Redis endpoint of a spoke started here.
    pub fn redis_endpoint(&self) -> Option<RedisEndpoint> {
        self.redis.as_ref().map(|r| RedisEndpoint {
            address: r.address(),
            password: r.password.clone(),
            tls_ca: r.tls_ca.clone(),
        })
    }

    /// The tails of every component's log, for failure messages.
    pub fn log_tails(&self, lines: usize) -> String {
        self.processes
            .iter()
            .map(|p| format!("--- {} ---\n{}", p.name(), p.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The whole log of this instance's `component` (e.g. `argocd-application-controller`); ""
    /// when it does not run here.
    pub fn log_of(&self, component: &str) -> String {
        let prefix = format!("{component}-");
        self.processes
            .iter()
            .find(|p| p.name().starts_with(&prefix))
            .map(|p| p.log())
            .unwrap_or_default()
    }

    /// Runs the `argocd` CLI against this server, logged in as admin (the first call logs in);
    /// returns stdout, failing with stderr.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        run_cli(&self.cli_config()?, args)
    }

    /// Runs the `argocd` CLI like [`ArgoCd::cli`] but reports how it ended instead of failing on
    /// a non-zero exit (`argocd app diff` exits 1 when it finds a difference), and kills it after
    /// `timeout` (a CLI that waits on the hub, e.g. `app get --refresh`, would otherwise hang).
    pub async fn cli_run(&self, args: &[&str], timeout: Duration) -> anyhow::Result<CliRun> {
        let child = self.cli_command(args)?.output();
        let out = tokio::time::timeout(timeout, child).await.map_err(|_| {
            anyhow::anyhow!("argocd {} did not end within {timeout:?}", args.join(" "))
        })??;
        Ok(CliRun {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// The `argocd` CLI with `args` against this server, logged in as admin, not yet started and
    /// killed when dropped: for a run the caller reads while it goes (`argocd app logs --follow`).
    pub fn cli_command(&self, args: &[&str]) -> anyhow::Result<tokio::process::Command> {
        let mut command = tokio::process::Command::new(Peer::ArgoCd.binary("argocd")?);
        command
            .arg("--config")
            .arg(self.cli_config()?)
            .args(args)
            .env_remove("ARGOCD_BINARY_NAME")
            .kill_on_drop(true);
        Ok(command)
    }

    /// The CLI's config file, logged in as admin (the first call logs in).
    fn cli_config(&self) -> anyhow::Result<PathBuf> {
        let port = self
            .server_port
            .ok_or_else(|| anyhow::anyhow!("the argocd CLI needs an argocd-server"))?;
        let config = self.dir.join("cli-config");
        if !config.exists() {
            run_cli(
                &config,
                &[
                    "login",
                    &format!("127.0.0.1:{port}"),
                    "--username",
                    "admin",
                    "--password",
                    ADMIN_PASSWORD,
                    "--plaintext",
                ],
            )?;
        }
        Ok(config)
    }
}

/// How one `argocd` CLI run ended ([`ArgoCd::cli_run`]).
#[derive(Debug)]
pub struct CliRun {
    /// Exit code (`None` when a signal ended it).
    pub code: Option<i32>,
    /// What it printed on stdout.
    pub stdout: String,
    /// What it printed on stderr.
    pub stderr: String,
}

impl CliRun {
    /// Stdout of a run that exited 0; else an error with both outputs.
    pub fn success(self) -> anyhow::Result<String> {
        anyhow::ensure!(
            self.code == Some(0),
            "argocd exited with {:?}: {}{}",
            self.code,
            self.stdout,
            self.stderr
        );
        Ok(self.stdout)
    }
}

impl ArgoCd {
    /// An admin session token from `POST /api/v1/session` (what the UI and API clients use).
    pub async fn session_token(&self) -> anyhow::Result<String> {
        let body =
            serde_json::to_string(&json!({"username": "admin", "password": ADMIN_PASSWORD}))?;
        let (status, reply) = self
            .api("POST", "/api/v1/session", None, Some(&body))
            .await?;
        anyhow::ensure!(status == 200, "POST /api/v1/session: {status} {reply}");
        let reply: serde_json::Value = serde_json::from_str(&reply)?;
        reply["token"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow::anyhow!("no token in the session reply: {reply}"))
    }

    /// `GET <path>` of argocd-server's REST API with `token`; returns (status, body).
    pub async fn api_get(&self, path: &str, token: &str) -> anyhow::Result<(u16, String)> {
        self.api("GET", path, Some(token), None).await
    }

    /// One HTTP/1.0 request (so the reply is never chunked) to the server's plaintext port.
    async fn api(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> anyhow::Result<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let port = self
            .server_port
            .ok_or_else(|| anyhow::anyhow!("the REST API needs an argocd-server"))?;
        let mut request = format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n");
        if let Some(t) = token {
            request.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if let Some(b) = body {
            request.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            ));
        } else {
            request.push_str("\r\n");
        }
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut raw))
            .await
            .map_err(|_| anyhow::anyhow!("{method} {path}: no reply within 60s"))??;
        Ok(crate::gateway::http_response(&raw))
    }
}

fn run_cli(config: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(Peer::ArgoCd.binary("argocd")?)
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("ARGOCD_BINARY_NAME")
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "argocd {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One Argo CD process: the multi-call binary under the component's name, with the environment
/// Argo CD's Procfile gives every component, and private data, socket and temp paths so several
/// instances share a machine.
fn component(
    dir: &Path,
    component: &str,
    name: &str,
    plane: &ControlPlane,
    redis: &RedisEndpoint,
) -> anyhow::Result<ProcessSpec> {
    let own = dir.join(component);
    for sub in ["tls", "ssh", "gpg/source", "gpg/keys", "tmp", "plugins"] {
        std::fs::create_dir_all(own.join(sub))?;
    }
    let spec = ProcessSpec::new(
        format!("{component}-{name}"),
        Peer::ArgoCd.binary(component)?,
        dir.join(format!("{component}.log")),
    )
    .arg(format!("--redis={}", redis.address))
    .args(["--loglevel", "info", "--logformat", "text"])
    .env("ARGOCD_FAKE_IN_CLUSTER", "true")
    // The reconciliation period (a user's `timeout.reconciliation`), shortened for tests; it also
    // bounds how long repo-server caches a resolved branch.
    .env("ARGOCD_RECONCILIATION_TIMEOUT", RECONCILIATION)
    .env("KUBECONFIG", &plane.kubeconfig)
    .env("ARGOCD_TLS_DATA_PATH", own.join("tls"))
    .env("ARGOCD_SSH_DATA_PATH", own.join("ssh"))
    .env("ARGOCD_GPG_DATA_PATH", own.join("gpg/source"))
    .env("ARGOCD_GNUPGHOME", own.join("gpg/keys"))
    .env("ARGOCD_GPG_ENABLED", "false")
    // A unix socket path must stay under 108 bytes: a short directory of its own.
    .env("ARGOCD_ASK_PASS_SOCK", temp_dir("askpass")?.join("s.sock"))
    .env("ARGOCD_PLUGINSOCKFILEPATH", own.join("plugins"))
    .env("TMPDIR", own.join("tmp"));
    let spec = match &redis.tls_ca {
        Some(ca) => spec
            .arg("--redis-use-tls")
            .arg(format!("--redis-ca-certificate={}", ca.display())),
        None => spec,
    };
    Ok(match &redis.password {
        Some(p) => spec.env("REDIS_PASSWORD", p),
        None => spec,
    })
}

/// repo-server on `port` (TLS with a self-signed certificate, as by default; clients accept it),
/// and the directory it finds config management plugins' sockets in (short: a unix socket path
/// must stay under 108 bytes).
fn repo_server(
    dir: &Path,
    name: &str,
    plane: &ControlPlane,
    redis: &RedisEndpoint,
    port: u16,
) -> anyhow::Result<(ProcessSpec, PathBuf)> {
    let plugin_sockets = temp_dir("cmp")?;
    let spec = component(dir, "argocd-repo-server", name, plane, redis)?
        .args(["--address", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .args(["--metrics-address", "127.0.0.1", "--metrics-port"])
        .arg(free_port().to_string())
        .env("ARGOCD_PLUGINSOCKFILEPATH", &plugin_sockets);
    Ok((spec, plugin_sockets))
}

/// The objects Argo CD reads at start-up, created or updated with server-side apply.
async fn prepare_namespace(
    plane: &ControlPlane,
    namespace: &str,
    redis: &RedisEndpoint,
) -> anyhow::Result<()> {
    let client = plane.client().await?;
    ensure_namespace(&client, namespace).await?;
    let ssa = PatchParams::apply(MANAGER).force();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    for (cm, data) in [
        (
            "argocd-cm",
            // Several Argo CDs share each test plane, and their Applications often share names
            // (`demo`): without an installation ID each controller takes the others' resources
            // (same tracking id) for its own and prunes them. Argo CD's own answer for several
            // instances on one cluster: an installationID per instance, stamped on what it applies.
            json!({"timeout.reconciliation": RECONCILIATION, "installationID": namespace}),
        ),
        ("argocd-rbac-cm", json!({})),
    ] {
        // Argo CD finds its ConfigMaps by this label: an unlabelled argocd-cm counts as missing.
        let obj = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": cm, "labels": {"app.kubernetes.io/part-of": "argocd"}},
            "data": data,
        });
        cms.patch(cm, &ssa, &Patch::Apply(obj)).await?;
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let hash = bcrypt_password(ADMIN_PASSWORD)?;
    let argocd_secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "argocd-secret", "labels": {"app.kubernetes.io/part-of": "argocd"}},
        "stringData": {
            "server.secretkey": uuid::Uuid::new_v4().simple().to_string(),
            "admin.password": hash,
            "admin.passwordMtime": "2020-01-01T00:00:00Z",
        },
    });
    secrets
        .patch("argocd-secret", &ssa, &Patch::Apply(argocd_secret))
        .await?;
    if let Some(p) = &redis.password {
        let obj = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "argocd-redis", "labels": {"app.kubernetes.io/part-of": "argocd"}},
            "stringData": {"auth": p},
        });
        secrets
            .patch("argocd-redis", &ssa, &Patch::Apply(obj))
            .await?;
    }
    let projects: Api<DynamicObject> =
        Api::namespaced_with(client, namespace, &appproject_resource());
    let default_project = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "default"},
        "spec": {
            "sourceRepos": ["*"],
            "destinations": [{"server": "*", "namespace": "*", "name": "*"}],
            "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
            "sourceNamespaces": ["*"],
        },
    });
    projects
        .patch("default", &ssa, &Patch::Apply(default_project))
        .await?;
    Ok(())
}

/// A bcrypt hash of `password`, made by Argo CD's own CLI (`argocd account bcrypt`).
fn bcrypt_password(password: &str) -> anyhow::Result<String> {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(h) = HASH.get() {
        return Ok(h.clone());
    }
    let out = std::process::Command::new(Peer::ArgoCd.binary("argocd")?)
        .args(["account", "bcrypt", "--password", password])
        .env_remove("ARGOCD_BINARY_NAME")
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "argocd account bcrypt failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(HASH.get_or_init(|| hash).clone())
}
