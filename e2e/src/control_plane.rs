//! One real Kubernetes control plane: etcd 3.6 and kube-apiserver 1.36 (built from their Go modules by
//! `hack/peers.sh`), on free loopback ports with a temporary data directory, an admin kubeconfig, and
//! the Argo CD / OCM CRDs installed. No kubelet, scheduler or controller-manager run here: objects are
//! stored and watched, never executed (no pods, no namespace finalisation), and garbage is collected
//! only on a plane a test started kube-controller-manager's garbage collector on
//! ([`ControlPlane::run_garbage_collector`]).

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::binaries::{kube_apiserver, Peer};
use crate::crds;
use crate::ports::free_port;
use crate::process::{print_log_tail, temp_dir, ManagedProcess, ProcessSpec};
use crate::wait::wait_until;

/// What kube-controller-manager's garbage collector logs once its graph covers every resource
/// and it starts collecting.
const GC_SYNCED: &str = "Proceeding to collect garbage";
/// Bearer token of the plane's `admin` user (group system:masters).
const ADMIN_TOKEN_LEN: usize = 32;
/// File names, in the plane's directory, of the client CA's certificate and key.
const CLIENT_CA_CERT: &str = "client-ca.crt";
const CLIENT_CA_KEY: &str = "client-ca.key";

/// A running control plane.
pub struct ControlPlane {
    /// Name given at start (hub, spoke1, ...), used in logs and as kubeconfig context.
    pub name: String,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// Admin kubeconfig usable by kubectl and kube-rs.
    pub kubeconfig: PathBuf,
    /// The admin bearer token.
    pub admin_token: String,
    /// CA bundle of the apiserver's self-signed serving certificate.
    pub ca_file: PathBuf,
    /// Time from `start` to Ready with CRDs installed.
    pub startup: Duration,
    dir: PathBuf,
    etcd: ManagedProcess,
    /// Behind a lock so a plane shared by a test binary can be stopped and restarted through `&self`.
    apiserver: Mutex<ManagedProcess>,
    /// kube-controller-manager's garbage collector, once a test asked for it
    /// ([`ControlPlane::run_garbage_collector`]).
    garbage_collector: Mutex<Option<ManagedProcess>>,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver, waits for `/readyz`, installs the CRDs. Blocking: from async
    /// code use [`ControlPlane::start_async`].
    pub fn start(name: &str) -> anyhow::Result<ControlPlane> {
        let started = Instant::now();
        let dir = temp_dir(&format!("plane-{name}"))?;
        let etcd = start_etcd(name, &dir)?;
        let etcd_url = etcd.1;
        let admin_token = random_token();
        let port = free_port();
        let apiserver = start_apiserver(name, &dir, port, &etcd_url, &admin_token)?;
        let url = format!("https://127.0.0.1:{port}");
        let ca_file = dir.join("certs/apiserver.crt");
        let kubeconfig = dir.join("kubeconfig");
        let mut plane = ControlPlane {
            name: name.to_string(),
            url,
            kubeconfig,
            admin_token,
            ca_file,
            startup: Duration::ZERO,
            dir,
            etcd: etcd.0,
            apiserver: Mutex::new(apiserver),
            garbage_collector: Mutex::new(None),
        };
        plane.wait_ready_and_install()?;
        plane.startup = started.elapsed();
        eprintln!(
            "[e2e] control plane {name} ready at {} in {:.1?}",
            plane.url, plane.startup
        );
        Ok(plane)
    }

    /// [`ControlPlane::start`] on a blocking thread.
    pub async fn start_async(name: &str) -> anyhow::Result<ControlPlane> {
        let name = name.to_string();
        tokio::task::spawn_blocking(move || ControlPlane::start(&name)).await?
    }

