//! The resource proxy: a Kubernetes-API-shaped HTTPS endpoint the hub's Argo CD uses as the
//! "cluster" of each agent, answered by the agent over its event stream.
//! An exec (`pods/{pod}/exec`, a WebSocket) is handed to [`crate::terminal`] once the agent
//! answered a read of the pod.
//!
//! Owns the listener (TLS, client certificate required, HTTP/1.1 and HTTP/2), who the caller is
//! (a bearer JWT's `sub` for self-registered clusters, else the client certificate's common name;
//! the `?agentName=` of the cluster URL is never trusted), turning an API request into a `resource`/`containerlog` request event in that
//! agent's outbox, and turning the agent's answer into the HTTP response: streamed part by part,
//! 502 with a Kubernetes `Status` when the agent is not connected or goes away, 504 when it does
//! not answer in time, 413 for a request body over the limit (refused from its declared length
//! when it has one), 408 closing the connection for a body that has not arrived in full within
//! `--request-body-timeout` (a stalled client holds nothing past it). What request bodies hold is
//! bounded across all clients ([`BodyBudget`]): at most `--max-request-bodies-in-flight` bodies
//! are being received at once and `--max-request-bodies-in-flight-per-agent` of one agent's (the
//! agent of its bearer token or client certificate), declaring together at most
//! [`MAX_BODY_BYTES_IN_FLIGHT`] bytes and [`MAX_AGENT_BODY_BYTES_IN_FLIGHT`] of one agent's (a
//! body without a declared length counts as the largest). A body that does not fit is answered
//! 429 with `Retry-After: 1` at once (as the kube-apiserver's in-flight limit, which client-go
//! retries) and its HTTP/1.1 connection closed: a client stalling many bodies holds the buffers of
//! a bounded number of connections, and one agent's stalls leave room for the others' writes.
//! HTTP/1.1 reads at most [`READ_QUANTUM`] at a time and HTTP/2 lets a connection send that much
//! ahead of what the proxy reads. A request without a body takes no place. The price: agents
//! stalling bodies together up to the caps in all get others' writes refused (429) until their
//! timeout. Each request is counted once in
//! [`ProxyMetrics`] (agent, status code, and the reason when the proxy answered it itself). Path
//! parsing is in [`route`]; `/version` answers in [`version`]; the request/answer matching in
//! [`crate::live`].

pub mod route;
pub mod version;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_proto::event::Event;
use argocd_agent_proto::identity::{AgentName, IdentitySource};
use argocd_agent_proto::payload::ContainerLogRequest;
use argocd_agent_runtime::accept::serve_tls_connections;
use argocd_agent_runtime::tls::reload::ReloadingServerConfig;
use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::net::TcpListener;

use crate::listener::{AgentCaps, AgentPlace, CapFull};
use crate::live::{LiveReply, LiveRequests, LiveWaiter, WaitKind};
use crate::metrics::ProxyMetrics;
use crate::sessions::AgentRegistry;
use crate::tokens::TokenIssuer;
use route::{parse_api_path, parse_query, resource_request, ApiRoute, PATCH_TYPE_PARAM};

/// How long the proxy waits for the agent's first answer (upstream: 30 s).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request body accepted (writes from Argo CD resource actions are small).
pub const MAX_REQUEST_BODY: usize = 4 << 20;
/// Answer parts buffered per request for a slow client.
const PART_BUFFER: usize = 16;
/// Default `--max-request-bodies-in-flight`: request bodies being received at once (each holds
/// its connection's TLS and HTTP buffers, up to ~100 KiB).
pub const DEFAULT_MAX_BODIES_IN_FLIGHT: usize = 64;
/// Default `--max-request-bodies-in-flight-per-agent` (argocd-server writes to a cluster one
/// resource action or deletion at a time; a body takes its place only while it arrives).
pub const DEFAULT_MAX_BODIES_IN_FLIGHT_PER_AGENT: usize = 8;
/// Request-body bytes the proxy holds at once, across all clients: two bodies of the largest size.
pub const MAX_BODY_BYTES_IN_FLIGHT: usize = 2 * MAX_REQUEST_BODY;
/// Request-body bytes one agent's bodies hold at once: one body of the largest size, so that one
/// agent leaves room for another's.
pub const MAX_AGENT_BODY_BYTES_IN_FLIGHT: usize = MAX_REQUEST_BODY;
/// The most a connection sends of a request body ahead of what the proxy reads: HTTP/1.1's read
/// buffer and HTTP/2's stream and connection windows.
pub const READ_QUANTUM: usize = 16 << 10;

