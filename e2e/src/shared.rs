//! Control planes shared by all tests of one test binary (start-up costs seconds, so each binary
//! starts one hub and two spokes once), and the per-test context that keeps tests apart on them:
//! unique names/namespaces, a private directory, and log tails printed when the test fails.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::control_plane::ControlPlane;
use crate::process::temp_dir;

/// The hub and spoke planes of this test binary.
pub struct SharedPlanes {
    /// The hub (where the principal and Argo CD's API live).
    pub hub: ControlPlane,
    /// Workload clusters.
    pub spokes: Vec<ControlPlane>,
}

static PLANES: OnceLock<Result<SharedPlanes, String>> = OnceLock::new();

/// The shared hub + two spokes, started on first use (in parallel) and stopped when the binary exits.
pub async fn shared_planes() -> &'static SharedPlanes {
    let planes = tokio::task::spawn_blocking(|| {
        PLANES.get_or_init(|| {
            ControlPlane::start_many(&["hub", "spoke1", "spoke2"])
                .map(|mut v| {
                    let spokes = v.split_off(1);
                    SharedPlanes {
                        hub: v.remove(0),
                        spokes,
                    }
                })
                .map_err(|e| format!("{e:#}"))
        })
    })
    .await
    .expect("shared plane start-up task");
    match planes {
        Ok(p) => p,
        Err(e) => panic!("shared control planes failed to start: {e}"),
    }
}

/// Per-test state on the shared planes.
pub struct TestContext {
    /// The test's name (for logs).
    pub name: String,
    /// A short random suffix; [`TestContext::unique`] builds DNS-label names from it.
    pub suffix: String,
    /// A private directory for certificates, logs and queues of this test.
    pub dir: PathBuf,
}

impl TestContext {
    /// A context for the test called `name`.
    pub fn new(name: &str) -> anyhow::Result<TestContext> {
        let suffix = uuid::Uuid::new_v4().simple().to_string()[..6].to_string();
        let dir = temp_dir(&format!("test-{name}"))?;
        Ok(TestContext {
            name: name.to_string(),
            suffix,
            dir,
        })
    }

    /// A DNS-1123 label unique to this test: `<prefix>-<suffix>`.
    pub fn unique(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.suffix)
    }
}

impl Drop for TestContext {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "[e2e] test {} failed; its files are in {}",
                self.name,
                self.dir.display()
            );
            if let Some(Ok(planes)) = PLANES.get() {
                planes.hub.print_logs(15);
                for s in &planes.spokes {
                    s.print_logs(15);
                }
            }
        }
    }
}
