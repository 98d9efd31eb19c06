//! Upstream argocd-agent (the Go principal and agent `hack/peers.sh` builds from its Go module) as
//! local processes, started with the flags upstream's own dev environment uses
//! (`hack/dev-env/start-principal.sh`, `start-agent-*.sh`) and TLS/JWT material from files, so any
//! mix of upstream and our principal and agents can be put together in one test.
//!
//! Constraints of upstream v0.9.0 that shape this: its resource proxy and Redis proxy listen on the
//! fixed addresses 0.0.0.0:9090 and 0.0.0.0:6379, so they are switched off here, except that a
//! test holding [`hold_resource_proxy_port`] may switch the resource proxy on
//! ([`resource_proxy_args`]) and one holding [`hold_redis_proxy_port`] the Redis proxy
//! ([`redis_proxy_args`]) (each a [`FixedPortHold`], shared by the test processes of the host,
//! since several test binaries may run at once); its health port must be below 32768 ([`free_low_port`]); and grpc-go's
//! server refuses HTTP/2 pings more often than every 5 minutes unless `--keepalive-min-interval`
//! allows them, which upstream's docs tell users to set for agents that ping.

use std::path::Path;
use std::time::Duration;

use crate::binaries::Peer;
use crate::control_plane::ControlPlane;
use crate::gateway::{agentctl, ensure_namespace, wait_http_ok, Pki};
use crate::ports::{free_low_port, free_port};
use crate::process::{ManagedProcess, ProcessSpec};
use crate::redis::Redis;

/// The port upstream v0.9.0's resource proxy listens on, on every interface (no flag sets it).
pub const RESOURCE_PROXY_PORT: u16 = 9090;

static RESOURCE_PROXY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits until no other test (of this process, or of another test process on this host holding
/// the same lock) runs an upstream principal with its resource proxy, and holds the port until
/// the guard is dropped.
pub async fn hold_resource_proxy_port() -> anyhow::Result<FixedPortHold> {
    FixedPortHold::take(&RESOURCE_PROXY, RESOURCE_PROXY_PORT).await
}

/// A fixed port held by one test on this host: the process's own lock, then an exclusive
/// advisory lock on a file named after the port in the temp directory, which test processes
/// running at once (several test binaries, or several checkouts on one machine) share.
pub struct FixedPortHold {
    _in_process: tokio::sync::MutexGuard<'static, ()>,
    _across_processes: std::fs::File,
}

impl FixedPortHold {
    async fn take(lock: &'static tokio::sync::Mutex<()>, port: u16) -> anyhow::Result<Self> {
        let in_process = lock.lock().await;
        let path = std::env::temp_dir().join(format!("argocd-agent-e2e-port-{port}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        // Blocks until the holder in another process drops it (or exits).
        let file = tokio::task::spawn_blocking(move || file.lock().map(|()| file)).await??;
        Ok(Self {
            _in_process: in_process,
            _across_processes: file,
        })
    }
}

/// Flags (given after [`UpstreamPrincipal::start`]'s own) that switch an upstream principal's
/// resource proxy on at [`RESOURCE_PROXY_PORT`], serving the PKI's principal certificate (valid
/// for 127.0.0.1) and accepting client certificates of the agent CA (upstream takes the agent's
/// name from their CN).
pub fn resource_proxy_args(pki: &Pki) -> Vec<String> {
    vec![
        "--enable-resource-proxy=true".into(),
        format!(
            "--resource-proxy-cert-path={}",
            pki.dir.join("principal.crt").display()
        ),
        format!(
            "--resource-proxy-key-path={}",
            pki.dir.join("principal.key").display()
        ),
        format!("--resource-proxy-ca-path={}", pki.ca().display()),
    ]
}

/// The port upstream v0.9.0's Redis proxy listens on, on every interface (no flag sets it:
/// `defaultRedisProxyListenerAddr` in principal/server.go).
pub const REDIS_PROXY_PORT: u16 = 6379;

static REDIS_PROXY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits until no other test (as [`hold_resource_proxy_port`]) runs an upstream principal with
/// its Redis proxy, and holds the port until the guard is dropped.
pub async fn hold_redis_proxy_port() -> anyhow::Result<FixedPortHold> {
    FixedPortHold::take(&REDIS_PROXY, REDIS_PROXY_PORT).await
}

/// Flags (given after [`UpstreamPrincipal::start`]'s own, which they override) that switch an
/// upstream principal's Redis proxy on at [`REDIS_PROXY_PORT`] in front of `hub` (the hub Argo
/// CD's Redis, started with [`Redis::start_as_hub`]): upstream's proxy sends no `AUTH` of its own
/// but passes argocd-server's on, and reads the password for its own use from the same creds
/// directory our principal does.
pub fn redis_proxy_args(hub: &Redis) -> Vec<String> {
    let mut args = vec![
        "--disable-redis-proxy=false".to_string(),
        format!("--redis-server-address={}", hub.address()),
    ];
    if let Some(dir) = &hub.creds_dir {
        args.push(format!("--redis-creds-dir-path={}", dir.display()));
    }
    args
}

/// A running upstream `argocd-agent principal`.
pub struct UpstreamPrincipal {
    /// The process.
    pub process: ManagedProcess,
    /// gRPC port on 127.0.0.1.
    pub grpc_port: u16,
    /// Health port (`/healthz`), on every interface as upstream binds it.
    pub health_port: u16,
    /// The principal's namespace on the hub.
    pub namespace: String,
}

impl UpstreamPrincipal {
    /// Starts an upstream principal against `hub` in `namespace` (created if needed) with the PKI's
    /// principal certificate, agent CA and JWT key, agents named by their certificate's CN, and
    /// waits for `/healthz`.
    pub async fn start(
        name: &str,
        dir: &Path,
        hub: &ControlPlane,
        pki: &Pki,
        namespace: &str,
        redis_address: Option<&str>,
        extra: &[&str],
    ) -> anyhow::Result<UpstreamPrincipal> {
        ensure_namespace(&hub.client().await?, namespace).await?;
        // Upstream signs its tokens RS512 and reads only an RSA key (PKCS#8); our principal's
        // default is ES256, so the PKI gets an RSA key of its own for upstream principals.
        let jwt_dir = pki.dir.join("upstream-jwt");
        if !jwt_dir.join("jwt.key").is_file() {
            agentctl(&[
                "jwt",
                "create-key",
                "--algorithm",
                "rsa2048",
                "--dir",
                jwt_dir.to_str().expect("utf-8 path"),
            ])?;
        }
        let grpc_port = free_port();
        let health_port = free_low_port();
        let redis = redis_address
            .map(str::to_string)
            .unwrap_or_else(|| format!("127.0.0.1:{}", free_port()));
        let spec = ProcessSpec::new(
            format!("upstream-principal-{name}"),
            Peer::UpstreamAgent.binary("argocd-agent")?,
            dir.join(format!("upstream-principal-{name}.log")),
        )
        .arg("principal")
        .arg(format!("--kubeconfig={}", hub.kubeconfig.display()))
        .arg(format!("--namespace={namespace}"))
        .args(["--listen-host=127.0.0.1"])
        .arg(format!("--listen-port={grpc_port}"))
        .arg(format!(
            "--tls-cert={}",
            pki.dir.join("principal.crt").display()
        ))
        .arg(format!(
            "--tls-key={}",
            pki.dir.join("principal.key").display()
        ))
        .arg(format!("--root-ca-path={}", pki.ca().display()))
        .arg(format!("--jwt-key={}", jwt_dir.join("jwt.key").display()))
        .arg("--auth=mtls:subject:CN=([^,]+)")
        .arg("--allowed-namespaces=*")
        .arg("--namespace-create-enable=true")
        .arg("--enable-resource-proxy=false")
        .arg("--disable-redis-proxy")
        .arg(format!("--redis-server-address={redis}"))
        .arg("--metrics-port=0")
        .arg(format!("--healthz-port={health_port}"))
        .arg("--keepalive-min-interval=10s")
        .args(["--log-level=debug", "--log-format=text"])
        .args(extra.iter().copied());
        let principal = UpstreamPrincipal {
            process: ManagedProcess::spawn(spec)?,
            grpc_port,
            health_port,
            namespace: namespace.to_string(),
        };
        principal.wait_ready().await?;
        Ok(principal)
    }

    /// Waits until `/healthz` answers (after a start or restart).
    pub async fn wait_ready(&self) -> anyhow::Result<()> {
        wait_http_ok(self.health_port, "/healthz", Duration::from_secs(60))
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.process.log_tail(30)))
    }

    /// `127.0.0.1:<grpc port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.grpc_port)
    }
}

