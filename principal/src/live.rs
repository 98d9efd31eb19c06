//! Requests the principal sends to an agent on behalf of a hub client (resource proxy, redis
//! proxy, container logs) and the agent's answers that come back on the event stream.
//!
//! Owns [`LiveRequests`]: the map from request UUID (or redis connection UUID) to the caller
//! waiting for the answer, which agents currently have a live stream, and the rules for answers:
//! only the agent a request was sent to may answer it; a response split into parts (our
//! `livechunk`/`liveend` extensions) is delivered in order and exactly once, even when the agent
//! resends a part. Container logs come over the agent's `StreamLogs` call instead (ours and
//! upstream's agents alike: [`LiveRequests::attach_log_stream`], relayed by
//! [`crate::log_stream`]); a log reader that went away stops its agent by that call ending, never
//! by an event (upstream's agent would take any `containerlog` event for a new request). When an
//! agent's last stream ends, every caller still waiting on it is answered with
//! [`LiveReply::AgentGone`] at once. Hooks registered with
//! [`LiveRequests::on_agent_connected`] run when an agent's stream starts, those registered with
//! [`LiveRequests::on_agent_disconnected`] when its last stream ends. Web terminal sessions
//! waiting for their agent's call are kept beside them ([`LiveRequests::terminals`], owned by
//! [`crate::terminal`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_proto::event::{Event, EventType, ExtensionValue, Target};
use argocd_agent_proto::payload::{RedisResponse, ResourceResponse};
use argocd_agent_proto::sync::HandleError;
use tokio::sync::mpsc;

use crate::sessions::AgentSession;

/// Extension on a response part: its sequence number (decimal), starting at 0. Our agent sets it;
/// a response without it (upstream's Go agent) is one complete part.
pub const CHUNK_SEQ: &str = "livechunk";
/// Extension on a response part: `"true"` on the last part.
pub const CHUNK_END: &str = "liveend";
/// How long an inbound part may wait for room in a slow caller's buffer before the agent is made
/// to resend it (backpressure through the stream's resend).
const DELIVERY_WAIT: Duration = Duration::from_secs(2);

/// What a waiting caller receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveReply {
    /// One part of a resource response or container-log stream, in order.
    Part {
        /// HTTP status (meaningful on the first part).
        status: u16,
        /// Body bytes of this part.
        body: Vec<u8>,
        /// Last part.
        end: bool,
    },
    /// A redis answer or a push from a subscription.
    Redis(RedisResponse),
    /// The agent's stream ended; no answer will come.
    AgentGone,
}

/// What the caller waits for; decides how answers are checked and what happens when it leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitKind {
    /// A resource-proxy request.
    Resource,
    /// A container-log stream, fed by the agent's `StreamLogs` call. `timestamps`: the caller asked
    /// for each line's timestamp (agents always send them).
    ContainerLog {
        /// The caller asked for timestamps.
        timestamps: bool,
    },
    /// A redis request or a redis connection's subscription pushes.
    Redis,
}

struct Waiter {
    agent: String,
    kind: WaitKind,
    tx: mpsc::Sender<LiveReply>,
    next_seq: u64,
}

#[derive(Default)]
struct State {
    waiters: HashMap<String, Waiter>,
    streams: HashMap<String, usize>,
}

/// Why [`LiveRequests::attach_log_stream`] refused a log stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AttachRefused {
    /// Nobody waits on this request (the caller left, or it never existed).
    #[error("unknown request id")]
    Unknown,
    /// The request is not a container-log request sent to this agent.
    #[error("this request was not sent to you")]
    NotYours,
}

/// Runs with the agent's name each time one of its streams starts (after it authenticated),
/// e.g. self-registration of its cluster Secret. Must not block.
pub type ConnectHook = Arc<dyn Fn(&str) + Send + Sync>;

/// The tracker (see the module docs). Shared as `Arc<LiveRequests>`.
#[derive(Default)]
pub struct LiveRequests {
    state: Mutex<State>,
    connect_hooks: Mutex<Vec<ConnectHook>>,
    disconnect_hooks: Mutex<Vec<ConnectHook>>,
    terminals: Arc<crate::terminal::TerminalSessions>,
}

/// A registered caller: receives the answers for its key; unregisters itself when dropped.
pub struct LiveWaiter {
    key: String,
    rx: mpsc::Receiver<LiveReply>,
    tracker: Arc<LiveRequests>,
}

