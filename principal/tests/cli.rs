//! The `argocd-principal` command-line contract: help, exit codes, env vars, ops endpoints.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_argocd-principal");

/// The binary with no inherited environment, so stray `ARGOCD_PRINCIPAL_*` vars cannot interfere.
fn principal() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_clear();
    cmd
}

/// Placeholder PEM files: configuration only checks they are readable.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// Real key material (a CA, a server certificate it signed, a JWT key) and a kubeconfig for a
    /// hub that does not answer, so the principal starts but cannot become ready.
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let server_key = rcgen::KeyPair::generate().unwrap();
        let server = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&server_key, &issuer)
            .unwrap();
        let jwt_key = rcgen::KeyPair::generate().unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        write("tls.crt", server.pem());
        write("tls.key", server_key.serialize_pem());
        write("ca.crt", ca.pem());
        write("jwt.key", jwt_key.serialize_pem());
        write(
            "kubeconfig",
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: hub\n  cluster:\n    server: https://127.0.0.1:{}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: hub\n  context:\n    cluster: hub\n    user: u\ncurrent-context: hub\nusers:\n- name: u\n  user:\n    token: t\n",
                free_port()
            ),
        );
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn required_flags(&self) -> Vec<String> {
        vec![
            format!("--tls-cert={}", self.path("tls.crt").display()),
            format!("--tls-key={}", self.path("tls.key").display()),
            format!("--tls-ca={}", self.path("ca.crt").display()),
            format!("--jwt-key={}", self.path("jwt.key").display()),
            "--namespace=argocd".to_string(),
        ]
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run argocd-principal")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Ok((status, response))
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("argocd-principal did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stderr_of(child: &mut Child) -> String {
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    stderr
}

#[test]
fn help_lists_key_flags_with_their_env_vars() {
    let output = run(principal().arg("--help"));
    assert_eq!(output.status.code(), Some(0));
    let help = text(&output.stdout);
    for flag in [
        "listen-address",
        "tls-cert",
        "tls-key",
        "tls-ca",
        "jwt-key",
        "namespace",
        "allowed-agent-modes",
        "resource-proxy-address",
        "redis-proxy-address",
        "redis-server-address",
        "metrics-address",
        "health-address",
        "enable-operator",
        "log-format",
        "log-level",
    ] {
        let env = format!("ARGOCD_PRINCIPAL_{}", flag.to_uppercase().replace('-', "_"));
        assert!(
            help.contains(&format!("--{flag}")),
            "--{flag} missing from help"
        );
        assert!(help.contains(&env), "{env} missing from help");
    }
    assert!(help.contains("0.0.0.0:8443"));
    assert!(help.contains("0.0.0.0:9090"));
    assert!(help.contains("0.0.0.0:8000"));
}

#[test]
fn version_exits_zero() {
    let output = run(principal().arg("--version"));
    assert_eq!(output.status.code(), Some(0));
    assert!(text(&output.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn missing_required_flag_is_a_usage_error() {
    let pki = Pki::new();
    let args: Vec<String> = pki
        .required_flags()
        .into_iter()
        .filter(|a| !a.starts_with("--namespace"))
        .collect();
    let output = run(principal().args(&args));
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("--namespace"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn nonexistent_cert_file_exits_2_naming_the_flag() {
    let pki = Pki::new();
    let output = run(principal()
        .args(pki.required_flags())
        .arg("--tls-cert=/nonexistent/principal.crt"));
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.starts_with("error: --tls-cert (env ARGOCD_PRINCIPAL_TLS_CERT)"),
        "{stderr}"
    );
    assert!(stderr.contains("/nonexistent/principal.crt"), "{stderr}");
}

#[test]
fn env_vars_stand_in_for_flags() {
    let pki = Pki::new();
    let with_env = |cmd: &mut Command| {
        cmd.env("ARGOCD_PRINCIPAL_TLS_CERT", pki.path("tls.crt"))
            .env("ARGOCD_PRINCIPAL_TLS_KEY", pki.path("tls.key"))
            .env("ARGOCD_PRINCIPAL_TLS_CA", pki.path("ca.crt"))
            .env("ARGOCD_PRINCIPAL_JWT_KEY", pki.path("jwt.key"))
            .env("ARGOCD_PRINCIPAL_NAMESPACE", "argocd");
    };

    let mut cmd = principal();
    with_env(&mut cmd);
    let output = run(cmd.env("ARGOCD_PRINCIPAL_TLS_MIN_VERSION", "tls1.1"));
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("tls1.1") && stderr.contains("--tls-min-version"),
        "{stderr}"
    );

    let mut cmd = principal();
    with_env(&mut cmd);
    let output = run(cmd.env("ARGOCD_PRINCIPAL_NAMESPACE", "Not_A_Namespace"));
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("--namespace (env ARGOCD_PRINCIPAL_NAMESPACE)"),
        "{stderr}"
    );
    assert!(stderr.contains("Not_A_Namespace"), "{stderr}");
}

fn spawn_principal(pki: &Pki, extra: &[String], envs: &[(&str, &str)]) -> Child {
    principal()
        .envs(envs.iter().copied())
        .args(pki.required_flags())
        .args([
            "--listen-address=127.0.0.1:0",
            "--resource-proxy-address=127.0.0.1:0",
            "--redis-proxy-address=127.0.0.1:0",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn argocd-principal")
}

#[test]
fn stays_live_but_unready_without_a_reachable_hub_until_sigterm_with_empty_env_vars_as_defaults() {
    let pki = Pki::new();
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut child = spawn_principal(
        &pki,
        &[
            format!("--metrics-address={addr}"),
            format!("--health-address={addr}"),
            "--enable-operator=false".to_string(),
            format!("--kubeconfig={}", pki.path("kubeconfig").display()),
        ],
        // Empty env vars (as Helm renders unset values) mean "use the default".
        &[
            ("ARGOCD_PRINCIPAL_KUBECONFIG", ""),
            ("ARGOCD_PRINCIPAL_LOG_LEVEL", ""),
            ("ARGOCD_PRINCIPAL_GRPC_MAX_MESSAGE_SIZE", ""),
            ("ARGOCD_PRINCIPAL_ALLOWED_NAMESPACES", ""),
        ],
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match http_get(addr, "/healthz") {
            Ok((200, _)) => break,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => {
                let _ = child.kill();
                panic!("/healthz never answered 200: {other:?}");
            }
        }
    }
    // Start-up moves from "starting" to waiting for the hub, and never to ready: the hub is unreachable.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = http_get(addr, "/readyz").unwrap();
        assert_eq!(
            status, 503,
            "an unreachable hub keeps the principal unready: {body}"
        );
        if body.contains("waiting for the hub watches") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "readiness reason never said it waits for the hub: {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, body) = http_get(addr, "/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("argocd_agent_build_info{version="), "{body}");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = wait_with_timeout(&mut child, Duration::from_secs(10));
    let stderr = stderr_of(&mut child);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("shutting down"), "{stderr}");
}

#[test]
fn busy_metrics_port_is_a_runtime_failure() {
    let pki = Pki::new();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut child = spawn_principal(
        &pki,
        &[
            format!("--metrics-address={addr}"),
            "--health-address=127.0.0.1:0".to_string(),
            "--log-format=json".to_string(),
        ],
        &[],
    );
    let status = wait_with_timeout(&mut child, Duration::from_secs(10));
    let stderr = stderr_of(&mut child);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot bind metrics endpoint on {addr}")),
        "{stderr}"
    );
    drop(taken);
}

#[test]
fn unreadable_path_flag_from_env_names_the_env_var() {
    let pki = Pki::new();
    let missing: &Path = Path::new("/nonexistent/kubeconfig");
    let output = run(principal()
        .args(pki.required_flags())
        .env("ARGOCD_PRINCIPAL_KUBECONFIG", missing));
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("ARGOCD_PRINCIPAL_KUBECONFIG"), "{stderr}");
}
