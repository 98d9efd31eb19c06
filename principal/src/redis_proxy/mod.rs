//! The Redis proxy: a RESP endpoint the hub's Argo CD server uses as its Redis.
//!
//! Owns one proxied connection per client: `GET` and `SUBSCRIBE` of the live-view keys of an
//! agent's applications (`app|managed-resources|<agent>_<app>|…`, `app|resources-tree|…`) are
//! answered from that agent's local Redis through its event stream; every other command goes to
//! the hub's real Redis on a connection of its own. Replies keep the order of the commands.
//! Malformed RESP gets an error reply and the connection closes (as Redis does); an agent that
//! goes away answers its waiting commands (and ends its subscriptions) with an error at once; an
//! unreachable upstream answers each command with an error instead of hanging (upstream #1104).
//! A client frame declaring more than the configured maximum request size (a bulk string, an
//! array, or an unterminated line) is refused from its header, before the bytes arrive, and the
//! connection closes. Each command is counted once in [`ProxyMetrics`].
//!
//! Bounded per client: one IP may hold `--redis-proxy-max-connections-per-ip` connections (the
//! next one is answered `-ERR max number of clients reached …` and closed, as Redis answers at its
//! `maxclients`), and one connection may hold `--redis-proxy-max-subscriptions-per-connection`
//! channels on agents (a `SUBSCRIBE` past it gets an error for each channel over).
//!
//! Each channel subscribed on an agent travels under a connection UUID of its own, so that the
//! agent can end it alone and its pushes come back to it whichever agent sends them (one client
//! may subscribe to channels of several agents). The wire has no per-channel unsubscribe, but
//! it has per-connection ends: on `UNSUBSCRIBE` (or when the client's connection ends) an agent
//! that answered the subscription with `supportsCloseConnection` (ours) is sent
//! `closeConnection` for that channel's UUID and closes its subscriber connection to the spoke
//! Redis at once, which frees the channel's slot. An upstream agent lacks that message: it
//! closes a subscription when its pings stop (its 10-minute idle rule, checked each minute), so
//! a channel unsubscribed on one keeps its slot for [`UPSTREAM_IDLE_CLOSE`], and the cap bounds
//! what it holds on the spoke either way.
//!
//! With hub Redis credentials configured (`--redis-password`, as Argo CD's default install
//! protects its Redis), every upstream connection authenticates with them, and a client must
//! authenticate first (`AUTH`, or `HELLO 2 AUTH`), as against Redis itself: the same credentials
//! are accepted here, other ones are checked by the hub Redis. Until then every other command
//! gets `NOAUTH`, so the proxy never opens the hub Redis or an agent's cache to a client without
//! the password. `HELLO 3` gets `NOPROTO` (the proxy speaks RESP2), which makes Argo CD's client
//! fall back to RESP2 and `AUTH`.
//!
//! With `--redis-tls-enabled` (upstream's flag, for an Argo CD whose Redis runs with TLS) the
//! listener serves TLS (no client certificates: clients authenticate with `AUTH`), and the hub
//! Redis is reached over TLS as the runtime's [`RedisTarget`] is configured.
//! The RESP codec is the `redis-protocol` crate's, behind [`ClientCodec`]'s checks.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use argocd_agent_proto::event::Event;
use argocd_agent_proto::payload::{
    RedisCommandBody, RedisCommandBodyCloseConnection, RedisCommandBodyGet, RedisCommandBodyPing,
    RedisCommandBodySubscribe, RedisRequest, RedisResponse,
};
use argocd_agent_runtime::redis_client::{RedisIo, RedisTarget};
use argocd_agent_runtime::tls::ReloadingServerConfig;
use bytes::{Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use redis_protocol::codec::Resp2;
use redis_protocol::error::{RedisProtocolError, RedisProtocolErrorKind};
use redis_protocol::resp2::types::BytesFrame as Frame;
use tokio::io::{AsyncRead, AsyncWrite, WriteHalf};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::codec::{Decoder, FramedRead, FramedWrite};

use crate::config::RedisCredentials;
use crate::hub::Hub;
use crate::listener::{ConnectionLimit, ConnectionSlot};
use crate::live::{LiveReply, LiveRequests, LiveWaiter, WaitKind};
use crate::metrics::ProxyMetrics;
use crate::sessions::AgentRegistry;

/// Key prefixes answered by agents.
pub const AGENT_KEY_PREFIXES: [&str; 2] = ["app|managed-resources|", "app|resources-tree|"];
/// How long a command waits for the agent (upstream: 60 s).
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a command waits for the hub's Redis.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a connection with agent subscriptions tells the agent it is still there.
const SUBSCRIPTION_PING: Duration = Duration::from_secs(60);
/// How long an upstream agent keeps a subscription after its last ping: 10 minutes without
/// pings, checked once a minute (argocd-agent v0.9.0 `principalRedisConnectionTimeout`).
pub const UPSTREAM_IDLE_CLOSE: Duration = Duration::from_secs(11 * 60);
/// Default largest client frame (`--redis-proxy-max-request-size`): Argo CD's cache writes are
/// far smaller, and Redis itself refuses bulk strings over 512 MB.
pub const DEFAULT_MAX_REQUEST_SIZE: usize = 16 << 20;
/// The fewest bytes a RESP element takes (`+\r\n`), to bound what an array header declares.
const MIN_ELEMENT_SIZE: u64 = 3;
/// Default `--redis-proxy-max-connections-per-ip`: Argo CD's server pools its connections
/// (go-redis: 10 per CPU) and opens one more per live-view watch; each connection holds a hub
/// Redis connection and, with subscriptions, one on the agent's Redis.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 512;
/// Default `--redis-proxy-max-subscriptions-per-connection`: Argo CD subscribes one channel per
/// connection.
pub const DEFAULT_MAX_SUBSCRIPTIONS_PER_CONNECTION: usize = 64;

/// The proxy's view of the principal.
pub struct RedisProxy {
    /// Agents' sessions (their outboxes carry the requests).
    pub registry: Arc<AgentRegistry>,
    /// Waiting requests and connected agents.
    pub live: Arc<LiveRequests>,
    /// The hub's Redis (address, TLS, and the credentials upstream connections authenticate with).
    pub upstream: RedisTarget,
    /// What clients must present (the hub Redis's credentials); `None` = no AUTH.
    pub credentials: Option<RedisCredentials>,
    /// Largest client frame in bytes.
    pub max_request_size: usize,
    /// Connections one client IP may hold open.
    pub max_connections_per_ip: usize,
    /// Channels one connection may hold subscribed on agents.
    pub max_subscriptions_per_connection: usize,
    /// Commands, errors and latency.
    pub metrics: ProxyMetrics,
    /// Under destination-based mapping, the hub that says which agent an application's key goes
    /// to (its `spec.destination.name`); `None`: the key's namespace is the agent.
    pub destination_mapping: Option<Arc<Hub>>,
}

/// The `command` label of a command name: the commands Argo CD and the proxy use, others as
/// `OTHER`, so a client cannot grow the metric with names of its own.
pub fn command_label(name: &str) -> &'static str {
    const KNOWN: [&str; 20] = [
        "GET",
        "SET",
        "SETEX",
        "DEL",
        "EXISTS",
        "EXPIRE",
        "MGET",
        "MSET",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "PSUBSCRIBE",
        "PUNSUBSCRIBE",
        "PUBLISH",
        "PING",
        "AUTH",
        "HELLO",
        "SELECT",
        "CLIENT",
        "INFO",
        "QUIT",
    ];
    KNOWN
        .into_iter()
        .find(|k| k.eq_ignore_ascii_case(name))
        .unwrap_or("OTHER")
}