/// Room for request bodies being received, shared by every connection of the proxy (see the
/// module docs): a body is admitted, or refused, at once, holding a place among the bodies in
/// flight and its declared length among their bytes, per agent and in all, until it is complete
/// or refused. Nothing waits for room, so no body holds room while waiting for more.
#[derive(Clone)]
pub struct BodyBudget {
    /// Bodies (`--max-request-bodies-in-flight`, `…-per-agent`).
    bodies: AgentCaps,
    /// Their declared lengths, a body without one counted at [`MAX_REQUEST_BODY`].
    bytes: AgentCaps,
    /// The caps of `bytes`: in all, and of one agent's.
    max_bytes: (usize, usize),
}

impl Default for BodyBudget {
    fn default() -> Self {
        Self::new(
            (
                DEFAULT_MAX_BODIES_IN_FLIGHT,
                DEFAULT_MAX_BODIES_IN_FLIGHT_PER_AGENT,
            ),
            (MAX_BODY_BYTES_IN_FLIGHT, MAX_AGENT_BODY_BYTES_IN_FLIGHT),
        )
    }
}

/// What an admitted body holds until it is complete or refused.
type BodyPlace = (AgentPlace, AgentPlace);

impl BodyBudget {
    /// At most `bodies.0` bodies at once in all and `bodies.1` of one agent's, declaring at most
    /// `bytes.0` bytes in all and `bytes.1` of one agent's.
    pub fn new(bodies: (usize, usize), bytes: (usize, usize)) -> Self {
        BodyBudget {
            bodies: AgentCaps::new(bodies.0, bodies.1),
            bytes: AgentCaps::new(bytes.0, bytes.1),
            max_bytes: bytes,
        }
    }

    /// A place for a body of `agent`'s of `size` bytes, or why there is none (which cap is full).
    fn admit(&self, agent: &str, size: usize) -> Result<BodyPlace, String> {
        Err(match self.bodies.admit(agent) {
            Err(CapFull::Agent(n)) => format!(
                "agent {agent} already has {n} request bodies being received, the most \
                 --max-request-bodies-in-flight-per-agent allows"
            ),
            Err(CapFull::All(n)) => format!(
                "the resource proxy already receives {n} request bodies, the most \
                 --max-request-bodies-in-flight allows"
            ),
            Ok(body) => match self.bytes.admit_n(agent, size) {
                Ok(bytes) => return Ok((body, bytes)),
                Err(CapFull::Agent(n)) => format!(
                    "agent {agent}'s request bodies being received declare {n} bytes; with this \
                     one's {size} they would pass the {} bytes one agent's may declare at once",
                    self.max_bytes.1
                ),
                Err(CapFull::All(n)) => format!(
                    "the request bodies being received declare {n} bytes; with this one's {size} \
                     they would pass the {} bytes the resource proxy holds at once",
                    self.max_bytes.0
                ),
            },
        })
    }
}

/// Body of every proxy response.
pub type ProxyBody = UnsyncBoxBody<Bytes, std::io::Error>;

/// The proxy's view of the principal.
pub struct ResourceProxy {
    /// Agents' sessions (their outboxes carry the requests).
    pub registry: Arc<AgentRegistry>,
    /// Waiting requests and connected agents.
    pub live: Arc<LiveRequests>,
    /// Validates the bearer tokens of self-registered clusters.
    pub tokens: Arc<TokenIssuer>,
    /// Requests, errors and latency.
    pub metrics: ProxyMetrics,
    /// Longest a request body may take to arrive (`--request-body-timeout`).
    pub body_timeout: Duration,
    /// Room for request bodies being received.
    pub body_budget: BodyBudget,
    /// How web terminals are bounded (`--terminal-*`) and observed.
    pub terminal: crate::terminal::TerminalPolicy,
}

