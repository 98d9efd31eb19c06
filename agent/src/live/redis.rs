//! Redis-proxy requests answered from the agent's local Argo CD Redis (`--redis-address`).
//!
//! Owns the agent's [`RedisPool`] ([`local_redis`]: the runtime's Redis connections — TCP, TLS
//! when `--redis-tls-enabled`, then `AUTH` — to `--redis-address`, kept open between commands),
//! the key mapping (the hub names an application `<agent>_<app>`; the local Argo CD, running
//! the app in its own namespace, names it `<app>`; under destination-based mapping an
//! Application keeps its namespace and its key too, see [`local_key`]), `GET` (on a pooled
//! connection: one round trip, no connect or `AUTH` per request), and `SUBSCRIBE`: one local
//! subscriber connection per hub redis connection, whose messages go back as
//! `pushFromSubscribe`. It ends as soon as the principal says the hub client's connection ended
//! (`closeConnection`, our extension, which our subscribe answers announce with
//! `supportsCloseConnection`), and otherwise (an upstream principal) when the hub connection
//! stops pinging for [`IDLE_LIMIT`] (upstream: 10 minutes). The RESP codec is `redis-protocol`'s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_agent_proto::payload::{
    RedisRequest, RedisResponse, RedisResponseBody, RedisResponseBodyGet, RedisResponseBodyPong,
    RedisResponseBodyPushFromSubscribe, RedisResponseBodySubscribeResponse,
};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use redis_protocol::resp2::types::BytesFrame as Frame;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info};

use super::LiveService;
use crate::config::AgentConfig;
use argocd_agent_runtime::redis_client::{RedisConnection, RedisTarget};
pub use argocd_agent_runtime::redis_pool::RedisPool;

/// A subscription whose hub connection has not pinged for this long is closed.
pub const IDLE_LIMIT: Duration = Duration::from_secs(600);
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections to the local Redis kept open between `GET`s (more run at once open more).
const IDLE_CONNECTIONS: usize = 4;

/// The local name of a hub live-view key. Namespace mapping (`destination_mapping` = `None`): the
/// `<namespace>_` prefix of the application segment is dropped (`app|resources-tree|agent-a_guestbook|1.8`
/// → `app|resources-tree|guestbook|1.8`), every Application being in the agent's namespace.
/// Destination-based mapping (`Some(agent namespace)`): Applications keep their hub namespace, so
/// the key is the local one as it is, except a prefix naming the agent's own namespace, which the
/// local Argo CD (running there) leaves out.
pub fn local_key(key: &str, destination_mapping: Option<&str>) -> String {
    let mut parts: Vec<&str> = key.split('|').collect();
    if parts.len() >= 3 {
        if let Some((namespace, app)) = parts[2].split_once('_') {
            if destination_mapping.is_none_or(|own| own == namespace) {
                parts[2] = app;
            }
        }
    }
    parts.join("|")
}

fn bulk(s: &str) -> Frame {
    Frame::BulkString(Bytes::copy_from_slice(s.as_bytes()))
}

/// The local Redis as the agent's `--redis-*` flags reach it, its connections kept open between
/// commands.
pub fn local_redis(config: &AgentConfig) -> Arc<RedisPool> {
    let target = RedisTarget::new(
        "local redis",
        config.redis_address.to_string(),
        config.redis_credentials.clone(),
        config.redis_tls.as_ref(),
    );
    Arc::new(RedisPool::new(target, IDLE_CONNECTIONS, REPLY_TIMEOUT))
}

/// `GET key` on the local Redis; a miss is `cache_hit: false`.
pub(crate) async fn get(redis: &RedisPool, key: &str) -> RedisResponseBodyGet {
    match redis
        .command(Frame::Array(vec![bulk("GET"), bulk(key)]))
        .await
    {
        Ok(Frame::BulkString(b)) | Ok(Frame::SimpleString(b)) => RedisResponseBodyGet {
            bytes: b.to_vec(),
            cache_hit: true,
            error: String::new(),
        },
        Ok(Frame::Null) => RedisResponseBodyGet::default(),
        Ok(Frame::Error(e)) => RedisResponseBodyGet {
            error: e.to_string(),
            ..Default::default()
        },
        Ok(other) => RedisResponseBodyGet {
            error: format!("unexpected reply from local redis: {other:?}"),
            ..Default::default()
        },
        Err(e) => RedisResponseBodyGet {
            error: e,
            ..Default::default()
        },
    }
}