impl LiveWaiter {
    /// The next answer; `None` only if the tracker dropped this caller.
    pub async fn recv(&mut self) -> Option<LiveReply> {
        self.rx.recv().await
    }

    /// Polls for the next answer, as [`Self::recv`] waits for it (to wait on several callers).
    pub fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<LiveReply>> {
        self.rx.poll_recv(cx)
    }

    /// The request (or connection) key this caller waits on.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Drop for LiveWaiter {
    fn drop(&mut self) {
        self.tracker.lock().waiters.remove(&self.key);
    }
}

fn part_position(ev: &Event) -> (u64, bool) {
    let text = |k: &str| ev.extensions.get(k).and_then(ExtensionValue::as_str);
    match text(CHUNK_SEQ).and_then(|s| s.parse::<u64>().ok()) {
        Some(seq) => (seq, text(CHUNK_END) == Some("true")),
        None => (0, true),
    }
}

impl LiveRequests {
    /// An empty tracker.
    pub fn new() -> Arc<LiveRequests> {
        Arc::new(LiveRequests::default())
    }

    /// Web terminal sessions waiting for their agent's `StreamTerminal` call.
    pub fn terminals(&self) -> &Arc<crate::terminal::TerminalSessions> {
        &self.terminals
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A stream of `agent` started; runs the connect hooks.
    pub fn agent_connected(&self, agent: &str) {
        *self.lock().streams.entry(agent.to_string()).or_default() += 1;
        let hooks = self
            .connect_hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for hook in hooks {
            hook(agent);
        }
    }

    /// Adds `hook` to what runs when an agent's stream starts.
    pub fn on_agent_connected(&self, hook: ConnectHook) {
        self.connect_hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(hook);
    }

    /// Adds `hook` to what runs when an agent's last stream ends (not when a newer stream of the
    /// agent replaced it).
    pub fn on_agent_disconnected(&self, hook: ConnectHook) {
        self.disconnect_hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(hook);
    }

    /// A stream of `agent` ended; when it was the last one, every caller waiting on the agent
    /// is answered with [`LiveReply::AgentGone`] and the disconnect hooks run.
    pub fn agent_disconnected(&self, agent: &str) {
        let gone: Vec<(String, Waiter)> = {
            let mut st = self.lock();
            let count = st.streams.entry(agent.to_string()).or_default();
            *count = count.saturating_sub(1);
            if *count > 0 {
                return;
            }
            st.streams.remove(agent);
            let keys: Vec<String> = st
                .waiters
                .iter()
                .filter(|(_, w)| w.agent == agent)
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| st.waiters.remove(&k).map(|w| (k, w)))
                .collect()
        };
        if !gone.is_empty() {
            tracing::info!(
                agent,
                waiting = gone.len(),
                "agent went away; answering its waiting live requests"
            );
        }
        for (_, w) in gone {
            let _ = w.tx.try_send(LiveReply::AgentGone);
        }
        let hooks = self
            .disconnect_hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for hook in hooks {
            hook(agent);
        }
    }

    /// Whether `agent` has a live stream.
    pub fn is_connected(&self, agent: &str) -> bool {
        self.lock().streams.get(agent).is_some_and(|c| *c > 0)
    }

    /// Number of callers waiting (for tests and metrics).
    pub fn waiting(&self) -> usize {
        self.lock().waiters.len()
    }

    /// Registers a caller waiting on `key` (a request or connection UUID) answered by `agent`.
    /// `depth` bounds the answers buffered for a slow caller.
    pub fn register(
        self: &Arc<Self>,
        agent: &str,
        key: &str,
        kind: WaitKind,
        depth: usize,
    ) -> LiveWaiter {
        let (tx, rx) = mpsc::channel(depth.max(1));
        self.lock().waiters.insert(
            key.to_string(),
            Waiter {
                agent: agent.to_string(),
                kind,
                tx,
                next_seq: 0,
            },
        );
        LiveWaiter {
            key: key.to_string(),
            rx,
            tracker: self.clone(),
        }
    }