/// A running upstream `argocd-agent agent`.
pub struct UpstreamAgent {
    /// The process.
    pub process: ManagedProcess,
    /// The agent's name (its certificate CN).
    pub name: String,
    /// The agent's Argo CD namespace on its spoke.
    pub namespace: String,
}

impl UpstreamAgent {
    /// Starts upstream agent `name` on `spoke` in `mode` (managed|autonomous), keeping its
    /// Applications in `namespace` there, dialling `principal` (`host:port`) with the PKI's agent
    /// certificate; `redis_address` is the spoke Argo CD's Redis (with `password`).
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        name: &str,
        dir: &Path,
        spoke: &ControlPlane,
        pki: &Pki,
        principal: &str,
        mode: &str,
        namespace: &str,
        redis: Option<(&str, Option<&str>)>,
        extra: &[&str],
    ) -> anyhow::Result<UpstreamAgent> {
        ensure_namespace(&spoke.client().await?, namespace).await?;
        let (host, port) = principal
            .rsplit_once(':')
            .ok_or_else(|| anyhow::anyhow!("principal address {principal} is not host:port"))?;
        let (cert, key) = pki.agent_files(name);
        let spec = ProcessSpec::new(
            format!("upstream-agent-{name}"),
            Peer::UpstreamAgent.binary("argocd-agent")?,
            dir.join(format!("upstream-agent-{name}.log")),
        )
        .arg("agent")
        .arg(format!("--kubeconfig={}", spoke.kubeconfig.display()))
        .arg(format!("--namespace={namespace}"))
        .arg(format!("--agent-mode={mode}"))
        .arg(format!("--server-address={host}"))
        .arg(format!("--server-port={port}"))
        .arg("--creds=mtls:any")
        .arg(format!("--root-ca-path={}", pki.ca().display()))
        .arg(format!("--tls-client-cert={}", cert.display()))
        .arg(format!("--tls-client-key={}", key.display()))
        .arg("--metrics-port=0")
        .arg(format!("--healthz-port={}", free_low_port()))
        .args(["--log-level=debug", "--log-format=text"]);
        let spec = match redis {
            Some((address, password)) => {
                let spec = spec.arg(format!("--redis-addr={address}"));
                match password {
                    Some(p) => spec.env("REDIS_PASSWORD", p),
                    None => spec,
                }
            }
            None => spec.arg(format!("--redis-addr=127.0.0.1:{}", free_port())),
        }
        .args(extra.iter().copied());
        Ok(UpstreamAgent {
            process: ManagedProcess::spawn(spec)?,
            name: name.to_string(),
            namespace: namespace.to_string(),
        })
    }
}
