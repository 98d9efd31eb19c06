//! Running the gateway in tests: a PKI made with the real `argocd-agentctl`, an `argocd-principal`
//! on a hub plane and `argocd-agent`s on spoke planes as child processes, and small helpers for the
//! Argo CD objects the tests create and inspect.

use std::path::{Path, PathBuf};
use std::time::Duration;

use argocd_agent_runtime::dial::{
    connect_tls, dial_grpc, ConnectError, GrpcDialOptions, TlsTarget,
};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{json, Value};

use crate::binaries::project_binary;
use crate::control_plane::ControlPlane;
use crate::ports::free_port;
use crate::process::{ManagedProcess, ProcessSpec};
use crate::wait::wait_until;
pub use argocd_agent_kube::resources::{
    application as application_resource, appproject as appproject_resource,
};

/// Annotation that links a spoke copy to its hub object.
pub const SOURCE_UID: &str = "argocd.argoproj.io/source-uid";

/// A minimal valid Application.
pub fn application(name: &str, namespace: &str, revision: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "project": "default",
            "source": {"repoURL": "https://github.com/argoproj/argocd-example-apps", "path": "guestbook", "targetRevision": revision},
            "destination": {"name": "remote", "namespace": "guestbook"}
        }
    }))
    .expect("valid Application")
}

/// Creates `ns` on a plane if it does not exist.
pub async fn ensure_namespace(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Runs `argocd-agentctl` with `args`, failing with its output if it fails. The user's
/// `~/.config/argocd-agent/ctl.conf` is not read (its default principal would redirect commands).
pub fn agentctl(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(project_binary("argocd-agentctl")?)
        .args(args)
        .env("ARGOCD_AGENTCTL_CONFIG", "/dev/null")
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "argocd-agentctl {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A file-based PKI made by `argocd-agentctl pki init/issue` and `jwt create-key`.
pub struct Pki {
    /// The PKI directory.
    pub dir: PathBuf,
}

impl Pki {
    /// A CA, a principal certificate for localhost/127.0.0.1 and a JWT key under `dir`.
    pub fn create(dir: &Path) -> anyhow::Result<Pki> {
        let d = dir.to_str().expect("utf-8 path");
        agentctl(&["pki", "init", "--dir", d])?;
        agentctl(&[
            "pki",
            "issue",
            "principal",
            "--dir",
            d,
            "--dns",
            "localhost",
            "--ip",
            "127.0.0.1",
        ])?;
        agentctl(&["jwt", "create-key", "--dir", d])?;
        Ok(Pki {
            dir: dir.to_path_buf(),
        })
    }

    /// Issues a client certificate for agent `name`.
    pub fn issue_agent(&self, name: &str) -> anyhow::Result<()> {
        agentctl(&[
            "pki",
            "issue",
            "agent",
            name,
            "--dir",
            self.dir.to_str().expect("utf-8 path"),
        ])?;
        Ok(())
    }

    /// Our principal's flags naming this PKI's files: its certificate and key, the agent CA and
    /// the JWT signing key.
    pub fn principal_args(&self) -> [String; 4] {
        [
            format!("--tls-cert={}", self.dir.join("principal.crt").display()),
            format!("--tls-key={}", self.dir.join("principal.key").display()),
            format!("--tls-ca={}", self.ca().display()),
            self.jwt_key_arg(),
        ]
    }

    /// `--jwt-key` naming this PKI's signing key.
    pub fn jwt_key_arg(&self) -> String {
        format!("--jwt-key={}", self.dir.join("jwt.key").display())
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// (certificate, key) of agent `name`.
    pub fn agent_files(&self, name: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("agents/{name}.crt")),
            self.dir.join(format!("agents/{name}.key")),
        )
    }
}

/// Waits until `http://127.0.0.1:<port><path>` answers 200 (a health or readiness endpoint).
pub async fn wait_http_ok(port: u16, path: &str, timeout: Duration) -> anyhow::Result<()> {
    wait_until(&format!("{path} on port {port}"), timeout, || async move {
        Ok::<_, anyhow::Error>(matches!(http_get(port, path).await, Ok((200, _))).then_some(()))
    })
    .await
}

/// Scrapes `http://127.0.0.1:<port><path>` with a plain HTTP/1.1 GET; returns (status, body).
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    Ok(http_response(&buf))
}

