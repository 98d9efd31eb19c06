//! The `argocd-principal` command-line contract: help, exit codes, env vars, ops endpoints.

#[path = "../../runtime/tests/support/cli.rs"]
mod cli_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use cli_support::{
    assert_cannot_bind, assert_config_error, assert_help_lists, assert_required,
    assert_version_exits_zero, free_port, http_get, run, spawn, taken_port, terminate, text,
    wait_until_live, write_ca_and_signed_cert, write_private_key, write_unreachable_kubeconfig,
};

const BIN: &str = env!("CARGO_BIN_EXE_argocd-principal");

/// The binary with no inherited environment, so stray `ARGOCD_PRINCIPAL_*` vars cannot interfere.
fn principal() -> Command {
    cli_support::clean_command(BIN)
}

/// Key material and a kubeconfig in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// Real key material (a CA, a server certificate it signed, a JWT key) and a kubeconfig for a
    /// hub that does not answer, so the principal starts but cannot become ready.
    fn new() -> Self {
        let pki = Pki {
            dir: tempfile::tempdir().unwrap(),
        };
        write_ca_and_signed_cert(
            &pki.path("ca.crt"),
            &pki.path("tls.crt"),
            &pki.path("tls.key"),
        );
        write_private_key(&pki.path("jwt.key"));
        write_unreachable_kubeconfig(&pki.path("kubeconfig"));
        pki
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

#[test]
fn help_lists_key_flags_with_their_env_vars() {
    let flags = [
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
    ];
    let defaults = ["0.0.0.0:8443", "0.0.0.0:9090", "0.0.0.0:8000"];
    assert_help_lists(principal(), "ARGOCD_PRINCIPAL_", &flags, &defaults);
}

#[test]
fn version_exits_zero() {
    assert_version_exits_zero(principal());
}

#[test]
fn missing_required_flag_is_a_usage_error() {
    assert_required(principal(), Pki::new().required_flags(), "namespace");
}

#[test]
fn nonexistent_cert_file_exits_2_naming_the_flag() {
    let pki = Pki::new();
    let output = run(principal()
        .args(pki.required_flags())
        .arg("--tls-cert=/nonexistent/principal.crt"));
    assert_config_error(
        &output,
        "--tls-cert (env ARGOCD_PRINCIPAL_TLS_CERT)",
        &["/nonexistent/principal.crt"],
    );
}

#[test]
fn env_vars_stand_in_for_flags() {
    let pki = Pki::new();
    // Every required value from the env, then `name` set to `value`.
    let run_with_env = |name: &str, value: &str| {
        run(principal()
            .env("ARGOCD_PRINCIPAL_TLS_CERT", pki.path("tls.crt"))
            .env("ARGOCD_PRINCIPAL_TLS_KEY", pki.path("tls.key"))
            .env("ARGOCD_PRINCIPAL_TLS_CA", pki.path("ca.crt"))
            .env("ARGOCD_PRINCIPAL_JWT_KEY", pki.path("jwt.key"))
            .env("ARGOCD_PRINCIPAL_NAMESPACE", "argocd")
            .env(name, value))
    };

    let output = run_with_env("ARGOCD_PRINCIPAL_TLS_MIN_VERSION", "tls1.1");
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("tls1.1") && stderr.contains("--tls-min-version"),
        "{stderr}"
    );

    let output = run_with_env("ARGOCD_PRINCIPAL_NAMESPACE", "Not_A_Namespace");
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("--namespace (env ARGOCD_PRINCIPAL_NAMESPACE)"),
        "{stderr}"
    );
    assert!(stderr.contains("Not_A_Namespace"), "{stderr}");
}

fn spawn_principal(pki: &Pki, extra: &[String], envs: &[(&str, &str)]) -> Child {
    spawn(
        principal()
            .envs(envs.iter().copied())
            .args(pki.required_flags())
            .args([
                "--listen-address=127.0.0.1:0",
                "--resource-proxy-address=127.0.0.1:0",
                "--redis-proxy-address=127.0.0.1:0",
            ])
            .args(extra),
    )
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

    wait_until_live(&mut child, addr);
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

    let (status, stderr) = terminate(&mut child);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("shutting down"), "{stderr}");
}

#[test]
fn busy_metrics_port_is_a_runtime_failure() {
    let pki = Pki::new();
    let (taken, addr) = taken_port();
    let mut child = spawn_principal(
        &pki,
        &[
            format!("--metrics-address={addr}"),
            "--health-address=127.0.0.1:0".to_string(),
            "--log-format=json".to_string(),
        ],
        &[],
    );
    assert_cannot_bind(&mut child, "metrics", addr);
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
