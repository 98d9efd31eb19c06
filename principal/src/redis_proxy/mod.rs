//! The Redis proxy: a RESP endpoint the hub's Argo CD server uses as its Redis.
//!
//! Owns one proxied connection per client: `GET` and `SUBSCRIBE` of the live-view keys of an
//! agent's applications (`app|managed-resources|<agent>_<app>|…`, `app|resources-tree|…`) are
//! answered from that agent's local Redis through its event stream; every other command goes to
//! the hub's real Redis on a connection of its own. Replies keep the order of the commands.
//! Malformed RESP gets an error reply and the connection closes (as Redis does); an agent that
//! goes away answers its waiting commands (and ends its subscriptions) with an error at once; an
//! unreachable upstream answers each command with an error instead of hanging (upstream #1104).
//! The RESP codec is the `redis-protocol` crate's.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_proto::event::Event;
use argocd_agent_proto::payload::{
    RedisCommandBody, RedisCommandBodyGet, RedisCommandBodyPing, RedisCommandBodySubscribe,
    RedisRequest, RedisResponse,
};
use bytes::{Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use redis_protocol::codec::Resp2;
use redis_protocol::error::{RedisProtocolError, RedisProtocolErrorKind};
use redis_protocol::resp2::types::BytesFrame as Frame;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::codec::{Decoder, FramedRead, FramedWrite};

use crate::live::{LiveReply, LiveRequests, LiveWaiter, WaitKind};
use crate::sessions::AgentRegistry;

/// Key prefixes answered by agents.
pub const AGENT_KEY_PREFIXES: [&str; 2] = ["app|managed-resources|", "app|resources-tree|"];
/// How long a command waits for the agent (upstream: 60 s).
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a command waits for the hub's Redis.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a connection with agent subscriptions tells the agent it is still there.
const SUBSCRIPTION_PING: Duration = Duration::from_secs(60);

/// The proxy's view of the principal.
pub struct RedisProxy {
    /// Agents' sessions (their outboxes carry the requests).
    pub registry: Arc<AgentRegistry>,
    /// Waiting requests and connected agents.
    pub live: Arc<LiveRequests>,
    /// The hub's Redis, `host:port`.
    pub upstream: String,
}

/// The agent whose application a live-view key is about: the `<namespace>_<app>` segment names
/// the hub namespace, which is the agent's name. `None` for every other key.
pub fn agent_of_key(key: &str) -> Option<&str> {
    let rest = AGENT_KEY_PREFIXES
        .iter()
        .find_map(|p| key.strip_prefix(p))?;
    let app = rest.split('|').next()?;
    let (namespace, name) = app.split_once('_')?;
    (!namespace.is_empty() && !name.is_empty()).then_some(namespace)
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

/// The codec of client connections: RESP2 frames as [`Resp2`] reads them, except that a frame
/// nesting one array in another is refused before it is parsed, as Redis refuses it. The parser
/// recurses once per nesting level: a client sending a few thousand nested array headers
/// (`*1\r\n*1\r\n…`, found by the `resp_parser` fuzz target) overflowed the stack and
/// aborted the principal.
#[derive(Debug, Default)]
pub struct ClientCodec(Resp2);

impl Decoder for ClientCodec {
    type Item = Frame;
    type Error = RedisProtocolError;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, RedisProtocolError> {
        if nests_arrays(buf) {
            return Err(RedisProtocolError::new(
                RedisProtocolErrorKind::DecodeError,
                "a command must be a flat array of bulk strings (nested arrays are refused)",
            ));
        }
        self.0.decode(buf)
    }
}

/// Whether the first RESP2 frame in `buf` (complete or not) holds an array inside an array,
/// read element by element without recursion; malformed input is left to the parser.
fn nests_arrays(buf: &[u8]) -> bool {
    let mut open_arrays: Vec<u64> = Vec::new(); // elements still expected, per open array
    let mut pos = 0usize;
    loop {
        let Some(&kind) = buf.get(pos) else {
            return false;
        };
        let line_start = pos + 1;
        let Some(eol) = buf[line_start..].windows(2).position(|w| w == b"\r\n") else {
            return false;
        };
        let len = std::str::from_utf8(&buf[line_start..line_start + eol])
            .ok()
            .and_then(|l| l.parse::<i64>().ok());
        pos = line_start + eol + 2;
        match (kind, len) {
            (b'*', Some(n)) if n > 0 => {
                if !open_arrays.is_empty() {
                    return true;
                }
                open_arrays.push(n as u64);
                continue;
            }
            (b'*', Some(_)) | (b'+' | b'-' | b':', _) => {}
            (b'$', Some(n)) if n >= 0 => pos = pos.saturating_add(n as usize).saturating_add(2),
            (b'$', Some(_)) => {}
            _ => return false,
        }
        // One element is complete: it completes every array it was the last element of.
        loop {
            match open_arrays.last_mut() {
                None => return false,
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
struct Upstream {
    out: FramedWrite<OwnedWriteHalf, Resp2>,
    replies: mpsc::Receiver<Frame>,
}

async fn connect_upstream(addr: &str) -> Result<Upstream, String> {
    let tcp = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .map_err(|_| format!("upstream redis {addr} did not accept a connection within 5s"))?
        .map_err(|e| format!("upstream redis {addr}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let (r, w) = tcp.into_split();
    let (tx, replies) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut frames = FramedRead::new(r, Resp2::default());
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

async fn next_push(w: &mut Option<LiveWaiter>) -> Option<LiveReply> {
    match w {
        Some(w) => w.recv().await,
        None => std::future::pending().await,
    }
}

async fn next_upstream(u: &mut Option<Upstream>, subscribed: bool) -> Option<Frame> {
    match u {
        Some(u) if subscribed => u.replies.recv().await,
        _ => std::future::pending().await,
    }
}

/// One client connection.
struct ClientConnection {
    proxy: Arc<RedisProxy>,
    id: String,
    upstream: Option<Upstream>,
    /// Channels subscribed through agents.
    agent_channels: BTreeSet<String>,
    /// Agents with subscriptions on this connection.
    agents: BTreeSet<String>,
    /// Subscription pushes from agents.
    pushes: Option<LiveWaiter>,
    /// The client is in subscribed mode on the upstream.
    upstream_subscribed: bool,
}

enum Outcome {
    Reply(Vec<Frame>),
    Close(Frame),
}

impl ClientConnection {
    /// Agent that answers `key`, if it is a live-view key of an agent the principal knows.
    fn agent_for(&self, key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        let agent = agent_of_key(key)?;
        self.proxy.registry.get(agent).map(|_| agent.to_string())
    }

    async fn ask_agent(
        &self,
        agent: &str,
        body: RedisCommandBody,
    ) -> Result<RedisResponse, String> {
        let proxy = &self.proxy;
        if !proxy.live.is_connected(agent) {
            return Err(format!("agent {agent} is not connected"));
        }
        let session = proxy
            .registry
            .get(agent)
            .ok_or_else(|| format!("agent {agent} is not connected"))?;
        let uuid = uuid::Uuid::new_v4().to_string();
        let mut waiter = proxy.live.register(agent, &uuid, WaitKind::Redis, 4, None);
        let req = RedisRequest {
            uuid: uuid.clone(),
            connection_uuid: self.id.clone(),
            body,
        };
        let ev = Event::redis_request("", &req).map_err(|e| e.to_string())?;
        session
            .outbox
            .push(ev)
            .map_err(|e| format!("cannot queue the request for agent {agent}: {e}"))?;
        match tokio::time::timeout(AGENT_TIMEOUT, waiter.recv()).await {
            Err(_) => Err(format!(
                "agent {agent} did not answer within {AGENT_TIMEOUT:?}"
            )),
            Ok(Some(LiveReply::Redis(resp))) => Ok(resp),
            Ok(_) => Err(format!("agent {agent} went away")),
        }
    }

    async fn upstream_call(
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

    fn subscription_count(&self) -> i64 {
        self.agent_channels.len() as i64
    }

    async fn command(&mut self, frame: Frame) -> Outcome {
        let args = match command_args(&frame) {
            Ok(a) => a,
            Err(msg) => return Outcome::Reply(vec![error(msg)]),
        };
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        match name.as_str() {
            "GET" if args.len() == 2 => {
                if let Some(agent) = self.agent_for(&args[1]) {
                    let key = String::from_utf8_lossy(&args[1]).into_owned();
                    let body = RedisCommandBody {
                        get: Some(RedisCommandBodyGet { key }),
                        ..Default::default()
                    };
                    let reply = match self.ask_agent(&agent, body).await {
                        Ok(resp) => match resp.body.get {
                            Some(g) if !g.error.is_empty() => {
                                error(format!("agent {agent}: {}", g.error))
                            }
                            Some(g) if g.cache_hit => Frame::BulkString(Bytes::from(g.bytes)),
                            Some(_) => Frame::Null,
                            None => {
                                error(format!("agent {agent} answered GET with something else"))
                            }
                        },
                        Err(e) => error(e),
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
                    if self.pushes.is_none() {
                        self.pushes = Some(self.proxy.live.register(
                            &agent,
                            &self.id,
                            WaitKind::Redis,
                            64,
                            None,
                        ));
                    }
                    let body = RedisCommandBody {
                        subscribe: Some(RedisCommandBodySubscribe {
                            channel_name: channel.clone(),
                        }),
                        ..Default::default()
                    };
                    match self.ask_agent(&agent, body).await {
                        Ok(resp) => match resp.body.subscribe_response {
                            Some(s) if s.error.is_empty() => {
                                self.agent_channels.insert(channel.clone());
                                self.agents.insert(agent);
                                replies.push(Frame::Array(vec![
                                    bulk("subscribe"),
                                    bulk(&channel),
                                    Frame::Integer(self.subscription_count()),
                                ]));
                            }
                            Some(s) => replies.push(error(format!("agent {agent}: {}", s.error))),
                            None => replies.push(error(format!(
                                "agent {agent} answered SUBSCRIBE with something else"
                            ))),
                        },
                        Err(e) => replies.push(error(e)),
                    }
                }
                if !upstream_channels.is_empty() {
                    let mut cmd = vec![bulk("SUBSCRIBE")];
                    cmd.extend(upstream_channels);
                    // Upstream confirms (and later pushes) on its own; they are forwarded as they come.
                    self.upstream_subscribed = true;
                    if let Err(e) = self.upstream_call(Frame::Array(cmd), false).await {
                        replies.push(error(e));
                    }
                }
                return Outcome::Reply(replies);
            }
            "UNSUBSCRIBE" if !self.agent_channels.is_empty() => {
                let channels: Vec<String> = if args.len() == 1 {
                    self.agent_channels.iter().cloned().collect()
                } else {
                    args[1..]
                        .iter()
                        .map(|c| String::from_utf8_lossy(c).into_owned())
                        .filter(|c| self.agent_channels.contains(c))
                        .collect()
                };
                let mut replies = Vec::new();
                for ch in channels {
                    self.agent_channels.remove(&ch);
                    replies.push(Frame::Array(vec![
                        bulk("unsubscribe"),
                        bulk(&ch),
                        Frame::Integer(self.subscription_count()),
                    ]));
                }
                if self.upstream_subscribed {
                    if let Err(e) = self.upstream_call(frame, false).await {
                        replies.push(error(e));
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
            Err(e) => Outcome::Reply(vec![error(e)]),
        }
    }

    async fn ping_agents(&self) {
        for agent in &self.agents {
            let body = RedisCommandBody {
                ping: Some(RedisCommandBodyPing {}),
                ..Default::default()
            };
            let Some(session) = self.proxy.registry.get(agent) else {
                continue;
            };
            let req = RedisRequest {
                uuid: uuid::Uuid::new_v4().to_string(),
                connection_uuid: self.id.clone(),
                body,
            };
            if let Ok(ev) = Event::redis_request("", &req) {
                let _ = session.outbox.push(ev);
            }
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

async fn serve_client(
    proxy: Arc<RedisProxy>,
    tcp: TcpStream,
    remote: SocketAddr,
    command_timeout: Duration,
) {
    let _ = tcp.set_nodelay(true);
    let (r, w) = tcp.into_split();
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
    let mut input = FramedRead::new(r, ClientCodec::default());
    let mut output = FramedWrite::new(w, Resp2::default());
    let mut conn = ClientConnection {
        proxy,
        id: uuid::Uuid::new_v4().to_string(),
        upstream: None,
        agent_channels: BTreeSet::new(),
        agents: BTreeSet::new(),
        pushes: None,
        upstream_subscribed: false,
    };
    let mut ping = tokio::time::interval(SUBSCRIPTION_PING);
    ping.tick().await;
    loop {
        let frames: Vec<Frame> = tokio::select! {
            frame = input.next() => match frame {
                None => break,
                Some(Err(e)) => {
                    tracing::info!(%remote, error = %e, "redis proxy: malformed RESP from client; closing");
                    let _ = output.send(error(format!("Protocol error: {e}"))).await;
                    break;
                }
                Some(Ok(frame)) => {
                    deadline.command_done();
                    match conn.command(frame).await {
                        Outcome::Reply(frames) => frames,
                        Outcome::Close(last) => {
                            let _ = output.send(last).await;
                            break;
                        }
                    }
                }
            },
            push = next_push(&mut conn.pushes) => match push {
                Some(LiveReply::Redis(resp)) => match resp.body.push_from_subscribe {
                    Some(p) if conn.agent_channels.contains(&p.channel_name) => vec![Frame::Array(vec![
                        bulk("message"),
                        bulk(&p.channel_name),
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
            _ = ping.tick(), if !conn.agents.is_empty() => {
                conn.ping_agents().await;
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

/// Binds `addr` and serves the proxy; a client must send each command within `command_timeout`
/// of its start (and its first one within that of connecting). Returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    proxy: Arc<RedisProxy>,
    command_timeout: Duration,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((tcp, remote)) => {
                    tokio::spawn(serve_client(proxy.clone(), tcp, remote, command_timeout));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "redis proxy: accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
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
}
