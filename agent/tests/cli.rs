//! The `argocd-agent` command-line contract: help, exit codes, env vars, ops endpoints.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_argocd-agent");

/// The binary with no inherited environment, so stray `ARGOCD_AGENT_*` vars cannot interfere.
fn agent() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_clear();
    cmd
}

/// PEM files and a queue directory. Flag validation only checks the files are readable; start-up
/// then loads them, so the agent only runs with [`Pki::real`].
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// Placeholder files: enough for flag validation, refused at start-up.
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for name in ["client.crt", "client.key", "ca.crt"] {
            std::fs::write(dir.path().join(name), "placeholder\n").unwrap();
        }
        Pki { dir }
    }

    /// A self-signed certificate that serves as client certificate and CA, and a kubeconfig
    /// pointing at a port nothing listens on (the agent retries; these tests do not need a cluster).
    fn real() -> Self {
        let pki = Pki::new();
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        std::fs::write(pki.path("client.crt"), ck.cert.pem()).unwrap();
        std::fs::write(pki.path("ca.crt"), ck.cert.pem()).unwrap();
        std::fs::write(pki.path("client.key"), ck.signing_key.serialize_pem()).unwrap();
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n\
             users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n\
             current-context: c\n",
            free_port()
        );
        std::fs::write(pki.path("kubeconfig"), kubeconfig).unwrap();
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn required_flags(&self) -> Vec<String> {
        vec![
            "--server-address=127.0.0.1:8443".to_string(),
            format!("--tls-client-cert={}", self.path("client.crt").display()),
            format!("--tls-client-key={}", self.path("client.key").display()),
            format!("--tls-ca={}", self.path("ca.crt").display()),
            format!("--queue-dir={}", self.path("queue").display()),
        ]
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run argocd-agent")
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
            panic!("argocd-agent did not exit within {timeout:?}");
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
    let output = run(agent().arg("--help"));
    assert_eq!(output.status.code(), Some(0));
    let help = text(&output.stdout);
    for flag in [
        "server-address",
        "mode",
        "tls-client-cert",
        "tls-client-key",
        "tls-ca",
        "namespace",
        "redis-address",
        "queue-dir",
        "metrics-address",
        "health-address",
        "log-format",
        "log-level",
    ] {
        let env = format!("ARGOCD_AGENT_{}", flag.to_uppercase().replace('-', "_"));
        assert!(
            help.contains(&format!("--{flag}")),
            "--{flag} missing from help"
        );
        assert!(help.contains(&env), "{env} missing from help");
    }
    assert!(help.contains("0.0.0.0:8181"));
    assert!(help.contains("0.0.0.0:8001"));
    assert!(help.contains("/var/lib/argocd-agent/queue"));
}