/// The agent whose application a live-view key is about (namespace mapping): the
/// `<namespace>_<app>` segment names the hub namespace, which is the agent's name. `None` for
/// every other key.
pub fn agent_of_key(key: &str) -> Option<&str> {
    match app_of_key(key)? {
        (Some(namespace), _) => Some(namespace),
        (None, _) => None,
    }
}

/// The application a live-view key is about: (`Some(namespace)` for `<namespace>_<app>`, `None`
/// for an application in the hub Argo CD's own namespace, which Argo CD names `<app>`; the name).
/// `None` for every other key. Kubernetes names hold no `_`, so the split is unambiguous.
pub fn app_of_key(key: &str) -> Option<(Option<&str>, &str)> {
    let rest = AGENT_KEY_PREFIXES
        .iter()
        .find_map(|p| key.strip_prefix(p))?;
    let app = rest.split('|').next()?;
    match app.split_once('_') {
        Some((namespace, name)) => {
            (!namespace.is_empty() && !name.is_empty()).then_some((Some(namespace), name))
        }
        None => (!app.is_empty()).then_some((None, app)),
    }
}

fn error(msg: impl AsRef<str>) -> Frame {
    Frame::Error(format!("ERR {}", msg.as_ref()).into())
}

fn bulk(s: &str) -> Frame {
    Frame::BulkString(Bytes::copy_from_slice(s.as_bytes()))
}

/// The arguments of a command frame (name first), or why it is not one: a command is a
/// non-empty array of bulk (or simple) strings. Every client frame goes through this first.
pub fn command_args(frame: &Frame) -> Result<Vec<Bytes>, &'static str> {
    let Frame::Array(items) = frame else {
        return Err("Protocol error: a command must be an array of bulk strings");
    };
    if items.is_empty() {
        return Err("Protocol error: empty command");
    }
    items
        .iter()
        .map(|f| match f {
            Frame::BulkString(b) | Frame::SimpleString(b) => Ok(b.clone()),
            _ => Err("Protocol error: a command must be an array of bulk strings"),
        })
        .collect()
}

/// The codec of client connections: RESP2 frames as [`Resp2`] reads them, after two checks on
/// the headers of the frame, made without recursion and before it is parsed:
/// - a frame nesting one array in another is refused, as Redis refuses it. The parser recurses
///   once per nesting level: a client sending a few thousand nested array headers
///   (`*1\r\n*1\r\n…`, found by the `resp_parser` fuzz target) overflowed the stack and
///   aborted the principal;
/// - a frame declaring more than `max_request_size` bytes (a bulk string's length, an array's
///   element count, or a line that does not end) is refused as soon as its header is read, so
///   the declared size is never buffered or allocated.
#[derive(Debug)]
pub struct ClientCodec {
    resp: Resp2,
    max_request_size: usize,
    refused_oversized: bool,
}

impl Default for ClientCodec {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_REQUEST_SIZE)
    }
}

impl ClientCodec {
    /// A codec refusing frames over `max_request_size` bytes.
    pub fn new(max_request_size: usize) -> Self {
        Self {
            resp: Resp2::default(),
            max_request_size,
            refused_oversized: false,
        }
    }

    /// Whether the last error was a frame over the size limit.
    pub fn refused_oversized(&self) -> bool {
        self.refused_oversized
    }
}

impl Decoder for ClientCodec {
    type Item = Frame;
    type Error = RedisProtocolError;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, RedisProtocolError> {
        match inspect_frame(buf, self.max_request_size) {
            Some(FrameRefusal::NestedArray) => Err(RedisProtocolError::new(
                RedisProtocolErrorKind::DecodeError,
                "a command must be a flat array of bulk strings (nested arrays are refused)",
            )),
            Some(FrameRefusal::TooLarge) => {
                self.refused_oversized = true;
                Err(RedisProtocolError::new(
                    RedisProtocolErrorKind::DecodeError,
                    format!(
                        "the request declares more than the proxy's limit of {} bytes",
                        self.max_request_size
                    ),
                ))
            }
            None => self.resp.decode(buf),
        }
    }
}

/// Why [`ClientCodec`] refuses a frame before parsing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrameRefusal {
    /// An array inside an array.
    NestedArray,
    /// More bytes declared (or already sent for one frame) than the limit.
    TooLarge,
}

/// Checks the first RESP2 frame in `buf` (complete or not) header by header, without recursion:
/// arrays nested in arrays, and the least size the headers read so far commit the frame to.
/// Malformed input is left to the parser.
fn inspect_frame(buf: &[u8], limit: usize) -> Option<FrameRefusal> {
    let limit = limit as u64;
    let mut open_arrays: Vec<u64> = Vec::new(); // elements still expected, per open array
    let mut pos = 0usize;
    loop {
        let kind = *buf.get(pos)?;
        let line_start = pos + 1;
        let Some(eol) = buf[line_start..].windows(2).position(|w| w == b"\r\n") else {
            // Everything buffered belongs to this frame's unfinished line.
            return (buf.len() as u64 > limit).then_some(FrameRefusal::TooLarge);
        };
        let len = std::str::from_utf8(&buf[line_start..line_start + eol])
            .ok()
            .and_then(|l| l.parse::<i64>().ok());
        pos = line_start + eol + 2;
        // The least the frame can still take: one element per element expected by open arrays.
        let pending: u64 = open_arrays.iter().sum::<u64>().saturating_sub(1);
        let committed = |declared: u64| {
            (pos as u64)
                .saturating_add(declared)
                .saturating_add(pending.saturating_mul(MIN_ELEMENT_SIZE))
                > limit
        };
        match (kind, len) {
            (b'*', Some(n)) if n > 0 => {
                if !open_arrays.is_empty() {
                    return Some(FrameRefusal::NestedArray);
                }
                if committed((n as u64).saturating_mul(MIN_ELEMENT_SIZE)) {
                    return Some(FrameRefusal::TooLarge);
                }
                open_arrays.push(n as u64);
                continue;
            }
            (b'$', Some(n)) if n >= 0 => {
                let body = (n as u64).saturating_add(2);
                if committed(body) {
                    return Some(FrameRefusal::TooLarge);
                }
                pos = pos.saturating_add(body as usize);
            }
            (b'*' | b'$', Some(_)) | (b'+' | b'-' | b':', _) => {
                if committed(0) {
                    return Some(FrameRefusal::TooLarge);
                }
            }
            _ => return None,
        }
        // One element is complete: it completes every array it was the last element of.
        loop {
            match open_arrays.last_mut() {
                None => return None,
                Some(1) => {
                    open_arrays.pop();
                }
                Some(n) => {
                    *n -= 1;
                    break;
                }
            }
        }
    }
}