    /// Attaches a `StreamLogs` call of `agent` to the container-log caller waiting on `key`:
    /// returns where to send the parts and whether the caller asked for timestamps. Refused when
    /// nobody waits on `key` (any more), or `key` is not a log request sent to `agent`.
    pub fn attach_log_stream(
        &self,
        agent: &str,
        key: &str,
    ) -> Result<(mpsc::Sender<LiveReply>, bool), AttachRefused> {
        let mut st = self.lock();
        let w = st.waiters.get_mut(key).ok_or(AttachRefused::Unknown)?;
        let WaitKind::ContainerLog { timestamps } = w.kind else {
            return Err(AttachRefused::NotYours);
        };
        if w.agent != agent {
            tracing::warn!(agent, request = %key, expected = %w.agent, "refusing a log stream from an agent that was not asked");
            return Err(AttachRefused::NotYours);
        }
        Ok((w.tx.clone(), timestamps))
    }

    /// Handles an answer event from `session`'s agent (`response` for resources, `redis-response`).
    /// Answers for callers that are gone are dropped; answers from another agent than the one
    /// asked are refused.
    pub async fn handle_reply(
        &self,
        session: &AgentSession,
        ev: &Event,
    ) -> Result<(), HandleError> {
        let agent = session.name.as_str();
        let rejected =
            |e: argocd_agent_proto::event::EventError| HandleError::Rejected(e.to_string());
        let (key, reply, seq) = match (&ev.event_type, &ev.target) {
            (EventType::RedisResponse, _) => {
                let resp: RedisResponse = ev.data_as().map_err(rejected)?;
                let key = if resp.body.push_from_subscribe.is_some() {
                    resp.connection_uuid.clone()
                } else {
                    resp.uuid.clone()
                };
                (key, LiveReply::Redis(resp), None)
            }
            (EventType::Response, Target::ContainerLog) => return Err(HandleError::Rejected(
                "container logs are sent over LogStreamService.StreamLogs, not as response events"
                    .into(),
            )),
            (EventType::Response, _) => {
                let resp: ResourceResponse = ev.data_as().map_err(rejected)?;
                let (seq, end) = part_position(ev);
                let status = u16::try_from(resp.status)
                    .ok()
                    .filter(|s| (100..600).contains(s))
                    .unwrap_or(502);
                let key = resp.uuid;
                let body = resp.resource.into_bytes();
                (key, LiveReply::Part { status, body, end }, Some(seq))
            }
            (t, target) => {
                return Err(HandleError::Rejected(format!(
                    "{} for target {} is not a live answer",
                    t.name(),
                    target.as_str()
                )))
            }
        };
        let tx = {
            let st = self.lock();
            let Some(w) = st.waiters.get(&key) else {
                tracing::debug!(agent, request = %key, "answer for a request nobody waits for any more");
                return Ok(());
            };
            if w.agent != agent {
                tracing::warn!(agent, request = %key, expected = %w.agent, "refusing an answer from an agent that was not asked");
                return Err(HandleError::Rejected(
                    "this request was not sent to you".into(),
                ));
            }
            if let Some(seq) = seq {
                if seq < w.next_seq {
                    return Ok(()); // a resend of a part already delivered
                }
            }
            w.tx.clone()
        };
        let end = matches!(reply, LiveReply::Part { end: true, .. });
        match tokio::time::timeout(DELIVERY_WAIT, tx.send(reply)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Ok(()), // the caller left between lookup and send
            Err(_) => {
                return Err(HandleError::Retryable(format!(
                    "the caller of {key} reads slowly; waiting for the agent to resend"
                )))
            }
        }
        let mut st = self.lock();
        if let (Some(seq), Some(w)) = (seq, st.waiters.get_mut(&key)) {
            // After the last part every resend finds nothing left to deliver.
            w.next_seq = if end { u64::MAX } else { seq + 1 };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sessions::AgentRegistry;
    use argocd_agent_proto::identity::AgentName;
    use argocd_agent_proto::mode::AgentMode;
    use argocd_agent_proto::sync::OutboxConfig;

    fn session(name: &str) -> Arc<AgentSession> {
        AgentRegistry::new(OutboxConfig::default(), Default::default())
            .get_or_create(&AgentName::new(name).unwrap(), AgentMode::Managed)
    }

    fn part(uuid: &str, target: Target, seq: Option<(u64, bool)>, body: &str) -> Event {
        let resp = ResourceResponse {
            uuid: uuid.into(),
            status: 200,
            resource: body.into(),
        };
        let mut ev = Event::resource_response("agent", &resp).unwrap();
        ev.target = target;
        if let Some((seq, end)) = seq {
            ev.extensions
                .insert(CHUNK_SEQ.into(), ExtensionValue::String(seq.to_string()));
            if end {
                ev.extensions
                    .insert(CHUNK_END.into(), ExtensionValue::String("true".into()));
            }
        }
        ev
    }

    #[tokio::test]
    async fn parts_arrive_once_and_in_order_even_when_resent() {
        let t = LiveRequests::new();
        let a = session("a");
        let mut w = t.register("a", "u1", WaitKind::Resource, 8);
        for (seq, end, body) in [
            (0, false, "x"),
            (0, false, "x"),
            (1, true, "y"),
            (1, true, "y"),
        ] {
            t.handle_reply(&a, &part("u1", Target::Resource, Some((seq, end)), body))
                .await
                .unwrap();
        }
        let mut got = Vec::new();
        while let Ok(r) = w.rx.try_recv() {
            got.push(r);
        }
        assert_eq!(
            got,
            vec![
                LiveReply::Part {
                    status: 200,
                    body: b"x".to_vec(),
                    end: false
                },
                LiveReply::Part {
                    status: 200,
                    body: b"y".to_vec(),
                    end: true
                },
            ]
        );
    }

    #[tokio::test]
    async fn another_agent_cannot_answer_a_request() {
        let t = LiveRequests::new();
        let _w = t.register("a", "u1", WaitKind::Resource, 8);
        let err = t
            .handle_reply(&session("b"), &part("u1", Target::Resource, None, "{}"))
            .await
            .unwrap_err();
        assert!(matches!(err, HandleError::Rejected(_)));
    }

    #[tokio::test]
    async fn waiting_callers_learn_at_once_that_their_agent_went_away() {
        let t = LiveRequests::new();
        t.agent_connected("a");
        t.agent_connected("a"); // a new stream superseding the old one
        let mut w = t.register("a", "u1", WaitKind::Redis, 8);
        t.agent_disconnected("a");
        assert!(t.is_connected("a"));
        assert!(w.rx.try_recv().is_err(), "the agent still has a stream");
        t.agent_disconnected("a");
        assert!(!t.is_connected("a"));
        assert_eq!(w.recv().await, Some(LiveReply::AgentGone));
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn connect_hooks_run_for_every_stream() {
        let t = LiveRequests::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        t.on_agent_connected(Arc::new(move |agent: &str| {
            record.lock().unwrap().push(agent.to_string())
        }));
        t.agent_connected("a");
        t.agent_connected("b");
        assert_eq!(*seen.lock().unwrap(), ["a", "b"]);
    }

    #[test]
    fn a_log_stream_attaches_only_to_a_log_request_sent_to_its_agent() {
        let t = LiveRequests::new();
        let a = session("a");
        a.outbox.set_connected(true);
        let log = WaitKind::ContainerLog { timestamps: true };
        let w = t.register("a", "log1", log, 8);
        let _res = t.register("a", "res1", WaitKind::Resource, 8);
        assert_eq!(
            t.attach_log_stream("a", "nope").err(),
            Some(AttachRefused::Unknown)
        );
        assert_eq!(
            t.attach_log_stream("b", "log1").err(),
            Some(AttachRefused::NotYours)
        );
        assert_eq!(
            t.attach_log_stream("a", "res1").err(),
            Some(AttachRefused::NotYours)
        );
        let (_tx, timestamps) = t.attach_log_stream("a", "log1").unwrap();
        assert!(timestamps);
        // The agent's StreamLogs call, not an event, tells it that the reader left.
        drop(w);
        assert!(a.outbox.is_empty());
    }

    #[tokio::test]
    async fn log_parts_as_events_are_refused() {
        let t = LiveRequests::new();
        let a = session("a");
        let _w = t.register("a", "log1", WaitKind::ContainerLog { timestamps: false }, 8);
        let refused = t
            .handle_reply(
                &a,
                &part("log1", Target::ContainerLog, Some((0, false)), ""),
            )
            .await;
        assert!(
            matches!(&refused, Err(HandleError::Rejected(m)) if m.contains("StreamLogs")),
            "{refused:?}"
        );
    }
}
