//! Each agent's cluster as the hub's Argo CD shows it in its cluster list (`argocd cluster list`,
//! `argocd cluster get`, the UI): its connection state and the spoke's cache counts, written into
//! the hub Argo CD's Redis as Argo CD's cluster info entry
//! ([`argocd_agent_kube::argocd_cache`]), as upstream argocd-agent's cluster manager does.
//!
//! Owns: which cluster is an agent's (the Argo CD cluster Secret in the principal's namespace
//! labelled `argocd-agent.argoproj-labs.io/agent-name=<agent>`; its `server` keys the entry), the
//! connection state written when an agent's first stream starts (`Successful`, "Agent: '<agent>'
//! is connected with principal") and when its last one ends (`Failed`, "... is disconnected ..."),
//! applied in the order they happened; the counts of an agent's `cluster-cache-info-update`
//! (applications, APIs, resources), which keep the connection state and last cache sync time
//! already written; and re-saving every entry every [`REFRESH_INTERVAL`], since Argo CD drops one
//! after [`CLUSTER_INFO_TTL`]. The hub Redis is reached the way the Redis proxy reaches it
//! (`--redis-server-address`, its credentials and TLS), with `--redis-compression-type`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_kube::argocd_cache::{
    cluster_info_key, decode, encode, ClusterInfo, ConnectionState, RedisCompression,
    CLUSTER_INFO_TTL, CONNECTION_FAILED, CONNECTION_SUCCESSFUL,
};
use argocd_agent_operator::registration::AGENT_NAME_LABEL;
use argocd_agent_proto::payload::ClusterCacheInfo;
use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::ResourceExt;
use redis_protocol::resp2::types::BytesFrame as Frame;
use tokio::sync::mpsc;

use argocd_agent_runtime::redis_pool::RedisPool;

/// How often every agent's entry is saved again (upstream: 3 minutes, well within the 10 minute TTL).
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(180);
/// Longest a connection change waits for the first list of cluster Secrets.
const LIST_WAIT: Duration = Duration::from_secs(10);
/// Hub Redis connections kept open between writes (the writer runs one write at a time per agent).
pub const IDLE_CONNECTIONS: usize = 2;
/// Longest a hub Redis reply may take.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Argo CD's label marking a cluster Secret.
const SECRET_TYPE_CLUSTER: &str = "argocd.argoproj.io/secret-type=cluster";

/// Where the hub Argo CD's cache is and how it is encoded.
#[derive(Clone, Debug)]
pub struct HubCache {
    /// The hub Redis (address, TLS, credentials), its connections kept open between writes: an
    /// agent's periodic cache stats would otherwise cost a TCP connect, TLS handshake and `AUTH`
    /// each.
    pub redis: Arc<RedisPool>,
    /// Argo CD's `--redis-compress`.
    pub compression: RedisCompression,
}

impl HubCache {
    async fn call(&self, command: Vec<Bytes>) -> Result<Frame, String> {
        let reply = self
            .redis
            .command(Frame::Array(
                command.into_iter().map(Frame::BulkString).collect(),
            ))
            .await?;
        match reply {
            Frame::Error(e) => Err(format!("hub redis: {e}")),
            other => Ok(other),
        }
    }

    /// The cluster info of `server`; `None` when there is none (or it cannot be read: it is then
    /// written anew).
    async fn get(&self, server: &str) -> Result<Option<ClusterInfo>, String> {
        let key = cluster_info_key(server, self.compression);
        match self
            .call(vec![Bytes::from_static(b"GET"), key.into()])
            .await?
        {
            Frame::BulkString(b) => match decode(&b, self.compression) {
                Ok(info) => Ok(Some(info)),
                Err(e) => {
                    tracing::warn!(server, error = %e, "unreadable cluster info in the hub redis; replacing it");
                    Ok(None)
                }
            },
            _ => Ok(None),
        }
    }

    async fn set(&self, server: &str, info: &ClusterInfo) -> Result<(), String> {
        let key = cluster_info_key(server, self.compression);
        self.call(vec![
            Bytes::from_static(b"SET"),
            key.into(),
            encode(info, self.compression).into(),
            Bytes::from_static(b"EX"),
            CLUSTER_INFO_TTL.as_secs().to_string().into(),
        ])
        .await
        .map(drop)
    }
}

/// The cluster info of an agent that just connected (or disconnected) at `at`.
pub fn connection_info(agent: &str, connected: bool, at: Time) -> ClusterInfo {
    let (status, state) = if connected {
        (CONNECTION_SUCCESSFUL, "connected")
    } else {
        (CONNECTION_FAILED, "disconnected")
    };
    ClusterInfo {
        connection_state: ConnectionState {
            status: status.into(),
            message: format!("Agent: '{agent}' is {state} with principal"),
            modified_at: Some(at),
        },
        ..ClusterInfo::default()
    }
}