    /// Starts several planes in parallel (each still takes its own etcd and apiserver).
    pub fn start_many(names: &[&str]) -> anyhow::Result<Vec<ControlPlane>> {
        let handles: Vec<_> = names
            .iter()
            .map(|n| {
                let n = n.to_string();
                std::thread::spawn(move || ControlPlane::start(&n))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("plane start-up panicked"))?
            })
            .collect()
    }

    /// A new kube-rs client built from the generated kubeconfig. Create one per test runtime: a client
    /// is bound to the tokio runtime that created it.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let config = self.kube_config().await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// The kube-rs configuration read from the generated kubeconfig.
    pub async fn kube_config(&self) -> anyhow::Result<kube::Config> {
        let kc = Kubeconfig::read_from(&self.kubeconfig)?;
        Ok(kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?)
    }

    /// Stops the apiserver gracefully (etcd keeps the data), for fault injection. Takes `&self` so
    /// a shared plane can be used; the caller keeps other users away meanwhile. Blocking: from
    /// async code use [`ControlPlane::stop_apiserver_async`].
    pub fn stop_apiserver(&self) {
        self.apiserver().stop();
        eprintln!("[e2e] control plane {}: kube-apiserver stopped", self.name);
    }

    /// Starts the apiserver again after [`stop_apiserver`](Self::stop_apiserver) (same etcd, same
    /// port, same serving certificate) and waits for `/readyz`. Blocking: from async code use
    /// [`ControlPlane::start_apiserver_async`].
    pub fn start_apiserver(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        self.apiserver().start_again()?;
        self.wait_ready_and_install()?;
        eprintln!(
            "[e2e] control plane {}: kube-apiserver ready again in {:.1?}",
            self.name,
            started.elapsed()
        );
        Ok(())
    }

    /// [`ControlPlane::stop_apiserver`] on a blocking thread.
    pub async fn stop_apiserver_async(&'static self) -> anyhow::Result<()> {
        Ok(tokio::task::spawn_blocking(move || self.stop_apiserver()).await?)
    }

    /// [`ControlPlane::start_apiserver`] on a blocking thread.
    pub async fn start_apiserver_async(&'static self) -> anyhow::Result<()> {
        tokio::task::spawn_blocking(move || self.start_apiserver()).await?
    }

    /// Prints the tails of etcd's and the apiserver's logs.
    pub fn print_logs(&self, lines: usize) {
        print_log_tail(self.etcd.name(), self.etcd.log_path(), lines);
        let apiserver = self.apiserver();
        print_log_tail(apiserver.name(), apiserver.log_path(), lines);
    }

    /// The plane's temporary directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The apiserver's audit log (JSON lines): every request made by a ServiceAccount
    /// (group `system:serviceaccounts`) at level Metadata, with its verb, resource and response
    /// code, so a test can name each request RBAC refused. Requests of other users are not logged.
    pub fn audit_log(&self) -> std::path::PathBuf {
        self.dir.join("audit.log")
    }

    /// Writes a kubeconfig for this plane that authenticates with bearer `token` (e.g. a
    /// ServiceAccount token from the TokenRequest API) as user `user`.
    pub fn write_token_kubeconfig(
        &self,
        path: &std::path::Path,
        user: &str,
        token: &str,
    ) -> anyhow::Result<()> {
        write_kubeconfig(path, &self.name, &self.url, &self.ca_file, user, token)
    }

    /// The client CA the apiserver trusts for client certificates (`--client-ca-file`): its
    /// certificate and private key, e.g. for a CSR signer.
    pub fn client_ca(&self) -> (PathBuf, PathBuf) {
        (self.dir.join(CLIENT_CA_CERT), self.dir.join(CLIENT_CA_KEY))
    }

    /// Runs kube-controller-manager with its garbage collector alone on this plane from now on
    /// (once per plane; later calls find it running) and waits until the collector has synced
    /// its view of every resource. Deletions with `propagationPolicy: Foreground` complete only
    /// with it: it removes the `foregroundDeletion` finalizer once no dependent blocks it. The
    /// rest of the plane's tests see a collector as every real cluster has one.
    pub async fn run_garbage_collector(&self) -> anyhow::Result<()> {
        let log = {
            let mut running = self
                .garbage_collector
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let alive = running.as_mut().is_some_and(ManagedProcess::is_running);
            if let Some(process) = running.as_ref().filter(|_| alive) {
                process.log_path().to_path_buf()
            } else {
                let log = self.dir.join("kube-controller-manager-gc.log");
                let process = ManagedProcess::spawn(
                    ProcessSpec::new(
                        format!("garbage-collector-{}", self.name),
                        Peer::Kube.binary("kube-controller-manager")?,
                        &log,
                    )
                    .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                    .args([
                        "--controllers=garbage-collector-controller",
                        "--leader-elect=false",
                        "--secure-port=0",
                        "-v=2",
                    ]),
                )?;
                *running = Some(process);
                log
            }
        };
        wait_until(
            &format!("the garbage collector of {} synced", self.name),
            Duration::from_secs(60),
            || {
                let log = log.clone();
                async move {
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    Ok::<_, std::io::Error>(text.contains(GC_SYNCED).then_some(()))
                }
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", crate::process::log_tail(&log, 30)))
    }

    fn apiserver(&self) -> MutexGuard<'_, ManagedProcess> {
        self.apiserver.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait_ready_and_install(&self) -> anyhow::Result<()> {
        // The serving certificate appears once the apiserver has generated it.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.ca_file.is_file() {
            if !self.apiserver().is_running() || Instant::now() > deadline {
                self.print_logs(30);
                anyhow::bail!(
                    "kube-apiserver for {} exited or produced no serving certificate",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        write_kubeconfig(
            &self.kubeconfig,
            &self.name,
            &self.url,
            &self.ca_file,
            "admin",
            &self.admin_token,
        )?;
        let kubeconfig = self.kubeconfig.clone();
        let name = self.name.clone();
        // A fresh thread with its own runtime: callers may be inside another runtime.
        let result = std::thread::spawn(move || -> anyhow::Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let kc = Kubeconfig::read_from(&kubeconfig)?;
                let config =
                    kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
                let client = kube::Client::try_from(config)?;
                wait_until(&format!("{name} /readyz"), Duration::from_secs(60), || {
                    let client = client.clone();
                    async move {
                        let req = http::Request::get("/readyz")
                            .body(Vec::new())
                            .expect("static request");
                        let body = client.request_text(req).await?;
                        Ok::<_, kube::Error>((body.trim() == "ok").then_some(()))
                    }
                })
                .await?;
                crds::install_all(&client).await?;
                Ok(())
            })
        })
        .join()
        .map_err(|_| anyhow::anyhow!("readiness thread panicked"))?;
        if let Err(e) = result {
            self.print_logs(30);
            return Err(e.context(format!("control plane {} did not become ready", self.name)));
        }
        Ok(())
    }
}