/// Marks a response the proxy made itself instead of relaying the agent's answer: the Kubernetes
/// `Status` reason, which is also the `reason` label of the errors counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyFailure(pub &'static str);

/// Who sent a request, from its headers and the connection's client certificate: the bearer JWT's
/// `sub` (audience [`crate::tokens::AUDIENCE_RESOURCE_PROXY`], signature and expiry checked) when
/// an `Authorization` header is present, else the certificate's common name. A failure is the
/// message of the 401 to answer; it never echoes the token.
pub fn identify_caller(
    tokens: &TokenIssuer,
    certificate: Result<AgentName, String>,
    headers: &http::HeaderMap,
) -> Result<AgentName, String> {
    let refused = |message: String| {
        tracing::info!(reason = %message, "resource proxy: request refused");
        message
    };
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return certificate.map_err(|reason| {
            refused(format!(
                "the client certificate does not name an agent: {reason}"
            ))
        });
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty())
        .ok_or_else(|| refused("the Authorization header must be `Bearer <token>`".into()))?;
    let agent = tokens
        .validate_resource_proxy(token)
        .map_err(|e| refused(format!("the bearer token is refused: {e}")))?;
    AgentName::new(agent)
        .map_err(|e| refused(format!("the bearer token does not name an agent: {e}")))
}

/// The JSON of a Kubernetes `Status` failure with `code`, `reason` and `message`.
pub fn status_body(code: StatusCode, reason: &str, message: impl Into<String>) -> Vec<u8> {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message.into(),
        "reason": reason,
        "code": code.as_u16(),
    })
    .to_string()
    .into_bytes()
}

/// A Kubernetes `Status` failure response, marked as the proxy's own ([`ProxyFailure`]).
pub fn status_response(
    code: StatusCode,
    reason: &'static str,
    message: impl Into<String>,
) -> Response<ProxyBody> {
    let mut resp = Response::new(full(status_body(code, reason, message)));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp.extensions_mut().insert(ProxyFailure(reason));
    resp
}

/// An empty body (e.g. of a `101 Switching Protocols`).
pub fn empty_body() -> ProxyBody {
    full(Vec::new())
}

