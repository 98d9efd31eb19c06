//! A managed agent's cluster cache counts for the hub's cluster list, as upstream argocd-agent's
//! agent sends them: every `--cache-refresh-interval` (upstream's flag and env var name), while
//! connected, the local Argo CD's cluster info for its in-cluster destination
//! (`https://kubernetes.default.svc`, written by its application-controller into its Redis in
//! Argo CD's gzip cache format, [`argocd_agent_kube::argocd_cache`]) goes to the principal as a
//! `cluster-cache-info-update` (applications, APIs and resources counted). The Redis is read with
//! the agent's `--redis-*` settings ([`crate::live::redis::local_redis`]); nothing is sent while
//! the entry is missing (no Application has made the controller watch the cluster yet).

use std::sync::Arc;
use std::time::Duration;

use argocd_agent_kube::argocd_cache::{
    cluster_info_key, decode, ClusterInfo, RedisCompression, IN_CLUSTER_SERVER,
};
use argocd_agent_proto::event::{Event, AGENT_SOURCE};
use argocd_agent_proto::payload::ClusterCacheInfo;
use argocd_agent_proto::sync::outbox::keyed_request;
use argocd_agent_proto::sync::Outbox;

use crate::live::redis::{get, RedisPool};

/// The resource id of every update, so that a newer one replaces one still queued.
const RESOURCE_ID: &str = "cluster-cache-info";

/// The counts the principal is sent, from the local cluster info.
pub fn cache_stats(info: &ClusterInfo) -> ClusterCacheInfo {
    ClusterCacheInfo {
        applications_count: info.applications_count,
        apis_count: info.cache_info.apis_count,
        resources_count: info.cache_info.resources_count,
    }
}

/// Reads the local cluster info: `Ok(None)` when there is none.
async fn local_cluster_info(redis: &RedisPool) -> Result<Option<ClusterInfo>, String> {
    // Upstream's agent reads gzip, Argo CD's default `--redis-compress`.
    let compression = RedisCompression::Gzip;
    let reply = get(redis, &cluster_info_key(IN_CLUSTER_SERVER, compression)).await;
    if !reply.error.is_empty() {
        return Err(format!(
            "cannot read the local Argo CD's cluster info: {}",
            reply.error
        ));
    }
    if !reply.cache_hit {
        return Ok(None);
    }
    decode(&reply.bytes, compression)
        .map(Some)
        .map_err(|e| format!("unreadable local Argo CD cluster info: {e}"))
}

/// Sends the counts every `interval` while the stream is up, until aborted.
pub fn spawn(
    interval: Duration,
    redis: Arc<RedisPool>,
    outbox: Arc<Outbox>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        // A Redis that stays unreachable is logged once, not every tick.
        let mut last_error = None;
        loop {
            tick.tick().await;
            if !outbox.is_connected() {
                continue;
            }
            let info = match local_cluster_info(&redis).await {
                Ok(Some(info)) => info,
                Ok(None) => continue,
                Err(e) => {
                    if last_error.as_ref() != Some(&e) {
                        tracing::warn!(error = %e, "cluster cache counts are not sent");
                    }
                    last_error = Some(e);
                    continue;
                }
            };
            last_error = None;
            let stats = cache_stats(&info);
            let queued = Event::cluster_cache_info_update(AGENT_SOURCE, &stats)
                .map_err(|e| e.to_string())
                .and_then(|ev| {
                    outbox
                        .push(keyed_request(ev, RESOURCE_ID))
                        .map_err(|e| e.to_string())
                });
            match queued {
                Ok(()) => tracing::debug!(
                    applications = stats.applications_count,
                    apis = stats.apis_count,
                    resources = stats.resources_count,
                    "queued cluster cache info"
                ),
                Err(e) => tracing::warn!(error = %e, "cannot queue the cluster cache info"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_kube::argocd_cache::ClusterCacheInfo as ArgoCacheInfo;

    #[test]
    fn the_counts_are_the_controllers() {
        let info = ClusterInfo {
            applications_count: 3,
            cache_info: ArgoCacheInfo {
                apis_count: 61,
                resources_count: 904,
                last_cache_sync_time: None,
            },
            ..Default::default()
        };
        assert_eq!(
            cache_stats(&info),
            ClusterCacheInfo {
                applications_count: 3,
                apis_count: 61,
                resources_count: 904
            }
        );
    }
}