#[test]
fn version_exits_zero() {
    let output = run(agent().arg("--version"));
    assert_eq!(output.status.code(), Some(0));
    assert!(text(&output.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn missing_required_flag_is_a_usage_error() {
    let pki = Pki::new();
    let args: Vec<String> = pki
        .required_flags()
        .into_iter()
        .filter(|a| !a.starts_with("--server-address"))
        .collect();
    let output = run(agent().args(&args));
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("--server-address"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn nonexistent_cert_file_exits_2_naming_the_flag() {
    let pki = Pki::new();
    let output = run(agent()
        .args(pki.required_flags())
        .arg("--tls-client-cert=/nonexistent/agent.crt"));
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.starts_with("error: --tls-client-cert (env ARGOCD_AGENT_TLS_CLIENT_CERT)"),
        "{stderr}"
    );
    assert!(stderr.contains("/nonexistent/agent.crt"), "{stderr}");
}

#[test]
fn mode_from_env_is_honoured() {
    let pki = Pki::new();
    let output = run(agent()
        .args(pki.required_flags())
        .env("ARGOCD_AGENT_MODE", "bogus"));
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("bogus") && stderr.contains("--mode"),
        "{stderr}"
    );

    // A valid mode from the env takes part in validation: autonomous forbids destination mapping.
    let output = run(agent()
        .args(pki.required_flags())
        .arg("--destination-based-mapping")
        .env("ARGOCD_AGENT_MODE", "autonomous"));
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("ARGOCD_AGENT_MODE"), "{stderr}");
}

#[test]
fn required_flags_can_all_come_from_env() {
    let pki = Pki::new();
    let output = run(agent()
        .env("ARGOCD_AGENT_SERVER_ADDRESS", "principal:8443")
        .env("ARGOCD_AGENT_TLS_CLIENT_CERT", pki.path("client.crt"))
        .env("ARGOCD_AGENT_TLS_CLIENT_KEY", pki.path("client.key"))
        .env("ARGOCD_AGENT_TLS_CA", "/nonexistent/ca.crt"));
    // Parsing succeeded (all required present); validation then names the env-provided file.
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.starts_with("error: --tls-ca (env ARGOCD_AGENT_TLS_CA)"),
        "{stderr}"
    );
}

fn spawn_agent(pki: &Pki, extra: &[String], envs: &[(&str, &str)]) -> Child {
    agent()
        .envs(envs.iter().copied())
        .args(pki.required_flags())
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn argocd-agent")
}

#[test]
fn unusable_certificate_files_exit_2_naming_the_flags() {
    let pki = Pki::new();
    let mut child = spawn_agent(
        &pki,
        &[
            "--metrics-address=127.0.0.1:0".to_string(),
            "--health-address=127.0.0.1:0".to_string(),
        ],
        &[],
    );
    let status = wait_with_timeout(&mut child, Duration::from_secs(10));
    let stderr = stderr_of(&mut child);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--tls-client-cert"), "{stderr}");
    assert!(
        stderr.contains(&pki.path("ca.crt").display().to_string()),
        "{stderr}"
    );
}

#[test]
fn autonomous_mode_is_refused_with_exit_2() {
    let pki = Pki::real();
    let output = run(agent().args(pki.required_flags()).arg("--mode=autonomous"));
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("autonomous mode is not implemented yet"),
        "{stderr}"
    );
}

#[test]
fn serves_health_and_metrics_on_separate_addresses_until_sigterm() {
    let pki = Pki::real();
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let health = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut child = spawn_agent(
        &pki,
        &[
            format!("--metrics-address={metrics}"),
            format!("--health-address={health}"),
            format!("--kubeconfig={}", pki.path("kubeconfig").display()),
            // Nothing listens there: the agent works offline.
            format!("--server-address=127.0.0.1:{}", free_port()),
        ],
        // Empty env vars (as Helm renders unset values) mean "use the default".
        &[
            ("ARGOCD_AGENT_NAMESPACE", ""),
            ("ARGOCD_AGENT_KUBECONFIG", ""),
        ],
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match http_get(health, "/healthz") {
            Ok((200, _)) => break,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => {
                let _ = child.kill();
                panic!("/healthz never answered 200: {other:?}");
            }
        }
    }
    // Principal unreachable but nothing queued: ready, working offline.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = http_get(health, "/readyz").unwrap();
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(
            body.contains("starting") || body.contains("connecting to the principal"),
            "{body}"
        );
        assert!(
            Instant::now() < deadline,
            "never became ready offline: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, body) = http_get(metrics, "/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("argocd_agent_build_info{version="), "{body}");
    assert!(body.contains("argocd_agent_connection_status 0"), "{body}");
    assert!(body.contains("argocd_agent_connections_total 0"), "{body}");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = wait_with_timeout(&mut child, Duration::from_secs(10));
    let stderr = stderr_of(&mut child);
    assert_eq!(status.code(), Some(0), "{stderr}");
}

#[test]
fn busy_health_port_is_a_runtime_failure() {
    let pki = Pki::new();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut child = spawn_agent(
        &pki,
        &[
            "--metrics-address=127.0.0.1:0".to_string(),
            format!("--health-address={addr}"),
        ],
        &[],
    );
    let status = wait_with_timeout(&mut child, Duration::from_secs(10));
    let stderr = stderr_of(&mut child);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot bind health endpoint on {addr}")),
        "{stderr}"
    );
    drop(taken);
}
