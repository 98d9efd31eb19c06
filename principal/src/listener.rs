//! The agent-facing TCP/TLS listener: accepts connections, completes the mutual-TLS handshake
//! (TLS 1.3 unless `--tls-min-version=tls1.2`, client certificate required, ALPN h2 only — an
//! HTTP/1.1 client cannot negotiate), and attaches the agent identity read from the verified
//! client certificate to the connection, where every RPC finds it as [`PeerIdentity`]. Or, with
//! `--insecure-plaintext` behind a service mesh ([`plaintext_accept_loop`]), accepts plain TCP and
//! marks the connection's requests as named by the mesh's identity header
//! ([`PeerCredential::MeshHeader`]); only that listener ever does.
//!
//! Also owns what every TLS listener of the principal (this one and the resource proxy) does
//! around the handshake, [`ConnectionPolicy`]: a handshake that does not finish within
//! `--tls-handshake-timeout` is dropped, and so is a connection that sends no request bytes within
//! `--request-header-timeout` after it (slowloris); a certificate on the blocklist is refused after
//! the handshake and a live connection is closed as soon as its certificate gets listed
//! ([`GuardedStream`]); a client certificate whose key usage does not allow digital signatures
//! names no agent. Failures are counted by reason; none affects other connections. The accept
//! loop and the handshake under its deadline are the runtime's
//! ([`argocd_agent_runtime::accept::serve_tls_connections`]); admitting its outcome ([`admit`]) is
//! this module's.
//!
//! [`ConnectionLimit`] caps the connections one key holds open at once: on the gRPC listener an
//! agent identity (`--max-connections-per-agent`; the connection over it gets GOAWAY
//! `ENHANCE_YOUR_CALM` naming the flag), on the Redis proxy a client IP; [`AgentCaps`] caps places
//! per agent and in all at once (web terminal sessions, resource-proxy request bodies).
//!
//! With `--enable-websocket` the gRPC listener also takes HTTP/1.1 connections (ALPN `http/1.1`
//! offered beside `h2`): each connection's protocol is known from ALPN, or, when none was
//! negotiated (a TLS-terminating proxy that re-encrypts without ALPN, or plaintext behind a mesh),
//! from its first bytes ([`argocd_agent_runtime::grpc_websocket::sniff`]); an HTTP/2 one goes to
//! the gRPC server as before, an HTTP/1.1 one to [`Http1Calls`] (gRPC over WebSocket) with the
//! same identity, blocklist watch, header timeout and `--max-connections-per-agent` slot — so
//! there, where every call is a connection of its own, the cap bounds an agent's calls at once
//! (over it, HTTP 429 naming the flag).
//!
//! And, on the gRPC listener only, `--keepalive-min-interval` ([`PingEnforcement`],
//! [`KeepaliveEnforced`]): grpc-go's `keepalive.EnforcementPolicy{MinTime}`, which the h2 crate
//! under tonic does not have (it answers every PING). The connection's HTTP/2 frames are scanned
//! (headers only, nothing is buffered or copied); a client that pings more often than the minimum
//! interval three times in a row gets `GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings")` and the
//! connection closes, as with upstream's Go principal.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use argocd_agent_proto::identity::{
    cert_fingerprint, AgentIdentity, HeaderIdentity, IdentitySource,
};
use argocd_agent_runtime::accept::{serve_connections, serve_tls_connections, HandshakeFailure};
use argocd_agent_runtime::grpc_websocket::sniff::{sniff, Rewind, Wire};
use argocd_agent_runtime::tls::reload::ReloadingServerConfig;
use argocd_agent_runtime::tls::{ALPN_H2, ALPN_HTTP1};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;
use tonic::transport::server::Connected;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::blocklist::Blocklist;
use crate::metrics::PrincipalMetrics;

/// Default `--max-connections-per-agent`: an agent holds one connection, two while it replaces a
/// broken one; a few more cover connections the principal has not yet seen die.
pub const DEFAULT_MAX_CONNECTIONS_PER_AGENT: usize = 16;

/// Connections open per key (agent identity, client IP), at most `max` each; a
/// [`ConnectionSlot`] counts one in and, dropped with its connection, out. Also counts weighted
/// holdings ([`Self::admit_n`]: bytes, say) against `max`.
#[derive(Debug)]
pub struct ConnectionLimit<K: Eq + Hash> {
    max: usize,
    open: Mutex<HashMap<K, usize>>,
}

/// One admitted connection (or holding of [`ConnectionLimit::admit_n`]) of `key`; frees its place
/// when dropped.
#[derive(Debug)]
pub struct ConnectionSlot<K: Eq + Hash> {
    key: K,
    weight: usize,
    limit: Arc<ConnectionLimit<K>>,
}

impl<K: Eq + Hash + Clone> ConnectionLimit<K> {
    /// At most `max` connections per key.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(ConnectionLimit {
            max,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for one more connection of `key`, or `Err(open)` when it already holds the maximum.
    pub fn admit(self: &Arc<Self>, key: K) -> Result<ConnectionSlot<K>, usize> {
        self.admit_n(key, 1)
    }

    /// A holding of `weight` for `key`, or `Err(held)` when it would take `key` past the maximum.
    pub fn admit_n(self: &Arc<Self>, key: K, weight: usize) -> Result<ConnectionSlot<K>, usize> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let held = open.get(&key).copied().unwrap_or(0);
        if held.saturating_add(weight) > self.max {
            return Err(held);
        }
        *open.entry(key.clone()).or_default() += weight;
        Ok(ConnectionSlot {
            key,
            weight,
            limit: self.clone(),
        })
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections of `key` open now.
    pub fn open(&self, key: &K) -> usize {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(key).copied().unwrap_or(0)
    }
}

