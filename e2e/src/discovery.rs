//! The embedded operator's server discovery as tests exercise it (upstream's behaviour: a
//! GitOpsCluster without `principalServerAddress`/`Port` gets the principal's NodePort endpoint
//! written back into its spec): a GitOpsCluster that names no endpoint, the wait for the
//! write-back, the Node whose InternalIP discovery reads — registered by the test (a stand-in,
//! said so in the names of the tests using it) because the planes run no kubelet — and a node port
//! held on that InternalIP (127.0.0.1) for the test to serve, since no kube-proxy runs either.

use std::time::Duration;

use argocd_agent_operator::gitops::crd::GitOpsCluster;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

use crate::wait::wait_until;

/// The name of the GitOpsCluster [`create_endpointless_gitopscluster`] creates.
pub const DISCOVERED: &str = "discovered";

/// Registers Node `name` with InternalIP 127.0.0.1 (where the planes' node ports answer).
pub async fn register_loopback_node(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]},
            }))?,
        )
        .await?;
    Ok(())
}

/// Creates GitOpsCluster [`DISCOVERED`] in `gocs`' namespace: managed mode, no principal endpoint,
/// Placement `placement`, for the principal serving `argo_namespace`, with `addon`'s further
/// `argoCDAgentAddon` fields (an object).
pub async fn create_endpointless_gitopscluster(
    gocs: &Api<GitOpsCluster>,
    namespace: &str,
    argo_namespace: &str,
    placement: &str,
    addon: Value,
) -> anyhow::Result<()> {
    let mut addon = addon;
    addon["mode"] = json!("managed");
    gocs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "apps.open-cluster-management.io/v1alpha1",
            "kind": "GitOpsCluster",
            "metadata": {"name": DISCOVERED, "namespace": namespace},
            "spec": {"placementRef": {"kind": "Placement", "name": placement},
                     "argoServer": {"argoNamespace": argo_namespace},
                     "argoCDAgentAddon": addon},
        }))?,
    )
    .await?;
    Ok(())
}

/// A port of kube-apiserver's default NodePort range (30000-32767) bound on 127.0.0.1 (the
/// loopback Node's InternalIP) and held, so a Service asking for it as its `nodePort` is served
/// by the test (kube-proxy's part) and by nothing else on this machine. The range lies below
/// Linux's ephemeral ports, where other tests' free ports come from.
pub fn hold_node_port() -> anyhow::Result<std::net::TcpListener> {
    const FIRST: u16 = 30000;
    const LAST: u16 = 32767;
    let start = FIRST + (uuid::Uuid::new_v4().as_u128() % u128::from(LAST - FIRST + 1)) as u16;
    (0..=(LAST - FIRST))
        .map(|i| FIRST + (start - FIRST + i) % (LAST - FIRST + 1))
        .find_map(|port| std::net::TcpListener::bind(("127.0.0.1", port)).ok())
        .ok_or_else(|| anyhow::anyhow!("no free port in {FIRST}-{LAST} on 127.0.0.1"))
}

/// Waits until the operator wrote `127.0.0.1:<node_port>` into [`DISCOVERED`]'s spec.
pub async fn wait_node_port_written(
    gocs: &Api<GitOpsCluster>,
    node_port: i32,
    within: Duration,
) -> anyhow::Result<GitOpsCluster> {
    wait_until(
        "the discovered node port written into the GitOpsCluster's spec",
        within,
        || async {
            let goc = gocs.get(DISCOVERED).await?;
            let addon = &goc.spec.argocd_agent_addon;
            let done = addon.principal_server_address.as_deref() == Some("127.0.0.1")
                && addon.principal_server_port.as_deref() == Some(&*node_port.to_string());
            Ok::<_, kube::Error>(done.then_some(goc))
        },
    )
    .await
}
