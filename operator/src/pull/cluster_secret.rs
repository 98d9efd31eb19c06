//! The cluster Secret controller: one Argo CD cluster Secret per ManagedCluster in the hub's Argo
//! CD namespace, so an ApplicationSet's cluster generator can iterate the fleet (and fill the pull
//! annotation with `{{name}}`).
//!
//! Owns Secrets named `<cluster>-secret` (upstream argocd-pull-integration's name) carrying the
//! label [`PULL_CLUSTER_SECRET_LABEL`]: created/updated with server-side apply while the
//! ManagedCluster exists, deleted explicitly when it goes. The ManagedCluster's labels are copied
//! so generators can select on them. A cluster already registered by argocd-agent (a cluster
//! Secret labelled with its agent name) gets no second Secret: Argo CD would list it twice.

use argocd_agent_kube::CancellationToken;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;
use kube::ResourceExt;

use super::application::managed_cluster_resource;
use super::watches::{controller_config, run_controller, touched, triggers, Subscription};
use super::{PullModelError, PullModelOptions, CLUSTER_SECRET_MANAGER};

/// Label Argo CD uses to find cluster Secrets.
pub const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";
/// Label marking the cluster Secrets this controller owns (value: the cluster name).
pub const PULL_CLUSTER_SECRET_LABEL: &str = "apps.open-cluster-management.io/pull-model-cluster";
/// Label argocd-agent puts on the cluster Secret of an agent (value: the agent name).
pub const AGENT_NAME_LABEL: &str = "argocd-agent.argoproj-labs.io/agent-name";
/// Label naming the ManagedCluster, as OCM's GitOpsCluster controller writes it.
pub const CLUSTER_NAME_LABEL: &str = "apps.open-cluster-management.io/cluster-name";
/// Coalesces a burst of triggers for one cluster (or its Secret).
const DEBOUNCE: std::time::Duration = std::time::Duration::from_millis(20);

/// Name of the cluster Secret of `cluster`.
pub fn cluster_secret_name(cluster: &str) -> String {
    format!("{cluster}-secret")
}

/// The server URL recorded for a cluster: its first `managedClusterClientConfigs` URL, else the
/// placeholder upstream writes (Argo CD keys clusters by server, so it must be unique; the pull
/// model never connects to it: payloads deploy in-cluster).
pub fn cluster_server(cluster: &DynamicObject) -> String {
    cluster
        .data
        .pointer("/spec/managedClusterClientConfigs/0/url")
        .and_then(|u| u.as_str())
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| format!("https://{}-control-plane:6443", cluster.name_any()))
}