impl<K: Eq + Hash> Drop for ConnectionSlot<K> {
    fn drop(&mut self) {
        let mut open = self.limit.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.key) {
            *count -= self.weight;
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// Places held at once per agent and in all, each capped (web terminal sessions, resource-proxy
/// request bodies being received and their bytes): an [`AgentPlace`] holds its weight under both
/// caps until dropped.
#[derive(Debug, Clone)]
pub struct AgentCaps {
    per_agent: Arc<ConnectionLimit<String>>,
    all: Arc<ConnectionLimit<()>>,
}

/// Which cap of an [`AgentCaps`] is full (or would be passed), with what is held under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapFull {
    /// The agent holds its maximum.
    Agent(usize),
    /// All agents together hold the maximum.
    All(usize),
}

/// One agent's place among [`AgentCaps`]; frees it under both caps when dropped.
#[derive(Debug)]
pub struct AgentPlace {
    _agent: ConnectionSlot<String>,
    _all: ConnectionSlot<()>,
}

impl AgentCaps {
    /// At most `max_per_agent` places per agent and `max_all` in all.
    pub fn new(max_all: usize, max_per_agent: usize) -> Self {
        AgentCaps {
            per_agent: ConnectionLimit::new(max_per_agent),
            all: ConnectionLimit::new(max_all),
        }
    }

    /// A place for `agent`, or which cap is full (the agent's is checked first).
    pub fn admit(&self, agent: &str) -> Result<AgentPlace, CapFull> {
        self.admit_n(agent, 1)
    }

    /// A place of `weight` for `agent`, or which cap it would pass (the agent's is checked first).
    pub fn admit_n(&self, agent: &str, weight: usize) -> Result<AgentPlace, CapFull> {
        let mine = self
            .per_agent
            .admit_n(agent.to_string(), weight)
            .map_err(CapFull::Agent)?;
        let all = self.all.admit_n((), weight).map_err(CapFull::All)?;
        Ok(AgentPlace {
            _agent: mine,
            _all: all,
        })
    }

    /// Places `agent` holds now.
    pub fn open(&self, agent: &str) -> usize {
        self.per_agent.open(&agent.to_string())
    }
}

/// Default `--tls-handshake-timeout`: how long a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--request-header-timeout`: how long a connection may stay silent after its handshake
/// before the first bytes of its first request (HTTP/2 preface, HTTP/1 request line, RESP command).
pub const REQUEST_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What every principal listener enforces around the TLS handshake.
#[derive(Debug, Clone)]
pub struct ConnectionPolicy {
    /// Longest TLS handshake.
    pub handshake_timeout: Duration,
    /// Longest silence between the handshake and the first request bytes; on the Redis proxy,
    /// also the longest a command may take to arrive once started.
    pub request_header_timeout: Duration,
    /// Refused client certificates.
    pub blocklist: Arc<Blocklist>,
}

impl Default for ConnectionPolicy {
    fn default() -> Self {
        ConnectionPolicy {
            handshake_timeout: HANDSHAKE_TIMEOUT,
            request_header_timeout: REQUEST_HEADER_TIMEOUT,
            blocklist: Blocklist::empty(),
        }
    }
}

/// Why a connection was dropped before it could carry a request; the metric reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The TLS handshake failed (no or untrusted client certificate, protocol, ALPN, ...).
    Handshake,
    /// The TLS handshake did not finish in time.
    HandshakeTimeout,
    /// The client certificate is on the blocklist.
    Blocklisted,
    /// The blocklist could not be read yet, so no certificate can be admitted.
    BlocklistUnavailable,
}

impl Refusal {
    /// The `reason` label of `argocd_principal_auth_failures_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Handshake => "tls_handshake",
            Refusal::HandshakeTimeout => "tls_handshake_timeout",
            Refusal::Blocklisted => "blocklisted",
            Refusal::BlocklistUnavailable => "blocklist_unavailable",
        }
    }
}

/// A stream that fails reads with `TimedOut` when no byte arrives before its first-request
/// deadline, and fails every operation once its certificate is blocklisted.
pub struct GuardedStream<S> {
    stream: S,
    first_request: Option<Pin<Box<Sleep>>>,
    revoked: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    closed: bool,
}