fn full(bytes: Vec<u8>) -> ProxyBody {
    Full::new(Bytes::from(bytes))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// The rest of a streamed answer after its first part; ends with an error (aborting the
/// response) when the agent goes away or, if `idle` is set, stays silent that long.
fn remaining_parts(
    waiter: LiveWaiter,
    idle: Option<Duration>,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send {
    futures::stream::unfold(Some(waiter), move |state| async move {
        let mut waiter = state?;
        let next = match idle {
            Some(d) => match tokio::time::timeout(d, waiter.recv()).await {
                Ok(r) => r,
                Err(_) => {
                    return Some((
                        Err(std::io::Error::other("the agent stopped answering")),
                        None,
                    ))
                }
            },
            None => waiter.recv().await,
        };
        match next {
            Some(LiveReply::Part { body, end, .. }) => {
                let frame = Ok(Frame::data(Bytes::from(body)));
                Some((frame, (!end).then_some(waiter)))
            }
            Some(LiveReply::AgentGone) | None => {
                Some((Err(std::io::Error::other("the agent went away")), None))
            }
            Some(LiveReply::Redis(_)) => None,
        }
    })
}

impl ResourceProxy {
    /// Handles one HTTP request and counts it in [`Self::metrics`]; `caller` is the client
    /// certificate's agent identity, which a bearer token overrides (see [`identify_caller`]).
    pub async fn serve_request(
        &self,
        caller: Result<AgentName, String>,
        req: Request<Incoming>,
    ) -> Response<ProxyBody> {
        let started = std::time::Instant::now();
        let resp = self.handle(caller, req).await;
        self.metrics.observe(
            resp.extensions()
                .get::<AgentName>()
                .map_or("", AgentName::as_str),
            resp.status().as_str(),
            resp.extensions().get::<ProxyFailure>().map(|f| f.0),
            started.elapsed(),
        );
        resp
    }

    /// Answers one HTTP request; the response carries the caller's [`AgentName`] (once known) and,
    /// when the proxy answered itself, a [`ProxyFailure`] in its extensions.
    pub async fn handle(
        &self,
        caller: Result<AgentName, String>,
        req: Request<Incoming>,
    ) -> Response<ProxyBody> {
        let agent = match identify_caller(&self.tokens, caller, req.headers()) {
            Ok(a) => a,
            Err(message) => {
                return status_response(StatusCode::UNAUTHORIZED, "Unauthorized", message)
            }
        };
        let mut resp = self.forward(&agent, req).await;
        resp.extensions_mut().insert(agent);
        resp
    }

    /// Relays a request of `agent`'s to it and its answer back.
    async fn forward(&self, agent: &AgentName, req: Request<Incoming>) -> Response<ProxyBody> {
        let path = req.uri().path().to_string();
        let params = parse_query(req.uri().query());
        let Some(route) = parse_api_path(&path) else {
            return status_response(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("{path} is not served by the resource proxy"),
            );
        };
        let method = req.method().clone();
        let allowed = match &route {
            ApiRoute::Discovery(_) | ApiRoute::ContainerLog { .. } => method == Method::GET,
            // GET: WebSocket; POST: SPDY, which is refused with a message saying so.
            ApiRoute::Exec { .. } => matches!(method, Method::GET | Method::POST),
            ApiRoute::Resource { .. } => matches!(
                method,
                Method::GET | Method::POST | Method::PATCH | Method::PUT | Method::DELETE
            ),
        };
        if !allowed {
            return status_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("{method} {path} is not supported by the resource proxy"),
            );
        }
        if params.get("watch").is_some_and(|w| w == "true" || w == "1") {
            return status_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "watch is not supported by the resource proxy",
            );
        }
        tracing::debug!(agent = agent.as_str(), %method, %path, "resource proxy request");
        if !self.live.is_connected(agent.as_str()) {
            return status_response(
                StatusCode::BAD_GATEWAY,
                "ServiceUnavailable",
                format!("agent {agent} is not connected"),
            );
        }
        let Some(session) = self.registry.get(agent.as_str()) else {
            return status_response(
                StatusCode::BAD_GATEWAY,
                "ServiceUnavailable",
                format!("agent {agent} is not connected"),
            );
        };
        if let ApiRoute::Exec { namespace, pod } = &route {
            let offer = match crate::terminal::websocket_offer(&req) {
                Ok(offer) => offer,
                Err(refused) => return refused,
            };
            // Only into a pod the agent lets the hub read (one Argo CD manages): upstream's Go
            // agent execs into any pod its ServiceAccount reaches, so the principal asks first.
            let read = ApiRoute::Resource {
                group: String::new(),
                version: "v1".into(),
                resource: "pods".into(),
                namespace: namespace.clone(),
                name: pod.clone(),
                subresource: String::new(),
            };
            let probe = self
                .relay(
                    agent,
                    &session,
                    &read,
                    Method::GET,
                    BTreeMap::new(),
                    Vec::new(),
                )
                .await;
            if !probe.status().is_success() {
                return probe;
            }
            return crate::terminal::upgrade(
                agent,
                &session,
                self.live.terminals(),
                &self.terminal,
                (namespace, pod),
                offer,
                req,
            );
        }
        let content_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = match read_body(
            req.into_body(),
            self.body_timeout,
            &self.body_budget,
            agent.as_str(),
        )
        .await
        {
            Ok(body) => body,
            Err(refused) => return refused,
        };
        let mut params = params;
        if method == Method::PATCH {
            params.insert(
                PATCH_TYPE_PARAM.to_string(),
                content_type.unwrap_or_else(|| "application/merge-patch+json".into()),
            );
        }
        let answer = self
            .relay(agent, &session, &route, method, params, body)
            .await;
        match &route {
            ApiRoute::Discovery(path) if path == "/version" => {
                version::answer(agent.as_str(), answer).await
            }
            _ => answer,
        }
    }

    /// Sends `route` as a request event to `agent` (connected, with `session`) and relays its answer.
    async fn relay(
        &self,
        agent: &AgentName,
        session: &Arc<crate::sessions::AgentSession>,
        route: &ApiRoute,
        method: Method,
        params: BTreeMap<String, String>,
        body: Vec<u8>,
    ) -> Response<ProxyBody> {
        let uuid = uuid::Uuid::new_v4().to_string();
        let (event, waiter, content, idle) = match route {
            ApiRoute::ContainerLog { namespace, pod } => {
                let log = ContainerLogRequest::from_params(&uuid, namespace, pod, &params);
                let follow = log.follow;
                let waiter = self.live.register(
                    agent.as_str(),
                    &uuid,
                    WaitKind::ContainerLog {
                        timestamps: log.timestamps,
                    },
                    PART_BUFFER,
                );
                (
                    Event::container_log_request("", method.as_str(), &log),
                    waiter,
                    "text/plain",
                    (!follow).then_some(ANSWER_TIMEOUT),
                )
            }
            _ => {
                let rr = resource_request(&uuid, method.as_str(), route, params, body);
                let waiter =
                    self.live
                        .register(agent.as_str(), &uuid, WaitKind::Resource, PART_BUFFER);
                (
                    Event::resource_request("", &rr),
                    waiter,
                    "application/json",
                    Some(ANSWER_TIMEOUT),
                )
            }
        };
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                return status_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    e.to_string(),
                )
            }
        };
        if let Err(e) = session.outbox.push(event) {
            return status_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                format!("cannot queue the request for agent {agent}: {e}"),
            );
        }
        self.answer(agent, waiter, content, idle).await
    }

    async fn answer(
        &self,
        agent: &AgentName,
        mut waiter: LiveWaiter,
        content_type: &'static str,
        idle: Option<Duration>,
    ) -> Response<ProxyBody> {
        let first = match tokio::time::timeout(ANSWER_TIMEOUT, waiter.recv()).await {
            Err(_) => {
                return status_response(
                    StatusCode::GATEWAY_TIMEOUT,
                    "Timeout",
                    format!("agent {agent} did not answer within {ANSWER_TIMEOUT:?}"),
                )
            }
            Ok(Some(LiveReply::Part { status, body, end })) => (status, body, end),
            Ok(Some(LiveReply::AgentGone) | None) => {
                return status_response(
                    StatusCode::BAD_GATEWAY,
                    "ServiceUnavailable",
                    format!("agent {agent} disconnected before answering"),
                )
            }
            Ok(Some(LiveReply::Redis(_))) => {
                return status_response(
                    StatusCode::BAD_GATEWAY,
                    "InternalError",
                    "the agent answered with a redis response",
                )
            }
        };
        let (status, body, end) = first;
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        // An error answer is a Kubernetes Status in JSON, also for logs.
        let content_type = if status.is_success() {
            content_type
        } else {
            "application/json"
        };
        let body = if end {
            full(body)
        } else {
            let head = futures::stream::once(async move {
                Ok::<_, std::io::Error>(Frame::data(Bytes::from(body)))
            });
            StreamBody::new(head.chain(remaining_parts(waiter, idle))).boxed_unsync()
        };
        let mut resp = Response::new(body);
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(content_type),
        );
        resp
    }
}

