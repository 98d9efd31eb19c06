//! The client side: a tower service under tonic's generated clients that carries each gRPC call
//! over a WebSocket of its own on HTTP/1.1, as grpc-http1's `ConnectViaProxy(...,
//! UseWebSocket(true))` does through its local HTTP/2 proxy — here without the proxy: the call's
//! request becomes the upgrade request, its messages the WebSocket's, its end the
//! [`END_OF_STREAM`] frame; the first message back is the response headers (or, carrying
//! `grpc-status`, the whole trailers-only answer), then messages, then the trailers.
//!
//! Owns: one connection per call (dialled by the caller's [`Dial`], a connection made beforehand
//! used by the first call), the upgrade and its check under the connect timeout, what a refused
//! upgrade says (HTTP status and the start of the answer's text, e.g. a proxy's or grpc-http1's
//! reason), and the call's cancellation: dropping the response closes the WebSocket.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::Status;

use super::frame::{self, Frame, MessageSplitter, END_OF_STREAM, PREFIX_LEN};
use super::handshake;
use super::server::READ_BUFFER;
use super::socket::{queue_messages, CallSocket, Keepalive, Outgoing, SocketError};

/// A byte stream a call runs on (TCP, or TLS over TCP).
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// Opens a new connection to the server, or says why it cannot.
pub type Dial = Arc<dyn Fn() -> BoxFuture<'static, Result<Box<dyn Io>, String>> + Send + Sync>;

/// How much of a refused upgrade's answer is quoted in the error.
const REFUSAL_TEXT: usize = 512;

/// What a [`WebSocketChannel`] is set up with beyond its dial.
#[derive(Debug, Clone)]
pub struct ChannelOptions {
    /// The `Host` of every upgrade request (`host:port` of the server as dialled).
    pub host: String,
    /// Largest gRPC message either way, prefix not counted.
    pub max_message_size: usize,
    /// Pings per call connection; `None`: none.
    pub keepalive: Option<Keepalive>,
    /// Limit on connecting and upgrading, per call (`None`: none).
    pub connect_timeout: Option<Duration>,
}

/// A gRPC channel whose calls each run over a WebSocket of their own (cheap to clone).
#[derive(Clone)]
pub struct WebSocketChannel {
    inner: Arc<Inner>,
}

struct Inner {
    dial: Dial,
    options: ChannelOptions,
    spare: Mutex<Option<Box<dyn Io>>>,
}

fn unavailable(what: impl std::fmt::Display) -> Status {
    Status::unavailable(what.to_string())
}

impl WebSocketChannel {
    /// Calls over connections from `dial`; `first`, when given, carries the first call.
    pub fn new(dial: Dial, options: ChannelOptions, first: Option<Box<dyn Io>>) -> Self {
        WebSocketChannel {
            inner: Arc::new(Inner {
                dial,
                options,
                spare: Mutex::new(first),
            }),
        }
    }
}

impl tower::Service<Request<tonic::body::Body>> for WebSocketChannel {
    type Response = Response<tonic::body::Body>;
    type Error = Status;
    type Future = BoxFuture<'static, Result<Self::Response, Status>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Status>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.inner.clone().call(request))
    }
}

type CallStream = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

impl Inner {
    async fn call(
        self: Arc<Self>,
        request: Request<tonic::body::Body>,
    ) -> Result<Response<tonic::body::Body>, Status> {
        let (head, body) = request.into_parts();
        let open = self.open(&head);
        let ws = match self.options.connect_timeout {
            Some(limit) => tokio::time::timeout(limit, open).await.map_err(|_| {
                unavailable(format!(
                    "no WebSocket to {} within {limit:?} (connect and upgrade)",
                    self.options.host
                ))
            })??,
            None => open.await?,
        };
        let CallSocket {
            mut incoming,
            outgoing,
            ..
        } = CallSocket::spawn(ws, self.options.keepalive);
        let call = CancellationToken::new();
        tokio::spawn(send_request(
            body,
            outgoing,
            self.options.max_message_size,
            call.clone(),
        ));
        let guard = call.drop_guard();
        let headers = match incoming.recv().await {
            Some(Ok(first)) => match frame::decode(first) {
                Ok(Frame::Metadata(block)) => {
                    frame::parse_metadata(&block).map_err(|e| Status::internal(e.to_string()))?
                }
                Ok(Frame::Message(_)) => {
                    return Err(Status::internal(
                        "the server sent a message before the response headers",
                    ))
                }
                Err(e) => return Err(Status::internal(e.to_string())),
            },
            Some(Err(e)) => return Err(unavailable(e)),
            None => {
                return Err(unavailable(
                    "the server closed the WebSocket before the response headers",
                ))
            }
        };
        let trailers_only = headers.contains_key("grpc-status");
        let body = if trailers_only {
            tonic::body::Body::empty()
        } else {
            response_body(incoming, guard)
        };
        let mut response = Response::new(body);
        *response.headers_mut() = headers;
        Ok(response)
    }