impl<S> GuardedStream<S> {
    /// Wraps `stream`: it must send within `header_timeout`, and closes when `fingerprint` gets
    /// listed in `blocklist`.
    pub fn new(
        stream: S,
        header_timeout: Duration,
        blocklist: Option<(Arc<Blocklist>, String)>,
    ) -> Self {
        GuardedStream {
            stream,
            first_request: Some(Box::pin(tokio::time::sleep(header_timeout))),
            revoked: blocklist.map(|(list, fp)| {
                Box::pin(async move {
                    list.listed(fp.clone()).await;
                    tracing::warn!(fingerprint = %fp, "closing a connection: its client certificate was blocklisted");
                }) as Pin<Box<dyn Future<Output = ()> + Send>>
            }),
            closed: false,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// The same guard around `f(stream)`.
    pub fn map<T>(self, f: impl FnOnce(S) -> T) -> GuardedStream<T> {
        GuardedStream {
            stream: f(self.stream),
            first_request: self.first_request,
            revoked: self.revoked,
            closed: self.closed,
        }
    }

    fn check_revoked(&mut self, cx: &mut Context<'_>) -> Result<(), std::io::Error> {
        if !self.closed {
            if let Some(revoked) = self.revoked.as_mut() {
                if revoked.as_mut().poll(cx).is_ready() {
                    self.closed = true;
                    self.revoked = None;
                }
            }
        }
        if self.closed {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the client certificate was blocklisted",
            ));
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for GuardedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.check_revoked(cx)?;
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.first_request = None;
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if let Some(deadline) = self.first_request.as_mut() {
                    if deadline.as_mut().poll(cx).is_ready() {
                        self.first_request = None;
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no request within the request header timeout",
                        )));
                    }
                }
                Poll::Pending
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GuardedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.check_revoked(cx)?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.check_revoked(cx)?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.check_revoked(cx)?;
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// HTTP/2 frame types and flags the keepalive enforcement looks at (RFC 9113 §6).
const FRAME_DATA: u8 = 0x0;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_PING: u8 = 0x6;
const FRAME_GOAWAY: u8 = 0x7;
const FLAG_ACK: u8 = 0x1;
/// `ENHANCE_YOUR_CALM`, the GOAWAY code grpc-go sends to a client that pings too often.
const ENHANCE_YOUR_CALM: u32 = 0xb;
/// The GOAWAY debug data grpc-go sends with it (grpc-go clients recognise it and back off).
pub const TOO_MANY_PINGS: &[u8] = b"too_many_pings";
/// Pings below the minimum interval tolerated before the GOAWAY (grpc-go's `maxPingStrikes`).
const MAX_PING_STRIKES: u32 = 2;
/// The client connection preface that precedes the client's first frame.
const CLIENT_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One HTTP/2 frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FrameHeader {
    kind: u8,
    flags: u8,
    stream_id: u32,
}

/// Follows the frame boundaries of one direction of an HTTP/2 connection from the bytes passing
/// through, yielding each frame header as it completes; payloads are skipped, not kept.
#[derive(Debug)]
struct FrameScanner {
    /// Bytes still to skip: the rest of the preface, then of the current frame's payload.
    skip: usize,
    header: [u8; 9],
    have: usize,
}

impl FrameScanner {
    fn new(preface: usize) -> Self {
        FrameScanner {
            skip: preface,
            header: [0; 9],
            have: 0,
        }
    }

    /// Whether the bytes seen so far end exactly at a frame boundary.
    fn at_boundary(&self) -> bool {
        self.skip == 0 && self.have == 0
    }

    /// How many more bytes belong to the frame under way (0 at a boundary).
    fn rest_of_frame(&self) -> usize {
        if self.have > 0 {
            // Inside a header: its rest, then its payload.
            let len = if self.have >= 3 {
                u32::from_be_bytes([0, self.header[0], self.header[1], self.header[2]]) as usize
            } else {
                // The length is not known yet; only the header's own rest is.
                0
            };
            9 - self.have + len
        } else {
            self.skip
        }
    }

    fn feed(&mut self, mut bytes: &[u8], mut on_header: impl FnMut(FrameHeader)) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == 9 {
                let h = &self.header;
                self.skip = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                self.have = 0;
                on_header(FrameHeader {
                    kind: h[3],
                    flags: h[4],
                    stream_id: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                });
            }
        }
    }
}

/// `--keepalive-min-interval` on one connection, grpc-go's `EnforcementPolicy{MinTime}` rules:
/// a PING from the client earlier than the minimum interval after its previous one is a strike;
/// the third strike in a row ends the connection. A PING that follows DATA or HEADERS the server
/// sent since the previous PING resets the strikes (the client saw traffic, so it is not probing an
/// idle link). Pings without open streams are held to the same interval (grpc-go's
/// `PermitWithoutStream: true`; its default also bounds them by two hours, not done here).
#[derive(Debug)]
pub struct PingEnforcement {
    min_interval: Duration,
    inbound: FrameScanner,
    outbound: FrameScanner,
    last_ping: Option<Instant>,
    strikes: u32,
    reset_strikes: bool,
    last_stream_id: u32,
    violated: bool,
}

impl PingEnforcement {
    /// Enforcement of `min_interval` on a fresh server-side connection.
    pub fn new(min_interval: Duration) -> Self {
        PingEnforcement {
            min_interval,
            inbound: FrameScanner::new(CLIENT_PREFACE.len()),
            outbound: FrameScanner::new(0),
            last_ping: None,
            strikes: 0,
            reset_strikes: false,
            last_stream_id: 0,
            violated: false,
        }
    }

    /// Bytes the client sent, read at `now`; true once the client has broken the policy.
    pub fn client_sent(&mut self, bytes: &[u8], now: Instant) -> bool {
        let mut pings = 0usize;
        let mut last_stream_id = self.last_stream_id;
        self.inbound.feed(bytes, |h| match h.kind {
            FRAME_PING if h.flags & FLAG_ACK == 0 => pings += 1,
            FRAME_HEADERS => last_stream_id = last_stream_id.max(h.stream_id),
            _ => {}
        });
        self.last_stream_id = last_stream_id;
        for _ in 0..pings {
            self.ping(now);
        }
        self.violated
    }

    fn ping(&mut self, now: Instant) {
        let last = self.last_ping.replace(now);
        if std::mem::take(&mut self.reset_strikes) {
            self.strikes = 0;
            return;
        }
        if last.is_some_and(|last| now.duration_since(last) < self.min_interval) {
            self.strikes += 1;
        }
        if self.strikes > MAX_PING_STRIKES {
            self.violated = true;
        }
    }

    /// Bytes the server wrote to the client.
    pub fn server_sent(&mut self, bytes: &[u8]) {
        let mut traffic = false;
        self.outbound.feed(bytes, |h| {
            traffic |= matches!(h.kind, FRAME_DATA | FRAME_HEADERS);
        });
        self.reset_strikes |= traffic;
    }

