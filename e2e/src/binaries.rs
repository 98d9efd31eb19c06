//! Where the executables a test starts come from: the project's own binaries in the cargo target
//! directory, the real peers (Kubernetes, etcd, Argo CD, upstream argocd-agent, OCM) built from the Go
//! modules under `e2e/peers/` and cached by `hack/peers.sh` (helm among them), and Debian's redis and
//! git.

use std::path::{Path, PathBuf};

/// The workspace root (parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e crate lives in the workspace")
        .to_path_buf()
}

/// Path of one of the project's binaries (`argocd-principal`, `argocd-agent`, `argocd-agentctl`) built
/// into the same target directory as the running executable: a test runs from `<target>/debug/deps`,
/// a binary of this crate (the quickstart) from `<target>/debug`.
pub fn project_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or_else(|| {
        anyhow::anyhow!("cannot locate the target directory from {}", exe.display())
    })?;
    let candidates = [Some(dir.join(name)), dir.parent().map(|p| p.join(name))];
    candidates.into_iter().flatten().find(|p| p.is_file()).ok_or_else(|| {
        anyhow::anyhow!(
            "{name} not found next to {}: build the binaries first with `cargo build --workspace --bins` (hack/test.sh does this)",
            exe.display()
        )
    })
}

/// The real programs built from one Go module under `e2e/peers/` by `hack/peers.sh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// etcd, kube-apiserver, kube-controller-manager, kubectl.
    Kube,
    /// Argo CD's multi-call binary (and its manifests).
    ArgoCd,
    /// Upstream argocd-agent and argocd-agentctl.
    UpstreamAgent,
    /// Open Cluster Management's controllers and agents.
    Ocm,
    /// The `helm` CLI.
    Helm,
    /// `cewire`: CloudEvents through cloudevents/sdk-go, the library upstream uses on the wire.
    Wire,
}

impl Peer {
    fn module(self) -> &'static str {
        match self {
            Peer::Kube => "kube",
            Peer::ArgoCd => "argocd",
            Peer::UpstreamAgent => "agent",
            Peer::Ocm => "ocm",
            Peer::Wire => "wire",
            Peer::Helm => "helm",
        }
    }

    /// The peer's cache directory, as `hack/peers.sh --dir` reports it (asked once per process).
    pub fn dir(self) -> anyhow::Result<PathBuf> {
        static DIRS: std::sync::Mutex<Vec<(Peer, PathBuf)>> = std::sync::Mutex::new(Vec::new());
        let mut dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, d)) = dirs.iter().find(|(p, _)| *p == self) {
            return Ok(d.clone());
        }
        let script = workspace_root().join("hack/peers.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .args(["--dir", self.module()])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "the {} peers are not built yet: run `bash {} {}` once (hack/test.sh does this)",
            self.module(),
            script.display(),
            self.module()
        );
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        dirs.push((self, dir.clone()));
        Ok(dir)
    }

    /// Path of one of the peer's programs (`kube-apiserver`, `etcd`, `argocd`, `argocd-agent`, ...).
    pub fn binary(self, name: &str) -> anyhow::Result<PathBuf> {
        let path = self.dir()?.join(name);
        anyhow::ensure!(
            path.is_file(),
            "{} is not among the built {} peers ({})",
            name,
            self.module(),
            path.display()
        );
        Ok(path)
    }
}

/// Path of the kube-apiserver: `$KUBE_APISERVER`, else the one `hack/peers.sh` built.
pub fn kube_apiserver() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("KUBE_APISERVER") {
        return Ok(PathBuf::from(p));
    }
    Peer::Kube.binary("kube-apiserver")
}

/// Path of kubectl built with the control plane (same minor version as the apiserver).
pub fn kubectl() -> anyhow::Result<PathBuf> {
    Peer::Kube.binary("kubectl")
}

/// Runs kubectl with `kubeconfig` and its discovery cache in `cache_dir`; returns (success, stdout,
/// stderr).
pub fn run_kubectl(
    kubeconfig: &Path,
    cache_dir: &Path,
    args: &[&str],
) -> anyhow::Result<(bool, String, String)> {
    let out = std::process::Command::new(kubectl()?)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--cache-dir={}", cache_dir.display()))
        .args(args)
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Path of a program expected on PATH (etcd, redis-server, kubectl), with an install hint if missing.
pub fn system_binary(name: &str, debian_package: &str) -> anyhow::Result<PathBuf> {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow::anyhow!("{name} not found on PATH: apt-get install {debian_package} (hack/test.sh installs it)"))
}
