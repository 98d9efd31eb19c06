//! The agent's side of the hub's live view: answers the principal's resource-proxy, redis-proxy,
//! container-log and web-terminal requests from the spoke.
//!
//! Owns [`LiveService`] (accepts a request event, runs it in its own task so the stream is never
//! held up, and queues the answer — split into ordered parts carrying our `livechunk`/`liveend`
//! extensions — in the outbox; container logs and terminals go over calls of their own), [`LiveDispatch`] (routes `resource`/`redis`/`containerlog`/
//! `terminal` events to it and everything else to the mode's handler), the duplicate filter (a request
//! resent after a reconnect runs once) and the staleness rule (a request older than the
//! principal's wait is dropped: its caller has gone). What a request may touch is decided in
//! [`resource`] (tracked objects only), [`redis`] (the local Argo CD Redis), [`logs`] (a
//! [`logs::LogSource`], streamed over `StreamLogs`) and [`terminal`] (exec into tracked pods, streamed over its own call).

pub mod logs;
pub mod redis;
pub mod resource;
pub mod terminal;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_agent_proto::event::{Event, ExtensionValue, Target, AGENT_SOURCE};
use argocd_agent_proto::payload::{
    ContainerLogRequest, ContainerTerminalRequest, RedisRequest, RedisResponse, ResourceRequest,
    ResourceResponse,
};
use argocd_agent_proto::sync::{EventHandler, HandleError, Outbox};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use tracing::{debug, info, warn};

pub use logs::{ApiserverLogSource, LogSource};

/// What a query parameter the agent sends to the apiserver escapes: every byte but RFC 3986's
/// unreserved characters (letters, digits, `-`, `.`, `_`, `~`).
const QUERY_ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `s` escaped as one query key or value of an apiserver request.
fn encode_query_component(s: &str) -> String {
    utf8_percent_encode(s, QUERY_ESCAPED).to_string()
}

/// Extension naming an answer part's sequence number (the principal's side uses the same name).
pub const CHUNK_SEQ: &str = "livechunk";
/// Extension set to `"true"` on an answer's last part.
pub const CHUNK_END: &str = "liveend";
/// Largest part of an answer carried by one event.
pub const PART_BYTES: usize = 512 << 10;
/// Largest resource answer sent; bigger ones are refused with 413 (narrow the request).
pub const MAX_ANSWER_BYTES: usize = 32 << 20;
/// Requests older than this are not run: the principal stopped waiting long ago.
const STALE_AFTER: Duration = Duration::from_secs(90);
/// How long a request id is remembered for the duplicate filter.
const REMEMBER_FOR: Duration = Duration::from_secs(300);
/// Limit on one resource request against the spoke apiserver.
const APISERVER_TIMEOUT: Duration = Duration::from_secs(25);

/// What the live view needs from the configuration.
#[derive(Debug, Clone)]
pub struct LiveSettings {
    /// The agent's Argo CD namespace (where `argocd-cm` lives).
    pub namespace: String,
    /// The local Argo CD Redis (address, credentials, TLS) and its open connections.
    pub redis: Arc<redis::RedisPool>,
    /// Applications keep their hub namespace (`--destination-based-mapping`), and so do the
    /// Redis keys that name them.
    pub destination_mapping: bool,
}

impl LiveSettings {
    /// What [`redis::local_key`] needs: the agent's namespace under destination-based mapping.
    pub fn key_namespace(&self) -> Option<&str> {
        self.destination_mapping.then_some(self.namespace.as_str())
    }
}

/// Runs live requests (see the module docs). Share it as `Arc<LiveService>`.
pub struct LiveService {
    client: kube::Client,
    outbox: Arc<Outbox>,
    settings: LiveSettings,
    logs: Arc<dyn LogSource>,
    tracking: resource::TrackingRules,
    seen: Mutex<HashMap<String, Instant>>,
    /// Log requests being streamed (a request the principal resends is not run twice).
    log_streams: Mutex<HashSet<String>>,
    redis: redis::Subscriptions,
    link: crate::connection::PrincipalLink,
}

/// An answer body split into parts of at most `max` bytes at character boundaries.
pub fn split_parts(body: &str, max: usize) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut rest = body;
    while rest.len() > max {
        let mut cut = max;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (head, tail) = rest.split_at(cut);
        parts.push(head);
        rest = tail;
    }
    parts.push(rest);
    parts
}