/// The cluster info after an agent reported `stats`: its counts, with the connection state (and
/// last cache sync time) of `existing` kept, as upstream's `SetClusterCacheStats` does.
pub fn with_cache_stats(existing: Option<ClusterInfo>, stats: &ClusterCacheInfo) -> ClusterInfo {
    let mut info = ClusterInfo {
        applications_count: stats.applications_count,
        ..ClusterInfo::default()
    };
    info.cache_info.apis_count = stats.apis_count;
    info.cache_info.resources_count = stats.resources_count;
    if let Some(existing) = existing.filter(|e| e.connection_state != ConnectionState::default()) {
        info.connection_state = existing.connection_state;
        info.cache_info.last_cache_sync_time = existing.cache_info.last_cache_sync_time;
    }
    info
}

/// `(agent, server)` of an agent's cluster Secret, if it is one.
pub fn cluster_of(secret: &Secret) -> Option<(String, String)> {
    let agent = secret
        .labels()
        .get(AGENT_NAME_LABEL)
        .filter(|a| !a.is_empty())?;
    let server = secret.data.as_ref()?.get("server")?;
    let server = String::from_utf8(server.0.clone()).ok()?;
    Some((agent.clone(), server))
}

/// What is written for an agent, in arrival order.
enum Change {
    /// Its first stream started (`true`) or its last one ended, at that time.
    Connection(bool, Time),
    /// It reported these counts.
    CacheStats(ClusterCacheInfo),
}

/// Changes waiting for the hub Redis; past this, new ones are dropped (and logged).
const PENDING_CHANGES: usize = 4096;

/// Writes agents' cluster info into the hub Argo CD's cache (see the module docs).
pub struct ClusterInfoWriter {
    cache: HubCache,
    /// `(agent, server)` by cluster Secret name; the first Secret (by name) of an agent wins.
    clusters: Mutex<BTreeMap<String, (String, String)>>,
    /// Serialises read-modify-write of entries, as upstream's manager mutex does.
    writing: tokio::sync::Mutex<()>,
    changes: mpsc::Sender<(String, Change)>,
    /// The first list of cluster Secrets has been read.
    listed: AtomicBool,
}

impl ClusterInfoWriter {
    /// Starts the writer: the cluster Secret watch in `namespace`, the worker applying connection
    /// changes in order, and the periodic re-save.
    pub fn start(client: kube::Client, namespace: &str, cache: HubCache) -> Arc<ClusterInfoWriter> {
        let (tx, mut rx) = mpsc::channel::<(String, Change)>(PENDING_CHANGES);
        let writer = Arc::new(ClusterInfoWriter {
            cache,
            clusters: Mutex::default(),
            writing: tokio::sync::Mutex::new(()),
            changes: tx,
            listed: AtomicBool::new(false),
        });
        tokio::spawn(watch_clusters(
            Arc::downgrade(&writer),
            Api::namespaced(client, namespace),
        ));
        let worker = Arc::downgrade(&writer);
        tokio::spawn(async move {
            while let Some((agent, change)) = rx.recv().await {
                let Some(writer) = worker.upgrade() else {
                    return;
                };
                match change {
                    Change::Connection(connected, at) => {
                        writer.set_connection(&agent, connected, at).await
                    }
                    Change::CacheStats(stats) => {
                        if let Err(e) = writer.set_cache_stats(&agent, &stats).await {
                            tracing::warn!(agent, error = %e, "cannot store the agent's cluster cache counts");
                        }
                    }
                }
            }
        });
        let refresher = Arc::downgrade(&writer);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REFRESH_INTERVAL);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(writer) = refresher.upgrade() else {
                    return;
                };
                writer.refresh().await;
            }
        });
        writer
    }

    /// Records that `agent`'s first stream started (`connected`) or its last one ended; written
    /// in the background, in order. Does not block.
    pub fn connection_changed(&self, agent: &str, connected: bool) {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        self.queue(agent, Change::Connection(connected, now));
    }

    /// Records the counts of `agent`'s `cluster-cache-info-update`; written in the background, in
    /// order (a slow or unreachable hub Redis never holds up the agent's other events).
    pub fn cache_stats_reported(&self, agent: &str, stats: ClusterCacheInfo) {
        self.queue(agent, Change::CacheStats(stats));
    }

    fn queue(&self, agent: &str, change: Change) {
        if self.changes.try_send((agent.to_string(), change)).is_err() {
            tracing::warn!(
                agent,
                "too many cluster info writes are waiting for the hub redis; dropping one"
            );
        }
    }

    fn server_of(&self, agent: &str) -> Option<String> {
        self.clusters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .find(|(a, _)| a == agent)
            .map(|(_, server)| server.clone())
    }

    async fn set_connection(&self, agent: &str, connected: bool, at: Time) {
        // An agent connecting as the principal starts: its Secret may not be listed yet.
        let deadline = tokio::time::Instant::now() + LIST_WAIT;
        while !self.listed.load(Ordering::Acquire) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let Some(server) = self.server_of(agent) else {
            tracing::info!(
                agent,
                "no cluster Secret is labelled {AGENT_NAME_LABEL}={agent}; its connection state is not shown in Argo CD"
            );
            return;
        };
        let info = connection_info(agent, connected, at);
        let _writing = self.writing.lock().await;
        match self.cache.set(&server, &info).await {
            Ok(()) => tracing::info!(
                agent,
                server,
                status = %info.connection_state.status,
                "cluster connection state written to the hub Argo CD cache"
            ),
            Err(e) => {
                tracing::warn!(agent, server, error = %e, "cannot write the cluster connection state")
            }
        }
    }

    async fn set_cache_stats(&self, agent: &str, stats: &ClusterCacheInfo) -> Result<(), String> {
        let Some(server) = self.server_of(agent) else {
            tracing::debug!(
                agent,
                "cluster cache counts of an agent without a cluster Secret"
            );
            return Ok(());
        };
        let _writing = self.writing.lock().await;
        let existing = self.cache.get(&server).await?;
        let info = with_cache_stats(existing, stats);
        self.cache.set(&server, &info).await?;
        tracing::debug!(
            agent,
            server,
            applications = stats.applications_count,
            apis = stats.apis_count,
            resources = stats.resources_count,
            "cluster cache stats written to the hub Argo CD cache"
        );
        Ok(())
    }

    /// Saves every agent's entry again so that Argo CD does not expire it.
    async fn refresh(&self) {
        let clusters: Vec<(String, String)> = self
            .clusters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let _writing = self.writing.lock().await;
        for (agent, server) in clusters {
            let saved = match self.cache.get(&server).await {
                Ok(Some(info)) => self.cache.set(&server, &info).await,
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = saved {
                tracing::warn!(agent, server, error = %e, "cannot refresh the cluster info");
            }
        }
    }
}

