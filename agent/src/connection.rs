//! The agent's link to its principal: dial, authenticate, subscribe, run the event stream, and
//! reconnect forever.
//!
//! Owns: the transport's settings (TCP to `--server-address`, TLS with the hot-reloading client
//! config, ALPN h2, SNI `--tls-server-name`, HTTP/2 keepalive so a half-open link is noticed; or,
//! with `--enable-websocket`, gRPC over WebSocket on HTTP/1.1 for every call, ALPN http/1.1),
//! dialled by the runtime's [`argocd_agent_runtime::dial`]; the session tokens (Authenticate with
//! mTLS, RefreshToken when the access token runs out — see [`token`]); the `Subscribe` stream
//! (streaming without waiting for the principal's response headers, as grpc-go's client does)
//! driven by `proto::sync::run_stream` against the process-wide [`Outbox`]; the reconnection
//! schedule ([`backoff`]); the classification of failures into transient ones and refusals that
//! need an operator (TLS failures by their rustls error, not their text); and what the outside
//! sees of all this:
//! one log line per state change, readiness, and the connection metrics.
//!
//! It never listens: the principal cannot reach the agent, the agent always dials.

pub mod backoff;
pub mod token;

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use argocd_agent_proto::event::{Event, AGENT_SOURCE};
use argocd_agent_proto::pb::authapi::authentication_client::AuthenticationClient;
use argocd_agent_proto::pb::authapi::{AuthRequest, RefreshTokenRequest};
use argocd_agent_proto::pb::eventstreamapi::event_stream_client::EventStreamClient;
use argocd_agent_proto::pb::eventstreamapi::Event as WireEvent;
use argocd_agent_proto::pb::versionapi::version_client::VersionClient;
use argocd_agent_proto::pb::versionapi::VersionRequest;
use argocd_agent_proto::sync::{run_stream, EventHandler, Lanes, Outbox, StreamEnd};
use argocd_agent_proto::version::{auth_version_for, check_compatible};
use argocd_agent_runtime::dial::{
    dial_grpc, dial_grpc_plaintext, dial_grpc_websocket, error_in, rustls_error_in, ConnectError,
    GrpcChannel, GrpcDialOptions, TlsTarget, WebSocketTarget,
};
use argocd_agent_runtime::flags::{format_duration, AgentMode, HostPort};
use argocd_agent_runtime::telemetry::HealthState;
use argocd_agent_runtime::tls::ReloadingClientConfig;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::CompressionEncoding;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};
use tracing::{debug, error, info, warn};

use crate::config::{AgentConfig, KeepaliveConfig};
use crate::metrics::AgentMetrics;
use crate::placement::PrincipalNamespace;
pub use backoff::ReconnectBackoff;
pub use token::{jwt_expiry, SessionTokens, TokenStep};

/// Authentication method sent in `AuthRequest.method` (the credential is the client certificate).
pub const AUTH_METHOD_MTLS: &str = "mtls";
/// `AuthRequest.method` behind a service mesh (`--insecure-plaintext`): the principal reads this
/// agent's name from the header the mesh sidecar sets (upstream agents' `--creds=header:`).
pub const AUTH_METHOD_HEADER: &str = "header";
/// Limit on TCP connect + TLS handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Limit on each unary call (Version, Authenticate, RefreshToken).
const RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// How long opening `Subscribe` waits for the principal's response headers before streaming
/// without them. A refusal (a stale token, an unknown agent) comes back at once; an accepted call
/// gets its headers from grpc-go's server (upstream's principal) only with the first message that
/// principal sends, and one with nothing to send (an autonomous agent reconnecting to a principal
/// that resynced it before) sends none until the agent has spoken: waiting for them would wait
/// forever. grpc-go's client (upstream's agent) never waits for them.
const HEADERS_GRACE: Duration = Duration::from_secs(1);
/// Inbound processing lanes per stream (events of one resource stay in one lane, in order).
const LANES: usize = 8;
/// Events buffered per lane before the stream reader waits.
const LANE_DEPTH: usize = 64;
/// ACKs and heartbeats buffered ahead of the outbound stream.
const CONTROL_BUFFER: usize = 256;
/// Outbound messages buffered between the pump and the HTTP/2 stream.
const OUTBOUND_BUFFER: usize = 64;
/// How long handlers may finish in-flight events after a stream ends before they are abandoned
/// (the principal resends anything not ACKed).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Share of the outbox capacity above which the agent stops calling itself ready while offline.
const OUTBOX_HEALTHY_PERCENT: usize = 90;

/// Everything the connection needs from the agent's configuration.
#[derive(Debug, Clone)]
pub struct ConnectionSettings {
    /// The principal's endpoint.
    pub server: HostPort,
    /// SNI and the name the principal's certificate must carry.
    pub server_name: String,
    /// Mode announced in `AuthRequest.mode`.
    pub mode: AgentMode,
    /// Namespace announced in `AuthRequest.agentNamespace`.
    pub namespace: String,
    /// HTTP/2 keepalive; `None` = off.
    pub keepalive: Option<KeepaliveConfig>,
    /// Heartbeat (`ping` event) interval; `None` = off.
    pub heartbeat_interval: Option<Duration>,
    /// gRPC message size limit, both directions.
    pub max_message_size: usize,
    /// Cap of the reconnection delay.
    pub backoff_max: Duration,
    /// Send gzip-compressed messages (`--enable-compression`).
    pub compression: bool,
    /// Carry every call as gRPC over WebSocket on HTTP/1.1 (`--enable-websocket`).
    pub websocket: bool,
    /// Maximum distinct resources the outbox holds (for the offline readiness rule).
    pub outbox_capacity: usize,
}