impl LiveService {
    /// A live service over the spoke `client`, answering through `outbox`.
    pub fn new(
        client: kube::Client,
        outbox: Arc<Outbox>,
        settings: LiveSettings,
        logs: Arc<dyn LogSource>,
        link: crate::connection::PrincipalLink,
    ) -> Arc<Self> {
        Arc::new(LiveService {
            tracking: resource::TrackingRules::new(client.clone(), settings.namespace.clone()),
            client,
            outbox,
            settings,
            logs,
            seen: Mutex::new(HashMap::new()),
            log_streams: Mutex::new(HashSet::new()),
            redis: redis::Subscriptions::default(),
            link,
        })
    }

    /// The live service of this agent's configuration (logs from `--log-endpoint`, or else the
    /// spoke apiserver), or `None` when the live view is disabled.
    pub fn start(
        config: &crate::config::AgentConfig,
        client: kube::Client,
        outbox: Arc<Outbox>,
        link: crate::connection::PrincipalLink,
    ) -> Option<Arc<Self>> {
        if !config.enable_resource_proxy {
            info!("live view disabled (--enable-resource-proxy=false): resource, redis and log requests are refused");
            return None;
        }
        let logs: Arc<dyn LogSource> = match &config.log_endpoint {
            Some(endpoint) => match ApiserverLogSource::endpoint(endpoint.clone()) {
                Ok(source) => {
                    info!(%endpoint, "container logs are read from --log-endpoint");
                    Arc::new(source)
                }
                Err(e) => {
                    tracing::error!(%endpoint, error = %e, "--log-endpoint is unusable; container log requests will be refused");
                    Arc::new(logs::UnusableLogSource {
                        reason: format!("the agent's --log-endpoint {endpoint} is unusable: {e}"),
                    })
                }
            },
            None => Arc::new(ApiserverLogSource {
                client: client.clone(),
            }),
        };
        let settings = LiveSettings {
            namespace: config.namespace.clone(),
            redis: redis::local_redis(config),
            destination_mapping: config.destination_based_mapping,
        };
        Some(LiveService::new(client, outbox, settings, logs, link))
    }

    /// Queues answer part `seq` of request `uuid`.
    fn push_part(&self, target: Target, uuid: &str, seq: u64, end: bool, status: u16, text: &str) {
        let resp = ResourceResponse {
            uuid: uuid.to_string(),
            status: i64::from(status),
            resource: text.to_string(),
        };
        let mut ev = match Event::resource_response(AGENT_SOURCE, &resp) {
            Ok(ev) => ev,
            Err(e) => {
                warn!(error = %e, "cannot build a live answer");
                return;
            }
        };
        ev.target = target;
        // All parts of one answer share a resource id: delivered one after the other, in order.
        ev.resource_id = format!("{uuid}.answer");
        ev.extensions
            .insert(CHUNK_SEQ.into(), ExtensionValue::String(seq.to_string()));
        if end {
            ev.extensions
                .insert(CHUNK_END.into(), ExtensionValue::String("true".into()));
        }
        if let Err(e) = self.outbox.push(ev) {
            warn!(request = uuid, error = %e, "cannot queue a live answer");
        }
    }

    /// Queues a complete answer, split into parts.
    fn answer(&self, target: Target, uuid: &str, status: u16, body: &[u8]) {
        if body.len() > MAX_ANSWER_BYTES {
            let refused = resource::status_body(
                413,
                "RequestEntityTooLarge",
                &format!(
                    "the answer has {} bytes, more than the {MAX_ANSWER_BYTES} the resource proxy carries; narrow the request (limit, labelSelector)",
                    body.len()
                ),
            );
            return self.answer(target, uuid, 413, &refused);
        }
        let text = String::from_utf8_lossy(body);
        let parts = split_parts(&text, PART_BYTES);
        let last = parts.len() - 1;
        for (i, p) in parts.iter().enumerate() {
            self.push_part(target.clone(), uuid, i as u64, i == last, status, p);
        }
    }

    fn redis_answer(&self, resp: &RedisResponse) {
        match Event::redis_response(AGENT_SOURCE, resp) {
            Ok(ev) => {
                if let Err(e) = self.outbox.push(ev) {
                    warn!(error = %e, "cannot queue a redis answer");
                }
            }
            Err(e) => warn!(error = %e, "cannot build a redis answer"),
        }
    }

