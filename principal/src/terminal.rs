//! The web terminal on the principal: a `pods/{pod}/exec` WebSocket of the hub's argocd-server
//! (or `kubectl exec`) through the resource proxy, carried to the agent over upstream's
//! `terminalstreamapi.TerminalStreamService/StreamTerminal`.
//!
//! Upstream's contract (v0.9.0): the principal sends a `terminal-request` event naming a session
//! UUID, the pod, container and command; the agent opens one bidi `StreamTerminal` call whose
//! first message carries only that UUID, then sends the process's output (`stream_type`
//! stdout/stderr), `eof` when it ended or `error`; the principal sends stdin, resizes
//! (`resize`, `rows`, `cols`) and ends its side when the client left.
//!
//! Before a session is requested, the resource proxy reads the pod through the agent: only a pod
//! the agent lets the hub read (one Argo CD manages) is exec'd into, whichever agent it is
//! (upstream's Go agent execs into any pod its ServiceAccount reaches; ours checks again).
//!
//! Owns the pending sessions ([`TerminalSessions`]: a call is joined to the session only when it
//! comes from the agent the request was sent to), how many sessions are open (at most
//! `--terminal-max-sessions-per-agent` per agent and `--terminal-max-sessions` in all: one over
//! either cap is refused before its agent is asked to open it, on the exec channel protocol after the
//! WebSocket upgrade, since client-go answers a failed upgrade by retrying over SPDY and would show
//! that refusal instead; see [`TerminalPolicy`]), their metrics
//! ([`crate::metrics::TerminalMetrics`]: open per agent, ended by outcome), the `StreamTerminal` service
//! ([`TerminalStreamRelay`]), the WebSocket upgrade ([`upgrade`]; the Kubernetes channel framing
//! is `argocd_agent_kube::exec_channels`) and the bridge between the two. Bounds: a WebSocket
//! message or gRPC message is at most [`MAX_MESSAGE`], each direction holds at most
//! [`BUFFER`] messages (one task per direction, each waiting on its own sink, so a slow side
//! slows only its direction), a session with no data either way for `--terminal-idle-timeout`
//! is ended, and the agent must join within [`crate::resource_proxy::ANSWER_TIMEOUT`]. Whenever
//! the session ends — client gone, idle, agent done — the agent's call is ended, and the agent
//! ends the exec on its spoke.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_kube::exec_channels::{self, ClientFrame};
use argocd_agent_proto::event::Event;
use argocd_agent_proto::identity::AgentName;
use argocd_agent_proto::payload::ContainerTerminalRequest;
use argocd_agent_proto::pb::terminalstreamapi::terminal_stream_service_server::TerminalStreamService;
use argocd_agent_proto::pb::terminalstreamapi::TerminalStreamData;
use argocd_agent_runtime::grpc_websocket::handshake;
use futures::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tonic::{Status, Streaming};

use crate::auth::authorize_stream;
use crate::listener::{AgentCaps, AgentPlace, CapFull};
use crate::metrics::{PrincipalMetrics, TerminalMetrics};
use crate::resource_proxy::{status_response, ProxyBody, ANSWER_TIMEOUT};
use crate::sessions::AgentSession;
use crate::tokens::TokenIssuer;

/// Largest WebSocket or gRPC message of a session (a terminal's keystrokes and screenfuls are far
/// smaller; the agent reads output in 32 KiB pieces).
pub const MAX_MESSAGE: usize = 64 << 10;
/// Largest `StreamTerminal` message decoded from an agent: a [`MAX_MESSAGE`] of data and its
/// envelope.
pub const MAX_CALL_MESSAGE: usize = MAX_MESSAGE + 1024;
/// Messages buffered per direction.
pub const BUFFER: usize = 16;
/// Default of `--terminal-max-sessions`.
pub const DEFAULT_MAX_SESSIONS: usize = 100;
/// Default of `--terminal-max-sessions-per-agent`.
pub const DEFAULT_MAX_SESSIONS_PER_AGENT: usize = 10;
/// The `outcome` of a session refused for a cap.
pub const REFUSED_LIMIT: &str = "refused_limit";
/// The `outcome` of a session whose request could not be queued for its agent.
pub const UNAVAILABLE: &str = "unavailable";