/// The hub-Redis side of one client connection.
pub(crate) struct Upstream {
    out: FramedWrite<WriteHalf<Box<dyn RedisIo>>, Resp2>,
    replies: mpsc::Receiver<Frame>,
}

/// Opens an authenticated connection to the hub Redis (TLS when configured); its replies arrive
/// on a channel, read by a task of their own, so pushes of a subscribed connection are not missed.
async fn connect_upstream(target: &RedisTarget) -> Result<Upstream, String> {
    let parts = target.connect().await?.into_parts();
    let (r, w) = tokio::io::split(parts.io);
    let (tx, replies) = mpsc::channel(64);
    let mut frames = FramedRead::new(r, Resp2::default());
    // Whatever arrived with the AUTH reply is not lost.
    frames.read_buffer_mut().extend_from_slice(&parts.read_buf);
    tokio::spawn(async move {
        while let Some(Ok(f)) = frames.next().await {
            if tx.send(f).await.is_err() {
                break;
            }
        }
    });
    Ok(Upstream {
        out: FramedWrite::new(w, Resp2::default()),
        replies,
    })
}

/// `AUTH [username] password`: the username only when one is given, so Redis before 6 (single
/// password) understands it too.
fn auth_command(username: Option<&str>, password: &str) -> Frame {
    let mut args = vec![bulk("AUTH")];
    if let Some(user) = username {
        args.push(bulk(user));
    }
    args.push(bulk(password));
    Frame::Array(args)
}

/// Whether `username`/`password` (a client's `AUTH`) are `expected`; no username means Redis's
/// `default` user. Compared without an early exit on the first differing byte.
pub fn credentials_match(
    expected: &RedisCredentials,
    username: Option<&[u8]>,
    password: &[u8],
) -> bool {
    fn same(a: &[u8], b: &[u8]) -> bool {
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
    let expected_user = expected.username.as_deref().unwrap_or("default").as_bytes();
    let user = username.unwrap_or(b"default");
    same(expected_user, user) & same(expected.password.expose().as_bytes(), password)
}

/// What a client's `AUTH` (or `HELLO … AUTH`) carries: `(username, password)`.
type ClientAuth = (Option<Bytes>, Bytes);

/// The parts of `HELLO [protover [AUTH username password] [SETNAME name]]`: the protocol
/// version asked for, the credentials, and the command without them (to forward upstream).
fn parse_hello(args: &[Bytes]) -> Result<(Option<Bytes>, Option<ClientAuth>, Frame), &'static str> {
    let protover = args.get(1).cloned();
    let mut forward = vec![Frame::BulkString(args[0].clone())];
    forward.extend(protover.clone().map(Frame::BulkString));
    let mut auth = None;
    let mut rest = args.iter().skip(2);
    while let Some(opt) = rest.next() {
        if opt.eq_ignore_ascii_case(b"AUTH") {
            let (Some(user), Some(pass)) = (rest.next(), rest.next()) else {
                return Err("Syntax error in HELLO option 'auth'");
            };
            auth = Some((Some(user.clone()), pass.clone()));
        } else if opt.eq_ignore_ascii_case(b"SETNAME") {
            let Some(name) = rest.next() else {
                return Err("Syntax error in HELLO option 'setname'");
            };
            forward.push(Frame::BulkString(opt.clone()));
            forward.push(Frame::BulkString(name.clone()));
        } else {
            return Err("Syntax error in HELLO option");
        }
    }
    Ok((protover, auth, Frame::Array(forward)))
}

/// The next push of any subscription, with the channel it came for; pending while there are none.
async fn next_push(
    subscriptions: &mut BTreeMap<String, AgentSubscription>,
) -> (String, Option<LiveReply>) {
    std::future::poll_fn(|cx| {
        subscriptions
            .iter_mut()
            .find_map(|(channel, sub)| match sub.pushes.poll_recv(cx) {
                Poll::Ready(reply) => Some((channel.clone(), reply)),
                Poll::Pending => None,
            })
            .map_or(Poll::Pending, Poll::Ready)
    })
    .await
}

async fn next_upstream(u: &mut Option<Upstream>, subscribed: bool) -> Option<Frame> {
    match u {
        Some(u) if subscribed => u.replies.recv().await,
        _ => std::future::pending().await,
    }
}

/// One channel subscribed on an agent for a client connection (see the module docs).
struct AgentSubscription {
    agent: String,
    /// The connection UUID the agent knows this subscription by.
    connection_uuid: String,
    /// Its pushes.
    pushes: LiveWaiter,
    /// The agent announced `supportsCloseConnection`.
    closes: bool,
}

/// One client connection.
struct ClientConnection {
    proxy: Arc<RedisProxy>,
    id: String,
    upstream: Option<Upstream>,
    /// Channels subscribed through agents.
    subscriptions: BTreeMap<String, AgentSubscription>,
    /// Until when upstream agents still hold channels this client unsubscribed: slots the
    /// subscription cap keeps counting.
    lingering: Vec<tokio::time::Instant>,
    /// The client is in subscribed mode on the upstream.
    upstream_subscribed: bool,
    /// The command being handled, for metrics.
    trace: CommandTrace,
    /// The client has authenticated (always, when the proxy has no credentials).
    authenticated: bool,
}

/// What the metrics say about one command: its `command` label, the agent that answered it (the
/// first one, for a SUBSCRIBE to several), and why the proxy answered it itself, if it did.
#[derive(Debug, Default)]
struct CommandTrace {
    command: &'static str,
    agent: Option<String>,
    failure: Option<&'static str>,
}

