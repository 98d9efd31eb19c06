//! End-to-end harness: real Kubernetes control planes (etcd + kube-apiserver), Redis, a Git server,
//! real Argo CD, upstream argocd-agent and OCM (built from their Go modules by `hack/peers.sh`) and the
//! project's binaries as child processes, for tests that prove behaviour across processes.
//!
//! Owns process lifecycle (every child is killed and every temporary directory removed when the test
//! binary ends, also on panic and on Ctrl-C), free-port allocation, control-plane start-up with the
//! Argo CD and OCM CRDs installed, and wait-for-condition helpers. It does not know the product's
//! protocol: tests drive the binaries through their command lines and the Kubernetes API (the one
//! exception, [`pull_model`], runs the operator's pull-model controllers in-process).

pub mod argocd;
pub mod argocd_terminal;
pub mod bench;
pub mod binaries;
pub mod control_plane;
pub mod crds;
pub mod discovery;
pub mod fleet;
pub mod fleet_load;
pub mod gateway;
pub mod git_server;
pub mod helm;
pub mod http1_proxy;
pub mod kubelet;
pub mod kubelet_exec;
pub mod mesh_sidecar;
pub mod metrics;
pub mod ocm;
pub mod otlp_collector;
pub mod pod_runner;
pub mod ports;
pub mod process;
pub mod pull_model;
pub mod raw_agent;
pub mod redis;
pub mod scenario;
pub mod shared;
pub mod sides;
pub mod sim_agent;
pub mod tcp_proxy;
pub mod upstream;
pub mod wait;

pub use control_plane::ControlPlane;
pub use process::{ManagedProcess, ProcessSpec};
pub use redis::Redis;
pub use shared::{shared_planes, SharedPlanes, TestContext};
pub use wait::wait_until;

/// Field `key` of a Secret's `data` as text ("" when the field or the data is absent).
pub fn secret_text(secret: &k8s_openapi::api::core::v1::Secret, key: &str) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default()
}