/// How web terminal sessions are bounded and observed.
#[derive(Clone, Debug)]
pub struct TerminalPolicy {
    /// A session with no data either way this long is ended (`--terminal-idle-timeout`).
    pub idle_timeout: Duration,
    /// Sessions open at once per agent (`--terminal-max-sessions-per-agent`) and in all
    /// (`--terminal-max-sessions`).
    caps: AgentCaps,
    /// Open sessions and outcomes.
    pub metrics: TerminalMetrics,
}

impl TerminalPolicy {
    /// Sessions idle for `idle_timeout` end; at most `max_sessions` open in all and
    /// `max_sessions_per_agent` per agent.
    pub fn new(
        idle_timeout: Duration,
        max_sessions: usize,
        max_sessions_per_agent: usize,
        metrics: TerminalMetrics,
    ) -> Self {
        TerminalPolicy {
            idle_timeout,
            caps: AgentCaps::new(max_sessions, max_sessions_per_agent),
            metrics,
        }
    }

    /// A place for one more session of `agent`'s, or why there is none (which cap is full and
    /// the flag that sets it).
    fn admit(&self, agent: &str) -> Result<OpenSlot, String> {
        let place = self.caps.admit(agent).map_err(|full| match full {
            CapFull::Agent(mine) => format!(
                "agent {agent} already has {mine} web terminal session(s) open, the most \
                 --terminal-max-sessions-per-agent allows: close one and try again"
            ),
            CapFull::All(all) => format!(
                "the principal already has {all} web terminal session(s) open, the most \
                 --terminal-max-sessions allows: close one and try again"
            ),
        })?;
        self.metrics.opened(agent);
        Ok(OpenSlot {
            _place: place,
            agent: agent.to_string(),
            metrics: self.metrics.clone(),
        })
    }

    /// Sessions of `agent`'s open now.
    pub fn open_sessions(&self, agent: &str) -> usize {
        self.caps.open(agent)
    }
}

/// A place among the open sessions, held from admission until the session ended.
struct OpenSlot {
    _place: AgentPlace,
    agent: String,
    metrics: TerminalMetrics,
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.metrics.closed(&self.agent);
    }
}

/// The agent's side of a session: its call's messages, and where to send the client's.
struct AgentLeg {
    inbound: Streaming<TerminalStreamData>,
    outbound: mpsc::Sender<Result<TerminalStreamData, Status>>,
}

struct Pending {
    agent: String,
    join: oneshot::Sender<AgentLeg>,
}

/// Sessions whose agent has not opened its `StreamTerminal` call yet.
#[derive(Default)]
pub struct TerminalSessions {
    pending: Mutex<HashMap<String, Pending>>,
}

/// Removes a pending session when the client's side gives up waiting.
struct PendingGuard<'a> {
    sessions: &'a TerminalSessions,
    uuid: String,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.sessions.lock().remove(&self.uuid);
    }
}

impl TerminalSessions {
    /// An empty registry.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn open(&self, agent: &str, uuid: &str) -> oneshot::Receiver<AgentLeg> {
        let (join, joined) = oneshot::channel();
        self.lock().insert(
            uuid.to_string(),
            Pending {
                agent: agent.to_string(),
                join,
            },
        );
        joined
    }

    /// Takes the session `uuid` for a call of `agent`'s.
    fn join(&self, agent: &str, uuid: &str) -> Result<oneshot::Sender<AgentLeg>, Status> {
        let mut pending = self.lock();
        match pending.get(uuid) {
            None => Err(Status::not_found(format!(
                "no terminal session {uuid} is waiting"
            ))),
            Some(p) if p.agent != agent => {
                tracing::warn!(agent, session = %uuid, expected = %p.agent, "refusing a terminal stream from an agent that was not asked");
                Err(Status::permission_denied(
                    "this terminal session was not opened for you",
                ))
            }
            Some(_) => Ok(pending.remove(uuid).expect("present").join),
        }
    }

    /// Sessions waiting for their agent (for tests).
    pub fn waiting(&self) -> usize {
        self.lock().len()
    }
}