/// (status, body) of a raw HTTP/1.1 response; status 0 when there is no status line.
pub fn http_response(raw: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// One HTTP/1.1 request over mutual TLS to `127.0.0.1:port` presenting `identity` (cert PEM, key
/// PEM); returns (status, body) of the answer (within 60 s).
pub async fn https_request(
    pki: &Pki,
    port: u16,
    identity: (&str, &str),
    method: &str,
    path: &str,
    body: &[u8],
) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tls = client_tls(pki, Some(identity), &[b"http/1.1"])?;
    let mut s = tls_connect(&format!("127.0.0.1:{port}"), std::sync::Arc::new(tls)).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body).await?;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut buf)).await?;
    Ok(http_response(&buf))
}

/// A running `argocd-principal`.
pub struct Principal {
    /// The process.
    pub process: ManagedProcess,
    /// gRPC port on 127.0.0.1.
    pub grpc_port: u16,
    /// Metrics/health port on 127.0.0.1.
    pub ops_port: u16,
    /// The principal's namespace on the hub.
    pub namespace: String,
    /// Resource proxy port on 127.0.0.1.
    pub resource_proxy_port: u16,
    /// Redis proxy port on 127.0.0.1.
    pub redis_proxy_port: u16,
}

impl Principal {
    /// Starts a principal against `hub` with its own namespace `namespace` (created if needed)
    /// and waits until it is ready.
    pub async fn start(
        name: &str,
        dir: &Path,
        hub: &ControlPlane,
        pki: &Pki,
        namespace: &str,
        extra: &[&str],
    ) -> anyhow::Result<Principal> {
        ensure_namespace(&hub.client().await?, namespace).await?;
        let principal = Principal::spawn(name, dir, hub, pki, namespace, extra)?;
        principal.wait_ready().await?;
        Ok(principal)
    }

    /// Starts the principal process without waiting for readiness (an HA standby never is ready)
    /// and without creating `namespace`; `extra` flags come last and win (e.g.
    /// `--enable-operator=true`).
    pub fn spawn(
        name: &str,
        dir: &Path,
        hub: &ControlPlane,
        pki: &Pki,
        namespace: &str,
        extra: &[&str],
    ) -> anyhow::Result<Principal> {
        Self::spawn_with_credentials(name, dir, hub, &pki.principal_args(), namespace, extra)
    }

    /// [`Principal::spawn`] with `credentials` in place of the PKI's file flags (e.g. only
    /// `--jwt-key`, for a principal that reads its TLS material from Secrets).
    pub fn spawn_with_credentials(
        name: &str,
        dir: &Path,
        hub: &ControlPlane,
        credentials: &[String],
        namespace: &str,
        extra: &[&str],
    ) -> anyhow::Result<Principal> {
        let grpc_port = free_port();
        let ops_port = free_port();
        let (resource_proxy_port, redis_proxy_port) = (free_port(), free_port());
        let spec = ProcessSpec::new(
            format!("principal-{name}"),
            project_binary("argocd-principal")?,
            dir.join(format!("principal-{name}.log")),
        )
        .arg(format!("--listen-address=127.0.0.1:{grpc_port}"))
        .arg(format!("--metrics-address=127.0.0.1:{ops_port}"))
        .arg(format!("--health-address=127.0.0.1:{ops_port}"))
        .arg(format!(
            "--resource-proxy-address=127.0.0.1:{resource_proxy_port}"
        ))
        .arg(format!(
            "--redis-proxy-address=127.0.0.1:{redis_proxy_port}"
        ))
        .args(credentials.iter().cloned())
        .arg(format!("--namespace={namespace}"))
        .arg(format!("--kubeconfig={}", hub.kubeconfig.display()))
        .arg("--enable-operator=false")
        .arg("--log-level=debug,kube_client=warn,hyper=info,h2=info,tower=info,rustls=info")
        .args(extra.iter().copied())
        .env("RUST_BACKTRACE", "1");
        Ok(Principal {
            process: ManagedProcess::spawn(spec)?,
            grpc_port,
            ops_port,
            namespace: namespace.to_string(),
            resource_proxy_port,
            redis_proxy_port,
        })
    }