/// The cluster Secret for a ManagedCluster.
pub fn build_cluster_secret(cluster: &DynamicObject, argocd_namespace: &str) -> Secret {
    let name = cluster.name_any();
    let mut labels: BTreeMap<String, String> = cluster
        .labels()
        .iter()
        .filter(|(k, _)| !k.starts_with("argocd.argoproj.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(SECRET_TYPE_LABEL.into(), "cluster".into());
    labels.insert(PULL_CLUSTER_SECRET_LABEL.into(), name.clone());
    labels.insert(CLUSTER_NAME_LABEL.into(), name.clone());
    let data = BTreeMap::from([
        ("name".to_string(), ByteString(name.clone().into_bytes())),
        (
            "server".to_string(),
            ByteString(cluster_server(cluster).into_bytes()),
        ),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(cluster_secret_name(&name)),
            namespace: Some(argocd_namespace.to_string()),
            labels: Some(labels),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// True when `existing` already has the desired data and labels.
fn secret_is_current(existing: &Secret, desired: &Secret) -> bool {
    let labels = existing.metadata.labels.clone().unwrap_or_default();
    existing.data == desired.data
        && desired
            .metadata
            .labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v))
}

struct Context {
    client: kube::Client,
    opts: PullModelOptions,
    clusters: Store<DynamicObject>,
    secrets: Store<Secret>,
    cluster_resource: kube::core::ApiResource,
}

impl Context {
    fn agent_registered(&self, cluster: &str) -> bool {
        self.secrets
            .find(|s| s.labels().get(AGENT_NAME_LABEL).map(String::as_str) == Some(cluster))
            .is_some()
    }

    fn cluster(&self, name: &str) -> Option<Arc<DynamicObject>> {
        self.clusters
            .get(&ObjectRef::new_with(name, self.cluster_resource.clone()))
    }

    /// Brings the cluster Secret of `cluster_name` in line with the ManagedCluster.
    async fn reconcile(&self, cluster_name: &str) -> Result<Action, ClusterSecretError> {
        let cluster = self.cluster(cluster_name);
        let desired = cluster
            .filter(|c| {
                c.metadata.deletion_timestamp.is_none() && !self.agent_registered(cluster_name)
            })
            .map(|c| build_cluster_secret(&c, &self.opts.argocd_namespace));
        let name = cluster_secret_name(cluster_name);
        let existing = self
            .secrets
            .get(&ObjectRef::new(&name).within(&self.opts.argocd_namespace));
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.opts.argocd_namespace);
        let failed = |source| ClusterSecretError {
            cluster: cluster_name.to_string(),
            source,
        };
        match desired {
            Some(secret)
                if existing
                    .as_deref()
                    .is_some_and(|e| secret_is_current(e, &secret)) => {}
            Some(secret) => {
                api.patch(
                    &name,
                    &PatchParams::apply(CLUSTER_SECRET_MANAGER).force(),
                    &Patch::Apply(&secret),
                )
                .await
                .map_err(failed)?;
                tracing::info!(cluster = %cluster_name, secret = %name, "cluster Secret applied");
            }
            None if existing
                .as_deref()
                .is_some_and(|e| e.labels().contains_key(PULL_CLUSTER_SECRET_LABEL)) =>
            {
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {
                        tracing::info!(cluster = %cluster_name, secret = %name, "cluster Secret deleted")
                    }
                    Err(kube::Error::Api(s)) if s.is_not_found() => {}
                    Err(e) => return Err(failed(e)),
                }
            }
            None => {}
        }
        Ok(Action::await_change())
    }
}

/// A failed write of one cluster's Secret (retried).
#[derive(Debug, thiserror::Error)]
#[error("cluster Secret of {cluster}: {source}")]
pub struct ClusterSecretError {
    /// The ManagedCluster.
    cluster: String,
    /// The API error.
    source: kube::Error,
}

async fn reconcile_cluster(
    cluster: Arc<DynamicObject>,
    ctx: Arc<Context>,
) -> Result<Action, ClusterSecretError> {
    ctx.reconcile(&cluster.name_any()).await
}

/// Deletes our Secret of a ManagedCluster that no longer exists.
async fn reconcile_secret(
    secret: Arc<Secret>,
    ctx: Arc<Context>,
) -> Result<Action, ClusterSecretError> {
    let Some(cluster) = secret.labels().get(PULL_CLUSTER_SECRET_LABEL) else {
        return Ok(Action::await_change());
    };
    if ctx.cluster(cluster).is_some() {
        return Ok(Action::await_change());
    }
    ctx.reconcile(cluster).await
}

fn retry<K>(_object: Arc<K>, error: &ClusterSecretError, ctx: Arc<Context>) -> Action {
    let cluster = &error.cluster;
    tracing::warn!(%cluster, error = %error.source, "cluster Secret reconciliation failed; retrying");
    Action::requeue(ctx.opts.retry_after)
}

/// The cluster a cluster Secret event concerns: ours by label, an agent's by its agent label.
fn secret_cluster(secret: &Secret) -> Option<String> {
    let labels = secret.labels();
    labels
        .get(PULL_CLUSTER_SECRET_LABEL)
        .or_else(|| labels.get(AGENT_NAME_LABEL))
        .cloned()
}

/// Runs the cluster Secret controllers until `shutdown`: one per ManagedCluster, one that removes
/// the Secrets of ManagedClusters that are gone.
pub async fn run(
    client: kube::Client,
    opts: PullModelOptions,
    clusters: [Subscription<DynamicObject>; 2],
    secrets: [Subscription<Secret>; 2],
    shutdown: CancellationToken,
) -> Result<(), PullModelError> {
    let cluster_resource = managed_cluster_resource();
    let [clusters, clusters_too] = clusters;
    let [secrets, secrets_too] = secrets;
    let ctx = Arc::new(Context {
        client,
        opts,
        clusters: clusters.store.clone(),
        secrets: secrets.store.clone(),
        cluster_resource: cluster_resource.clone(),
    });
    let config = controller_config(1, DEBOUNCE);
    let reads = [clusters.ready.clone(), secrets.ready.clone()];
    let secret_to_cluster = {
        let cr = cluster_resource.clone();
        move |s: Secret| secret_cluster(&s).map(|c| ObjectRef::new_with(&c, cr.clone()))
    };
    let cluster_controller =
        Controller::for_stream_with(touched(clusters.events), clusters.store, cluster_resource)
            .watches_stream(touched(secrets_too.events), secret_to_cluster);
    // A deleted cluster's Secret goes; after a relist, so do those of clusters deleted while
    // nothing watched.
    let ours = {
        let ctx = ctx.clone();
        move |event: Event<DynamicObject>| match event {
            Event::Delete(c) => vec![ObjectRef::new(&cluster_secret_name(&c.name_any()))
                .within(&ctx.opts.argocd_namespace)],
            Event::InitDone => ctx
                .secrets
                .state()
                .iter()
                .filter(|s| s.labels().contains_key(PULL_CLUSTER_SECRET_LABEL))
                .map(|s| ObjectRef::from_obj(s.as_ref()))
                .collect(),
            _ => Vec::new(),
        }
    };
    let secret_controller = Controller::for_stream(touched(secrets.events), secrets.store)
        .reconcile_on(triggers(clusters_too.events, ours));
    tokio::join!(
        run_controller(
            "cluster secrets",
            reads.clone(),
            cluster_controller,
            config.clone(),
            reconcile_cluster,
            retry,
            ctx.clone(),
            shutdown.clone()
        ),
        run_controller(
            "cluster secret removal",
            reads,
            secret_controller,
            config,
            reconcile_secret,
            retry,
            ctx,
            shutdown
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster(spec: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": {"name": "cluster1", "labels": {"cloud": "aws", "argocd.argoproj.io/secret-type": "bogus"}},
            "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn cluster_secret_has_argo_cd_layout_and_cluster_labels() {
        let secret = build_cluster_secret(&cluster(json!({"hubAcceptsClient": true})), "argocd");
        assert_eq!(secret.metadata.name.as_deref(), Some("cluster1-secret"));
        assert_eq!(secret.metadata.namespace.as_deref(), Some("argocd"));
        let labels = secret.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[SECRET_TYPE_LABEL], "cluster");
        assert_eq!(labels[PULL_CLUSTER_SECRET_LABEL], "cluster1");
        assert_eq!(labels["cloud"], "aws");
        let data = secret.data.as_ref().unwrap();
        assert_eq!(data["name"].0, b"cluster1");
        assert_eq!(data["server"].0, b"https://cluster1-control-plane:6443");
    }

    #[test]
    fn server_comes_from_the_cluster_client_config_when_known() {
        let c = cluster(
            json!({"managedClusterClientConfigs": [{"url": "https://api.cluster1.example.com:6443"}]}),
        );
        assert_eq!(cluster_server(&c), "https://api.cluster1.example.com:6443");
    }
}