impl ConnectionSettings {
    /// Settings from the validated configuration and the outbox capacity.
    pub fn from_config(config: &AgentConfig, outbox_capacity: usize) -> Self {
        ConnectionSettings {
            server: config.server_address.clone(),
            server_name: config.tls_server_name.clone(),
            mode: config.mode,
            namespace: config.namespace.clone(),
            keepalive: config.keepalive,
            heartbeat_interval: config.heartbeat_interval,
            max_message_size: config.grpc_max_message_size,
            backoff_max: config.reconnect_backoff_max,
            compression: config.enable_compression,
            websocket: config.enable_websocket,
            outbox_capacity,
        }
    }
}

/// Where in the connection sequence something failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// TCP connect, TLS handshake, HTTP/2 set-up.
    Connect,
    /// `Authenticate`.
    Authenticate,
    /// `RefreshToken`.
    RefreshToken,
    /// Opening `Subscribe`.
    Subscribe,
    /// The open event stream.
    Stream,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Stage::Connect => "connect",
            Stage::Authenticate => "authenticate",
            Stage::RefreshToken => "refresh token",
            Stage::Subscribe => "subscribe",
            Stage::Stream => "event stream",
        }
    }
}

/// A failed connection attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Where it failed.
    pub stage: Stage,
    /// What happened (the principal's status or the transport error chain; never a token).
    pub message: String,
    /// For refusals that retrying will not cure: what the operator should fix.
    pub fix: Option<&'static str>,
}

impl Failure {
    fn transient(stage: Stage, message: impl Into<String>) -> Self {
        Failure {
            stage,
            message: message.into(),
            fix: None,
        }
    }

    /// Whether this failure needs an operator (retried at the maximum delay).
    pub fn is_refusal(&self) -> bool {
        self.fix.is_some()
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {}", self.stage.as_str(), self.message)?;
        if let Some(fix) = self.fix {
            write!(f, " ({fix})")?;
        }
        Ok(())
    }
}

/// gzip for what we send when `compression` is set (upstream's `--enable-compression`);
/// gzip-compressed answers are accepted either way.
macro_rules! with_gzip {
    ($client:expr, $compression:expr) => {{
        let client = $client.accept_compressed(CompressionEncoding::Gzip);
        if $compression {
            client.send_compressed(CompressionEncoding::Gzip)
        } else {
            client
        }
    }};
}

/// What the principal's unauthenticated `Version` RPC answers, if it answers in time.
async fn principal_version(channel: &GrpcChannel, compression: bool) -> Option<String> {
    let mut client = with_gzip!(VersionClient::new(channel.clone()), compression);
    match tokio::time::timeout(RPC_TIMEOUT, client.version(VersionRequest::default())).await {
        Ok(Ok(resp)) => Some(resp.into_inner().version),
        Ok(Err(status)) => {
            debug!(error = %status, "the principal's Version call failed; sending our own version");
            None
        }
        Err(_) => None,
    }
}

/// Classifies a gRPC status from the principal.
pub fn classify_status(stage: Stage, status: &Status) -> Failure {
    let message = format!("{:?}: {}", status.code(), status.message());
    let fix = match (status.code(), stage) {
        (Code::PermissionDenied, _) => Some(
            "the principal does not accept this agent: check that the name in --tls-client-cert is an agent the \
             principal knows, that the principal allows --mode, and that --namespace is right",
        ),
        (Code::Unauthenticated, Stage::Authenticate) => Some(
            "the principal does not accept the client certificate: check that --tls-client-cert/--tls-client-key \
             were issued by the principal's agent CA and have not expired",
        ),
        (Code::FailedPrecondition, _) => Some(
            "the principal and this agent speak incompatible protocol versions: upgrade the older side",
        ),
        (Code::InvalidArgument, _) => {
            Some("the principal refused the request as invalid: check --mode and --namespace")
        }
        (Code::Unimplemented, _) => Some(
            "the server at --server-address does not serve the argocd-agent API: check the address and port",
        ),
        _ => None,
    };
    Failure {
        stage,
        message,
        fix,
    }
}

/// What to fix when the two ends (or a proxy between them) do not agree on HTTP/2 versus
/// HTTP/1.1: `websocket` is whether this agent runs with `--enable-websocket`.
fn protocol_fix(websocket: bool) -> &'static str {
    if websocket {
        "the principal does not serve gRPC over WebSocket on HTTP/1.1 (it offered no http/1.1): start it \
         with --enable-websocket, or drop --enable-websocket here if nothing between the two needs it"
    } else {
        "the principal, or a proxy or load balancer between it and this agent, does not speak HTTP/2: \
         if what is in between passes only HTTP/1.1, start the principal and this agent with \
         --enable-websocket (gRPC over WebSocket)"
    }
}