/// Why a command got an error from the proxy, and the message the client reads.
type Failure = (&'static str, String);

enum Outcome {
    Reply(Vec<Frame>),
    Close(Frame),
}

impl ClientConnection {
    /// Agent that answers `key`, if it is a live-view key of an agent the principal knows.
    fn agent_for(&self, key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        let agent = match &self.proxy.destination_mapping {
            None => agent_of_key(key)?.to_string(),
            Some(hub) => {
                let (namespace, name) = app_of_key(key)?;
                hub.agent_answering_for(namespace.unwrap_or(&hub.principal_namespace), name)?
            }
        };
        self.proxy.registry.get(&agent).map(|_| agent)
    }

    /// An error reply for the client, remembered (the first one) as the command's failure.
    fn fail(&mut self, (reason, message): Failure) -> Frame {
        self.trace.failure.get_or_insert(reason);
        error(message)
    }

    async fn ask_agent(
        &mut self,
        agent: &str,
        connection_uuid: &str,
        body: RedisCommandBody,
    ) -> Result<RedisResponse, Failure> {
        self.trace.agent.get_or_insert_with(|| agent.to_string());
        let proxy = &self.proxy;
        let not_connected = || {
            (
                "agent_not_connected",
                format!("agent {agent} is not connected"),
            )
        };
        if !proxy.live.is_connected(agent) {
            return Err(not_connected());
        }
        let session = proxy.registry.get(agent).ok_or_else(not_connected)?;
        let uuid = uuid::Uuid::new_v4().to_string();
        let mut waiter = proxy.live.register(agent, &uuid, WaitKind::Redis, 4);
        let req = RedisRequest {
            uuid: uuid.clone(),
            connection_uuid: connection_uuid.to_string(),
            body,
        };
        let ev = Event::redis_request("", &req).map_err(|e| ("internal", e.to_string()))?;
        session.outbox.push(ev).map_err(|e| {
            (
                "queue_full",
                format!("cannot queue the request for agent {agent}: {e}"),
            )
        })?;
        match tokio::time::timeout(AGENT_TIMEOUT, waiter.recv()).await {
            Err(_) => Err((
                "agent_timeout",
                format!("agent {agent} did not answer within {AGENT_TIMEOUT:?}"),
            )),
            Ok(Some(LiveReply::Redis(resp))) => Ok(resp),
            Ok(_) => Err(("agent_gone", format!("agent {agent} went away"))),
        }
    }

    async fn upstream_call(
        &mut self,
        frame: Frame,
        wait_reply: bool,
    ) -> Result<Option<Frame>, Failure> {
        self.upstream_exchange(frame, wait_reply)
            .await
            .map_err(|e| ("upstream_unavailable", e))
    }

    async fn upstream_exchange(
        &mut self,
        frame: Frame,
        wait_reply: bool,
    ) -> Result<Option<Frame>, String> {
        if self.upstream.is_none() {
            self.upstream = Some(connect_upstream(&self.proxy.upstream).await?);
        }
        let up = self.upstream.as_mut().expect("connected above");
        if let Err(e) = up.out.send(frame).await {
            self.upstream = None;
            return Err(format!("upstream redis: {e}"));
        }
        if !wait_reply {
            return Ok(None);
        }
        match tokio::time::timeout(UPSTREAM_TIMEOUT, up.replies.recv()).await {
            Ok(Some(f)) => Ok(Some(f)),
            Ok(None) => {
                self.upstream = None;
                Err("upstream redis closed the connection".into())
            }
            Err(_) => {
                // The reply may still come and would then answer the wrong command: start over.
                self.upstream = None;
                Err(format!(
                    "upstream redis did not answer within {UPSTREAM_TIMEOUT:?}"
                ))
            }
        }
    }

    /// Authentication in front of every command (see the module docs): answers `AUTH` and
    /// `HELLO` and refuses everything else until the client has authenticated; otherwise hands
    /// the command (a `HELLO` without its credentials) back to be run.
    async fn authentication(
        &mut self,
        name: &str,
        args: &[Bytes],
        frame: Frame,
    ) -> Result<Frame, Outcome> {
        let reply = |frame: Frame| Err(Outcome::Reply(vec![frame]));
        let Some(expected) = self.proxy.credentials.clone() else {
            // No password on the hub Redis: AUTH and HELLO go to it as they are.
            if name == "HELLO" && args.get(1).is_some_and(|v| v.as_ref() != b"2") {
                return reply(self.noproto());
            }
            return Ok(frame);
        };
        match name {
            "AUTH" => {
                let auth = match args {
                    [_, password] => (None, password.clone()),
                    [_, user, password] => (Some(user.clone()), password.clone()),
                    _ => {
                        return reply(self.fail((
                            "invalid_command",
                            "wrong number of arguments for 'auth' command".into(),
                        )))
                    }
                };
                let answer = self.authenticate(&expected, auth).await;
                reply(answer)
            }
            "HELLO" => {
                let (protover, auth, forward) = match parse_hello(args) {
                    Ok(parts) => parts,
                    Err(msg) => return reply(self.fail(("invalid_command", msg.into()))),
                };
                if protover.as_ref().is_some_and(|v| v.as_ref() != b"2") {
                    return reply(self.noproto());
                }
                if let Some(auth) = auth {
                    let answer = self.authenticate(&expected, auth).await;
                    if !self.authenticated {
                        return reply(answer);
                    }
                }
                if !self.authenticated {
                    return reply(self.noauth(
                        "HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
                    ));
                }
                Ok(forward)
            }
            "QUIT" => Ok(frame),
            _ if self.authenticated => Ok(frame),
            _ => reply(self.noauth("Authentication required.")),
        }
    }

    /// Checks a client's credentials: the proxy's own at once, any other ones by the hub Redis
    /// (an ACL user of its own). Returns the reply to send.
    async fn authenticate(&mut self, expected: &RedisCredentials, auth: ClientAuth) -> Frame {
        let (user, password) = auth;
        if credentials_match(expected, user.as_deref(), &password) {
            self.authenticated = true;
            return Frame::SimpleString(Bytes::from_static(b"OK"));
        }
        let user = user.map(|u| String::from_utf8_lossy(&u).into_owned());
        let password = String::from_utf8_lossy(&password).into_owned();
        match self
            .upstream_call(auth_command(user.as_deref(), &password), true)
            .await
        {
            Ok(Some(Frame::SimpleString(ok))) if ok.as_ref() == b"OK" => {
                self.authenticated = true;
                Frame::SimpleString(ok)
            }
            Ok(Some(refused @ Frame::Error(_))) => {
                self.trace.failure.get_or_insert("unauthenticated");
                refused
            }
            Ok(other) => self.fail((
                "upstream_unavailable",
                format!("upstream redis answered AUTH with {other:?}"),
            )),
            Err(e) => self.fail(e),
        }
    }

    fn noauth(&mut self, message: &str) -> Frame {
        self.trace.failure.get_or_insert("unauthenticated");
        Frame::Error(format!("NOAUTH {message}").into())
    }

    fn noproto(&mut self) -> Frame {
        self.trace.failure.get_or_insert("unsupported_protocol");
        Frame::Error(
            "NOPROTO sorry, this protocol version is not supported (the proxy speaks RESP2)".into(),
        )
    }

    fn subscription_count(&self) -> i64 {
        self.subscriptions.len() as i64
    }

    /// Channels on agents this connection holds: its subscriptions and the unsubscribed ones
    /// upstream agents have not closed yet.
    fn held_channels(&mut self) -> usize {
        let now = tokio::time::Instant::now();
        self.lingering.retain(|until| *until > now);
        self.subscriptions.len() + self.lingering.len()
    }

    /// Subscribes `channel` on `agent` under a connection UUID of its own; the reply for the
    /// client.
    async fn subscribe_on_agent(&mut self, agent: String, channel: String) -> Frame {
        let confirmed = |count| {
            Frame::Array(vec![
                bulk("subscribe"),
                bulk(&channel),
                Frame::Integer(count),
            ])
        };
        if self.subscriptions.contains_key(&channel) {
            return confirmed(self.subscription_count());
        }
        let max = self.proxy.max_subscriptions_per_connection;
        if self.held_channels() >= max {
            self.trace.agent.get_or_insert_with(|| agent.clone());
            return self.fail((
                "too_many_subscriptions",
                format!(
                    "max number of subscriptions reached: this connection holds {max} channels on agents (--redis-proxy-max-subscriptions-per-connection; a channel unsubscribed on an upstream agent is held until that agent closes it)"
                ),
            ));
        }
        let connection_uuid = uuid::Uuid::new_v4().to_string();
        // Registered before asking: a push may follow the agent's answer at once.
        let pushes = self
            .proxy
            .live
            .register(&agent, &connection_uuid, WaitKind::Redis, 64);
        let body = RedisCommandBody {
            subscribe: Some(RedisCommandBodySubscribe {
                channel_name: channel.clone(),
            }),
            ..Default::default()
        };
        match self.ask_agent(&agent, &connection_uuid, body).await {
            Ok(resp) => match resp.body.subscribe_response {
                Some(s) if s.error.is_empty() => {
                    let sub = AgentSubscription {
                        agent,
                        connection_uuid,
                        pushes,
                        closes: s.supports_close_connection,
                    };
                    self.subscriptions.insert(channel.clone(), sub);
                    confirmed(self.subscription_count())
                }
                Some(s) => self.fail(("agent_error", format!("agent {agent}: {}", s.error))),
                None => self.fail((
                    "agent_error",
                    format!("agent {agent} answered SUBSCRIBE with something else"),
                )),
            },
            Err(e) => {
                if e.0 == "agent_timeout" {
                    // It may still subscribe, unpinged: its idle rule ends that, holding the slot.
                    self.lingering
                        .push(tokio::time::Instant::now() + UPSTREAM_IDLE_CLOSE);
                }
                self.fail(e)
            }
        }
    }

    /// Ends a subscription on its agent: at once for an agent that can close it, otherwise its
    /// slot is held until the agent's idle rule has ended it.
    fn end_subscription(&mut self, sub: AgentSubscription) {
        if sub.closes {
            self.close_on_agent(&sub);
        } else {
            self.lingering
                .push(tokio::time::Instant::now() + UPSTREAM_IDLE_CLOSE);
        }
    }

    fn close_on_agent(&self, sub: &AgentSubscription) {
        let body = RedisCommandBody {
            close_connection: Some(RedisCommandBodyCloseConnection {}),
            ..Default::default()
        };
        self.notify_agent(&sub.agent, &sub.connection_uuid, body);
    }

    async fn command(&mut self, frame: Frame) -> Outcome {
        self.trace = CommandTrace {
            command: "INVALID",
            ..CommandTrace::default()
        };
        let args = match command_args(&frame) {
            Ok(a) => a,
            Err(msg) => {
                return Outcome::Reply(vec![self.fail(("invalid_command", msg.to_string()))])
            }
        };
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        self.trace.command = command_label(&name);
        let frame = match self.authentication(&name, &args, frame).await {
            Ok(frame) => frame,
            Err(outcome) => return outcome,
        };
        match name.as_str() {
            "GET" if args.len() == 2 => {
                if let Some(agent) = self.agent_for(&args[1]) {
                    let key = String::from_utf8_lossy(&args[1]).into_owned();
                    let body = RedisCommandBody {
                        get: Some(RedisCommandBodyGet { key }),
                        ..Default::default()
                    };
                    let id = self.id.clone();
                    let reply = match self.ask_agent(&agent, &id, body).await {
                        Ok(resp) => match resp.body.get {
                            Some(g) if !g.error.is_empty() => {
                                self.fail(("agent_error", format!("agent {agent}: {}", g.error)))
                            }
                            Some(g) if g.cache_hit => Frame::BulkString(Bytes::from(g.bytes)),
                            Some(_) => Frame::Null,
                            None => self.fail((
                                "agent_error",
                                format!("agent {agent} answered GET with something else"),
                            )),
                        },
                        Err(e) => self.fail(e),
                    };
                    return Outcome::Reply(vec![reply]);
                }
            }
            "SUBSCRIBE" if args.len() >= 2 => {
                let mut replies = Vec::new();
                let mut upstream_channels = Vec::new();
                for ch in &args[1..] {
                    let Some(agent) = self.agent_for(ch) else {
                        upstream_channels.push(Frame::BulkString(ch.clone()));
                        continue;
                    };
                    let channel = String::from_utf8_lossy(ch).into_owned();
                    replies.push(self.subscribe_on_agent(agent, channel).await);
                }
                if !upstream_channels.is_empty() {
                    let mut cmd = vec![bulk("SUBSCRIBE")];
                    cmd.extend(upstream_channels);
                    // Upstream confirms (and later pushes) on its own; they are forwarded as they come.
                    self.upstream_subscribed = true;
                    if let Err(e) = self.upstream_call(Frame::Array(cmd), false).await {
                        replies.push(self.fail(e));
                    }
                }
                return Outcome::Reply(replies);
            }
            "UNSUBSCRIBE" if !self.subscriptions.is_empty() => {
                let channels: Vec<String> = if args.len() == 1 {
                    self.subscriptions.keys().cloned().collect()
                } else {
                    args[1..]
                        .iter()
                        .map(|c| String::from_utf8_lossy(c).into_owned())
                        .filter(|c| self.subscriptions.contains_key(c))
                        .collect()
                };
                let mut replies = Vec::new();
                for ch in channels {
                    if let Some(sub) = self.subscriptions.remove(&ch) {
                        self.trace.agent.get_or_insert_with(|| sub.agent.clone());
                        self.end_subscription(sub);
                    }
                    replies.push(Frame::Array(vec![
                        bulk("unsubscribe"),
                        bulk(&ch),
                        Frame::Integer(self.subscription_count()),
                    ]));
                }
                if self.upstream_subscribed {
                    if let Err(e) = self.upstream_call(frame, false).await {
                        replies.push(self.fail(e));
                    }
                }
                return Outcome::Reply(replies);
            }
            "QUIT" => return Outcome::Close(Frame::SimpleString(Bytes::from_static(b"OK"))),
            _ => {}
        }
        let wait = !self.upstream_subscribed;
        match self.upstream_call(frame, wait).await {
            Ok(Some(reply)) => Outcome::Reply(vec![reply]),
            Ok(None) => Outcome::Reply(Vec::new()),
            Err(e) => Outcome::Reply(vec![self.fail(e)]),
        }
    }

    /// Counts the command of [`Self::trace`], started at `started`.
    fn observe(&self, started: tokio::time::Instant) {
        let t = &self.trace;
        self.proxy.metrics.observe(
            t.agent.as_deref().unwrap_or(""),
            t.command,
            t.failure,
            started.elapsed(),
        );
    }

    /// Tells the agent of each subscription that it is still wanted.
    fn ping_agents(&self) {
        for sub in self.subscriptions.values() {
            let body = RedisCommandBody {
                ping: Some(RedisCommandBodyPing {}),
                ..Default::default()
            };
            self.notify_agent(&sub.agent, &sub.connection_uuid, body);
        }
    }

    /// Queues `body` about the agent-side connection `connection_uuid` for `agent`, answered by
    /// nobody.
    fn notify_agent(&self, agent: &str, connection_uuid: &str, body: RedisCommandBody) {
        let Some(session) = self.proxy.registry.get(agent) else {
            return;
        };
        let req = RedisRequest {
            uuid: uuid::Uuid::new_v4().to_string(),
            connection_uuid: connection_uuid.to_string(),
            body,
        };
        match Event::redis_request("", &req) {
            Ok(ev) => {
                if let Err(e) = session.outbox.push(ev) {
                    tracing::debug!(agent, connection = %connection_uuid, error = %e, "redis proxy: cannot queue a notice for the agent");
                }
            }
            Err(e) => tracing::warn!(error = %e, "redis proxy: cannot build a redis request"),
        }
    }
}

/// However the connection ends, the agents that can close its subscriptions are told to.
impl Drop for ClientConnection {
    fn drop(&mut self) {
        for sub in self.subscriptions.values().filter(|s| s.closes) {
            self.close_on_agent(sub);
        }
    }
}

/// Counts the bytes read from a client, so that a command trickling in can be told from an idle
/// connection (slowloris).
struct CountingReader<R> {
    inner: R,
    read: Arc<std::sync::atomic::AtomicU64>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for CountingReader<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        self.read.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        r
    }
}