/// Keeps `writer`'s agent → cluster map from the labelled cluster Secrets, until it is dropped.
async fn watch_clusters(writer: std::sync::Weak<ClusterInfoWriter>, api: Api<Secret>) {
    let config =
        watcher::Config::default().labels(&format!("{SECRET_TYPE_CLUSTER},{AGENT_NAME_LABEL}"));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    let mut listing = BTreeMap::new();
    while let Some(event) = events.next().await {
        let Some(writer) = writer.upgrade() else {
            return;
        };
        let mut clusters = writer.clusters.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(s)) => {
                if let Some(c) = cluster_of(&s) {
                    listing.insert(s.name_any(), c);
                }
            }
            Ok(watcher::Event::InitDone) => {
                *clusters = std::mem::take(&mut listing);
                writer.listed.store(true, Ordering::Release);
            }
            Ok(watcher::Event::Apply(s)) => match cluster_of(&s) {
                Some(c) => {
                    clusters.insert(s.name_any(), c);
                }
                None => {
                    clusters.remove(&s.name_any());
                }
            },
            Ok(watcher::Event::Delete(s)) => {
                clusters.remove(&s.name_any());
            }
            Err(e) => tracing::warn!(error = %e, "watching the agents' cluster Secrets"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn time(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn connection_state_reads_as_upstreams() {
        let at = time("2026-11-24T16:00:00Z");
        let up = connection_info("spoke1", true, at.clone());
        assert_eq!(up.connection_state.status, "Successful");
        assert_eq!(
            up.connection_state.message,
            "Agent: 'spoke1' is connected with principal"
        );
        assert_eq!(up.connection_state.modified_at, Some(at.clone()));
        let down = connection_info("spoke1", false, at);
        assert_eq!(down.connection_state.status, "Failed");
        assert_eq!(
            down.connection_state.message,
            "Agent: 'spoke1' is disconnected with principal"
        );
    }

    #[test]
    fn cache_stats_keep_the_connection_state_and_sync_time() {
        let stats = ClusterCacheInfo {
            applications_count: 2,
            apis_count: 50,
            resources_count: 700,
        };
        let mut existing = connection_info("a", true, time("2026-11-24T16:00:00Z"));
        existing.applications_count = 9;
        existing.cache_info.last_cache_sync_time = Some(time("2026-11-24T15:00:00Z"));
        let info = with_cache_stats(Some(existing.clone()), &stats);
        assert_eq!(info.connection_state, existing.connection_state);
        assert_eq!(
            info.cache_info.last_cache_sync_time,
            existing.cache_info.last_cache_sync_time
        );
        assert_eq!(
            (
                info.applications_count,
                info.cache_info.apis_count,
                info.cache_info.resources_count
            ),
            (2, 50, 700)
        );
        // Nothing written yet (or an entry without a connection state): the counts alone.
        let fresh = with_cache_stats(None, &stats);
        assert_eq!(fresh.connection_state, ConnectionState::default());
        assert_eq!(fresh.applications_count, 2);
    }

    #[test]
    fn a_cluster_secret_maps_its_agent_to_its_server() {
        let mut s = Secret::default();
        s.metadata.name = Some("cluster-a".into());
        s.metadata.labels = Some([(AGENT_NAME_LABEL.to_string(), "a".to_string())].into());
        assert_eq!(cluster_of(&s), None, "no server");
        s.data = Some(
            [(
                "server".to_string(),
                ByteString(b"https://proxy:9090?agentName=a".to_vec()),
            )]
            .into(),
        );
        assert_eq!(
            cluster_of(&s),
            Some(("a".into(), "https://proxy:9090?agentName=a".into()))
        );
        s.metadata.labels = None;
        assert_eq!(cluster_of(&s), None, "not an agent's");
    }
}