/// Classifies a transport error (TCP, TLS, HTTP/2) by the TLS error in its chain, if any, or a
/// protocol the server negotiated that this agent does not speak (`websocket`: whether it runs
/// with `--enable-websocket`).
fn classify_transport(error: &(dyn StdError + 'static), websocket: bool) -> Failure {
    let fix = match rustls_error_in(error) {
        Some(rustls::Error::AlertReceived(rustls::AlertDescription::NoApplicationProtocol)) => {
            Some(protocol_fix(websocket))
        }
        Some(rustls::Error::AlertReceived(_)) => Some(
            "the principal rejected the TLS handshake: check that --tls-client-cert/--tls-client-key were issued \
             by the principal's agent CA and have not expired",
        ),
        Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented) => Some(
            "the principal's certificate is not trusted: check that --tls-ca holds the CA that signed it and that \
             --tls-server-name matches a name in it",
        ),
        _ => match error_in::<ConnectError>(error) {
            Some(ConnectError::NotHttp2(_) | ConnectError::NotHttp1(_)) => {
                Some(protocol_fix(websocket))
            }
            _ => None,
        },
    };
    Failure {
        stage: Stage::Connect,
        message: error_chain(error),
        fix,
    }
}

/// An error and its sources, joined with ": " (tonic's transport error alone says only
/// "transport error").
fn error_chain(e: &(dyn StdError + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// How one attempt ended.
enum Attempt {
    /// Never got a stream.
    Failed(Failure),
    /// A stream was up for `lasted` and then ended.
    Ended { lasted: Duration, reason: Failure },
    /// The process is shutting down.
    Shutdown,
}

/// What another part of the agent needs to make calls of its own to the principal over the
/// current connection (the web terminal's `StreamTerminal`, container logs' `StreamLogs`): the channel, the access token of the
/// current stream, and whether to send gzip.
#[derive(Clone)]
pub struct LinkState {
    /// The channel of the current stream (an HTTP/2 connection, or per-call WebSockets).
    pub channel: GrpcChannel,
    /// The access token `Subscribe` was opened with.
    pub token: MetadataValue<tonic::metadata::Ascii>,
    /// The session's refresh token: access tokens last minutes (`--access-token-lifetime`), a
    /// stream far longer.
    pub refresh: String,
    /// `--enable-compression`.
    pub compression: bool,
}

impl LinkState {
    /// `message` as a request carrying a current access token (raw JWT in `authorization`): one
    /// refreshed for it, or the stream's when the refresh fails (the call then says why).
    pub async fn request<T>(&self, message: T) -> tonic::Request<T> {
        let auth = AuthenticationClient::new(self.channel.clone());
        let mut auth = with_gzip!(auth, self.compression);
        let req = RefreshTokenRequest {
            refresh_token: self.refresh.clone(),
        };
        let token = match tokio::time::timeout(RPC_TIMEOUT, auth.refresh_token(req)).await {
            Ok(Ok(resp)) => MetadataValue::try_from(resp.into_inner().access_token).ok(),
            _ => None,
        };
        let mut request = tonic::Request::new(message);
        request
            .metadata_mut()
            .insert("authorization", token.unwrap_or_else(|| self.token.clone()));
        request
    }

    /// The `StreamLogs` client, sending gzip when the agent does on its stream, and accepting it.
    pub fn log_client(
        &self,
    ) -> argocd_agent_proto::pb::logstreamapi::log_stream_service_client::LogStreamServiceClient<
        GrpcChannel,
    > {
        use argocd_agent_proto::pb::logstreamapi::log_stream_service_client::LogStreamServiceClient;
        with_gzip!(
            LogStreamServiceClient::new(self.channel.clone()),
            self.compression
        )
    }

    /// `client` sending gzip when the agent does on its stream, and accepting it.
    pub fn terminal_client(
        &self,
    ) -> argocd_agent_proto::pb::terminalstreamapi::terminal_stream_service_client::TerminalStreamServiceClient<GrpcChannel>{
        use argocd_agent_proto::pb::terminalstreamapi::terminal_stream_service_client::TerminalStreamServiceClient;
        with_gzip!(
            TerminalStreamServiceClient::new(self.channel.clone()),
            self.compression
        )
    }
}

/// The current [`LinkState`], `None` while the agent is not connected. Cheap to clone.
#[derive(Clone, Default)]
pub struct PrincipalLink(Arc<std::sync::Mutex<Option<LinkState>>>);

impl PrincipalLink {
    /// The link of the current stream, if any.
    pub fn current(&self) -> Option<LinkState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, state: Option<LinkState>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = state;
    }
}

/// The agent's connection to the principal. One per process; [`Connection::run`] loops until
/// shutdown, reconnecting as needed. The [`Outbox`] outlives every stream.
pub struct Connection {
    settings: ConnectionSettings,
    /// Client TLS; `None` = `--insecure-plaintext` (a service mesh secures the link).
    tls: Option<ReloadingClientConfig>,
    outbox: Arc<Outbox>,
    metrics: AgentMetrics,
    health: HealthState,
    tokens: Option<SessionTokens>,
    principal_version: Option<String>,
    /// Where the principal's namespace from login answers goes, if anyone needs it.
    principal_namespace: Option<Arc<PrincipalNamespace>>,
    link: PrincipalLink,
}

impl Connection {
    /// A connection that has not dialled yet.
    pub fn new(
        settings: ConnectionSettings,
        tls: Option<ReloadingClientConfig>,
        outbox: Arc<Outbox>,
        metrics: AgentMetrics,
        health: HealthState,
    ) -> Self {
        Connection {
            settings,
            tls,
            outbox,
            metrics,
            health,
            tokens: None,
            principal_version: None,
            principal_namespace: None,
            link: PrincipalLink::default(),
        }
    }

    /// Records the principal's namespace from every login answer in `into` (destination-based
    /// mapping moves Applications of that namespace into the agent's).
    pub fn report_principal_namespace(mut self, into: Arc<PrincipalNamespace>) -> Self {
        self.principal_namespace = Some(into);
        self
    }

    /// The link other parts of the agent make their own calls over.
    pub fn link(&self) -> PrincipalLink {
        self.link.clone()
    }

    /// Connects, streams, and reconnects until `shutdown` becomes true (or its sender is
    /// dropped). Inbound events go to `handler`.
    pub async fn run<H: EventHandler>(mut self, handler: Arc<H>, shutdown: watch::Receiver<bool>) {
        let server = self.settings.server.to_string();
        let mut backoff = ReconnectBackoff::new(self.settings.backoff_max);
        // What was last logged at warn/error, so a repeated failure is logged once.
        let mut last_logged: Option<String> = None;
        let mut failed_attempts: u32 = 0;
        self.health
            .set_ready(false, format!("connecting to the principal at {server}"));
        loop {
            if *shutdown.borrow() {
                break;
            }
            let attempt = self.attempt(&handler, &shutdown, failed_attempts).await;
            let delay = match attempt {
                Attempt::Shutdown => break,
                Attempt::Ended { lasted, reason } => {
                    failed_attempts = 0;
                    if lasted >= backoff::STABLE_AFTER {
                        backoff.reset();
                    }
                    let delay = if reason.is_refusal() {
                        backoff.max()
                    } else {
                        backoff.next_delay()
                    };
                    let connected_for = format_duration(Duration::from_secs(lasted.as_secs()));
                    let retry_in = format_duration(round_delay(delay));
                    if reason.is_refusal() {
                        error!(principal = %server, connected_for = %connected_for,
                            "the principal ended the stream and refuses this agent: {reason}; reconnecting in {retry_in}");
                    } else {
                        warn!(principal = %server, connected_for = %connected_for,
                            "disconnected from the principal: {reason}; reconnecting in {retry_in}");
                    }
                    self.set_offline_readiness(Some(&reason));
                    last_logged = Some(reason.to_string());
                    delay
                }
                Attempt::Failed(failure) => {
                    failed_attempts = failed_attempts.saturating_add(1);
                    let delay = if failure.is_refusal() {
                        backoff.max()
                    } else {
                        backoff.next_delay()
                    };
                    let summary = failure.to_string();
                    let retry_in = format_duration(round_delay(delay));
                    if last_logged.as_deref() == Some(summary.as_str()) {
                        debug!(principal = %server, attempts = failed_attempts, "still cannot connect to the principal: {summary}; retrying in {retry_in}");
                    } else if failure.is_refusal() {
                        error!(principal = %server, "the principal refuses this agent: {summary}; retrying in {retry_in}");
                    } else {
                        warn!(principal = %server, "cannot connect to the principal: {summary}; retrying in {retry_in}");
                    }
                    last_logged = Some(summary);
                    self.set_offline_readiness(Some(&failure));
                    delay
                }
            };
            let mut stop = shutdown.clone();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        self.metrics.connection_status.set(0);
        debug!("connection loop stopped");
    }

    /// Readiness while not connected: ready (working offline) unless the principal refuses this
    /// agent or the outbound queue is close to full.
    fn set_offline_readiness(&self, failure: Option<&Failure>) {
        if let Some(f) = failure.filter(|f| f.is_refusal()) {
            self.health
                .set_ready(false, format!("the principal refuses this agent: {f}"));
            return;
        }
        let queued = self.outbox.resources();
        let limit = self.settings.outbox_capacity / 100 * OUTBOX_HEALTHY_PERCENT;
        if queued >= limit.max(1) {
            self.health.set_ready(
                false,
                format!(
                    "offline from the principal and the outbound queue is nearly full ({queued} resources)"
                ),
            );
        } else {
            // Working offline: local reconciliation goes on and changes queue up for later.
            self.health.set_ready(true, "");
        }
    }

    async fn attempt<H: EventHandler>(
        &mut self,
        handler: &Arc<H>,
        shutdown: &watch::Receiver<bool>,
        failed_before: u32,
    ) -> Attempt {
        let channel = match self.dial().await {
            Ok(c) => c,
            Err(f) => return Attempt::Failed(f),
        };
        let mut stale_token_retried = false;
        let (out_tx, inbound) = loop {
            let (out_tx, out_rx) = mpsc::channel(OUTBOUND_BUFFER);
            match self.subscribe(&channel, out_rx).await {
                Ok(inbound) => break (out_tx, inbound),
                Err(SubscribeFailure::StaleToken) if !stale_token_retried => {
                    stale_token_retried = true;
                }
                Err(SubscribeFailure::StaleToken) => {
                    return Attempt::Failed(Failure::transient(
                        Stage::Subscribe,
                        "the principal rejected a new session token",
                    ))
                }
                Err(SubscribeFailure::Failed(f)) => return Attempt::Failed(f),
            }
        };

        if let Some((token, refresh)) = self.tokens.as_ref().and_then(|t| {
            let access = MetadataValue::try_from(t.access()).ok()?;
            Some((access, t.refresh().to_string()))
        }) {
            self.link.set(Some(LinkState {
                channel: channel.clone(),
                token,
                refresh,
                compression: self.settings.compression,
            }));
        }
        self.metrics.connections.inc();
        self.metrics.connection_status.set(1);
        self.health.set_ready(true, "");
        if failed_before > 0 {
            info!(principal = %self.settings.server, failed_attempts = failed_before, "connected to the principal");
        } else {
            info!(principal = %self.settings.server, "connected to the principal");
        }
        let started = Instant::now();

        let (control_tx, mut control_rx) = mpsc::channel(CONTROL_BUFFER);
        let lanes = Lanes::start(handler.clone(), LANES, LANE_DEPTH, control_tx.clone());
        let heartbeat = self.settings.heartbeat_interval.map(|every| {
            let control = control_tx.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    // A full control lane means traffic is flowing: no ping needed.
                    if let Err(mpsc::error::TrySendError::Closed(_)) =
                        control.try_send(Box::new(Event::ping(AGENT_SOURCE)))
                    {
                        return;
                    }
                }
            })
        });
        drop(control_tx);

        let mut stop = shutdown.clone();
        let metrics = self.metrics.clone();
        let end = run_stream(
            inbound,
            out_tx,
            &self.outbox,
            &mut control_rx,
            &lanes,
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
            |ev| metrics.observe_received(ev),
        )
        .await;

        if let Some(h) = heartbeat {
            h.abort();
        }
        // ACKs for a dead stream are worthless: closing the control lane lets the lanes stop
        // after their current event.
        drop(control_rx);
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, lanes.drain()).await;
        self.metrics.connection_status.set(0);
        self.link.set(None);

        let shutting_down = *shutdown.borrow() || shutdown.has_changed().is_err();
        let reason = match end {
            StreamEnd::Shutdown if shutting_down => return Attempt::Shutdown,
            StreamEnd::Shutdown => Failure::transient(Stage::Stream, "the HTTP/2 stream closed"),
            StreamEnd::PeerClosed => {
                Failure::transient(Stage::Stream, "the principal closed the stream")
            }
            StreamEnd::Error(status) => {
                if status.code() == Code::Unauthenticated {
                    self.tokens = None;
                }
                classify_status(Stage::Stream, &status)
            }
        };
        Attempt::Ended {
            lasted: started.elapsed(),
            reason,
        }
    }

    /// Opens the channel: TCP, TLS (ALPN h2, SNI), HTTP/2 keepalive; without TLS under
    /// `--insecure-plaintext`; with `--enable-websocket`, gRPC over WebSocket (ALPN http/1.1, a
    /// connection per call, each pinged per the keepalive).
    async fn dial(&self) -> Result<GrpcChannel, Failure> {
        let s = &self.settings;
        let options = GrpcDialOptions {
            connect_timeout: Some(CONNECT_TIMEOUT),
            keepalive: s.keepalive,
        };
        let classify = |e: &(dyn StdError + 'static)| classify_transport(e, s.websocket);
        let tls = match &self.tls {
            None if s.websocket => {
                let target =
                    WebSocketTarget::<ReloadingClientConfig>::Plaintext(s.server.to_string());
                return dial_grpc_websocket(target, options, s.max_message_size)
                    .await
                    .map(GrpcChannel::WebSocket)
                    .map_err(|e| classify(&e));
            }
            None => {
                return dial_grpc_plaintext(&s.server.to_string(), options)
                    .await
                    .map(GrpcChannel::Http2)
                    .map_err(|e| classify(&e))
            }
            Some(tls) => tls,
        };
        let server_name = ServerName::try_from(s.server_name.clone()).map_err(|e| {
            Failure::transient(
                Stage::Connect,
                format!("--tls-server-name {:?} is not usable: {e}", s.server_name),
            )
        })?;
        let target = TlsTarget::new(s.server.to_string(), server_name);
        if s.websocket {
            return dial_grpc_websocket(
                WebSocketTarget::Tls(target, tls.clone()),
                options,
                s.max_message_size,
            )
            .await
            .map(GrpcChannel::WebSocket)
            .map_err(|e| classify(&e));
        }
        dial_grpc(&target, tls.clone(), options)
            .await
            .map(GrpcChannel::Http2)
            .map_err(|e| classify(&e))
    }

    /// A usable access token: the held one, a refreshed one, or a new session. Returns the
    /// token and whether it was obtained just now.
    async fn access_token(&mut self, channel: &GrpcChannel) -> Result<(String, bool), Failure> {
        let limit = self.settings.max_message_size;
        let auth = AuthenticationClient::new(channel.clone())
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        let mut auth = with_gzip!(auth, self.settings.compression);
        if let Some(tokens) = &self.tokens {
            match tokens.next_step(unix_now()) {
                TokenStep::UseAccess => return Ok((tokens.access().to_string(), false)),
                TokenStep::Refresh => {
                    let req = RefreshTokenRequest {
                        refresh_token: tokens.refresh().to_string(),
                    };
                    match tokio::time::timeout(RPC_TIMEOUT, auth.refresh_token(req)).await {
                        Ok(Ok(resp)) => {
                            let resp = resp.into_inner();
                            if !resp.access_token.is_empty() {
                                let refresh = if resp.refresh_token.is_empty() {
                                    tokens.refresh().to_string()
                                } else {
                                    resp.refresh_token
                                };
                                let fresh = SessionTokens::new(resp.access_token, refresh);
                                let access = fresh.access().to_string();
                                self.tokens = Some(fresh);
                                debug!("refreshed the session token");
                                return Ok((access, true));
                            }
                        }
                        Ok(Err(status)) => {
                            self.metrics.auth_failures.inc();
                            debug!(error = %classify_status(Stage::RefreshToken, &status),
                                "token refresh refused; authenticating again");
                        }
                        Err(_) => {
                            return Err(Failure::transient(
                                Stage::RefreshToken,
                                format!("no answer within {}", format_duration(RPC_TIMEOUT)),
                            ))
                        }
                    }
                }
                TokenStep::Authenticate => {}
            }
        }
        self.tokens = None;
        // Upstream principals accept only their own release string: ask which one this is first
        // (the Version RPC needs no authentication). No answer: send ours.
        let principal_version = principal_version(channel, self.settings.compression).await;
        let req = AuthRequest {
            method: if self.tls.is_some() {
                AUTH_METHOD_MTLS
            } else {
                AUTH_METHOD_HEADER
            }
            .to_string(),
            credentials: Default::default(),
            mode: self.settings.mode.as_str().to_string(),
            version: auth_version_for(principal_version.as_deref()),
            agent_namespace: self.settings.namespace.clone(),
        };
        let resp = match tokio::time::timeout(RPC_TIMEOUT, auth.authenticate(req)).await {
            Ok(Ok(resp)) => resp.into_inner(),
            Ok(Err(status)) => {
                self.metrics.auth_failures.inc();
                return Err(classify_status(Stage::Authenticate, &status));
            }
            Err(_) => {
                return Err(Failure::transient(
                    Stage::Authenticate,
                    format!("no answer within {}", format_duration(RPC_TIMEOUT)),
                ))
            }
        };
        if resp.access_token.is_empty() {
            return Err(Failure::transient(
                Stage::Authenticate,
                "the principal answered without an access token",
            ));
        }
        if self.principal_version.as_deref() != Some(resp.version.as_str()) {
            match check_compatible(&resp.version) {
                Ok(()) => {
                    info!(principal_version = %resp.version, principal_namespace = %resp.principal_namespace,
                    "authenticated with the principal")
                }
                Err(e) if resp.version.is_empty() => {
                    debug!(error = %e, "the principal did not say its version")
                }
                Err(e) => warn!(principal_version = %resp.version, error = %e,
                    "the principal's version may not be compatible with this agent"),
            }
            self.principal_version = Some(resp.version.clone());
        }
        if let Some(into) = &self.principal_namespace {
            into.set(&resp.principal_namespace);
        }
        let tokens = SessionTokens::new(resp.access_token, resp.refresh_token);
        let access = tokens.access().to_string();
        self.tokens = Some(tokens);
        Ok((access, true))
    }

    /// Opens `Subscribe` with a valid access token (`authorization` metadata, raw JWT).
    async fn subscribe(
        &mut self,
        channel: &GrpcChannel,
        out_rx: mpsc::Receiver<WireEvent>,
    ) -> Result<Inbound, SubscribeFailure> {
        let limit = self.settings.max_message_size;
        let (access, fresh) = self
            .access_token(channel)
            .await
            .map_err(SubscribeFailure::Failed)?;
        let Ok(token) = MetadataValue::try_from(access.as_str()) else {
            self.tokens = None;
            return Err(SubscribeFailure::Failed(Failure::transient(
                Stage::Authenticate,
                "the principal issued a token that is not valid gRPC metadata",
            )));
        };
        let metrics = self.metrics.clone();
        let outbound = ReceiverStream::new(out_rx).inspect(move |ev| metrics.observe_sent(ev));
        let mut request = tonic::Request::new(outbound);
        request.metadata_mut().insert("authorization", token);
        let client = EventStreamClient::new(channel.clone())
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        let mut client = with_gzip!(client, self.settings.compression);
        // Polled here first and then by the inbound stream: the call (and our side of the
        // stream) is under way from the first poll on, whether or not the headers came.
        let mut call = Box::pin(async move { client.subscribe(request).await });
        match tokio::time::timeout(HEADERS_GRACE, &mut call).await {
            Ok(Ok(resp)) => Ok(resp.into_inner().boxed()),
            Err(_) => {
                debug!("no response headers yet; streaming without them");
                Ok(futures::stream::once(call)
                    .flat_map(|answer| match answer {
                        Ok(resp) => resp.into_inner().left_stream(),
                        Err(status) => futures::stream::iter([Err(status)]).right_stream(),
                    })
                    .boxed())
            }
            Ok(Err(status)) if status.code() == Code::Unauthenticated && !fresh => {
                debug!(error = %status.message(),
                    "the principal rejected the held session token; authenticating again");
                self.tokens = None;
                Err(SubscribeFailure::StaleToken)
            }
            Ok(Err(status)) => {
                if status.code() == Code::Unauthenticated {
                    self.tokens = None;
                }
                Err(SubscribeFailure::Failed(classify_status(
                    Stage::Subscribe,
                    &status,
                )))
            }
        }
    }
}