/// Slowloris guard of one client: the first command must arrive within `limit` of the
/// connection opening, and a command, once its first bytes arrived, within `limit` of them.
/// Idle time between commands is not limited (pooled clients keep connections open).
struct CommandDeadline {
    limit: Duration,
    read: Arc<std::sync::atomic::AtomicU64>,
    opened: tokio::time::Instant,
    /// Bytes read when the last command was complete.
    consumed: u64,
    seen_command: bool,
    partial_since: Option<tokio::time::Instant>,
}

impl CommandDeadline {
    fn command_done(&mut self) {
        self.consumed = self.read.load(std::sync::atomic::Ordering::Relaxed);
        self.seen_command = true;
        self.partial_since = None;
    }

    /// Why the connection must close now, if it must.
    fn expired(&mut self) -> Option<String> {
        let now = tokio::time::Instant::now();
        if !self.seen_command && now - self.opened >= self.limit {
            return Some(format!("no complete command within {:?}", self.limit));
        }
        if self.read.load(std::sync::atomic::Ordering::Relaxed) > self.consumed {
            let since = *self.partial_since.get_or_insert(now);
            if now - since >= self.limit {
                return Some(format!("command not completed within {:?}", self.limit));
            }
        }
        None
    }
}

async fn serve_client<S: AsyncRead + AsyncWrite + Send + 'static>(
    proxy: Arc<RedisProxy>,
    stream: S,
    remote: SocketAddr,
    command_timeout: Duration,
    _slot: ConnectionSlot<IpAddr>,
) {
    let (r, w) = tokio::io::split(stream);
    let read = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut deadline = CommandDeadline {
        limit: command_timeout,
        read: read.clone(),
        opened: tokio::time::Instant::now(),
        consumed: 0,
        seen_command: false,
        partial_since: None,
    };
    let mut check = tokio::time::interval(
        (command_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(1)),
    );
    let r = CountingReader { inner: r, read };
    let mut input = FramedRead::new(r, ClientCodec::new(proxy.max_request_size));
    let mut output = FramedWrite::new(w, Resp2::default());
    let proxy_has_no_credentials = proxy.credentials.is_none();
    let mut conn = ClientConnection {
        proxy,
        id: uuid::Uuid::new_v4().to_string(),
        upstream: None,
        subscriptions: BTreeMap::new(),
        lingering: Vec::new(),
        upstream_subscribed: false,
        trace: CommandTrace::default(),
        authenticated: proxy_has_no_credentials,
    };
    let mut ping = tokio::time::interval(SUBSCRIPTION_PING);
    ping.tick().await;
    loop {
        let frames: Vec<Frame> = tokio::select! {
            frame = input.next() => match frame {
                None => break,
                Some(Err(e)) => {
                    tracing::info!(%remote, error = %e, "redis proxy: malformed RESP from client; closing");
                    let reason = if input.decoder().refused_oversized() {
                        "request_too_large"
                    } else {
                        "protocol_error"
                    };
                    conn.trace = CommandTrace {
                        command: "INVALID",
                        agent: None,
                        failure: Some(reason),
                    };
                    conn.observe(tokio::time::Instant::now());
                    let _ = output.send(error(format!("Protocol error: {e}"))).await;
                    break;
                }
                Some(Ok(frame)) => {
                    deadline.command_done();
                    let started = tokio::time::Instant::now();
                    let outcome = conn.command(frame).await;
                    conn.observe(started);
                    match outcome {
                        Outcome::Reply(frames) => frames,
                        Outcome::Close(last) => {
                            let _ = output.send(last).await;
                            break;
                        }
                    }
                }
            },
            (channel, push) = next_push(&mut conn.subscriptions) => match push {
                Some(LiveReply::Redis(resp)) => match resp.body.push_from_subscribe {
                    Some(p) if p.channel_name == channel => vec![Frame::Array(vec![
                        bulk("message"),
                        bulk(&channel),
                        Frame::BulkString(Bytes::new()),
                    ])],
                    _ => Vec::new(),
                },
                _ => {
                    let _ = output.send(error("the agent serving this subscription went away")).await;
                    break;
                }
            },
            up = next_upstream(&mut conn.upstream, conn.upstream_subscribed) => match up {
                Some(f) => vec![f],
                None => {
                    let _ = output.send(error("upstream redis closed the connection")).await;
                    break;
                }
            },
            _ = check.tick() => match deadline.expired() {
                Some(reason) => {
                    tracing::info!(%remote, "redis proxy: closing a slow client: {reason}");
                    let _ = output.send(error(format!("{reason}; closing"))).await;
                    break;
                }
                None => Vec::new(),
            },
            _ = ping.tick(), if !conn.subscriptions.is_empty() => {
                conn.ping_agents();
                Vec::new()
            }
        };
        for f in frames {
            if output.feed(f).await.is_err() {
                return;
            }
        }
        if SinkExt::<Frame>::flush(&mut output).await.is_err() {
            return;
        }
    }
}

