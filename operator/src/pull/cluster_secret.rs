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

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::ResourceExt;

use super::application::managed_cluster_resource;
use super::queue::DirtyQueue;
use super::{PullModelError, PullModelOptions, CLUSTER_SECRET_MANAGER};

/// Label Argo CD uses to find cluster Secrets.
pub const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";
/// Label marking the cluster Secrets this controller owns (value: the cluster name).
pub const PULL_CLUSTER_SECRET_LABEL: &str = "apps.open-cluster-management.io/pull-model-cluster";
/// Label argocd-agent puts on the cluster Secret of an agent (value: the agent name).
pub const AGENT_NAME_LABEL: &str = "argocd-agent.argoproj-labs.io/agent-name";
/// Label naming the ManagedCluster, as OCM's GitOpsCluster controller writes it.
pub const CLUSTER_NAME_LABEL: &str = "apps.open-cluster-management.io/cluster-name";
/// Coalesces a burst of events for one cluster.
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

struct ClusterSecrets {
    client: kube::Client,
    namespace: String,
    clusters: Store<DynamicObject>,
    secrets: Store<Secret>,
    cluster_resource: kube::core::ApiResource,
}

impl ClusterSecrets {
    fn agent_registered(&self, cluster: &str) -> bool {
        self.secrets
            .find(|s| s.labels().get(AGENT_NAME_LABEL).map(String::as_str) == Some(cluster))
            .is_some()
    }

    async fn reconcile(&self, cluster_name: &str) -> Result<(), kube::Error> {
        let cluster = self.clusters.get(&ObjectRef::new_with(
            cluster_name,
            self.cluster_resource.clone(),
        ));
        let desired = cluster
            .filter(|c| {
                c.metadata.deletion_timestamp.is_none() && !self.agent_registered(cluster_name)
            })
            .map(|c| build_cluster_secret(&c, &self.namespace));
        let name = cluster_secret_name(cluster_name);
        let existing = self
            .secrets
            .get(&ObjectRef::new(&name).within(&self.namespace));
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        match desired {
            Some(secret)
                if existing
                    .as_deref()
                    .is_some_and(|e| secret_is_current(e, &secret)) =>
            {
                Ok(())
            }
            Some(secret) => {
                api.patch(
                    &name,
                    &PatchParams::apply(CLUSTER_SECRET_MANAGER).force(),
                    &Patch::Apply(&secret),
                )
                .await?;
                tracing::info!(cluster = %cluster_name, secret = %name, "cluster Secret applied");
                Ok(())
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
                    Err(e) => return Err(e),
                }
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// The cluster a cluster Secret event concerns: ours by label, an agent's by its agent label.
fn secret_cluster(secret: &Secret) -> Option<String> {
    let labels = secret.labels();
    labels
        .get(PULL_CLUSTER_SECRET_LABEL)
        .or_else(|| labels.get(AGENT_NAME_LABEL))
        .cloned()
}

/// Runs the cluster Secret controller until `shutdown`.
pub async fn run(
    client: kube::Client,
    opts: PullModelOptions,
    shutdown: CancellationToken,
) -> Result<(), PullModelError> {
    let cluster_resource = managed_cluster_resource();
    let cluster_writer = reflector::store::Writer::<DynamicObject>::new(cluster_resource.clone());
    let clusters = cluster_writer.as_reader();
    let mut cluster_events = reflector::reflector(
        cluster_writer,
        watcher::watcher(
            Api::<DynamicObject>::all_with(client.clone(), &cluster_resource),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .boxed();
    let secret_writer = reflector::store::Writer::<Secret>::default();
    let secrets = secret_writer.as_reader();
    let mut secret_events = reflector::reflector(
        secret_writer,
        watcher::watcher(
            Api::<Secret>::namespaced(client.clone(), &opts.argocd_namespace),
            watcher::Config::default().labels(&format!("{SECRET_TYPE_LABEL}=cluster")),
        ),
    )
    .default_backoff()
    .boxed();

    let controller = ClusterSecrets {
        client,
        namespace: opts.argocd_namespace.clone(),
        clusters,
        secrets,
        cluster_resource,
    };
    let mut queue = DirtyQueue::<String>::default();
    let (mut clusters_ready, mut secrets_ready) = (false, false);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            event = cluster_events.next() => match event {
                Some(Ok(Event::Apply(c) | Event::InitApply(c) | Event::Delete(c))) => queue.mark(c.name_any(), DEBOUNCE),
                Some(Ok(Event::InitDone)) => {
                    clusters_ready = true;
                    // Secrets of clusters deleted while nothing watched are found here.
                    for s in controller.secrets.state() {
                        if let Some(c) = s.labels().get(PULL_CLUSTER_SECRET_LABEL) {
                            queue.mark(c.clone(), DEBOUNCE);
                        }
                    }
                }
                Some(Ok(Event::Init)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "cluster secrets: ManagedCluster watch failed; retrying"),
                None => break,
            },
            event = secret_events.next() => match event {
                Some(Ok(Event::Apply(s) | Event::InitApply(s) | Event::Delete(s))) => {
                    if let Some(c) = secret_cluster(&s) {
                        queue.mark(c, DEBOUNCE);
                    }
                }
                Some(Ok(Event::InitDone)) => secrets_ready = true,
                Some(Ok(Event::Init)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "cluster secrets: Secret watch failed; retrying"),
                None => break,
            },
            _ = queue.wait_due(), if clusters_ready && secrets_ready => {
                for cluster in queue.take_due(std::time::Instant::now()) {
                    if let Err(e) = controller.reconcile(&cluster).await {
                        tracing::warn!(%cluster, error = %e, "cluster Secret reconciliation failed; retrying");
                        queue.mark(cluster, opts.retry_after);
                    }
                }
            }
        }
    }
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