/// Implements `TerminalStreamService` (see the module docs).
pub struct TerminalStreamRelay {
    /// Token validation (the call carries the agent's access token, as Subscribe does).
    pub issuer: Arc<TokenIssuer>,
    /// Metrics (authentication failures).
    pub metrics: Arc<PrincipalMetrics>,
    /// Sessions waiting for their agent.
    pub sessions: Arc<TerminalSessions>,
}

#[tonic::async_trait]
impl TerminalStreamService for TerminalStreamRelay {
    type StreamTerminalStream = ReceiverStream<Result<TerminalStreamData, Status>>;

    async fn stream_terminal(
        &self,
        req: tonic::Request<Streaming<TerminalStreamData>>,
    ) -> Result<tonic::Response<Self::StreamTerminalStream>, Status> {
        let (agent, _) = authorize_stream(&req, &self.issuer, &self.metrics)?;
        let mut inbound = req.into_inner();
        let first = tokio::time::timeout(ANSWER_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no terminal handshake"))??
            .ok_or_else(|| {
                Status::invalid_argument("the terminal stream ended before its handshake")
            })?;
        let join = self.sessions.join(agent.as_str(), &first.request_uuid)?;
        let (outbound, rx) = mpsc::channel(BUFFER);
        join.send(AgentLeg { inbound, outbound })
            .map_err(|_| Status::not_found("the terminal's client went away"))?;
        tracing::debug!(agent = agent.as_str(), session = %first.request_uuid, "terminal stream attached");
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
}

/// What an exec request asks for (its query, as client-go encodes `PodExecOptions`).
fn exec_request(
    uuid: &str,
    namespace: &str,
    pod: &str,
    query: Option<&str>,
) -> ContainerTerminalRequest {
    use crate::resource_proxy::route::{parse_query, query_values};
    let params = parse_query(query);
    let flag = |k: &str| params.get(k).is_some_and(|v| v == "true" || v == "1");
    ContainerTerminalRequest {
        uuid: uuid.to_string(),
        namespace: namespace.to_string(),
        pod_name: pod.to_string(),
        container_name: params.get("container").cloned().unwrap_or_default(),
        command: query_values(query, "command"),
        tty: flag("tty"),
        stdin: flag("stdin"),
        stdout: flag("stdout"),
        stderr: flag("stderr"),
    }
}

/// What a WebSocket upgrade request offers: its key and the channel subprotocol we answer with.
pub struct WebSocketOffer {
    key: http::HeaderValue,
    protocol: &'static str,
}

/// The WebSocket offer of an exec request, or the refusal of anything else (SPDY, or no channel
/// subprotocol we speak).
#[allow(clippy::result_large_err)]
pub fn websocket_offer(req: &Request<Incoming>) -> Result<WebSocketOffer, Response<ProxyBody>> {
    let headers = req.headers();
    let is_websocket = headers
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let key = headers.get(http::header::SEC_WEBSOCKET_KEY).cloned();
    let protocol = exec_channels::pick_subprotocol(
        headers
            .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    match (is_websocket, key, protocol) {
        (true, Some(key), Some(protocol)) => Ok(WebSocketOffer { key, protocol }),
        _ => Err(status_response(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "exec through the resource proxy needs a WebSocket upgrade offering {} (SPDY is not supported)",
                exec_channels::SUBPROTOCOLS.join(" or ")
            ),
        )),
    }
}

/// Answers an exec request of `agent`'s (connected, with `session`) whose pod the agent let the
/// hub read: when both caps of `policy` have room, queues the terminal request for the agent and
/// switches protocols, the session running in a task of its own; otherwise switches protocols
/// only to send the refusal (see the module docs).
pub fn upgrade(
    agent: &AgentName,
    session: &Arc<AgentSession>,
    sessions: &Arc<TerminalSessions>,
    policy: &TerminalPolicy,
    (namespace, pod): (&str, &str),
    offer: WebSocketOffer,
    mut req: Request<Incoming>,
) -> Response<ProxyBody> {
    let WebSocketOffer { key, protocol } = offer;
    let upgraded = hyper::upgrade::on(&mut req);
    let agent_name = agent.to_string();
    let slot = match policy.admit(agent.as_str()) {
        Ok(slot) => slot,
        Err(refusal) => {
            tracing::warn!(agent = %agent_name, namespace, pod, "{refusal}");
            policy.metrics.ended(&agent_name, REFUSED_LIMIT);
            tokio::spawn(async move {
                if let Some(ws) = accept(upgraded).await {
                    let (mut ws_tx, _) = ws.split();
                    let refused = exec_channels::encode_failure("TooManyRequests", &refusal);
                    let _ = ws_tx.send(Message::binary(refused)).await;
                    let _ = ws_tx.send(normal_close()).await;
                }
            });
            return switching_protocols(&key, protocol);
        }
    };
    let uuid = uuid::Uuid::new_v4().to_string();
    let request = exec_request(&uuid, namespace, pod, req.uri().query());
    let event = match Event::terminal_request("", &request) {
        Ok(e) => e,
        Err(e) => {
            return status_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                e.to_string(),
            )
        }
    };
    let joined = sessions.open(agent.as_str(), &uuid);
    if let Err(e) = session.outbox.push(event) {
        sessions.lock().remove(&uuid);
        policy.metrics.ended(&agent_name, UNAVAILABLE);
        return status_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!("cannot queue the terminal request for agent {agent}: {e}"),
        );
    }
    tracing::info!(agent = agent.as_str(), session = %uuid, namespace, pod, container = %request.container_name, "terminal session requested");
    let (sessions, idle, metrics) = (
        sessions.clone(),
        policy.idle_timeout,
        policy.metrics.clone(),
    );
    tokio::spawn(async move {
        let guard = PendingGuard {
            sessions: &sessions,
            uuid: uuid.clone(),
        };
        let end = match accept(upgraded).await {
            Some(ws) => run_session(ws, joined, idle).await,
            None => SessionEnd::ClientGone,
        };
        drop(guard);
        drop(slot);
        metrics.ended(&agent_name, end.outcome());
        tracing::info!(agent = %agent_name, session = %uuid, end = ?end, "terminal session ended");
    });
    switching_protocols(&key, protocol)
}