/// `resp` with `Connection: close` (HTTP/1.1; hyper leaves the header out of HTTP/2 responses).
fn closing(mut resp: Response<ProxyBody>) -> Response<ProxyBody> {
    resp.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    resp
}

/// Reads a request body of `agent`'s of at most [`MAX_REQUEST_BODY`] bytes that arrives within
/// `timeout`, once `budget` admitted it; otherwise the answer to send instead (413; 429 closing
/// the connection when the budget has no room for it; 408 closing the connection: a client that
/// stalls mid-body holds no buffer or task beyond the timeout). An empty body takes no place.
async fn read_body<B>(
    body: B,
    timeout: Duration,
    budget: &BodyBudget,
    agent: &str,
) -> Result<Vec<u8>, Response<ProxyBody>>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    if body.is_end_stream() {
        return Ok(Vec::new());
    }
    let hint = body.size_hint();
    if hint.lower() > MAX_REQUEST_BODY as u64 {
        return Err(status_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!(
                "request body of {} bytes refused (limit {MAX_REQUEST_BODY} bytes)",
                hint.lower()
            ),
        ));
    }
    let size = hint
        .exact()
        .map_or(MAX_REQUEST_BODY, |n| n as usize)
        .min(MAX_REQUEST_BODY);
    let _place = budget.admit(agent, size).map_err(|refused| {
        tracing::debug!(agent, "resource proxy: request body refused: {refused}");
        let mut resp = status_response(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            format!("{refused}: retry once they arrived"),
        );
        resp.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
        // The connection closes, so that it frees its buffers.
        closing(resp)
    })?;
    match tokio::time::timeout(timeout, read_all(Limited::new(body, size), size)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => Err(status_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!("request body refused (limit {size} bytes): {e}"),
        )),
        Err(_) => Err(closing(status_response(
            StatusCode::REQUEST_TIMEOUT,
            "Timeout",
            format!(
                "request body not received within {} (--request-body-timeout)",
                argocd_agent_runtime::flags::format_duration(timeout)
            ),
        ))),
    }
}

