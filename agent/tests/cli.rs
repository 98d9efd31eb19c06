//! The `argocd-agent` command-line contract: help, exit codes, env vars, ops endpoints.

#[path = "../../runtime/tests/support/cli.rs"]
mod cli_support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use cli_support::{
    assert_cannot_bind, assert_config_error, assert_help_lists, assert_required,
    assert_version_exits_zero, exit_of, free_port, http_get, run, spawn, taken_port, terminate,
    text, wait_until_live, write_ca_and_signed_cert, write_unreachable_kubeconfig,
};

const BIN: &str = env!("CARGO_BIN_EXE_argocd-agent");

/// The binary with no inherited environment, so stray `ARGOCD_AGENT_*` vars cannot interfere.
fn agent() -> Command {
    cli_support::clean_command(BIN)
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

    /// A client certificate and the CA that signed it, and a kubeconfig pointing at a port
    /// nothing listens on (the agent retries; these tests do not need a cluster).
    fn real() -> Self {
        let pki = Pki::new();
        write_ca_and_signed_cert(
            &pki.path("ca.crt"),
            &pki.path("client.crt"),
            &pki.path("client.key"),
        );
        write_unreachable_kubeconfig(&pki.path("kubeconfig"));
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

#[test]
fn help_lists_key_flags_with_their_env_vars() {
    let flags = [
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
    ];
    let defaults = [
        "0.0.0.0:8181",
        "0.0.0.0:8001",
        "/var/lib/argocd-agent/queue",
    ];
    assert_help_lists(agent(), "ARGOCD_AGENT_", &flags, &defaults);
}

#[test]
fn version_exits_zero() {
    assert_version_exits_zero(agent());
}

#[test]
fn missing_required_flag_is_a_usage_error() {
    assert_required(agent(), Pki::new().required_flags(), "server-address");
}

#[test]
fn nonexistent_cert_file_exits_2_naming_the_flag() {
    let pki = Pki::new();
    let output = run(agent()
        .args(pki.required_flags())
        .arg("--tls-client-cert=/nonexistent/agent.crt"));
    assert_config_error(
        &output,
        "--tls-client-cert (env ARGOCD_AGENT_TLS_CLIENT_CERT)",
        &["/nonexistent/agent.crt"],
    );
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
    assert_config_error(&output, "--tls-ca (env ARGOCD_AGENT_TLS_CA)", &[]);
}

fn spawn_agent(pki: &Pki, extra: &[String], envs: &[(&str, &str)]) -> Child {
    spawn(
        agent()
            .envs(envs.iter().copied())
            .args(pki.required_flags())
            .args(extra),
    )
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
    let (status, stderr) = exit_of(&mut child);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--tls-client-cert"), "{stderr}");
    assert!(
        stderr.contains(&pki.path("ca.crt").display().to_string()),
        "{stderr}"
    );
}

#[test]
fn managed_only_options_are_refused_in_autonomous_mode_with_exit_2() {
    let pki = Pki::real();
    let output = run(agent()
        .args(pki.required_flags())
        .args(["--mode=autonomous", "--create-namespace"]));
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("--create-namespace"), "{stderr}");
    assert!(stderr.contains("managed agents only"), "{stderr}");
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

    wait_until_live(&mut child, health);
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

    let (status, stderr) = terminate(&mut child);
    assert_eq!(status.code(), Some(0), "{stderr}");
}

#[test]
fn busy_health_port_is_a_runtime_failure() {
    let pki = Pki::new();
    let (taken, addr) = taken_port();
    let mut child = spawn_agent(
        &pki,
        &[
            "--metrics-address=127.0.0.1:0".to_string(),
            format!("--health-address={addr}"),
        ],
        &[],
    );
    assert_cannot_bind(&mut child, "health", addr);
    drop(taken);
}