/// The client's WebSocket once the upgrade completed, with the session's message bounds.
async fn accept(
    upgraded: hyper::upgrade::OnUpgrade,
) -> Option<ClientSocket<TokioIo<hyper::upgrade::Upgraded>>> {
    let io = match upgraded.await {
        Ok(io) => io,
        Err(e) => {
            tracing::debug!(error = %e, "terminal upgrade failed");
            return None;
        }
    };
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(MAX_MESSAGE);
    config.max_frame_size = Some(MAX_MESSAGE);
    Some(WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Server, Some(config)).await)
}

/// `101 Switching Protocols` to the WebSocket offered with `key`, speaking `protocol`.
fn switching_protocols(key: &http::HeaderValue, protocol: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(crate::resource_proxy::empty_body());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *resp.headers_mut() = handshake::switching_protocols(key, protocol);
    resp
}

/// How a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// The process ended and the agent said so.
    Finished,
    /// The agent reported an error, or its call broke.
    AgentFailed(String),
    /// The agent did not open its call in time.
    AgentAbsent,
    /// The client closed the WebSocket or went away.
    ClientGone,
    /// The client sent a message the channel protocol does not allow.
    BadClientMessage(String),
    /// No data either way for the idle timeout.
    Idle,
}

impl SessionEnd {
    /// The `outcome` label of the sessions counter.
    pub fn outcome(&self) -> &'static str {
        match self {
            SessionEnd::Finished => "finished",
            SessionEnd::AgentFailed(_) => "agent_failed",
            SessionEnd::AgentAbsent => "agent_absent",
            SessionEnd::ClientGone => "client_gone",
            SessionEnd::BadClientMessage(_) => "bad_client_message",
            SessionEnd::Idle => "idle",
        }
    }
}