    /// The GOAWAY frame that ends a connection that broke the policy.
    pub fn goaway_frame(&self) -> Vec<u8> {
        calm_down_frame(self.last_stream_id, TOO_MANY_PINGS)
    }
}

/// A GOAWAY `ENHANCE_YOUR_CALM` frame after stream `last_stream_id`, with `debug` data.
fn calm_down_frame(last_stream_id: u32, debug: &[u8]) -> Vec<u8> {
    let len = (8 + debug.len()) as u32;
    let mut frame = len.to_be_bytes()[1..].to_vec();
    frame.extend([FRAME_GOAWAY, 0, 0, 0, 0, 0]);
    frame.extend(last_stream_id.to_be_bytes());
    frame.extend(ENHANCE_YOUR_CALM.to_be_bytes());
    frame.extend(debug);
    frame
}

/// How a connection over `--max-connections-per-agent` is ended the HTTP/2 way: the server
/// preface (an empty SETTINGS frame) and a GOAWAY `ENHANCE_YOUR_CALM` whose debug data says why.
fn goaway_over_cap(reason: &str) -> Vec<u8> {
    let mut goodbye = vec![0, 0, 0, FRAME_SETTINGS, 0, 0, 0, 0, 0];
    goodbye.extend(calm_down_frame(0, reason.as_bytes()));
    goodbye
}

/// How an HTTP/1.1 connection over `--max-connections-per-agent` is ended: `429 Too Many
/// Requests` with the reason.
fn too_many_requests(reason: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain; charset=utf-8\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{reason}",
        reason.len()
    )
    .into_bytes()
}

/// Writes `goodbye`, then drains the client's input until it closes (at most a second and
/// 64 KiB), so the goodbye is not lost to a reset.
async fn say_goodbye<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, goodbye: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(goodbye).await?;
        stream.flush().await?;
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < 64 << 10 {
            match stream.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        stream.shutdown().await
    })
    .await;
}

/// Where a connection that broke the ping policy is on its way out.
#[derive(Debug)]
enum Ending {
    /// Still serving.
    Open,
    /// Writing the GOAWAY (bytes, how many are written).
    GoAway(Vec<u8>, usize),
    /// Flushing it out.
    Flushing,
    /// Closed: reads see the end, writes fail.
    Closed,
}

/// A server-side HTTP/2 connection under [`PingEnforcement`] (or passed through untouched when
/// there is no policy). The GOAWAY goes out at the next frame boundary of the server's own
/// writes, so it never lands inside a frame h2 is writing.
pub struct KeepaliveEnforced<S> {
    stream: S,
    policy: Option<PingEnforcement>,
    ending: Ending,
}

impl<S> KeepaliveEnforced<S> {
    /// `stream` under `min_interval` (`None` = no enforcement).
    pub fn new(stream: S, min_interval: Option<Duration>) -> Self {
        KeepaliveEnforced {
            stream,
            policy: min_interval.map(PingEnforcement::new),
            ending: Ending::Open,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }
}

fn too_many_pings() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "closed: the client pinged more often than --keepalive-min-interval allows (too_many_pings)",
    )
}

