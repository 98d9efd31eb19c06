//! A local Git server for Argo CD's repo-server to clone from: `git daemon` (Debian's git) serving
//! bare repositories from a temporary directory over `git://127.0.0.1:<port>/<name>.git`, and the
//! demo manifests the tests and the quickstart deploy (plus a PreSync hook that keeps a sync running).
//!
//! Repositories are made with the real `git` CLI (init, commit, push into the bare repository), so
//! repo-server resolves revisions and clones exactly as it would from any Git host.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::binaries::system_binary;
use crate::ports::free_port;
use crate::process::{temp_dir, ManagedProcess, ProcessSpec};

/// A running `git daemon`.
pub struct GitServer {
    /// Port on 127.0.0.1.
    pub port: u16,
    root: PathBuf,
    _daemon: ManagedProcess,
}

/// The demo application: a ConfigMap and a Secret (Argo CD gives both no health check of their own,
/// so the app is Healthy once synced, with no kubelet needed) and a ServiceAccount.
pub fn demo_manifests(greeting: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "configmap.yaml",
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo-config\ndata:\n  greeting: {greeting}\n"
            ),
        ),
        (
            "secret.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: demo-secret\nstringData:\n  token: not-a-real-token\n"
                .to_string(),
        ),
        (
            "serviceaccount.yaml",
            "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: demo\n".to_string(),
        ),
    ]
}

/// A pod of the demo app bound to the fake kubelet's node `node` (its health is left out of the
/// app's: the app is Healthy before the kubelet reports it).
pub fn demo_pod(name: &str, node: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations:
    argocd.argoproj.io/ignore-healthcheck: \"true\"
spec:
  nodeName: {node}
  serviceAccountName: demo
  automountServiceAccountToken: false
  containers:
  - name: web
    image: registry.invalid/web:1
"
    )
}

/// A PreSync hook Job to add to the demo manifests that never completes on the test planes (no Job
/// controller, no kubelet): a sync of the app stays Running until someone terminates it.
pub const PRESYNC_HOOK_JOB: &str = "apiVersion: batch/v1
kind: Job
metadata:
  name: demo-presync
  annotations:
    argocd.argoproj.io/hook: PreSync
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: wait
        image: registry.invalid/never-runs:1
";

impl GitServer {
    /// Starts `git daemon` on a free port serving an (initially empty) directory of bare repositories.
    pub fn start(name: &str) -> anyhow::Result<GitServer> {
        let git = system_binary("git", "git")?;
        let dir = temp_dir(&format!("git-{name}"))?;
        let root = dir.join("repos");
        std::fs::create_dir_all(&root)?;
        let port = free_port();
        let spec = ProcessSpec::new(format!("git-daemon-{name}"), git, dir.join("daemon.log"))
            .arg("daemon")
            .arg(format!("--base-path={}", root.display()))
            .args(["--export-all", "--reuseaddr", "--listen=127.0.0.1"])
            .arg(format!("--port={port}"))
            .arg(&root);
        let daemon = ManagedProcess::spawn(spec)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "git daemon did not listen on {port} within 10 s:\n{}",
                daemon.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(GitServer {
            port,
            root,
            _daemon: daemon,
        })
    }

    /// The clone URL of repository `repo`.
    pub fn url(&self, repo: &str) -> String {
        format!("git://127.0.0.1:{}/{repo}.git", self.port)
    }

    /// Commits `files` (path under the repository, content) into directory `path` of repository
    /// `repo` on branch `main`, creating the repository on first use; returns the commit SHA.
    pub fn commit(
        &self,
        repo: &str,
        path: &str,
        files: &[(&str, String)],
        message: &str,
    ) -> anyhow::Result<String> {
        let bare = self.root.join(format!("{repo}.git"));
        if !bare.join("HEAD").exists() {
            std::fs::create_dir_all(&bare)?;
            git(&bare, &["init", "--bare", "-q", "-b", "main"])?;
        }
        let work = self.root.join(format!(".work-{repo}"));
        if !work.exists() {
            git(
                &self.root,
                &[
                    "clone",
                    "-q",
                    bare.to_str().expect("utf-8 path"),
                    work.to_str().expect("utf-8 path"),
                ],
            )?;
            git(&work, &["checkout", "-q", "-B", "main"])?;
        }
        let target = work.join(path);
        std::fs::create_dir_all(&target)?;
        for (name, content) in files {
            std::fs::write(target.join(name), content)?;
        }
        git(&work, &["add", "-A"])?;
        git(
            &work,
            &[
                "-c",
                "user.name=e2e",
                "-c",
                "user.email=e2e@example.invalid",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                message,
            ],
        )?;
        git(&work, &["push", "-q", "origin", "main"])?;
        Ok(git(&work, &["rev-parse", "HEAD"])?.trim().to_string())
    }
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(system_binary("git", "git")?)
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "git {} in {} failed: {}",
        args.join(" "),
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