/// Milliseconds since `start` of the latest data, shared by both directions.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Returns when nothing moved for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let deadline = last + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

type ClientSocket<S> = WebSocketStream<S>;

/// Bridges the client's WebSocket and the agent's call until either ends (see the module docs).
async fn run_session<S>(
    ws: ClientSocket<S>,
    joined: oneshot::Receiver<AgentLeg>,
    idle: Duration,
) -> SessionEnd
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut ws_tx, mut ws_rx) = ws.split();
    let leg = match tokio::time::timeout(ANSWER_TIMEOUT, joined).await {
        Ok(Ok(leg)) => leg,
        _ => {
            let message = format!("the agent did not open the terminal within {ANSWER_TIMEOUT:?}");
            let _ = ws_tx
                .send(Message::binary(exec_channels::encode_failure(
                    "Timeout", &message,
                )))
                .await;
            let _ = ws_tx.send(normal_close()).await;
            return SessionEnd::AgentAbsent;
        }
    };
    let AgentLeg {
        mut inbound,
        outbound,
    } = leg;
    let activity = Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    };
    let end = tokio::select! {
        end = client_to_agent(&mut ws_rx, &outbound, &activity) => end,
        end = agent_to_client(&mut inbound, &mut ws_tx, &activity) => end,
        () = activity.idle_for(idle) => SessionEnd::Idle,
    };
    let last = match &end {
        SessionEnd::Finished => Some(exec_channels::encode_success()),
        SessionEnd::AgentFailed(m) => Some(exec_channels::encode_failure("InternalError", m)),
        SessionEnd::BadClientMessage(m) => Some(exec_channels::encode_failure("BadRequest", m)),
        SessionEnd::Idle => Some(exec_channels::encode_failure(
            "Timeout",
            &format!("the terminal was idle for {idle:?}"),
        )),
        SessionEnd::ClientGone | SessionEnd::AgentAbsent => None,
    };
    if let Some(last) = last {
        let _ = ws_tx.send(Message::binary(last)).await;
    }
    let _ = ws_tx.send(normal_close()).await;
    // Dropping our side ends the agent's call, which ends the exec on the spoke.
    drop(outbound);
    end
}

async fn client_to_agent<S>(
    ws_rx: &mut futures::stream::SplitStream<ClientSocket<S>>,
    outbound: &mpsc::Sender<Result<TerminalStreamData, Status>>,
    activity: &Activity,
) -> SessionEnd
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    while let Some(msg) = ws_rx.next().await {
        let data = match msg {
            Ok(Message::Binary(data)) => data,
            Ok(Message::Close(_)) | Err(_) => {
                tracing::debug!("the terminal's client closed its socket");
                break;
            }
            // Pings are answered by the socket; text is no channel frame.
            Ok(_) => continue,
        };
        let frame = match exec_channels::decode_client(&data) {
            Ok(f) => f,
            Err(e) => return SessionEnd::BadClientMessage(e.to_string()),
        };
        let to_agent = match frame {
            ClientFrame::Stdin(bytes) => TerminalStreamData {
                data: bytes.to_vec(),
                stream_type: "stdin".into(),
                ..Default::default()
            },
            ClientFrame::Resize { width, height } => TerminalStreamData {
                resize: true,
                cols: u32::from(width),
                rows: u32::from(height),
                ..Default::default()
            },
            ClientFrame::CloseStdin => {
                tracing::debug!("the terminal's client closed its stdin");
                TerminalStreamData {
                    eof: true,
                    stream_type: "stdin".into(),
                    ..Default::default()
                }
            }
            ClientFrame::Ignore => continue,
        };
        activity.touch();
        if outbound.send(Ok(to_agent)).await.is_err() {
            return SessionEnd::AgentFailed("the agent's terminal stream closed".into());
        }
    }
    SessionEnd::ClientGone
}

