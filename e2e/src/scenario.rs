//! Building blocks of the user stories run against real Argo CD: the demo Application a hub
//! creates for an agent (its manifests from [`crate::git_server::demo_manifests`]), and waiting
//! for Argo CD to report it Synced and Healthy and for its ConfigMap to carry a greeting, checking
//! the demo's resource tree as Argo CD answers it, and the cluster Secret that names an agent on
//! the hub. Tests compose these with the processes of
//! [`crate::gateway`] and [`crate::argocd`]; nothing here writes what Argo CD or an agent would
//! ([`record_demo_event`] writes what a user's tool reading the ConfigMap would).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{json, Value};

use crate::control_plane::ControlPlane;
use crate::wait::wait_until;

/// Generous: a first sync clones, renders and applies (seconds), status then crosses the stream.
pub const SYNC_WAIT: Duration = Duration::from_secs(120);

/// An Application of the demo manifests at `repo_url` (path `demo`, branch `main`) synced
/// automatically to `destination` (e.g. `{"name": <agent>, "namespace": …}` on the hub, which a
/// managed agent rewrites to its in-cluster destination), pruning in the background (there is no
/// garbage collector in the test clusters).
pub fn demo_application(
    name: &str,
    namespace: &str,
    repo_url: &str,
    destination: Value,
) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "project": "default",
            "source": {"repoURL": repo_url, "path": "demo", "targetRevision": "main"},
            "destination": destination,
            // A failed sync is retried within its operation with a short backoff, as users set
            // it: without `retry`, one transient failure leaves the app OutOfSync until Argo CD's
            // auto-sync backoff (minutes) runs out, longer than any wait here.
            "syncPolicy": {"automated": {"prune": true, "selfHeal": true},
                           "syncOptions": ["PrunePropagationPolicy=background"],
                           "retry": {"limit": 5,
                                     "backoff": {"duration": "2s", "factor": 2, "maxDuration": "20s"}}},
        }
    }))
    .expect("valid Application")
}

/// `(sync status, health status, synced revision)` of an Application as JSON.
pub fn sync_state(app: &Value) -> (String, String, String) {
    let s = |p: &str| {
        app.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (
        s("/status/sync/status"),
        s("/status/health/status"),
        s("/status/sync/revision"),
    )
}

/// The phase and message of an Application's last operation.
pub fn operation_state(app: &Value) -> (String, String) {
    let s = |p: &str| {
        app.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (
        s("/status/operationState/phase"),
        s("/status/operationState/message"),
    )
}

/// Whether an Application's last operation ended terminated (Argo CD's `Failed` or `Error` with
/// a message saying so).
pub fn operation_terminated(app: &Value) -> bool {
    let (phase, message) = operation_state(app);
    (phase == "Failed" || phase == "Error") && message.contains("terminated")
}

/// Waits until Application `name` in `api` is Synced and Healthy at `revision`; the error carries
/// `logs()`.
pub async fn wait_synced(
    api: &Api<DynamicObject>,
    name: &str,
    revision: &str,
    what: &str,
    logs: impl Fn() -> String,
) -> anyhow::Result<Value> {
    wait_until(what, SYNC_WAIT, || async {
        let app = api
            .get_opt(name)
            .await?
            .map(serde_json::to_value)
            .transpose()?;
        Ok::<_, anyhow::Error>(app.filter(|a| {
            let (sync, health, rev) = sync_state(a);
            sync == "Synced" && health == "Healthy" && rev == revision
        }))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))
}

/// Waits until ConfigMap `demo-config` in `namespace` of `plane` says `greeting`.
pub async fn wait_greeting(
    plane: &ControlPlane,
    namespace: &str,
    greeting: &str,
) -> anyhow::Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(plane.client().await?, namespace);
    wait_until(
        &format!(
            "demo-config in {namespace} on {} says {greeting}",
            plane.name
        ),
        SYNC_WAIT,
        || async {
            Ok::<_, kube::Error>(
                cms.get_opt("demo-config")
                    .await?
                    .and_then(|cm| cm.data)
                    .is_some_and(|d| d.get("greeting").map(String::as_str) == Some(greeting))
                    .then_some(()),
            )
        },
    )
    .await
}

/// The Argo CD cluster Secret that maps agent `agent` to a destination on the hub (what
/// `argocd-agentctl agent create` writes): the hub's Argo CD (e.g. the ApplicationSet controller,
/// which refuses a destination name no cluster has) and upstream's principal (which refuses an
/// autonomous agent's Applications without one) need it.
pub async fn register_agent_cluster(
    hub: &kube::Client,
    principal_ns: &str,
    agent: &str,
) -> anyhow::Result<()> {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(hub.clone(), principal_ns);
    secrets
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("cluster-{agent}"), "labels": {
                    "argocd.argoproj.io/secret-type": "cluster",
                    "argocd-agent.argoproj-labs.io/agent-name": agent}},
                "stringData": {
                    "name": agent,
                    "server": format!("https://127.0.0.1:9090?agentName={agent}"),
                    "config": "{\"tlsClientConfig\":{\"insecure\":true}}",
                },
            }))?,
        )
        .await?;
    Ok(())
}

/// The uid of the demo's `demo-config` ConfigMap as synced into `namespace` on a spoke (what the
/// hub's views of it must carry).
pub async fn demo_config_uid(spoke: &kube::Client, namespace: &str) -> anyhow::Result<String> {
    Api::<ConfigMap>::namespaced(spoke.clone(), namespace)
        .get("demo-config")
        .await?
        .metadata
        .uid
        .ok_or_else(|| anyhow::anyhow!("demo-config in {namespace} has no uid"))
}

/// Checks an Argo CD resource tree (`GET /api/v1/applications/<app>/resource-tree`) of the demo
/// manifests synced into `namespace` on a spoke: its `demo-config` node carries the spoke
/// object's `uid` and namespace, and `demo-secret` and the `demo` ServiceAccount are there.
pub fn assert_demo_tree(tree: &Value, uid: &str, namespace: &str) {
    let nodes = tree["nodes"].as_array().cloned().unwrap_or_default();
    let node = |kind: &str, name: &str| {
        nodes
            .iter()
            .find(|n| n["kind"] == kind && n["name"] == name)
            .cloned()
    };
    let config_map =
        node("ConfigMap", "demo-config").unwrap_or_else(|| panic!("no demo-config in {tree}"));
    assert_eq!(config_map["uid"], uid, "{config_map}");
    assert_eq!(config_map["namespace"], namespace, "{config_map}");
    assert!(node("Secret", "demo-secret").is_some(), "{tree}");
    assert!(node("ServiceAccount", "demo").is_some(), "{tree}");
}

/// Records a Kubernetes Event `name` about the demo's `demo-config` (uid `uid`) in `namespace`,
/// reason `GreetingRead`, as a tool reading it on the spoke would, for the resource-events view.
pub async fn record_demo_event(
    spoke: &kube::Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> anyhow::Result<()> {
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap", "name": "demo-config",
                           "namespace": namespace, "uid": uid},
        "reason": "GreetingRead", "message": "read on the spoke", "type": "Normal",
        "source": {"component": "e2e"},
    }))?;
    Api::<Event>::namespaced(spoke.clone(), namespace)
        .create(&PostParams::default(), &event)
        .await?;
    Ok(())
}