/// Reads `body` (of at most `size` bytes) whole into one buffer of that capacity: its pages are
/// touched only as the bytes arrive, and it is never copied to grow.
async fn read_all<B: hyper::body::Body>(body: B, size: usize) -> Result<Vec<u8>, B::Error> {
    let mut body = std::pin::pin!(body);
    let mut read = Vec::with_capacity(size);
    while let Some(frame) = body.frame().await.transpose()? {
        if let Ok(data) = frame.into_data() {
            bytes::BufMut::put(&mut read, data);
        }
    }
    Ok(read)
}

/// Binds `addr` and serves the proxy with `tls` (which must require client certificates) under
/// `policy` (handshake and header timeouts, blocklist); returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    tls: ReloadingServerConfig,
    proxy: Arc<ResourceProxy>,
    policy: crate::listener::ConnectionPolicy,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let handshake_timeout = policy.handshake_timeout;
    tokio::spawn(serve_tls_connections(
        listener,
        "resource proxy",
        tls,
        handshake_timeout,
        std::future::pending(),
        move |handshake, remote| {
            let proxy = proxy.clone();
            let policy = policy.clone();
            async move {
                let admitted = match crate::listener::admit(handshake, &policy).await {
                    Ok(a) => a,
                    Err((refusal, reason)) => {
                        tracing::info!(%remote, reason = refusal.reason(), "resource proxy: connection dropped: {reason}");
                        return;
                    }
                };
                let stream = admitted.stream;
                let caller = crate::listener::agent_of_certificate(
                    admitted.leaf.as_deref(),
                    &IdentitySource::CommonName,
                )
                .map(|id| id.name);
                let service = hyper::service::service_fn(move |req| {
                    let proxy = proxy.clone();
                    let caller = caller.clone();
                    async move { Ok::<_, Infallible>(proxy.serve_request(caller, req).await) }
                });
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder
                    .http1()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(policy.request_header_timeout)
                    .max_buf_size(READ_QUANTUM);
                builder
                    .http2()
                    .initial_stream_window_size(READ_QUANTUM as u32)
                    .initial_connection_window_size(READ_QUANTUM as u32);
                if let Err(e) = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(%remote, error = %e, "resource proxy connection ended with an error");
                }
            }
        },
    ));
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer() -> TokenIssuer {
        TokenIssuer::generate(Duration::from_secs(60), Duration::from_secs(120)).unwrap()
    }

    fn bearer(token: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        h
    }

    fn cert(name: &str) -> Result<AgentName, String> {
        Ok(AgentName::new(name).unwrap())
    }

    #[tokio::test]
    async fn a_stalled_request_body_is_answered_408_after_the_timeout_and_closes_the_connection() {
        let first =
            futures::stream::iter([Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![
                b'x';
                1024
            ])))]);
        let stalled = StreamBody::new(first.chain(futures::stream::pending()));
        let started = std::time::Instant::now();
        let refused = read_body(
            stalled,
            Duration::from_millis(200),
            &BodyBudget::default(),
            "a",
        )
        .await
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(refused.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(refused.headers()[http::header::CONNECTION], "close");
        assert_eq!(
            refused.extensions().get::<ProxyFailure>().map(|f| f.0),
            Some("Timeout")
        );
    }

    #[tokio::test]
    async fn request_bodies_over_the_limit_are_refused_from_their_declared_length() {
        let big = Full::new(Bytes::from(vec![0u8; MAX_REQUEST_BODY + 1]));
        let budget = BodyBudget::default();
        let refused = read_body(big, Duration::from_secs(30), &budget, "a")
            .await
            .unwrap_err();
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let small = Full::new(Bytes::from_static(b"{}"));
        assert_eq!(
            read_body(small, Duration::from_secs(30), &budget, "a")
                .await
                .unwrap(),
            b"{}"
        );
    }

    /// A body declaring `declared` bytes (a Content-Length) that sends `sent` of them and then
    /// stalls, unless it sent them all.
    struct Declared {
        sent: Option<Bytes>,
        declared: u64,
        stalls: bool,
    }

    impl Declared {
        fn new(sent: usize, declared: usize) -> Self {
            Declared {
                sent: Some(Bytes::from(vec![b'x'; sent])),
                declared: declared as u64,
                stalls: sent < declared,
            }
        }
    }

    /// `n` bytes sent in full.
    fn whole(n: usize) -> Declared {
        Declared::new(n, n)
    }

    impl hyper::body::Body for Declared {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            match self.sent.take() {
                Some(data) => std::task::Poll::Ready(Some(Ok(Frame::data(data)))),
                None if self.stalls => std::task::Poll::Pending,
                None => std::task::Poll::Ready(None),
            }
        }

        fn size_hint(&self) -> hyper::body::SizeHint {
            hyper::body::SizeHint::with_exact(self.declared)
        }
    }

    /// The status and message of a refusal.
    async fn refusal(answer: Result<Vec<u8>, Response<ProxyBody>>) -> (StatusCode, String) {
        let refused = answer.unwrap_err();
        let status = refused.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(refused.headers()[http::header::RETRY_AFTER], "1");
            assert_eq!(refused.headers()[http::header::CONNECTION], "close");
        }
        let body = refused.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        (status, body["message"].as_str().unwrap().to_string())
    }

    #[tokio::test]
    async fn bodies_past_a_cap_of_bodies_in_flight_are_answered_429_at_once_and_empty_ones_take_no_place(
    ) {
        let budget = BodyBudget::new((3, 2), (MAX_BODY_BYTES_IN_FLIGHT, MAX_REQUEST_BODY));
        let timeout = Duration::from_millis(500);
        let stalled = |agent| read_body(Declared::new(10, 100), timeout, &budget, agent);
        let held = futures::future::join_all([stalled("a"), stalled("a"), stalled("b")]);
        let refused = async {
            // Once the three are admitted (they hold their places until their timeout).
            tokio::task::yield_now().await;
            let started = std::time::Instant::now();
            let mine = read_body(whole(10), timeout, &budget, "a").await;
            let all = read_body(whole(10), timeout, &budget, "c").await;
            let empty = read_body(Full::new(Bytes::new()), timeout, &budget, "c").await;
            (mine, all, empty, started.elapsed())
        };
        let (held, (mine, all, empty, took)) = tokio::join!(held, refused);
        assert!(
            took < timeout,
            "refused at once, not after waiting ({took:?})"
        );
        assert_eq!(empty.unwrap(), Vec::<u8>::new());
        let (status, message) = refusal(mine).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            message.contains("--max-request-bodies-in-flight-per-agent"),
            "{message}"
        );
        let (status, message) = refusal(all).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            message.contains("--max-request-bodies-in-flight allows"),
            "{message}"
        );
        for h in held {
            assert_eq!(refusal(h).await.0, StatusCode::REQUEST_TIMEOUT);
        }
        // Their places are free again.
        let read = read_body(whole(10), timeout, &budget, "a").await;
        assert_eq!(read.unwrap().len(), 10);
    }

    #[tokio::test]
    async fn bodies_whose_declared_bytes_do_not_fit_are_refused_per_agent_and_in_all() {
        let budget = BodyBudget::new((10, 10), (100, 60));
        let timeout = Duration::from_millis(500);
        let held = futures::future::join_all([
            read_body(Declared::new(1, 50), timeout, &budget, "a"),
            read_body(Declared::new(1, 40), timeout, &budget, "b"),
        ]);
        let others = async {
            tokio::task::yield_now().await;
            let mine = read_body(whole(20), timeout, &budget, "a").await;
            let all = read_body(whole(20), timeout, &budget, "c").await;
            // What fits is read at once: the bytes are admitted, not waited for.
            let fits = read_body(whole(10), timeout, &budget, "c").await;
            (mine, all, fits)
        };
        let (held, (mine, all, fits)) = tokio::join!(held, others);
        assert_eq!(fits.unwrap().len(), 10);
        let (status, message) = refusal(mine).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            message.contains("declare 50 bytes; with this one's 20"),
            "{message}"
        );
        assert!(message.contains("one agent's may declare"), "{message}");
        let (status, message) = refusal(all).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(message.contains("declare 90 bytes"), "{message}");
        for h in held {
            assert_eq!(refusal(h).await.0, StatusCode::REQUEST_TIMEOUT);
        }
        // A body without a declared length counts as the largest.
        let budget = BodyBudget::default();
        let unknown = || {
            StreamBody::new(futures::stream::pending::<
                Result<Frame<Bytes>, std::io::Error>,
            >())
        };
        let (first, second) = tokio::join!(
            read_body(unknown(), timeout, &budget, "a"),
            read_body(unknown(), timeout, &budget, "a")
        );
        assert_eq!(refusal(first).await.0, StatusCode::REQUEST_TIMEOUT);
        assert_eq!(refusal(second).await.0, StatusCode::TOO_MANY_REQUESTS);
    }

    #[test]
    fn a_bearer_token_names_the_agent_over_the_certificate() {
        let tokens = issuer();
        let t = tokens
            .issue_resource_proxy("agent-a", Duration::from_secs(60))
            .unwrap();
        let who = identify_caller(&tokens, cert("shared-client"), &bearer(&t)).unwrap();
        assert_eq!(who.as_str(), "agent-a");
        let who = identify_caller(&tokens, cert("agent-b"), &http::HeaderMap::new()).unwrap();
        assert_eq!(who.as_str(), "agent-b");
    }

    #[test]
    fn bad_bearer_tokens_are_401_even_with_a_good_certificate() {
        let tokens = issuer();
        let foreign = issuer()
            .issue_resource_proxy("agent-a", Duration::from_secs(60))
            .unwrap();
        let access = tokens
            .issue_access(&crate::tokens::Subject {
                client_id: "agent-a".into(),
                mode: "managed".into(),
            })
            .unwrap();
        for headers in [bearer(&foreign), bearer(&access), bearer(""), {
            let mut h = http::HeaderMap::new();
            h.insert(http::header::AUTHORIZATION, "Basic YTpi".parse().unwrap());
            h
        }] {
            let refused = identify_caller(&tokens, cert("agent-a"), &headers).unwrap_err();
            assert!(!refused.contains("eyJ"), "no token echoed: {refused}");
        }
    }
}