fn random_token() -> String {
    let mut s = String::new();
    while s.len() < ADMIN_TOKEN_LEN {
        s.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    s.truncate(ADMIN_TOKEN_LEN);
    s
}

fn start_etcd(name: &str, dir: &std::path::Path) -> anyhow::Result<(ManagedProcess, String)> {
    let bin = Peer::Kube.binary("etcd")?;
    let client_port = free_port();
    let peer_port = free_port();
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let spec = ProcessSpec::new(format!("etcd-{name}"), bin, dir.join("etcd.log"))
        .args(["--name", "default", "--data-dir"])
        .arg(dir.join("etcd"))
        .args([
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("default={peer_url}")])
        .args(["--log-level", "warn"]);
    Ok((ManagedProcess::spawn(spec)?, client_url))
}

fn start_apiserver(
    name: &str,
    dir: &std::path::Path,
    port: u16,
    etcd_url: &str,
    token: &str,
) -> anyhow::Result<ManagedProcess> {
    let bin = kube_apiserver()?;
    let sa_key = dir.join("sa.key");
    let status = Command::new("openssl")
        .args(["genrsa", "-out"])
        .arg(&sa_key)
        .arg("2048")
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| anyhow::anyhow!("running openssl to create the service-account key: {e}"))?;
    anyhow::ensure!(status.success(), "openssl genrsa failed");
    create_client_ca(name, dir)?;
    let tokens = dir.join("tokens.csv");
    std::fs::write(&tokens, format!("{token},admin,admin,system:masters\n"))?;
    // Audit ServiceAccounts' requests only (tests run binaries under chart RBAC as one); the
    // admin's and others' requests are not written.
    let audit_policy = dir.join("audit-policy.yaml");
    std::fs::write(
        &audit_policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\n\
         rules:\n  - level: Metadata\n    userGroups: [\"system:serviceaccounts\"]\n  - level: None\n",
    )?;
    let spec = ProcessSpec::new(
        format!("kube-apiserver-{name}"),
        bin,
        dir.join("apiserver.log"),
    )
    .args(["--etcd-servers", etcd_url, "--cert-dir"])
    .arg(dir.join("certs"))
    .args([
        "--secure-port",
        &port.to_string(),
        "--bind-address",
        "127.0.0.1",
    ])
    .args(["--advertise-address", "127.0.0.1", "--token-auth-file"])
    .arg(&tokens)
    .arg("--client-ca-file")
    .arg(dir.join(CLIENT_CA_CERT))
    .args(["--authorization-mode", "RBAC", "--service-account-key-file"])
    .arg(&sa_key)
    .arg("--service-account-signing-key-file")
    .arg(&sa_key)
    .args(["--service-account-issuer", "https://kubernetes.default.svc"])
    .args(["--service-cluster-ip-range", "10.0.0.0/24"])
    .arg("--audit-policy-file")
    .arg(&audit_policy)
    .arg("--audit-log-path")
    .arg(dir.join("audit.log"))
    // No controller-manager: do not try to maintain the `kubernetes` Service endpoints.
    .args(["--endpoint-reconciler-type", "none"])
    .args(["--enable-priority-and-fairness=false", "-v", "1"]);
    ManagedProcess::spawn(spec)
}

/// Creates the plane's client CA (an EC P-256 key and a self-signed certificate): the apiserver
/// authenticates client certificates it signed, and a CSR signer (OCM's registration flow runs
/// kube-controller-manager's `csrsigning` controller with it) issues them.
fn create_client_ca(name: &str, dir: &std::path::Path) -> anyhow::Result<()> {
    let status = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "365"])
        .args(["-subj", &format!("/CN={name}-client-ca"), "-keyout"])
        .arg(dir.join(CLIENT_CA_KEY))
        .arg("-out")
        .arg(dir.join(CLIENT_CA_CERT))
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| anyhow::anyhow!("running openssl to create the client CA: {e}"))?;
    anyhow::ensure!(status.success(), "openssl req (client CA) failed");
    Ok(())
}

fn write_kubeconfig(
    path: &std::path::Path,
    name: &str,
    url: &str,
    ca: &std::path::Path,
    user: &str,
    token: &str,
) -> anyhow::Result<()> {
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": url, "certificate-authority": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
    });
    std::fs::write(path, serde_norway::to_string(&kubeconfig)?)?;
    Ok(())
}