async fn agent_to_client<S>(
    inbound: &mut Streaming<TerminalStreamData>,
    ws_tx: &mut futures::stream::SplitSink<ClientSocket<S>, Message>,
    activity: &Activity,
) -> SessionEnd
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        let msg = match inbound.message().await {
            Ok(Some(m)) => m,
            Ok(None) => return SessionEnd::AgentFailed("the agent ended the terminal".into()),
            Err(status) => return SessionEnd::AgentFailed(status.message().to_string()),
        };
        if !msg.error.is_empty() {
            return SessionEnd::AgentFailed(msg.error);
        }
        if msg.eof {
            return SessionEnd::Finished;
        }
        if msg.data.is_empty() {
            continue;
        }
        activity.touch();
        let frame = exec_channels::encode_output(msg.stream_type == "stderr", &msg.data);
        if ws_tx.send(Message::binary(frame)).await.is_err() {
            return SessionEnd::ClientGone;
        }
    }
}

/// A close frame with the normal closure code ([`exec_channels::NORMAL_CLOSURE`]).
fn normal_close() -> Message {
    use tokio_tungstenite::tungstenite::protocol::frame::{coding::CloseCode, CloseFrame};
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(exec_channels::NORMAL_CLOSURE),
        reason: "".into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_queries_become_terminal_requests() {
        let req = exec_request(
            "u",
            "ns",
            "web-1",
            Some("container=web&command=sh&command=-c&command=echo+hi&stdin=true&stdout=true&stderr=true&tty=true"),
        );
        assert_eq!(req.container_name, "web");
        assert_eq!(req.command, ["sh", "-c", "echo hi"]);
        assert!(req.tty && req.stdin && req.stdout && req.stderr);
        let req = exec_request("u", "ns", "web-1", Some("container=web&command=ls"));
        assert!(!req.tty && !req.stdin);
    }

    #[test]
    fn only_the_agent_asked_joins_a_session_and_only_once() {
        let sessions = TerminalSessions::new();
        let _joined = sessions.open("agent-a", "s1");
        let code = |r: Result<_, Status>| r.err().map(|s| s.code());
        assert_eq!(
            code(sessions.join("agent-b", "s1")),
            Some(tonic::Code::PermissionDenied)
        );
        assert!(sessions.join("agent-a", "s1").is_ok());
        assert_eq!(
            code(sessions.join("agent-a", "s1")),
            Some(tonic::Code::NotFound)
        );
        assert_eq!(sessions.waiting(), 0);
    }

    #[test]
    fn sessions_over_either_cap_are_refused_naming_its_flag_until_one_ends() {
        let registry = argocd_agent_runtime::telemetry::MetricsRegistry::empty();
        let metrics = PrincipalMetrics::register(&registry);
        let policy = TerminalPolicy::new(Duration::from_secs(60), 3, 2, metrics.terminal.clone());
        let a1 = policy.admit("agent-a").unwrap();
        let _a2 = policy.admit("agent-a").unwrap();
        let refused = policy.admit("agent-a").err().unwrap();
        assert!(
            refused.contains("agent agent-a already has 2")
                && refused.contains("--terminal-max-sessions-per-agent"),
            "{refused}"
        );
        let _b1 = policy.admit("agent-b").unwrap();
        let refused = policy.admit("agent-c").err().unwrap();
        assert!(
            refused.contains("already has 3") && refused.contains("--terminal-max-sessions allows"),
            "{refused}"
        );
        let gauge = |agent: &str| {
            format!("argocd_principal_terminal_sessions_open{{agent_name=\"{agent}\"}}")
        };
        let text = registry.encode().unwrap();
        assert!(text.contains(&format!("{} 2", gauge("agent-a"))), "{text}");
        drop(a1);
        assert_eq!(policy.open_sessions("agent-a"), 1);
        let text = registry.encode().unwrap();
        assert!(text.contains(&format!("{} 1", gauge("agent-a"))), "{text}");
        assert!(policy.admit("agent-c").is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_with_no_data_either_way_ends_at_the_idle_timeout() {
        let activity = Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        };
        let started = Instant::now();
        tokio::time::advance(Duration::from_secs(5)).await;
        activity.touch();
        activity.idle_for(Duration::from_secs(60)).await;
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(65) && waited < Duration::from_secs(66),
            "{waited:?}"
        );
    }
}