impl<S: AsyncWrite + Unpin> KeepaliveEnforced<S> {
    /// Drives the GOAWAY out once the server's writes are at a frame boundary; `Ready` when the
    /// connection is closed.
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        loop {
            match &mut self.ending {
                Ending::Open => {
                    let Some(policy) = &self.policy else {
                        return Poll::Pending;
                    };
                    if !policy.violated || !policy.outbound.at_boundary() {
                        return Poll::Pending;
                    }
                    tracing::warn!(
                        "an agent pinged more often than --keepalive-min-interval allows; \
                         sending GOAWAY too_many_pings and closing the connection"
                    );
                    self.ending = Ending::GoAway(policy.goaway_frame(), 0);
                }
                Ending::GoAway(frame, written) => {
                    while *written < frame.len() {
                        match Pin::new(&mut self.stream).poll_write(cx, &frame[*written..]) {
                            Poll::Ready(Ok(0)) => {
                                self.ending = Ending::Closed;
                                return Poll::Ready(Ok(()));
                            }
                            Poll::Ready(Ok(n)) => *written += n,
                            Poll::Ready(Err(e)) => {
                                self.ending = Ending::Closed;
                                return Poll::Ready(Err(e));
                            }
                            Poll::Pending => return Poll::Pending,
                        }
                    }
                    self.ending = Ending::Flushing;
                }
                Ending::Flushing => {
                    let flushed = std::task::ready!(Pin::new(&mut self.stream).poll_flush(cx));
                    let _ = Pin::new(&mut self.stream).poll_shutdown(cx);
                    self.ending = Ending::Closed;
                    return Poll::Ready(flushed);
                }
                Ending::Closed => return Poll::Ready(Ok(())),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for KeepaliveEnforced<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.policy.is_none() {
            return Pin::new(&mut this.stream).poll_read(cx, buf);
        }
        if this.poll_end(cx).is_ready() {
            // Closed: the end of the stream, so the server lets the connection go.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(policy)) = (&read, this.policy.as_mut()) {
            if policy.client_sent(&buf.filled()[before..], Instant::now()) {
                // The GOAWAY may go at once if the server is between frames; otherwise the
                // server's next write completes its frame and sends it.
                if let Poll::Ready(Err(e)) = this.poll_end(cx) {
                    tracing::debug!(error = %e, "sending GOAWAY too_many_pings failed");
                }
            }
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for KeepaliveEnforced<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let (violated, at_boundary, rest) = match &this.policy {
            None => return Pin::new(&mut this.stream).poll_write(cx, buf),
            Some(p) => (
                p.violated,
                p.outbound.at_boundary(),
                p.outbound.rest_of_frame(),
            ),
        };
        let mut limit = buf.len();
        if violated {
            if at_boundary {
                std::task::ready!(this.poll_end(cx))?;
                return Poll::Ready(Err(too_many_pings()));
            }
            // Finish the frame under way, no more, so the GOAWAY follows it directly.
            limit = limit.min(rest.max(1));
        }
        let written = std::task::ready!(Pin::new(&mut this.stream).poll_write(cx, &buf[..limit]))?;
        if let Some(policy) = this.policy.as_mut() {
            policy.server_sent(&buf[..written]);
        }
        Poll::Ready(Ok(written))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if matches!(self.ending, Ending::Closed) {
            return Poll::Ready(Err(too_many_pings()));
        }
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A finished, admitted TLS connection of any principal listener.
pub struct Admitted {
    /// The connection, guarded by the policy.
    pub stream: GuardedStream<TlsStream<TcpStream>>,
    /// The verified client certificate (DER), if one was presented.
    pub leaf: Option<Vec<u8>>,
}

/// Admits the outcome of a TLS handshake (run by the runtime's accept loop under
/// `policy.handshake_timeout`) under `policy`: checks the client certificate against the blocklist
/// (waiting up to the handshake timeout for the blocklist's first read) and guards the stream.
pub async fn admit(
    handshake: Result<TlsStream<TcpStream>, HandshakeFailure>,
    policy: &ConnectionPolicy,
) -> Result<Admitted, (Refusal, String)> {
    let stream = match handshake {
        Ok(s) => s,
        Err(e @ HandshakeFailure::Failed(_)) => return Err((Refusal::Handshake, e.to_string())),
        Err(e @ HandshakeFailure::TimedOut(_)) => {
            return Err((Refusal::HandshakeTimeout, e.to_string()))
        }
    };
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec());
    let mut watch = None;
    if let Some(der) = &leaf {
        if tokio::time::timeout(policy.handshake_timeout, policy.blocklist.synced())
            .await
            .is_err()
        {
            return Err((
                Refusal::BlocklistUnavailable,
                "the certificate blocklist has not been read yet".into(),
            ));
        }
        let fingerprint = cert_fingerprint(der);
        if policy.blocklist.contains(&fingerprint) {
            return Err((
                Refusal::Blocklisted,
                format!("client certificate {fingerprint} is blocklisted"),
            ));
        }
        watch = Some((policy.blocklist.clone(), fingerprint));
    }
    Ok(Admitted {
        stream: GuardedStream::new(stream, policy.request_header_timeout, watch),
        leaf,
    })
}

/// Refuses a client certificate whose keyUsage extension, when present, does not allow digital
/// signatures (the TLS client signs the handshake with that key). The extended key usage
/// (clientAuth when present) is already enforced by the handshake's verifier.
pub fn check_key_usage(der: &[u8]) -> Result<(), String> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| format!("cannot be parsed: {e}"))?;
    match cert.key_usage() {
        Ok(Some(ku)) if !ku.value.digital_signature() => Err(
            "its keyUsage does not include digitalSignature, so it may not authenticate a TLS client"
                .into(),
        ),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("its keyUsage extension is malformed: {e}")),
    }
}

/// The agent named by a verified client certificate (`None` = no certificate).
pub fn agent_of_certificate(
    leaf: Option<&[u8]>,
    source: &IdentitySource,
) -> Result<AgentIdentity, String> {
    let der = leaf.ok_or_else(|| "no client certificate presented".to_string())?;
    check_key_usage(der).map_err(|e| format!("client certificate refused: {e}"))?;
    AgentIdentity::from_cert_der(der, source).map_err(|e| e.to_string())
}

/// Who the peer of a connection is, as far as the connection can tell.
#[derive(Debug, Clone)]
pub struct PeerIdentity {
    /// How the agent is named.
    pub credential: PeerCredential,
    /// Remote address.
    pub remote: Option<std::net::SocketAddr>,
}

/// Where the agent's name comes from. Which one a connection carries is decided by the listener
/// that accepted it, never by the client: a TLS connection is only ever named by its certificate,
/// so a header cannot name an agent there.
#[derive(Debug, Clone)]
pub enum PeerCredential {
    /// A mutual-TLS connection: the agent identity its verified certificate names, or why it names
    /// none.
    Certificate(Result<AgentIdentity, String>),
    /// A connection to the `--insecure-plaintext` listener behind a service mesh: each request
    /// names its agent in the header the mesh sidecar sets.
    MeshHeader(Arc<HeaderIdentity>),
}

/// The transport under an agent connection: mutual TLS, or plaintext behind a service mesh.
type AgentTransport = Either<TlsStream<TcpStream>, TcpStream>;

/// Serves an agent's HTTP/1.1 connection (gRPC over WebSocket with `--enable-websocket`); without
/// it, every connection is taken as HTTP/2, as before. The connection carries its peer
/// ([`Connected::connect_info`]) and its `--max-connections-per-agent` slot, which it frees when
/// dropped, whoever ends up holding it (an upgraded call outlives the HTTP/1.1 exchange).
pub type Http1Calls =
    Arc<dyn Fn(AgentConnection) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Which protocol `stream` (from `remote`) speaks: HTTP/2 unless `http1` is served, then by the
