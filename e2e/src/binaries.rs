//! Where the executables a test starts come from: the project's own binaries in the cargo target
//! directory, the cached kube-apiserver built by `hack/control-plane.sh`, and Debian's etcd/redis.

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

/// Path of the kube-apiserver: `$KUBE_APISERVER`, else the one cached by `hack/control-plane.sh`.
pub fn kube_apiserver() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("KUBE_APISERVER") {
        return Ok(PathBuf::from(p));
    }
    let script = workspace_root().join("hack/control-plane.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("--path")
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "kube-apiserver is not built yet: run `{}` once (hack/test.sh does this)",
        script.display()
    );
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Path of a program expected on PATH (etcd, redis-server, kubectl), with an install hint if missing.
pub fn system_binary(name: &str, debian_package: &str) -> anyhow::Result<PathBuf> {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow::anyhow!("{name} not found on PATH: apt-get install {debian_package} (hack/control-plane.sh does this)"))
}