/// Answers a client over the per-IP cap with an error, as Redis answers at `maxclients`, and
/// closes the connection without reading from it.
async fn refuse_client<S: AsyncRead + AsyncWrite + Unpin>(
    proxy: Arc<RedisProxy>,
    mut tcp: S,
    remote: SocketAddr,
    open: usize,
) {
    use tokio::io::AsyncWriteExt;
    tracing::info!(%remote, open, "redis proxy: refusing a connection over --redis-proxy-max-connections-per-ip");
    proxy
        .metrics
        .observe("", "INVALID", Some("too_many_connections"), Duration::ZERO);
    let reply = format!(
        "-ERR max number of clients reached: {open} connections from {} are open (--redis-proxy-max-connections-per-ip)\r\n",
        remote.ip()
    );
    // What the client already sent is read and dropped until it closes (at most a second and
    // 64 KiB): closing with unread input would reset the connection before it reads the error.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        use tokio::io::AsyncReadExt;
        tcp.write_all(reply.as_bytes()).await?;
        tcp.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < 64 << 10 {
            match tcp.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        std::io::Result::Ok(())
    })
    .await;
}

/// Serves an admitted client, or refuses one over the per-IP cap.
async fn serve_or_refuse<S: AsyncRead + AsyncWrite + Send + Unpin + 'static>(
    proxy: Arc<RedisProxy>,
    admitted: Result<ConnectionSlot<IpAddr>, usize>,
    stream: S,
    remote: SocketAddr,
    command_timeout: Duration,
) {
    match admitted {
        Ok(slot) => serve_client(proxy, stream, remote, command_timeout, slot).await,
        Err(open) => refuse_client(proxy, stream, remote, open).await,
    }
}