/// The principal's side of the event stream, readable before its response headers arrived.
type Inbound = futures::stream::BoxStream<'static, Result<WireEvent, Status>>;

/// Why `Subscribe` did not open.
enum SubscribeFailure {
    /// A held token was refused (e.g. the principal restarted with new keys): try again at once
    /// with a new session.
    StaleToken,
    /// Anything else.
    Failed(Failure),
}

/// Delays in logs, rounded to 100 ms so lines stay readable.
fn round_delay(d: Duration) -> Duration {
    Duration::from_millis((d.as_millis() as u64).div_ceil(100) * 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_say_what_to_fix_transient_failures_do_not() {
        let denied = classify_status(
            Stage::Authenticate,
            &Status::permission_denied("agent not allowed"),
        );
        assert!(denied.is_refusal());
        assert!(denied.to_string().contains("--tls-client-cert"), "{denied}");
        let version = classify_status(
            Stage::Authenticate,
            &Status::failed_precondition("version mismatch"),
        );
        assert!(version.is_refusal());
        assert!(version.to_string().contains("upgrade"), "{version}");
        let cert = classify_status(
            Stage::Authenticate,
            &Status::unauthenticated("no client certificate"),
        );
        assert!(cert.is_refusal());
        let token = classify_status(Stage::Subscribe, &Status::unauthenticated("token expired"));
        assert!(
            !token.is_refusal(),
            "an expired token is cured by a new session"
        );
        assert!(
            !classify_status(Stage::Subscribe, &Status::unavailable("not active")).is_refusal()
        );
    }

    /// A handshake error as the dial reports it: rustls's error inside tokio-rustls's io::Error
    /// inside the dial's own error.
    fn handshake_error(e: rustls::Error) -> std::io::Error {
        std::io::Error::other(argocd_agent_runtime::dial::ConnectError::Handshake {
            server_name: ServerName::try_from("p").unwrap(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })
    }

    #[test]
    fn transport_failures_name_the_tls_problem() {
        let refused = std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused (os error 111)",
        );
        assert!(!classify_transport(&refused, false).is_refusal());
        let untrusted = classify_transport(
            &handshake_error(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            )),
            false,
        );
        assert!(untrusted.to_string().contains("--tls-ca"), "{untrusted}");
        assert!(
            untrusted
                .message
                .contains("invalid peer certificate: UnknownIssuer"),
            "{untrusted}"
        );
        let rejected = classify_transport(
            &handshake_error(rustls::Error::AlertReceived(
                rustls::AlertDescription::CertificateRequired,
            )),
            false,
        );
        assert!(
            rejected.to_string().contains("--tls-client-cert"),
            "{rejected}"
        );
        // Words in a message are not what decides.
        let worded = std::io::Error::other("certificate alert");
        assert!(!classify_transport(&worded, false).is_refusal());
    }

    #[test]
    fn an_http1_only_peer_is_a_refusal_that_names_enable_websocket() {
        // A TLS proxy without h2 (nginx without http2) refuses ALPN h2 with a fatal alert.
        let no_h2 = handshake_error(rustls::Error::AlertReceived(
            rustls::AlertDescription::NoApplicationProtocol,
        ));
        let native = classify_transport(&no_h2, false);
        assert!(native.is_refusal());
        assert!(
            native
                .to_string()
                .contains("start the principal and this agent with --enable-websocket"),
            "{native}"
        );
        // With the flag, the same alert means the principal offers no http/1.1.
        let websocket = classify_transport(&no_h2, true);
        assert!(
            websocket
                .to_string()
                .contains("start it with --enable-websocket"),
            "{websocket}"
        );
        // A server that picked http/1.1 for a native dial (it offered both) says so too.
        let picked = std::io::Error::other(ConnectError::NotHttp2("http/1.1".into()));
        let picked = classify_transport(&picked, false);
        assert!(picked.is_refusal());
        assert!(
            picked.message.contains("\"http/1.1\" instead of h2"),
            "{picked}"
        );
    }

    #[test]
    fn error_chain_includes_sources_once() {
        let inner = std::io::Error::other("connection refused");
        let outer = std::io::Error::other(OuterErr(inner));
        let chain = error_chain(&outer);
        assert_eq!(chain.matches("connection refused").count(), 1, "{chain}");
    }

    #[derive(Debug)]
    struct OuterErr(std::io::Error);
    impl std::fmt::Display for OuterErr {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("transport error")
        }
    }
    impl StdError for OuterErr {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    /// A Version server on loopback that records each request's `grpc-encoding` header.
    async fn recording_version_server() -> (GrpcChannel, Arc<std::sync::Mutex<Vec<String>>>) {
        use argocd_agent_proto::pb::versionapi::version_server::{Version, VersionServer};
        use argocd_agent_proto::pb::versionapi::VersionResponse;
        struct Answer;
        #[tonic::async_trait]
        impl Version for Answer {
            async fn version(
                &self,
                _: tonic::Request<VersionRequest>,
            ) -> Result<tonic::Response<VersionResponse>, Status> {
                Ok(tonic::Response::new(VersionResponse {
                    version: "v0.9.0".into(),
                }))
            }
        }
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let server = tonic::service::interceptor::InterceptedService::new(
            VersionServer::new(Answer).accept_compressed(CompressionEncoding::Gzip),
            move |req: tonic::Request<()>| {
                let encoding = req.metadata().get("grpc-encoding");
                let encoding = encoding.and_then(|v| v.to_str().ok()).unwrap_or("identity");
                record.lock().unwrap().push(encoding.to_string());
                Ok(req)
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(server)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        (GrpcChannel::Http2(channel), seen)
    }

    #[tokio::test]
    async fn enable_compression_sends_gzip_and_plain_is_the_default() {
        let (channel, seen) = recording_version_server().await;
        assert_eq!(
            principal_version(&channel, true).await.as_deref(),
            Some("v0.9.0")
        );
        assert_eq!(
            principal_version(&channel, false).await.as_deref(),
            Some("v0.9.0")
        );
        assert_eq!(*seen.lock().unwrap(), ["gzip", "identity"]);
    }

    /// An EventStream server that, like grpc-go's serving upstream's principal, sends its
    /// response headers only with its first message, which here answers the client's first one.
    async fn headers_with_first_message_server() -> GrpcChannel {
        use argocd_agent_proto::pb::eventstreamapi::event_stream_server::{
            EventStream, EventStreamServer,
        };
        use argocd_agent_proto::pb::eventstreamapi::{PingRequest, PongReply, PushSummary};
        struct AnswersFirst;
        #[tonic::async_trait]
        impl EventStream for AnswersFirst {
            type SubscribeStream = futures::stream::BoxStream<'static, Result<WireEvent, Status>>;
            async fn subscribe(
                &self,
                req: tonic::Request<tonic::Streaming<WireEvent>>,
            ) -> Result<tonic::Response<Self::SubscribeStream>, Status> {
                // tonic sends the headers once this returns.
                let mut inbound = req.into_inner();
                let first = inbound
                    .message()
                    .await?
                    .ok_or_else(|| Status::aborted("none"))?;
                let answer = Event::try_from_stream_event(first)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?
                    .ack();
                let answers = futures::stream::iter([Ok(answer.into_stream_event())])
                    .chain(futures::stream::pending());
                Ok(tonic::Response::new(answers.boxed()))
            }
            async fn push(
                &self,
                _: tonic::Request<tonic::Streaming<WireEvent>>,
            ) -> Result<tonic::Response<PushSummary>, Status> {
                Err(Status::unimplemented("push"))
            }
            async fn ping(
                &self,
                _: tonic::Request<PingRequest>,
            ) -> Result<tonic::Response<PongReply>, Status> {
                Err(Status::unimplemented("ping"))
            }
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(EventStreamServer::new(AnswersFirst))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        GrpcChannel::Http2(
            tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap(),
        )
    }

    /// A JWT (unsigned: the agent reads only `exp`) that runs out in an hour.
    fn token_valid_for_an_hour() -> String {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine as _;
        let claims = serde_json::json!({"exp": unix_now() + 3600});
        format!("e30.{}.sig", URL_SAFE_NO_PAD.encode(claims.to_string()))
    }

    #[tokio::test]
    async fn the_stream_opens_before_a_principal_that_answers_first_sent_its_headers() {
        let channel = headers_with_first_message_server().await;
        let settings = ConnectionSettings {
            server: "127.0.0.1:1".parse().unwrap(),
            server_name: "localhost".into(),
            mode: AgentMode::Autonomous,
            namespace: "argocd".into(),
            keepalive: None,
            heartbeat_interval: None,
            max_message_size: 1 << 20,
            backoff_max: Duration::from_secs(1),
            compression: false,
            websocket: false,
            outbox_capacity: 10,
        };
        let outbox = Arc::new(Outbox::new(Default::default()));
        let mut conn = Connection::new(
            settings,
            None,
            outbox,
            AgentMetrics::default(),
            HealthState::new(),
        );
        let token = token_valid_for_an_hour();
        conn.tokens = Some(SessionTokens::new(token.clone(), token));
        let (out_tx, out_rx) = mpsc::channel(4);
        let opened = tokio::time::timeout(
            HEADERS_GRACE + Duration::from_secs(5),
            conn.subscribe(&channel, out_rx),
        )
        .await;
        let Ok(Ok(mut inbound)) = opened else {
            panic!("Subscribe did not open without the principal's headers");
        };
        let resync = Event::request_resource_resync(AGENT_SOURCE).unwrap();
        out_tx
            .send(resync.clone().into_stream_event())
            .await
            .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), inbound.next())
            .await
            .expect("the principal's answer to our first message")
            .expect("a message")
            .expect("not an error");
        let answer = Event::try_from_stream_event(answer).unwrap();
        assert!(answer.is_ack(), "{answer:?}");
        assert_eq!(answer.event_id, resync.event_id);
    }

    #[test]
    fn log_delays_are_rounded() {
        assert_eq!(
            round_delay(Duration::from_millis(1234)),
            Duration::from_millis(1300)
        );
        assert_eq!(
            round_delay(Duration::from_secs(60)),
            Duration::from_secs(60)
        );
    }
}
