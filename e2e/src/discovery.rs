//! The embedded operator's server discovery as tests exercise it (upstream's behaviour: a
//! GitOpsCluster without `principalServerAddress`/`Port` gets the principal's NodePort endpoint
//! written back into its spec): a GitOpsCluster that names no endpoint, the wait for the
//! write-back, and the Node whose InternalIP discovery reads — registered by the test (a stand-in,
//! said so in the names of the tests using it) because the planes run no kubelet.

use std::time::Duration;

use argocd_agent_operator::gitops::crd::GitOpsCluster;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::wait::wait_until;

/// The name of [`endpointless_gitopscluster`].
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
/// a Placement `nobody` (which selects no cluster), for the principal serving `argo_namespace`.
pub async fn create_endpointless_gitopscluster(
    gocs: &Api<GitOpsCluster>,
    namespace: &str,
    argo_namespace: &str,
) -> anyhow::Result<()> {
    gocs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "apps.open-cluster-management.io/v1alpha1",
            "kind": "GitOpsCluster",
            "metadata": {"name": DISCOVERED, "namespace": namespace},
            "spec": {"placementRef": {"kind": "Placement", "name": "nobody"},
                     "argoServer": {"argoNamespace": argo_namespace},
                     "argoCDAgentAddon": {"mode": "managed"}},
        }))?,
    )
    .await?;
    Ok(())
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
