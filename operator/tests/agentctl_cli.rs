//! Runs the built `argocd-agentctl` binary against a temporary PKI directory: the file-based
//! flow the quickstart and the e2e suite use, the certificates it writes, and how bad usage is
//! reported (exit 2 with a message naming the flag or file).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use argocd_agent_operator::pki::{inspect, CertificateAuthority};
use argocd_agent_proto::identity::{AgentIdentity, IdentitySource};
use argocd_agent_runtime::tls::{ClientTlsOptions, ServerTlsOptions, ALPN_H2};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn agentctl_with_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_argocd-agentctl"));
    cmd.env_clear().args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run argocd-agentctl");
    Run {
        code: status.code().expect("exited normally"),
        stdout: String::from_utf8(stdout).unwrap(),
        stderr: String::from_utf8(stderr).unwrap(),
    }
}

fn agentctl(args: &[&str]) -> Run {
    agentctl_with_env(args, &[])
}

fn ok(args: &[&str]) -> String {
    let run = agentctl(args);
    assert_eq!(
        run.code, 0,
        "argocd-agentctl {args:?} failed:\nstdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    run.stdout
}

fn usage_error(args: &[&str]) -> String {
    let run = agentctl(args);
    assert_eq!(
        run.code, 2,
        "argocd-agentctl {args:?} should exit 2:\nstdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    run.stderr
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn init_pki() -> (tempfile::TempDir, PathBuf, String) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pki");
    let d = dir.to_str().unwrap().to_owned();
    ok(&["pki", "init", "--dir", &d]);
    (tmp, dir, d)
}

#[test]
fn init_issue_and_inspect_write_a_consistent_pki_directory() {
    let (_tmp, dir, d) = init_pki();
    let ca_pem = read(&dir.join("ca.crt"));
    let ca = CertificateAuthority::from_pem(&ca_pem, &read(&dir.join("ca.key"))).unwrap();
    let ca_info = inspect(&ca_pem).unwrap();
    assert!(ca_info.is_ca);
    assert_eq!(ca_info.subject_cn.as_deref(), Some("argocd-agent-ca"));
    #[cfg(unix)]
    assert_eq!(mode(&dir.join("ca.key")), 0o600);

    let out = ok(&[
        "pki",
        "issue",
        "principal",
        "--dir",
        &d,
        "--dns",
        "localhost",
        "--ip",
        "127.0.0.1",
    ]);
    assert_eq!(out.lines().count(), 1, "one-line summary, got {out:?}");
    assert!(out.contains("principal.crt"), "{out}");
    let principal = read(&dir.join("principal.crt"));
    let info = inspect(&principal).unwrap();
    assert_eq!(info.subject_cn.as_deref(), Some("argocd-agent-principal"));
    assert_eq!(info.issuer_cn.as_deref(), Some("argocd-agent-ca"));
    assert_eq!(info.sans, ["DNS:localhost", "IP:127.0.0.1"]);
    assert_eq!(info.extended_key_usages, ["serverAuth"]);
    ca.verify_issued(&principal).unwrap();
    #[cfg(unix)]
    assert_eq!(mode(&dir.join("principal.key")), 0o600);

    ok(&[
        "pki",
        "issue",
        "resource-proxy",
        "--dir",
        &d,
        "--dns",
        "rp.example,argocd-agent-resource-proxy",
        "--ip",
        "10.0.0.1",
        "--days",
        "30",
    ]);
    let rp = inspect(&read(&dir.join("resource-proxy.crt"))).unwrap();
    assert_eq!(
        rp.subject_cn.as_deref(),
        Some("argocd-agent-resource-proxy")
    );
    assert_eq!(
        rp.sans,
        [
            "DNS:rp.example",
            "DNS:argocd-agent-resource-proxy",
            "IP:10.0.0.1"
        ]
    );
    let lifetime = rp.not_after - rp.not_before;
    assert!(lifetime >= chrono::Duration::days(30) && lifetime < chrono::Duration::days(31));

    let out = ok(&["pki", "issue", "agent", "spoke1", "--dir", &d]);
    assert!(out.contains("agents/spoke1.crt"), "{out}");
    let agent = read(&dir.join("agents/spoke1.crt"));
    let info = inspect(&agent).unwrap();
    assert_eq!(info.subject_cn.as_deref(), Some("spoke1"));
    assert_eq!(info.issuer_cn.as_deref(), Some("argocd-agent-ca"));
    assert!(info.sans.is_empty());
    assert_eq!(info.extended_key_usages, ["clientAuth"]);
    ca.verify_issued(&agent).unwrap();
    #[cfg(unix)]
    assert_eq!(mode(&dir.join("agents/spoke1.key")), 0o600);

    let json: serde_json::Value =
        serde_json::from_str(&ok(&["pki", "inspect", "--dir", &d, "-o", "json"])).unwrap();
    assert_eq!(json["ca"]["isCa"], true);
    assert_eq!(json["principal"]["subjectCn"], "argocd-agent-principal");
    assert_eq!(json["resourceProxy"]["sans"][2], "IP:10.0.0.1");
    assert_eq!(json["agents"]["spoke1"]["subjectCn"], "spoke1");
    assert_eq!(
        json["agents"]["spoke1"]["fingerprintSha256"],
        info.fingerprint_sha256
    );

    let text = ok(&["pki", "inspect", "--dir", &d]);
    assert!(text.contains("Agent spoke1"), "{text}");
    let principal_path = dir.join("principal.crt");
    let text = ok(&["pki", "inspect", "--cert", principal_path.to_str().unwrap()]);
    assert!(text.contains("CN=argocd-agent-principal"), "{text}");
    assert!(text.contains("DNS:localhost, IP:127.0.0.1"), "{text}");
}

#[test]
fn every_flag_can_come_from_the_environment() {
    let (_tmp, dir, d) = init_pki();
    let run = agentctl_with_env(
        &["pki", "issue", "agent", "spoke2"],
        &[("ARGOCD_AGENTCTL_DIR", &d), ("ARGOCD_AGENTCTL_DAYS", "7")],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let info = inspect(&read(&dir.join("agents/spoke2.crt"))).unwrap();
    assert!(info.not_after - info.not_before < chrono::Duration::days(8));
}

#[test]
fn jwt_create_key_writes_a_usable_private_key_once() {
    let (_tmp, dir, d) = init_pki();
    let out = ok(&["jwt", "create-key", "--dir", &d]);
    assert!(out.contains("jwt.key") && out.contains("ES256"), "{out}");
    let pem = read(&dir.join("jwt.key"));
    #[cfg(unix)]
    assert_eq!(mode(&dir.join("jwt.key")), 0o600);
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
    jsonwebtoken::EncodingKey::from_ec_pem(pem.as_bytes()).unwrap();
    assert!(
        !out.contains(pem.lines().nth(1).unwrap()),
        "key material printed"
    );

    let err = usage_error(&["jwt", "create-key", "--dir", &d]);
    assert!(err.contains("jwt.key") && err.contains("--force"), "{err}");
    ok(&["jwt", "create-key", "--dir", &d, "--force"]);
    let inspected = ok(&["jwt", "inspect-key", "--dir", &d, "-o", "json"]);
    assert!(
        inspected.contains("\"jwtAlgorithm\": \"ES256\""),
        "{inspected}"
    );
}

#[test]
fn bad_usage_exits_2_with_a_message_naming_the_problem() {
    let (tmp, _dir, d) = init_pki();

    let err = usage_error(&["pki", "init", "--dir", &d]);
    assert!(err.contains("ca.crt") && err.contains("--force"), "{err}");
    ok(&["pki", "init", "--dir", &d, "--force"]);

    let err = usage_error(&["pki", "issue", "agent", "Bad_Name", "--dir", &d]);
    assert!(err.contains("NAME") && err.contains("'B'"), "{err}");

    let err = usage_error(&[
        "pki",
        "issue",
        "principal",
        "--dir",
        &d,
        "--ip",
        "not-an-ip",
    ]);
    assert!(err.contains("--ip"), "{err}");

    let empty = tmp.path().join("empty");
    let err = usage_error(&[
        "pki",
        "issue",
        "principal",
        "--dir",
        empty.to_str().unwrap(),
    ]);
    assert!(
        err.contains("no CA found") && err.contains("pki init"),
        "{err}"
    );

    let err = usage_error(&["pki", "init", "--dir", &d, "--kubeconfig", "/nope"]);
    assert!(
        err.contains("--dir") && err.contains("--kubeconfig"),
        "{err}"
    );

    let err = usage_error(&[
        "pki", "issue", "agent", "spoke1", "--dir", &d, "--days", "0",
    ]);
    assert!(err.contains("--days"), "{err}");

    let err = usage_error(&["pki", "inspect", "--cert", "/does/not/exist.crt"]);
    assert!(
        err.contains("--cert") && err.contains("/does/not/exist.crt"),
        "{err}"
    );

    let err = usage_error(&[
        "agent",
        "create",
        "spoke1",
        "--dir",
        &d,
        "--resource-proxy-server",
        "no-port",
    ]);
    assert!(err.contains("--resource-proxy-server"), "{err}");

    let err = usage_error(&[
        "agent",
        "create",
        "spoke1",
        "--dir",
        &d,
        "--kubeconfig",
        "/does/not/exist.kubeconfig",
        "--resource-proxy-server",
        "127.0.0.1:9090",
    ]);
    assert!(
        err.contains("--kubeconfig") && err.contains("/does/not/exist.kubeconfig"),
        "{err}"
    );

    let garbage = tmp.path().join("garbage");
    std::fs::create_dir(&garbage).unwrap();
    std::fs::write(garbage.join("ca.crt"), "garbage").unwrap();
    std::fs::write(garbage.join("ca.key"), "garbage").unwrap();
    let err = usage_error(&[
        "pki",
        "issue",
        "agent",
        "x",
        "--dir",
        garbage.to_str().unwrap(),
    ]);
    assert!(err.contains("ca.crt"), "{err}");

    usage_error(&["pki", "frobnicate"]);
    usage_error(&[]);
}

#[test]
fn help_is_available_on_every_command() {
    for args in [
        vec!["--help"],
        vec!["pki", "--help"],
        vec!["pki", "init", "--help"],
        vec!["pki", "issue", "--help"],
        vec!["pki", "issue", "principal", "--help"],
        vec!["pki", "issue", "resource-proxy", "--help"],
        vec!["pki", "issue", "agent", "--help"],
        vec!["pki", "inspect", "--help"],
        vec!["jwt", "create-key", "--help"],
        vec!["agent", "create", "--help"],
        vec!["agent", "list", "--help"],
        vec!["agent", "delete", "--help"],
    ] {
        let out = ok(&args);
        assert!(out.contains("Usage:"), "{args:?}: {out}");
    }
    let propagate = ok(&["pki", "propagate", "--help"]);
    for upstream in ["ARGOCD_AGENT_AGENT_CONTEXT", "ARGOCD_AGENT_AGENT_NAMESPACE"] {
        assert!(
            propagate.contains(upstream),
            "upstream's variable in help: {propagate}"
        );
    }
    assert!(
        ok(&["--help"]).contains("ARGOCD_AGENTCTL_<FLAG>"),
        "the top-level help states the naming scheme"
    );
    let out = ok(&["pki", "init", "--help"]);
    assert!(
        out.contains("ARGOCD_AGENTCTL_DIR"),
        "env var shown in help: {out}"
    );
}

/// The certificates the CLI writes work with the TLS stack the principal and agent use.
#[tokio::test]
async fn issued_certificates_complete_an_mtls_handshake_with_our_tls_stack() {
    let (_tmp, dir, d) = init_pki();
    ok(&["pki", "issue", "principal", "--dir", &d]);
    ok(&["pki", "issue", "agent", "spoke1", "--dir", &d]);

    let server = ServerTlsOptions::new(dir.join("principal.crt"), dir.join("principal.key"))
        .require_client_certs(dir.join("ca.crt"))
        .with_alpn(&[ALPN_H2])
        .load()
        .unwrap();
    let client = ClientTlsOptions::new(dir.join("ca.crt"))
        .with_client_cert(dir.join("agents/spoke1.crt"), dir.join("agents/spoke1.key"))
        .with_alpn(&[ALPN_H2])
        .load()
        .unwrap();

    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let acceptor = tokio_rustls::TlsAcceptor::from(server.config);
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&client.config));
    let server_side = async move {
        let mut tls = acceptor.accept(server_io).await.unwrap();
        let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
        let mut buf = [0u8; 2];
        tls.read_exact(&mut buf).await.unwrap();
        leaf
    };
    let client_side = async move {
        let mut tls = connector
            .connect(ServerName::try_from("localhost").unwrap(), client_io)
            .await
            .unwrap();
        tls.write_all(b"hi").await.unwrap();
        tls.flush().await.unwrap();
        tls
    };
    let (leaf, _client) = tokio::join!(server_side, client_side);
    let id = AgentIdentity::from_cert_der(&leaf, &IdentitySource::CommonName).unwrap();
    assert_eq!(id.name, "spoke1");
}

#[test]
fn wrap_renders_a_folder_into_one_manifestwork_and_refuses_invalid_yaml() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wrap");
    let out = ok(&[
        "wrap",
        "--cluster",
        "spoke1",
        "--name",
        "guestbook",
        fixtures.join("app").to_str().unwrap(),
    ]);
    let work: serde_norway::Value = serde_norway::from_str(&out).expect("stdout is YAML");
    assert_eq!(work["kind"], "ManifestWork");
    assert_eq!(work["metadata"]["namespace"], "spoke1");
    assert_eq!(work["metadata"]["name"], "guestbook");
    assert!(work["spec"]["workload"]["manifests"]
        .as_sequence()
        .is_some_and(|m| !m.is_empty()));

    let bad = agentctl(&[
        "wrap",
        "--cluster",
        "c",
        "--name",
        "w",
        fixtures.join("invalid-yaml").to_str().unwrap(),
    ]);
    assert_eq!(bad.code, 2, "invalid YAML is bad input: {}", bad.stderr);
    assert!(
        bad.stderr.contains("broken.yaml:10:"),
        "error names the file and line: {}",
        bad.stderr
    );
}