type SubscribeCommand = (String, String, oneshot::Sender<Result<(), String>>);

/// The handle of one [`run_subscriber`] task; dropping it (its `stop` sender) ends the task and
/// closes its local connection.
struct Subscriber {
    commands: mpsc::Sender<SubscribeCommand>,
    last_ping: Arc<Mutex<Instant>>,
    _stop: oneshot::Sender<()>,
}

/// Local subscriber connections by hub connection UUID.
#[derive(Default)]
pub struct Subscriptions {
    by_connection: Mutex<HashMap<String, Subscriber>>,
}

fn frame_text(f: &Frame) -> Option<String> {
    match f {
        Frame::BulkString(b) | Frame::SimpleString(b) => {
            Some(String::from_utf8_lossy(b).into_owned())
        }
        _ => None,
    }
}

/// Runs one local subscriber connection until the hub connection closes (`stop` resolves) or
/// goes idle.
async fn run_subscriber(
    live: Arc<LiveService>,
    connection: String,
    mut commands: mpsc::Receiver<SubscribeCommand>,
    last_ping: Arc<Mutex<Instant>>,
    mut stop: oneshot::Receiver<()>,
) {
    let target = live.settings.redis.target().clone();
    let mut conn: Option<RedisConnection> = None;
    // local channel -> hub channel name, and subscriptions waiting for their confirmation
    let mut names: HashMap<String, String> = HashMap::new();
    let mut pending: HashMap<String, oneshot::Sender<Result<(), String>>> = HashMap::new();
    let mut idle_check = tokio::time::interval(Duration::from_secs(30));
    loop {
        let frame = async {
            match conn.as_mut() {
                Some(c) => c.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stop => {
                debug!(connection = %connection, "hub redis connection closed; closing its subscriptions");
                break;
            }
            cmd = commands.recv() => {
                let Some((local, hub, done)) = cmd else { break };
                if conn.is_none() {
                    match target.connect().await {
                        Ok(c) => conn = Some(c),
                        Err(e) => { let _ = done.send(Err(e)); continue; }
                    }
                }
                let c = conn.as_mut().expect("connected above");
                if let Err(e) = c.send(Frame::Array(vec![bulk("SUBSCRIBE"), bulk(&local)])).await {
                    let _ = done.send(Err(e.to_string()));
                    conn = None;
                    continue;
                }
                names.insert(local.clone(), hub);
                pending.insert(local, done);
            }
            f = frame => match f {
                Some(Ok(Frame::Array(items))) => {
                    let kind = items.first().and_then(frame_text).unwrap_or_default();
                    let channel = items.get(1).and_then(frame_text).unwrap_or_default();
                    match kind.as_str() {
                        "subscribe" => {
                            if let Some(done) = pending.remove(&channel) { let _ = done.send(Ok(())); }
                        }
                        "message" => {
                            if let Some(hub) = names.get(&channel) {
                                live.redis_answer(&RedisResponse {
                                    uuid: uuid::Uuid::new_v4().to_string(),
                                    connection_uuid: connection.clone(),
                                    body: RedisResponseBody {
                                        push_from_subscribe: Some(RedisResponseBodyPushFromSubscribe { channel_name: hub.clone() }),
                                        ..Default::default()
                                    },
                                });
                            }
                        }
                        _ => {}
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    info!(connection = %connection, "local redis subscription connection ended");
                    for (_, done) in pending.drain() { let _ = done.send(Err("local redis closed the connection".into())); }
                    break;
                }
            },
            _ = idle_check.tick() => {
                let idle = last_ping.lock().unwrap_or_else(|e| e.into_inner()).elapsed();
                if idle > IDLE_LIMIT {
                    info!(connection = %connection, "hub redis connection idle; closing its subscriptions");
                    break;
                }
            }
        }
    }
    // Only this task's entry: after a `closeConnection` it is gone already.
    let mut map = live
        .redis
        .by_connection
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if map
        .get(&connection)
        .is_some_and(|s| Arc::ptr_eq(&s.last_ping, &last_ping))
    {
        map.remove(&connection);
    }
}

impl Subscriptions {
    /// Answers one redis request; `closeConnection` gets no answer (nobody waits for one).
    pub async fn handle(
        &self,
        live: &Arc<LiveService>,
        req: &RedisRequest,
    ) -> Option<RedisResponse> {
        if req.body.close_connection.is_some() {
            self.close(&req.connection_uuid);
            return None;
        }
        let mut resp = RedisResponse {
            uuid: req.uuid.clone(),
            connection_uuid: req.connection_uuid.clone(),
            body: RedisResponseBody::default(),
        };
        if let Some(g) = &req.body.get {
            let key = local_key(&g.key, live.settings.key_namespace());
            resp.body.get = Some(get(&live.settings.redis, &key).await);
            debug!(request = %req.uuid, hit = resp.body.get.as_ref().is_some_and(|g| g.cache_hit), "redis GET answered");
        } else if let Some(s) = &req.body.subscribe {
            let error = match self
                .subscribe(live, &req.connection_uuid, &s.channel_name)
                .await
            {
                Ok(()) => String::new(),
                Err(e) => e,
            };
            resp.body.subscribe_response = Some(RedisResponseBodySubscribeResponse {
                error,
                supports_close_connection: true,
            });
        } else {
            if let Some(sub) = self
                .by_connection
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&req.connection_uuid)
            {
                *sub.last_ping.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            }
            resp.body.pong = Some(RedisResponseBodyPong {});
        }
        Some(resp)
    }

    /// Ends the subscriptions of hub connection `connection`: its subscriber task stops and
    /// closes the local connection.
    fn close(&self, connection: &str) {
        let removed = self
            .by_connection
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(connection);
        if removed.is_some() {
            debug!(
                connection,
                "hub redis connection closed; ending its local subscriptions"
            );
        }
    }

    async fn subscribe(
        &self,
        live: &Arc<LiveService>,
        connection: &str,
        channel: &str,
    ) -> Result<(), String> {
        let commands = {
            let mut map = self.by_connection.lock().unwrap_or_else(|e| e.into_inner());
            let sub = map.entry(connection.to_string()).or_insert_with(|| {
                let (tx, rx) = mpsc::channel(16);
                let (stop_tx, stop_rx) = oneshot::channel();
                let last_ping = Arc::new(Mutex::new(Instant::now()));
                tokio::spawn(run_subscriber(
                    live.clone(),
                    connection.to_string(),
                    rx,
                    last_ping.clone(),
                    stop_rx,
                ));
                Subscriber {
                    commands: tx,
                    last_ping,
                    _stop: stop_tx,
                }
            });
            *sub.last_ping.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            sub.commands.clone()
        };
        let (done, confirmed) = oneshot::channel();
        commands
            .send((
                local_key(channel, live.settings.key_namespace()),
                channel.to_string(),
                done,
            ))
            .await
            .map_err(|_| "the local subscription connection ended".to_string())?;
        match tokio::time::timeout(REPLY_TIMEOUT, confirmed).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err("the local subscription connection ended".into()),
            Err(_) => Err("local redis did not confirm the subscription in time".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_keys_map_to_local_keys() {
        assert_eq!(
            local_key("app|resources-tree|agent-a_guestbook|1.8.3", None),
            "app|resources-tree|guestbook|1.8.3"
        );
        assert_eq!(
            local_key("app|managed-resources|agent-a_my_app", None),
            "app|managed-resources|my_app"
        );
        assert_eq!(
            local_key("app|resources-tree|guestbook", None),
            "app|resources-tree|guestbook"
        );
    }

    #[test]
    fn under_destination_mapping_hub_keys_keep_their_namespace_but_the_agents_own() {
        let own = Some("argocd");
        assert_eq!(
            local_key("app|resources-tree|team-a_guestbook|1.8.3", own),
            "app|resources-tree|team-a_guestbook|1.8.3"
        );
        assert_eq!(
            local_key("app|managed-resources|argocd_guestbook", own),
            "app|managed-resources|guestbook"
        );
        // The principal's namespace (no prefix on the hub) is the agent's own on the spoke.
        assert_eq!(
            local_key("app|resources-tree|guestbook|1.8.3", own),
            "app|resources-tree|guestbook|1.8.3"
        );
    }
}