    /// Waits for `/readyz` to answer 200.
    pub async fn wait_ready(&self) -> anyhow::Result<()> {
        wait_http_ok(self.ops_port, "/readyz", Duration::from_secs(30))
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.process.log_tail(30)))
    }

    /// `127.0.0.1:<grpc port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.grpc_port)
    }
}

/// A running `argocd-agent`.
pub struct Agent {
    /// The process.
    pub process: ManagedProcess,
    /// The agent's name (its certificate CN and hub namespace).
    pub name: String,
    /// The agent's Argo CD namespace on its spoke.
    pub namespace: String,
    /// Metrics/health port on 127.0.0.1.
    pub ops_port: u16,
}

impl Agent {
    /// Starts managed agent `name` on `spoke`, keeping its Applications in `namespace` there;
    /// `extra` flags come last and win (e.g. `--mode=autonomous`).
    pub async fn start(
        name: &str,
        dir: &Path,
        spoke: &ControlPlane,
        pki: &Pki,
        principal_address: &str,
        namespace: &str,
        extra: &[&str],
    ) -> anyhow::Result<Agent> {
        let (cert, key) = pki.agent_files(name);
        let transport = [
            "--tls-server-name=localhost".to_string(),
            format!("--tls-client-cert={}", cert.display()),
            format!("--tls-client-key={}", key.display()),
            format!("--tls-ca={}", pki.ca().display()),
        ];
        Self::start_with_transport(
            name,
            dir,
            spoke,
            principal_address,
            namespace,
            &transport,
            extra,
        )
        .await
    }

    /// [`Agent::start`] without TLS (`--insecure-plaintext`), for a principal behind a service
    /// mesh sidecar at `sidecar_address` that names the agent.
    pub async fn start_plaintext(
        name: &str,
        dir: &Path,
        spoke: &ControlPlane,
        sidecar_address: &str,
        namespace: &str,
        extra: &[&str],
    ) -> anyhow::Result<Agent> {
        let transport = ["--insecure-plaintext".to_string()];
        Self::start_with_transport(
            name,
            dir,
            spoke,
            sidecar_address,
            namespace,
            &transport,
            extra,
        )
        .await
    }

    /// [`Agent::start`] with `transport` flags in place of the PKI's TLS files and server name.
    pub async fn start_with_transport(
        name: &str,
        dir: &Path,
        spoke: &ControlPlane,
        principal_address: &str,
        namespace: &str,
        transport: &[String],
        extra: &[&str],
    ) -> anyhow::Result<Agent> {
        ensure_namespace(&spoke.client().await?, namespace).await?;
        let ops_port = free_port();
        let spec = ProcessSpec::new(
            format!("agent-{name}"),
            project_binary("argocd-agent")?,
            dir.join(format!("agent-{name}.log")),
        )
        .arg(format!("--server-address={principal_address}"))
        .arg("--mode=managed")
        .args(transport.iter().cloned())
        .arg(format!("--namespace={namespace}"))
        .arg(format!(
            "--queue-dir={}",
            dir.join(format!("queue-{name}")).display()
        ))
        .arg(format!("--metrics-address=127.0.0.1:{ops_port}"))
        .arg(format!("--health-address=127.0.0.1:{ops_port}"))
        .arg(format!("--kubeconfig={}", spoke.kubeconfig.display()))
        .arg("--reconnect-backoff-max=2s")
        .arg("--log-level=debug,kube_client=warn,hyper=info,h2=info,tower=info,rustls=info")
        .args(extra.iter().copied())
        .env("RUST_BACKTRACE", "1");
        Ok(Agent {
            process: ManagedProcess::spawn(spec)?,
            name: name.to_string(),
            namespace: namespace.to_string(),
            ops_port,
        })
    }