/// ALPN protocol negotiated (`alpn`) or, without one, by its first bytes; `None` when it ended
/// (or timed out) before saying.
async fn wire_of(
    stream: GuardedStream<AgentTransport>,
    alpn: Option<Vec<u8>>,
    http1: bool,
    remote: std::net::SocketAddr,
) -> Option<(Wire, Rewind<GuardedStream<AgentTransport>>)> {
    let routed = match alpn.as_deref() {
        _ if !http1 => Ok((Wire::Http2, Rewind::new(stream))),
        Some(ALPN_H2) => Ok((Wire::Http2, Rewind::new(stream))),
        Some(ALPN_HTTP1) => Ok((Wire::Http1, Rewind::new(stream))),
        _ => sniff(stream).await,
    };
    routed
        .inspect_err(|e| {
            tracing::debug!(%remote, error = %e, "connection ended before its first request");
        })
        .ok()
}

/// An accepted agent connection.
pub struct AgentConnection {
    stream: KeepaliveEnforced<Rewind<GuardedStream<AgentTransport>>>,
    peer: PeerIdentity,
    /// Its place under `--max-connections-per-agent` (TLS only), freed when the server drops it.
    _slot: Option<ConnectionSlot<String>>,
}

impl Connected for AgentConnection {
    type ConnectInfo = PeerIdentity;

    fn connect_info(&self) -> PeerIdentity {
        self.peer.clone()
    }
}

impl AsyncRead for AgentConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for AgentConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Accepts connections on `listener` forever, handing finished mutual-TLS connections that
/// `policy` admits to the returned channel (the gRPC server's incoming stream), each under
/// `--keepalive-min-interval` ([`KeepaliveEnforced`]) and within `per_agent`, keyed by the agent
/// the certificate names (or, when it names none, by the certificate); HTTP/1.1 connections go to
/// `http1` when given (`--enable-websocket`).
#[allow(clippy::too_many_arguments)]
pub fn accept_loop(
    listener: TcpListener,
    tls: ReloadingServerConfig,
    source: IdentitySource,
    metrics: Arc<PrincipalMetrics>,
    policy: ConnectionPolicy,
    keepalive_min_interval: Option<Duration>,
    per_agent: Arc<ConnectionLimit<String>>,
    http1: Option<Http1Calls>,
) -> mpsc::Receiver<Result<AgentConnection, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    let handshake_timeout = policy.handshake_timeout;
    tokio::spawn(serve_tls_connections(
        listener,
        "agent gRPC",
        tls,
        handshake_timeout,
        std::future::pending(),
        move |handshake, remote| {
            let tx = tx.clone();
            let source = source.clone();
            let metrics = metrics.clone();
            let policy = policy.clone();
            let per_agent = per_agent.clone();
            let http1 = http1.clone();
            async move {
                let admitted = match admit(handshake, &policy).await {
                    Ok(admitted) => admitted,
                    Err((refusal, reason)) => {
                        metrics.auth_failure(refusal.reason());
                        if refusal == Refusal::Blocklisted {
                            tracing::warn!(%remote, %reason, "connection refused");
                        } else {
                            tracing::info!(%remote, %reason, "connection dropped");
                        }
                        return;
                    }
                };
                let identity = agent_of_certificate(admitted.leaf.as_deref(), &source);
                if let Err(reason) = &identity {
                    metrics.auth_failure("certificate_identity");
                    tracing::warn!(%remote, %reason, "client certificate does not name a valid agent");
                }
                let key = match (&identity, &admitted.leaf) {
                    (Ok(id), _) => id.name.as_str().to_string(),
                    (Err(_), Some(der)) => format!("certificate {}", cert_fingerprint(der)),
                    (Err(_), None) => "no certificate".to_string(),
                };
                let alpn = admitted
                    .stream
                    .get_ref()
                    .get_ref()
                    .1
                    .alpn_protocol()
                    .map(<[u8]>::to_vec);
                let stream = admitted.stream.map(Either::Left);
                let Some((wire, stream)) = wire_of(stream, alpn, http1.is_some(), remote).await
                else {
                    return;
                };
                let slot = match per_agent.admit(key.clone()) {
                    Ok(slot) => slot,
                    Err(open) => {
                        metrics.auth_failure("too_many_connections");
                        let reason = format!(
                            "too many connections: {key} already holds {open} (--max-connections-per-agent={})",
                            per_agent.max()
                        );
                        tracing::warn!(%remote, %reason, "connection refused");
                        let goodbye = match wire {
                            Wire::Http2 => goaway_over_cap(&reason),
                            Wire::Http1 => too_many_requests(&reason),
                        };
                        say_goodbye(stream, &goodbye).await;
                        return;
                    }
                };
                let peer = PeerIdentity {
                    credential: PeerCredential::Certificate(identity),
                    remote: Some(remote),
                };
                serve(
                    wire,
                    stream,
                    peer,
                    Some(slot),
                    keepalive_min_interval,
                    &tx,
                    http1.as_ref(),
                )
                .await;
            }
        },
    ));
    rx
}

/// Hands a routed connection to the gRPC server (HTTP/2, under `--keepalive-min-interval`) or
/// serves it as HTTP/1.1 (`http1`, present whenever the connection was routed there); `slot` is
/// held as long as the connection is open.
async fn serve(
    wire: Wire,
    stream: Rewind<GuardedStream<AgentTransport>>,
    peer: PeerIdentity,
    slot: Option<ConnectionSlot<String>>,
    keepalive_min_interval: Option<Duration>,
    grpc: &mpsc::Sender<Result<AgentConnection, std::io::Error>>,
    http1: Option<&Http1Calls>,
) {
    let connection = |min_interval| AgentConnection {
        stream: KeepaliveEnforced::new(stream, min_interval),
        peer,
        _slot: slot,
    };
    match (wire, http1) {
        // HTTP/2 PINGs are not HTTP/1.1's: the keepalive enforcement stays with HTTP/2.
        (Wire::Http1, Some(http1)) => http1(connection(None)).await,
        _ => {
            let _ = grpc.send(Ok(connection(keepalive_min_interval))).await;
        }
    }
}

