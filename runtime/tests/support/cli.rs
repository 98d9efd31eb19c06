//! Process-level support for the command-line contract tests of both binaries
//! (`principal/tests/cli.rs`, `agent/tests/cli.rs`), which include this file with
//! `#[path = "../../runtime/tests/support/cli.rs"] mod cli_support;`.
//!
//! Owns: starting a binary with a clean environment, waiting for it to exit or to become live,
//! stopping it with SIGTERM, plain HTTP GETs to its ops endpoints, and the certificate and
//! kubeconfig fixtures the binaries need to start. It sits under `runtime/tests/support/` (a
//! directory cargo does not build as a test of its own) because the runtime crate owns the ops
//! endpoints and flag handling these tests exercise; it needs nothing but std and `rcgen`, which
//! both crates already have for their tests.

#![allow(
    dead_code,
    reason = "each including test crate uses its own subset of these helpers"
)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a started binary gets to answer `/healthz`.
const LIVE_WITHIN: Duration = Duration::from_secs(20);

/// How long a binary gets to exit after failing or being sent SIGTERM.
const EXIT_WITHIN: Duration = Duration::from_secs(10);

/// The binary at `path` with no inherited environment, so stray `ARGOCD_*` vars cannot interfere.
pub fn clean_command(path: &str) -> Command {
    let mut cmd = Command::new(path);
    cmd.env_clear();
    cmd
}

/// Process output as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `cmd` to completion, capturing its output.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("run {}: {e}", cmd.get_program().to_string_lossy()))
}

/// Starts `cmd` in the background with stdout discarded and stderr captured.
pub fn spawn(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", cmd.get_program().to_string_lossy()))
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP/1.1 GET: the status code (0 when unparsable) and the whole response.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
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

/// Waits for `child` to exit, killing it and failing the test after `timeout`.
pub fn wait_with_timeout(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("process {} did not exit within {timeout:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Everything `child` wrote to its captured stderr (read after it exited).
pub fn stderr_of(child: &mut Child) -> String {
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    stderr
}

/// Waits for `child` to exit on its own, and returns how it exited and what it wrote to stderr.
pub fn exit_of(child: &mut Child) -> (ExitStatus, String) {
    let status = wait_with_timeout(child, EXIT_WITHIN);
    (status, stderr_of(child))
}

/// Waits until `child` answers `/healthz` on `health` with 200; kills it and fails otherwise.
pub fn wait_until_live(child: &mut Child, health: SocketAddr) {
    let deadline = Instant::now() + LIVE_WITHIN;
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
}

/// Sends `child` SIGTERM, and returns how it exited and what it wrote to stderr.
pub fn terminate(child: &mut Child) -> (ExitStatus, String) {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    exit_of(child)
}

/// Writes a CA certificate to `ca`, and a `localhost` certificate it signed with its key to `cert`
/// and `key`: good for a TLS server and a TLS client alike.
pub fn write_ca_and_signed_cert(ca: &Path, cert: &Path, key: &Path) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    std::fs::write(ca, ca_cert.pem()).unwrap();
    std::fs::write(cert, leaf.pem()).unwrap();
    std::fs::write(key, leaf_key.serialize_pem()).unwrap();
}

/// Writes a PEM private key (such as a JWT signing key) to `path`.
pub fn write_private_key(path: &Path) {
    std::fs::write(path, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
}

/// Writes a kubeconfig whose only cluster is a loopback port nothing listens on, so the binary
/// starts and keeps retrying without a real cluster.
pub fn write_unreachable_kubeconfig(path: &Path) {
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n    insecure-skip-tls-verify: true\n\
         users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n\
         current-context: c\n",
        free_port()
    );
    std::fs::write(path, kubeconfig).unwrap();
}

/// `--help` exits 0 and shows each of `flags` next to the `<env_prefix>FLAG` env var mirroring
/// it, and each of `defaults`.
pub fn assert_help_lists(mut cmd: Command, env_prefix: &str, flags: &[&str], defaults: &[&str]) {
    let output = run(cmd.arg("--help"));
    assert_eq!(output.status.code(), Some(0));
    let help = text(&output.stdout);
    for flag in flags {
        let env = format!("{env_prefix}{}", flag.to_uppercase().replace('-', "_"));
        assert!(
            help.contains(&format!("--{flag}")),
            "--{flag} missing from help"
        );
        assert!(help.contains(&env), "{env} missing from help");
    }
    for default in defaults {
        assert!(
            help.contains(default),
            "default {default} missing from help"
        );
    }
}

/// `--version` exits 0 and prints the crate's version.
pub fn assert_version_exits_zero(mut cmd: Command) {
    let output = run(cmd.arg("--version"));
    assert_eq!(output.status.code(), Some(0));
    assert!(text(&output.stdout).contains(env!("CARGO_PKG_VERSION")));
}

/// Leaving `--<flag>` out of `required_flags` is a usage error (exit 2) whose message names it.
pub fn assert_required(mut cmd: Command, required_flags: Vec<String>, flag: &str) {
    let option = format!("--{flag}");
    let args: Vec<String> = required_flags
        .into_iter()
        .filter(|a| !a.starts_with(&option))
        .collect();
    let output = run(cmd.args(&args));
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains(&option),
        "{}",
        text(&output.stderr)
    );
}

/// `output` is a configuration error (exit 2) whose message opens with `error: <names>` (the flag
/// and env var, such as `--tls-ca (env ARGOCD_AGENT_TLS_CA)`) and mentions each of `mentions`.
pub fn assert_config_error(output: &Output, names: &str, mentions: &[&str]) {
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(stderr.starts_with(&format!("error: {names}")), "{stderr}");
    for mention in mentions {
        assert!(stderr.contains(mention), "{stderr}");
    }
}

/// A loopback port held by a listener, so a binary told to serve on it cannot bind it.
pub fn taken_port() -> (TcpListener, SocketAddr) {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    (taken, addr)
}

/// `child` fails at run time (exit 1) because it cannot bind its `endpoint` endpoint on `addr`.
pub fn assert_cannot_bind(child: &mut Child, endpoint: &str, addr: SocketAddr) {
    let (status, stderr) = exit_of(child);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot bind {endpoint} endpoint on {addr}")),
        "{stderr}"
    );
}