    /// Waits until the agent reports a live connection (`argocd_agent_connection_status 1`).
    pub async fn wait_connected(&self) -> anyhow::Result<()> {
        let port = self.ops_port;
        wait_until(
            &format!("agent {} connected", self.name),
            Duration::from_secs(30),
            || async move {
                Ok::<_, anyhow::Error>(crate::metrics::agent_connected(port).await?.then_some(()))
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", self.process.log_tail(30)))
    }
}

/// Reads a field of a JSON object by pointer, as a string ("" if absent).
pub fn text(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Opens a gRPC channel to `addr` over TLS with `tls` (ALPN h2), as an agent would (the agent's
/// own dial, server name `localhost`), so tests can speak the protocol with certificates and
/// tokens of their choosing.
pub async fn grpc_channel(
    addr: &str,
    tls: impl Into<std::sync::Arc<rustls::ClientConfig>>,
) -> anyhow::Result<tonic::transport::Channel> {
    let channel = dial_grpc(&localhost(addr), tls.into(), GrpcDialOptions::default()).await?;
    Ok(channel)
}

/// Connects to `addr` and completes a TLS handshake with `tls` for server name `localhost`.
pub async fn tls_connect(
    addr: &str,
    tls: std::sync::Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, ConnectError> {
    connect_tls(&localhost(addr), &tls).await
}

/// `addr` as a TLS server verified as `localhost` (what the test PKI's server certificates name).
fn localhost(addr: &str) -> TlsTarget {
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("static name");
    TlsTarget::new(addr, name)
}

/// Issues a client certificate signed by the PKI's CA with an arbitrary common name and validity
/// (for certificates `argocd-agentctl` would refuse to make: bad names, expired ones).
pub fn forge_client_cert(
    pki: &Pki,
    cn: &str,
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
) -> anyhow::Result<(String, String)> {
    forge_client_cert_shaped(pki, cn, |p| {
        p.not_before = not_before;
        p.not_after = not_after;
    })
}

/// Issues a client certificate signed by the PKI's CA for common name `cn` (valid from a day ago
/// to a day ahead, extended key usage clientAuth, no key usage) after `shape` changed it.
pub fn forge_client_cert_shaped(
    pki: &Pki,
    cn: &str,
    shape: impl FnOnce(&mut rcgen::CertificateParams),
) -> anyhow::Result<(String, String)> {
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(pki.dir.join("ca.key"))?)?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&std::fs::read_to_string(pki.ca())?, ca_key)?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(1);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    shape(&mut params);
    let key = rcgen::KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A client TLS config trusting the PKI's CA and presenting `identity` (cert PEM, key PEM), if any.
pub fn client_tls(
    pki: &Pki,
    identity: Option<(&str, &str)>,
    alpn: &[&[u8]],
) -> anyhow::Result<rustls::ClientConfig> {
    use argocd_agent_runtime::tls::{client_config_from_pem, PemInput, TlsPolicy};
    let ca = std::fs::read(pki.ca())?;
    let alpn: Vec<Vec<u8>> = alpn.iter().map(|a| a.to_vec()).collect();
    let loaded = client_config_from_pem(
        PemInput::new("ca", &ca),
        identity.map(|(c, k)| {
            (
                PemInput::new("cert", c.as_bytes()),
                PemInput::new("key", k.as_bytes()),
            )
        }),
        &alpn,
        TlsPolicy::default(),
    )?;
    Ok(std::sync::Arc::unwrap_or_clone(loaded.config))
}

/// The PEM files of agent `name` as strings.
pub fn agent_identity(pki: &Pki, name: &str) -> anyhow::Result<(String, String)> {
    let (c, k) = pki.agent_files(name);
    Ok((std::fs::read_to_string(c)?, std::fs::read_to_string(k)?))
}