/// [`accept_loop`] for `--insecure-plaintext`: connections without TLS, as a service mesh sidecar
/// forwards them, each under `--request-header-timeout` and `--keepalive-min-interval`. Every
/// request on them names its agent in `header` ([`PeerCredential::MeshHeader`]). No
/// `--max-connections-per-agent` here: the agent is not known per connection (and every
/// connection comes from the sidecar), so the mesh is where connections are limited.
pub fn plaintext_accept_loop(
    listener: TcpListener,
    header: HeaderIdentity,
    policy: ConnectionPolicy,
    keepalive_min_interval: Option<Duration>,
    http1: Option<Http1Calls>,
) -> mpsc::Receiver<Result<AgentConnection, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    let header = Arc::new(header);
    tokio::spawn(serve_connections(
        listener,
        "agent gRPC (plaintext)",
        std::future::pending(),
        move |tcp, remote| {
            let tx = tx.clone();
            let header = header.clone();
            let http1 = http1.clone();
            let request_header_timeout = policy.request_header_timeout;
            async move {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(%remote, error = %e, "cannot disable Nagle's delay");
                }
                let stream = GuardedStream::new(Either::Right(tcp), request_header_timeout, None);
                let Some((wire, stream)) = wire_of(stream, None, http1.is_some(), remote).await
                else {
                    return;
                };
                let peer = PeerIdentity {
                    credential: PeerCredential::MeshHeader(header),
                    remote: Some(remote),
                };
                serve(
                    wire,
                    stream,
                    peer,
                    None,
                    keepalive_min_interval,
                    &tx,
                    http1.as_ref(),
                )
                .await;
            }
        },
    ));
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn cert_with(usages: Vec<rcgen::KeyUsagePurpose>) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.key_usages = usages;
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_key_holds_at_most_its_cap_of_connections_and_closing_one_frees_a_slot() {
        let limit = ConnectionLimit::new(2);
        let first = limit.admit("a").unwrap();
        let second = limit.admit("a").unwrap();
        assert_eq!(limit.admit("a").err(), Some(2));
        let _other = limit.admit("b").expect("the cap is per key");
        drop(first);
        let third = limit
            .admit("a")
            .expect("a closed connection frees its slot");
        drop((second, third));
        assert!(
            !limit.open.lock().unwrap().contains_key("a"),
            "a key with no connections is forgotten"
        );
    }

    #[test]
    fn an_agent_holds_at_most_its_cap_and_all_agents_the_total() {
        let caps = AgentCaps::new(3, 2);
        let a = [caps.admit("a").unwrap(), caps.admit("a").unwrap()];
        assert_eq!(caps.admit("a").err(), Some(CapFull::Agent(2)));
        let b = caps.admit("b").expect("another agent has room");
        assert_eq!(caps.admit("c").err(), Some(CapFull::All(3)));
        assert_eq!(caps.open("c"), 0, "a refused admission holds no place");
        assert_eq!(caps.open("a"), 2);
        drop(a);
        let _c = caps.admit("c").expect("dropped places are free again");
        assert_eq!(caps.open("a"), 0);
        drop(b);
    }

    #[test]
    fn weighted_places_count_their_weight_and_a_refusal_holds_nothing() {
        let caps = AgentCaps::new(10, 6);
        let a = caps.admit_n("a", 5).unwrap();
        assert_eq!(caps.admit_n("a", 2).err(), Some(CapFull::Agent(5)));
        assert_eq!(caps.admit_n("b", 6).err(), Some(CapFull::All(5)));
        assert_eq!(caps.open("b"), 0);
        let b = caps.admit_n("b", 5).unwrap();
        drop(a);
        assert_eq!(caps.open("a"), 0);
        let _a = caps.admit_n("a", 5).expect("freed by the drop");
        drop(b);
    }

    #[test]
    fn key_usage_must_allow_signatures_when_present() {
        assert!(check_key_usage(&cert_with(vec![])).is_ok(), "no extension");
        assert!(
            check_key_usage(&cert_with(vec![rcgen::KeyUsagePurpose::DigitalSignature])).is_ok()
        );
        let err =
            check_key_usage(&cert_with(vec![rcgen::KeyUsagePurpose::KeyEncipherment])).unwrap_err();
        assert!(err.contains("digitalSignature"), "{err}");
    }

    #[tokio::test]
    async fn a_silent_connection_times_out_and_a_talking_one_does_not() {
        let (client, server) = tokio::io::duplex(64);
        let mut guarded = GuardedStream::new(server, Duration::from_millis(100), None);
        let mut buf = [0u8; 8];
        let err = guarded.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        drop(client);

        let (mut client, server) = tokio::io::duplex(64);
        let mut guarded = GuardedStream::new(server, Duration::from_millis(100), None);
        client.write_all(b"x").await.unwrap();
        assert_eq!(guarded.read(&mut buf).await.unwrap(), 1);
        // After the first bytes, silence is the protocol's business, not the guard's.
        let idle = tokio::time::timeout(Duration::from_millis(300), guarded.read(&mut buf)).await;
        assert!(
            idle.is_err(),
            "the guard timed out a connection that had spoken"
        );
    }

    #[tokio::test]
    async fn a_connection_closes_when_its_certificate_gets_listed() {
        let list = Blocklist::empty();
        let (_client, server) = tokio::io::duplex(64);
        let mut guarded = GuardedStream::new(
            server,
            Duration::from_secs(60),
            Some((list.clone(), "FP".to_string())),
        );
        let mut buf = [0u8; 8];
        let reader = async { guarded.read(&mut buf).await };
        let lister = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            list.replace(BTreeSet::from(["FP".to_string()]));
        };
        let (read, ()) = tokio::join!(reader, lister);
        assert_eq!(
            read.unwrap_err().kind(),
            std::io::ErrorKind::ConnectionAborted
        );
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    }

    fn ping() -> Vec<u8> {
        frame(FRAME_PING, 0, 0, &[0; 8])
    }

    #[test]
    fn the_third_early_ping_breaks_the_policy_and_spaced_pings_never_do() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut p = PingEnforcement::new(Duration::from_secs(1));
        let mut opening = CLIENT_PREFACE.to_vec();
        opening.extend(frame(0x4, 0, 0, &[]));
        opening.extend(ping());
        assert!(!p.client_sent(&opening, ms(0)), "the first ping is free");
        assert!(!p.client_sent(&ping(), ms(10)), "strike 1");
        // A PING ACK (answering the server's own ping) is no ping from the client.
        assert!(!p.client_sent(&frame(FRAME_PING, FLAG_ACK, 0, &[0; 8]), ms(15)));
        assert!(!p.client_sent(&ping(), ms(20)), "strike 2");
        assert!(p.client_sent(&ping(), ms(30)), "strike 3 ends it");

        let mut spaced = PingEnforcement::new(Duration::from_secs(1));
        assert!(!spaced.client_sent(CLIENT_PREFACE, ms(0)));
        for i in 0..10 {
            assert!(!spaced.client_sent(&ping(), ms(1000 * i)));
        }
    }

    #[test]
    fn server_traffic_between_pings_resets_the_strikes_as_in_grpc_go() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut p = PingEnforcement::new(Duration::from_secs(1));
        p.client_sent(CLIENT_PREFACE, ms(0));
        for i in 0..20 {
            // Split the frames byte by byte: the scanner must follow boundaries across reads.
            p.server_sent(&frame(FRAME_DATA, 0, 1, b"event")[..4]);
            p.server_sent(&frame(FRAME_DATA, 0, 1, b"event")[4..]);
            for b in ping() {
                assert!(!p.client_sent(&[b], ms(i)), "ping {i} after server data");
            }
        }
    }

    #[test]
    fn the_goaway_names_the_last_stream_and_too_many_pings() {
        let mut p = PingEnforcement::new(Duration::from_secs(1));
        let mut bytes = CLIENT_PREFACE.to_vec();
        bytes.extend(frame(FRAME_HEADERS, 0x4, 7, &[0x82]));
        p.client_sent(&bytes, Instant::now());
        let goaway = p.goaway_frame();
        assert_eq!(goaway[3], FRAME_GOAWAY);
        assert_eq!(&goaway[9..13], &7u32.to_be_bytes());
        assert_eq!(&goaway[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
        assert_eq!(&goaway[17..], TOO_MANY_PINGS);
        assert_eq!(
            goaway.len(),
            9 + u32::from_be_bytes([0, goaway[0], goaway[1], goaway[2]]) as usize
        );
    }

    #[tokio::test]
    async fn a_ping_flood_gets_goaway_after_the_frame_under_way_and_the_connection_closes() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut conn = KeepaliveEnforced::new(server, Some(Duration::from_secs(60)));
        // The server is half-way through a DATA frame when the flood arrives.
        let data = frame(FRAME_DATA, 0, 1, b"0123456789");
        assert_eq!(conn.write(&data[..12]).await.unwrap(), 12);
        let mut flood = CLIENT_PREFACE.to_vec();
        for _ in 0..4 {
            flood.extend(ping());
        }
        client.write_all(&flood).await.unwrap();
        let mut buf = vec![0u8; 1024];
        let n = conn.read(&mut buf).await.unwrap();
        assert_eq!(n, flood.len(), "the frames still reach the server");
        // The frame under way completes (and no more than it), then the GOAWAY follows.
        let mut rest = data[12..].to_vec();
        rest.extend(frame(FRAME_DATA, 0, 1, b"next"));
        assert_eq!(
            conn.write(&rest).await.unwrap(),
            data.len() - 12,
            "the rest of the frame, not the next one"
        );
        let err = conn
            .write(&frame(FRAME_DATA, 0, 1, b"more"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionAborted);
        assert_eq!(conn.read(&mut buf).await.unwrap(), 0, "reads see the end");
        drop(conn);
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(&got[..data.len()], &data[..]);
        let goaway = &got[data.len()..];
        assert_eq!(goaway[3], FRAME_GOAWAY);
        assert_eq!(&goaway[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
        assert!(goaway.ends_with(TOO_MANY_PINGS));
    }

    #[tokio::test]
    async fn without_a_minimum_interval_pings_pass_untouched() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut conn = KeepaliveEnforced::new(server, None);
        let mut flood = CLIENT_PREFACE.to_vec();
        for _ in 0..50 {
            flood.extend(ping());
        }
        client.write_all(&flood).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let mut total = 0;
        while total < flood.len() {
            total += conn.read(&mut buf).await.unwrap();
        }
        assert_eq!(conn.write(b"x").await.unwrap(), 1);
    }
}
