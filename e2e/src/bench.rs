//! What the benchmark binaries share: the `--count` argument, percentiles of latency samples, and
//! the common set-up (a hub and a spoke plane, a PKI with an agent certificate `bench`, and a
//! principal on the hub).

use std::path::PathBuf;
use std::time::Duration;

use crate::control_plane::ControlPlane;
use crate::gateway::{Pki, Principal};

/// The value after `--count`, or `default`.
pub fn count_arg(default: usize) -> anyhow::Result<usize> {
    Ok(std::env::args()
        .skip_while(|a| a != "--count")
        .nth(1)
        .map(|c| c.parse())
        .transpose()?
        .unwrap_or(default))
}

/// The `p` percentile (0.0..=1.0) of already sorted, non-empty samples (nearest rank).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Hub and spoke planes with a principal on the hub, ready for an agent named `bench`.
pub struct BenchSetup {
    /// `[hub, spoke]`.
    pub planes: Vec<ControlPlane>,
    /// Working directory (logs, PKI).
    pub dir: PathBuf,
    /// The PKI (CA, principal certificate, agent `bench`).
    pub pki: Pki,
    /// The principal, logging at info.
    pub principal: Principal,
}

impl BenchSetup {
    /// Starts everything; `label` names the working directory.
    pub async fn start(label: &str) -> anyhow::Result<BenchSetup> {
        eprintln!("==> starting hub and spoke control planes");
        let planes =
            tokio::task::spawn_blocking(|| ControlPlane::start_many(&["hub", "spoke"])).await??;
        let dir = crate::process::temp_dir(label)?;
        let pki = Pki::create(&dir.join("pki"))?;
        pki.issue_agent("bench")?;
        let principal = Principal::start(
            "bench",
            &dir,
            &planes[0],
            &pki,
            "argocd",
            &["--log-level=info"],
        )
        .await?;
        Ok(BenchSetup {
            planes,
            dir,
            pki,
            principal,
        })
    }

    /// The hub plane.
    pub fn hub(&self) -> &ControlPlane {
        &self.planes[0]
    }

    /// The spoke plane.
    pub fn spoke(&self) -> &ControlPlane {
        &self.planes[1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_takes_the_nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&s, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&s, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&s, 0.0), Duration::from_millis(1));
        assert_eq!(
            percentile(&[Duration::from_millis(7)], 0.99),
            Duration::from_millis(7)
        );
    }
}