/// Binds `addr` and serves the proxy, over TLS when `tls` is given (`--redis-tls-enabled`); a
/// client must send each command within `command_timeout` of its start (and its first one within
/// that of connecting, the TLS handshake included). Returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    proxy: Arc<RedisProxy>,
    command_timeout: Duration,
    tls: Option<ReloadingServerConfig>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let per_ip = ConnectionLimit::new(proxy.max_connections_per_ip);
    match tls {
        None => {
            tokio::spawn(argocd_agent_runtime::accept::serve_connections(
                listener,
                "redis proxy",
                std::future::pending(),
                move |tcp, remote| {
                    let _ = tcp.set_nodelay(true);
                    let admitted = per_ip.admit(remote.ip());
                    serve_or_refuse(proxy.clone(), admitted, tcp, remote, command_timeout)
                },
            ));
        }
        Some(tls) => {
            tokio::spawn(argocd_agent_runtime::accept::serve_tls_connections(
                listener,
                "redis proxy",
                tls,
                command_timeout,
                std::future::pending(),
                move |handshake, remote| {
                    let proxy = proxy.clone();
                    let admitted = handshake.map(|stream| (per_ip.admit(remote.ip()), stream));
                    async move {
                        match admitted {
                            Ok((admitted, stream)) => {
                                serve_or_refuse(proxy, admitted, stream, remote, command_timeout)
                                    .await
                            }
                            Err(e) => {
                                tracing::info!(%remote, error = %e, "redis proxy: TLS handshake failed")
                            }
                        }
                    }
                },
            ));
        }
    }
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_view_keys_name_their_agent() {
        assert_eq!(
            agent_of_key("app|resources-tree|agent-a_guestbook|1.8.3"),
            Some("agent-a")
        );
        assert_eq!(
            agent_of_key("app|managed-resources|agent-a_guestbook"),
            Some("agent-a")
        );
        assert_eq!(
            agent_of_key("app|resources-tree|guestbook|1.8.3"),
            None,
            "hub-namespace app"
        );
        assert_eq!(agent_of_key("mfst|agent-a_guestbook"), None);
        assert_eq!(
            app_of_key("app|resources-tree|team-a_guestbook|1.8.3"),
            Some((Some("team-a"), "guestbook"))
        );
        assert_eq!(
            app_of_key("app|managed-resources|guestbook"),
            Some((None, "guestbook")),
            "an application in the hub Argo CD's namespace (destination-based mapping)"
        );
        assert_eq!(app_of_key("mfst|guestbook"), None);
        assert_eq!(agent_of_key("app|resources-tree|_x"), None);
    }

    #[test]
    fn only_arrays_of_strings_are_commands() {
        assert!(command_args(&Frame::Integer(1)).is_err());
        assert!(command_args(&Frame::Array(vec![])).is_err());
        assert!(command_args(&Frame::Array(vec![Frame::Integer(1)])).is_err());
        assert_eq!(
            command_args(&Frame::Array(vec![bulk("GET"), bulk("k")])).unwrap(),
            vec![Bytes::from_static(b"GET"), Bytes::from_static(b"k")]
        );
    }

    #[test]
    fn deeply_nested_arrays_are_refused_without_overflowing_the_stack() {
        // The resp_parser fuzz crash: 100,000 nested one-element arrays around a bulk string.
        let mut crash = BytesMut::from("*1\r\n".repeat(100_000).as_str());
        crash.extend_from_slice(b"$1\r\na\r\n");
        let err = ClientCodec::default().decode(&mut crash).unwrap_err();
        assert!(
            err.to_string().contains("nested arrays are refused"),
            "{err}"
        );
        let mut nested_after_args = BytesMut::from("*2\r\n$3\r\nGET\r\n*1\r\n$1\r\nk\r\n");
        assert!(ClientCodec::default()
            .decode(&mut nested_after_args)
            .is_err());
    }

    #[test]
    fn a_frame_starting_with_its_line_end_is_a_protocol_error() {
        // resp_parser fuzz crash: the nesting check sliced the empty line before `\r\n`.
        let mut crash = BytesMut::from(&b"\r\nPI\xff*1\r\n$4\r\nPING\r\n"[..]);
        assert!(ClientCodec::default().decode(&mut crash).is_err());
    }

    fn refused_as_too_large(codec: &mut ClientCodec, wire: &[u8]) -> bool {
        let mut buf = BytesMut::from(wire);
        match codec.decode(&mut buf) {
            Err(e) => {
                assert!(e.to_string().contains("limit of"), "{e}");
                codec.refused_oversized()
            }
            Ok(_) => false,
        }
    }

    #[test]
    fn oversized_requests_are_refused_from_their_header() {
        let mut codec = ClientCodec::default();
        // Only the headers: the 1 GiB value is never sent, buffered or allocated.
        assert!(refused_as_too_large(
            &mut codec,
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1073741824\r\n"
        ));
        assert!(refused_as_too_large(
            &mut ClientCodec::default(),
            b"*100000000\r\n"
        ));
        assert!(refused_as_too_large(
            &mut ClientCodec::default(),
            b"$9223372036854775807\r\n"
        ));
        // A line that never ends, past the limit.
        let mut endless = b"+".to_vec();
        endless.extend(std::iter::repeat_n(b'a', 2048));
        assert!(refused_as_too_large(&mut ClientCodec::new(1024), &endless));
        // Bulk strings that each fit but together do not.
        assert!(refused_as_too_large(
            &mut ClientCodec::new(1024),
            b"*3\r\n$3\r\nSET\r\n$600\r\n"
                .iter()
                .chain([b'k'; 600].iter())
                .chain(b"\r\n$600\r\n")
                .copied()
                .collect::<Vec<u8>>()
                .as_slice()
        ));
    }

    #[test]
    fn requests_up_to_the_limit_decode_and_the_limit_is_per_frame() {
        let value = "v".repeat(1000);
        let one = format!("*1\r\n$1000\r\n{value}\r\n");
        let limit = one.len();
        let mut codec = ClientCodec::new(limit);
        // Two frames of exactly the limit, pipelined in one read.
        let mut buf = BytesMut::from(format!("{one}{one}").as_str());
        for _ in 0..2 {
            assert_eq!(
                codec.decode(&mut buf).unwrap(),
                Some(Frame::Array(vec![bulk(&value)]))
            );
        }
        let over = format!("*1\r\n$1001\r\n{value}v\r\n");
        assert!(refused_as_too_large(&mut codec, over.as_bytes()));
        let mut nested = BytesMut::from("*1\r\n*1\r\n$1\r\na\r\n");
        let mut codec = ClientCodec::new(limit);
        assert!(codec.decode(&mut nested).is_err());
        assert!(!codec.refused_oversized(), "nesting is not a size refusal");
    }

    #[test]
    fn command_labels_are_a_fixed_set() {
        assert_eq!(command_label("get"), "GET");
        assert_eq!(command_label("SUBSCRIBE"), "SUBSCRIBE");
        assert_eq!(command_label("x-client-chosen"), "OTHER");
    }

    #[test]
    fn flat_commands_decode_whole_and_byte_by_byte() {
        let wire: &[u8] =
            b"*2\r\n$3\r\nGET\r\n$39\r\napp|managed-resources|agent-a_guestbook\r\n*1\r\n$4\r\nPING\r\n";
        let expected = vec![
            Frame::Array(vec![
                bulk("GET"),
                bulk("app|managed-resources|agent-a_guestbook"),
            ]),
            Frame::Array(vec![bulk("PING")]),
        ];
        for chunk in [wire.len(), 1] {
            let mut codec = ClientCodec::default();
            let (mut buf, mut frames) = (BytesMut::new(), Vec::new());
            for piece in wire.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Some(f) = codec.decode(&mut buf).unwrap() {
                    frames.push(f);
                }
            }
            assert_eq!(frames, expected, "chunk {chunk}");
        }
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn client_credentials_match_the_configured_ones_with_default_as_the_implicit_user() {
        let creds = RedisCredentials {
            username: None,
            password: "pw".parse().unwrap(),
        };
        assert!(credentials_match(&creds, None, b"pw"));
        assert!(credentials_match(&creds, Some(b"default"), b"pw"));
        assert!(!credentials_match(&creds, Some(b"argo"), b"pw"));
        assert!(!credentials_match(&creds, None, b"pw2"));
        assert!(!credentials_match(&creds, None, b""));
        let acl = RedisCredentials {
            username: Some("argo".into()),
            password: "pw".parse().unwrap(),
        };
        assert!(credentials_match(&acl, Some(b"argo"), b"pw"));
        assert!(!credentials_match(&acl, None, b"pw"));
    }

    #[test]
    fn hello_is_split_into_protocol_credentials_and_what_goes_upstream() {
        // What Argo CD's go-redis sends first on every connection.
        let args = [
            b("HELLO"),
            b("3"),
            b("AUTH"),
            b("default"),
            b("pw"),
            b("SETNAME"),
            b("argocd"),
        ];
        let (protover, auth, forward) = parse_hello(&args).unwrap();
        assert_eq!(protover, Some(b("3")));
        assert_eq!(auth, Some((Some(b("default")), b("pw"))));
        assert_eq!(
            forward,
            Frame::Array(vec![
                bulk("HELLO"),
                bulk("3"),
                bulk("SETNAME"),
                bulk("argocd")
            ])
        );
        let (protover, auth, _) = parse_hello(&[b("HELLO")]).unwrap();
        assert_eq!((protover, auth), (None, None));
        assert!(parse_hello(&[b("HELLO"), b("2"), b("AUTH"), b("u")]).is_err());
        assert!(parse_hello(&[b("HELLO"), b("2"), b("BOGUS")]).is_err());
    }

    #[test]
    fn auth_names_the_user_only_when_there_is_one() {
        assert_eq!(
            auth_command(None, "pw"),
            Frame::Array(vec![bulk("AUTH"), bulk("pw")])
        );
        assert_eq!(
            auth_command(Some("u"), "pw"),
            Frame::Array(vec![bulk("AUTH"), bulk("u"), bulk("pw")])
        );
    }
}