    /// Whether `ev` was already accepted (a resend), remembering it if not.
    fn already_seen(&self, ev: &Event) -> bool {
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.retain(|_, at| now.duration_since(*at) < REMEMBER_FOR);
        seen.insert(ev.event_id.clone(), now).is_some()
    }

    /// Accepts one request event; the work runs in its own task.
    pub fn accept(self: &Arc<Self>, ev: Event) -> Result<(), HandleError> {
        if ev.event_id.is_empty() {
            return Err(HandleError::Rejected("live request without an id".into()));
        }
        if self.already_seen(&ev) {
            debug!(request = %ev.event_id, "live request resent; already running");
            return Ok(());
        }
        if let Some(age) = ev
            .sent_at
            .and_then(|t| (chrono::Utc::now() - t).to_std().ok())
        {
            if age > STALE_AFTER {
                info!(request = %ev.event_id, age_secs = age.as_secs(), "dropping a live request its caller no longer waits for");
                return Ok(());
            }
        }
        let me = self.clone();
        match ev.target {
            Target::Resource => {
                let req: ResourceRequest = ev
                    .data_as()
                    .map_err(|e| HandleError::Rejected(e.to_string()))?;
                tokio::spawn(async move {
                    let run = resource::execute(&me.client, &me.tracking, &req);
                    let (status, body) = match tokio::time::timeout(APISERVER_TIMEOUT, run).await {
                        Ok(answer) => answer,
                        Err(_) => (
                            504,
                            resource::status_body(
                                504,
                                "Timeout",
                                "the spoke apiserver did not answer in time",
                            ),
                        ),
                    };
                    debug!(request = %req.uuid, method = %req.method, resource = %req.resource, status, "resource request answered");
                    me.answer(Target::Resource, &req.uuid, status, &body);
                });
            }
            Target::Redis => {
                let req: RedisRequest = ev
                    .data_as()
                    .map_err(|e| HandleError::Rejected(e.to_string()))?;
                tokio::spawn(async move {
                    if let Some(resp) = me.redis.handle(&me, &req).await {
                        me.redis_answer(&resp);
                    }
                });
            }
            Target::ContainerLog => {
                let req: ContainerLogRequest = ev
                    .data_as()
                    .map_err(|e| HandleError::Rejected(e.to_string()))?;
                if !self.lock_logs().insert(req.uuid.clone()) {
                    debug!(request = %req.uuid, "log request resent; already streaming");
                    return Ok(());
                }
                let link = self.link.clone();
                tokio::spawn(async move {
                    let uuid = req.uuid.clone();
                    logs::run(me.clone(), link, req).await;
                    me.lock_logs().remove(&uuid);
                });
            }
            Target::Terminal => {
                let req: ContainerTerminalRequest = ev
                    .data_as()
                    .map_err(|e| HandleError::Rejected(e.to_string()))?;
                tokio::spawn(terminal::run(me, self.link.clone(), req));
            }
            _ => {
                return Err(HandleError::Rejected(format!(
                    "target {} is not a live request",
                    ev.target.as_str()
                )))
            }
        }
        Ok(())
    }

    fn lock_logs(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.log_streams.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Routes live requests to a [`LiveService`] (when the live view is enabled) and every other
/// event to the mode's handler `H`.
pub struct LiveDispatch<H> {
    /// The mode's handler (managed or autonomous sync).
    pub inner: Arc<H>,
    /// The live service; `None` when `--enable-resource-proxy=false`.
    pub live: Option<Arc<LiveService>>,
}

impl<H> LiveDispatch<H> {
    /// `inner` with live requests going to `live`.
    pub fn wrap(inner: Arc<H>, live: Option<Arc<LiveService>>) -> Arc<Self> {
        Arc::new(LiveDispatch { inner, live })
    }
}

impl<H: EventHandler> EventHandler for LiveDispatch<H> {
    async fn handle(&self, event: Event) -> Result<(), HandleError> {
        match (&event.target, &self.live) {
            (
                Target::Resource | Target::Redis | Target::ContainerLog | Target::Terminal,
                Some(live),
            ) => live.accept(event),
            _ => self.inner.handle(event).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_split_at_character_boundaries_and_join_back() {
        let body = "aé".repeat(1000);
        let parts = split_parts(&body, 7);
        assert!(parts.iter().all(|p| p.len() <= 7));
        assert_eq!(parts.concat(), body);
        assert_eq!(split_parts("", 7), vec![""]);
    }
}