    /// A connection (the spare one, or a new one) upgraded to a WebSocket for `head`'s call.
    async fn open(&self, head: &http::request::Parts) -> Result<CallStream, Status> {
        let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).take();
        let io = match spare {
            Some(io) => io,
            None => (self.dial)().await.map_err(unavailable)?,
        };
        let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| unavailable(format!("HTTP/1.1 to {}: {e}", self.options.host)))?;
        tokio::spawn(async move {
            let _ = connection.with_upgrades().await;
        });
        let path = head
            .uri
            .path_and_query()
            .map(|pq| pq.as_str())
            .unwrap_or("/");
        let key = generate_key();
        let mut upgrade = Request::new(Empty::<Bytes>::new());
        *upgrade.uri_mut() = path.parse().map_err(|e| Status::internal(format!("{e}")))?;
        *upgrade.headers_mut() =
            handshake::upgrade_headers(&head.headers, &self.options.host, &key).map_err(|e| {
                Status::internal(format!("a request header cannot travel in an upgrade: {e}"))
            })?;
        let answer = sender.send_request(upgrade).await.map_err(|e| {
            unavailable(format!(
                "the WebSocket upgrade of {path} to {} failed: {e}",
                self.options.host
            ))
        })?;
        if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
            let status = answer.status();
            let text = refusal_text(answer.into_body()).await;
            return Err(unavailable(format!(
                "the server at {} (or a proxy in between) refused the WebSocket upgrade of \
                 {path}: HTTP {status}: {text}",
                self.options.host
            )));
        }
        handshake::check_answer(answer.headers(), &key).map_err(unavailable)?;
        let io = hyper::upgrade::on(answer)
            .await
            .map_err(|e| unavailable(format!("the WebSocket upgrade of {path}: {e}")))?;
        let limit = self.options.max_message_size + PREFIX_LEN;
        let config = WebSocketConfig::default()
            .read_buffer_size(READ_BUFFER)
            .max_message_size(Some(limit))
            .max_frame_size(Some(limit));
        Ok(WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Client, Some(config)).await)
    }
}

/// The start of a refused upgrade's answer, as text.
async fn refusal_text(body: hyper::body::Incoming) -> String {
    let mut text = Vec::new();
    let mut body = std::pin::pin!(body);
    let read = async {
        while text.len() < REFUSAL_TEXT {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        text.extend_from_slice(&data);
                    }
                }
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    text.truncate(REFUSAL_TEXT);
    let text = String::from_utf8_lossy(&text);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        "(no text)".into()
    } else {
        text
    }
}

/// Sends the call's request messages, then its end of stream, and keeps the WebSocket open until
/// the call is over (its response dropped or finished).
async fn send_request(
    body: tonic::body::Body,
    outgoing: mpsc::Sender<Outgoing>,
    limit: usize,
    call: CancellationToken,
) {
    let mut splitter = MessageSplitter::new(limit);
    let mut body = std::pin::pin!(body);
    let failure = loop {
        let chunk = tokio::select! {
            chunk = body.frame() => chunk,
            () = call.cancelled() => return,
        };
        let data = match chunk {
            None => break splitter.finish().err().map(|e| e.to_string()),
            Some(Err(e)) => break Some(format!("the request failed: {e}")),
            Some(Ok(chunk)) => match chunk.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
        };
        match queue_messages(&mut splitter, data, &outgoing).await {
            None => return,
            Some(Err(e)) => break Some(e.to_string()),
            Some(Ok(())) => {}
        }
    };
    let last = match failure {
        None => Outgoing::Message(Bytes::from_static(&END_OF_STREAM)),
        Some(reason) => Outgoing::Close(
            tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Error,
            reason,
        ),
    };
    if outgoing.send(last).await.is_ok() {
        call.cancelled().await;
    }
}

/// The server's messages as the gRPC response body: data, then the trailers; the WebSocket
/// ending before them fails it. `guard` ends the call (closes the WebSocket) when the body is
/// done or dropped.
fn response_body(
    incoming: mpsc::Receiver<Result<Bytes, SocketError>>,
    guard: DropGuard,
) -> tonic::body::Body {
    let messages = futures::stream::unfold(Some((incoming, guard)), |state| async move {
        let (mut incoming, guard) = state?;
        let item = match incoming.recv().await {
            None => Err(unavailable(
                "the server closed the WebSocket before the call's trailers",
            )),
            Some(Err(e)) => Err(unavailable(e)),
            Some(Ok(message)) => match frame::decode(message) {
                Ok(Frame::Message(m)) => {
                    return Some((Ok(hyper::body::Frame::data(m)), Some((incoming, guard))))
                }
                Ok(Frame::Metadata(block)) => frame::parse_metadata(&block)
                    .map(hyper::body::Frame::trailers)
                    .map_err(|e| Status::internal(e.to_string())),
                Err(e) => Err(Status::internal(e.to_string())),
            },
        };
        Some((item, None))
    });
    tonic::body::Body::new(StreamBody::new(messages))
}
