//! The server side: an HTTP/1.1 connection whose requests are gRPC-over-WebSocket calls, each
//! answered by the very gRPC service that serves native calls, as grpc-http1's downgrading handler
//! hands them to `grpc.Server.ServeHTTP`.
//!
//! Owns: the HTTP/1.1 connection (one request: an upgrade, or a refusal that closes it; its
//! headers within the header timeout and [`MAX_HEADER_BYTES`]; anything but an offer of
//! [`SUBPROTOCOL`] answered with the reason, [`super::handshake::offer`]); per call, the WebSocket with a message limit fixed by the
//! method before any message is read (so a call the service would refuse at its decoding limit
//! cannot make the server buffer more first), the gRPC request built from the upgrade request
//! (its headers, the connection's extensions — who the peer is — and a body of the client's
//! messages up to its end of stream), and the response written back: headers, one WebSocket
//! message per gRPC message, trailers (or the headers alone for a trailers-only answer), then a
//! normal close.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Body, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;
use tonic::Status;
use tower::{Service, ServiceExt};

use super::frame::{self, Frame, MessageSplitter, PREFIX_LEN, SUBPROTOCOL};
use super::handshake;
use super::socket::{queue_messages, CallSocket, Keepalive, Outgoing, SocketError};

/// Largest upgrade request head (request line and headers: the gRPC metadata, a JWT among them).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Read buffer of each call's WebSocket (tungstenite allocates it up front; 128 KiB by default).
pub const READ_BUFFER: usize = 16 * 1024;

/// The largest request message a method decodes, by request path.
pub type RequestLimit = Arc<dyn Fn(&str) -> usize + Send + Sync>;

/// Serves gRPC-over-WebSocket calls with `service`.
#[derive(Clone)]
pub struct WebSocketServer<S> {
    service: S,
    request_limit: RequestLimit,
    response_limit: usize,
    keepalive: Option<Keepalive>,
    header_timeout: Duration,
}

impl<S> WebSocketServer<S> {
    /// Calls answered by `service`; a request message may be at most `request_limit(path)` bytes
    /// and a response message `response_limit`; pings per `keepalive`; the upgrade request must
    /// arrive within `header_timeout`.
    pub fn new(
        service: S,
        request_limit: RequestLimit,
        response_limit: usize,
        keepalive: Option<Keepalive>,
        header_timeout: Duration,
    ) -> Self {
        WebSocketServer {
            service,
            request_limit,
            response_limit,
            keepalive,
            header_timeout,
        }
    }
}

/// A plain-text HTTP answer (refusals before any WebSocket).
fn text(status: StatusCode, reason: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(reason)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

impl<S, B> WebSocketServer<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// Serves the HTTP/1.1 connection `io`, each call's request carrying `extensions`.
    pub async fn serve<IO>(&self, io: IO, extensions: http::Extensions)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let server = self.clone();
        let answer = hyper::service::service_fn(move |req: Request<Incoming>| {
            let response = server.answer(req, extensions.clone());
            async move { Ok::<_, Infallible>(response) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout)
            .max_buf_size(MAX_HEADER_BYTES)
            .serve_connection(TokioIo::new(io), answer)
            .with_upgrades();
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "gRPC-WebSocket connection ended with an error");
        }
    }

    /// Accepts an offer (the call then runs in a task of its own) or answers why not.
    fn answer(
        &self,
        mut req: Request<Incoming>,
        extensions: http::Extensions,
    ) -> Response<Full<Bytes>> {
        let key = match handshake::offer(req.method(), req.headers()) {
            Ok(key) => key,
            Err(refusal) => {
                tracing::debug!(path = %req.uri().path(), reason = %refusal.reason,
                    "refused an HTTP/1.1 request on the gRPC port");
                let mut refused = text(refusal.status, refusal.reason);
                // One request per connection: a refused one ends it.
                refused.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
                return refused;
            }
        };
        let upgrade = hyper::upgrade::on(&mut req);
        let (head, _) = req.into_parts();
        let server = self.clone();
        tokio::spawn(async move {
            match upgrade.await {
                Ok(io) => server.call(TokioIo::new(io), head, extensions).await,
                Err(e) => tracing::debug!(error = %e, "a gRPC-WebSocket upgrade did not complete"),
            }
        });
        let mut resp = text(StatusCode::SWITCHING_PROTOCOLS, String::new());
        resp.headers_mut().remove(http::header::CONTENT_TYPE);
        resp.headers_mut()
            .extend(handshake::switching_protocols(&key, SUBPROTOCOL));
        resp
    }

    /// Runs one call on its upgraded connection.
    async fn call<IO>(&self, io: IO, head: http::request::Parts, extensions: http::Extensions)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let limit = (self.request_limit)(head.uri.path()) + PREFIX_LEN;
        let config = WebSocketConfig::default()
            .read_buffer_size(READ_BUFFER)
            .max_message_size(Some(limit))
            .max_frame_size(Some(limit));
        let ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
        let CallSocket {
            incoming, outgoing, ..
        } = CallSocket::spawn(ws, self.keepalive);
        let mut request = Request::new(request_body(incoming));
        *request.method_mut() = http::Method::POST;
        *request.version_mut() = http::Version::HTTP_2;
        *request.uri_mut() = head
            .uri
            .path_and_query()
            .map(|pq| pq.as_str())
            .unwrap_or("/")
            .parse()
            .unwrap_or_default();
        *request.headers_mut() = handshake::call_headers(&head.headers);
        *request.extensions_mut() = extensions;
        let Ok(response) = self.service.clone().oneshot(request).await;
        send_response(&outgoing, response, self.response_limit).await;
        // Dropping the last sender closes the WebSocket normally.
    }
}

/// The client's messages as a gRPC request body: data until its end of stream; a WebSocket that
/// fails or closes before that fails the body, as a reset stream does on HTTP/2.
fn request_body(incoming: mpsc::Receiver<Result<Bytes, SocketError>>) -> tonic::body::Body {
    let messages = futures::stream::unfold(Some(incoming), |state| async move {
        let mut incoming = state?;
        let item = match incoming.recv().await {
            None => Err(Status::cancelled(
                "the client closed the WebSocket before the end of its request stream",
            )),
            Some(Err(e)) => Err(Status::unavailable(e.to_string())),
            Some(Ok(message)) if frame::is_end_of_stream(&message) => return None,
            Some(Ok(message)) => match frame::decode(message) {
                Ok(Frame::Message(m)) => {
                    return Some((Ok(hyper::body::Frame::data(m)), Some(incoming)))
                }
                Ok(Frame::Metadata(_)) => Err(Status::internal(
                    "the client sent a metadata frame that is not its end of stream",
                )),
                Err(e) => Err(Status::internal(e.to_string())),
            },
        };
        Some((item, None))
    });
    tonic::body::Body::new(StreamBody::new(messages))
}

/// Trailers of a call that failed with `status`.
fn failure_trailers(status: Status) -> http::HeaderMap {
    let mut trailers = http::HeaderMap::new();
    // Fails only for a message that cannot be percent-encoded into a header, which ours are.
    let _ = status.add_header(&mut trailers);
    trailers
}

/// Writes `response` to the call's WebSocket: headers, messages, trailers; stops when the
/// client is gone (the response body is then dropped, which ends the call's stream).
async fn send_response<B>(out: &mpsc::Sender<Outgoing>, response: Response<B>, limit: usize)
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (head, body) = response.into_parts();
    let mut headers = head.headers;
    if head.status != StatusCode::OK && !headers.contains_key("grpc-status") {
        headers.extend(failure_trailers(Status::unknown(format!(
            "the gRPC service answered HTTP {}",
            head.status
        ))));
    }
    // grpc-http1's client treats headers carrying grpc-status as a trailers-only answer.
    let trailers_only = headers.contains_key("grpc-status");
    let sent = out
        .send(Outgoing::Message(frame::encode_metadata(&headers)))
        .await;
    if sent.is_err() || trailers_only {
        return;
    }
    let mut splitter = MessageSplitter::new(limit);
    let mut body = std::pin::pin!(body);
    let trailers = loop {
        let chunk = match body.frame().await {
            None => {
                break failure_trailers(Status::internal(
                    "the gRPC response ended without trailers",
                ))
            }
            Some(Err(e)) => break failure_trailers(Status::unknown(e.into().to_string())),
            Some(Ok(chunk)) => chunk,
        };
        let data = match chunk.into_data() {
            Ok(data) => data,
            Err(chunk) => match (chunk.into_trailers(), splitter.finish()) {
                (Ok(trailers), Ok(())) => break trailers,
                (_, Err(e)) => break failure_trailers(Status::internal(e.to_string())),
                (Err(_), Ok(())) => continue,
            },
        };
        match queue_messages(&mut splitter, data, out).await {
            None => return,
            Some(Err(e)) => break failure_trailers(Status::internal(e.to_string())),
            Some(Ok(())) => {}
        }
    };
    let _ = out
        .send(Outgoing::Message(frame::encode_metadata(&trailers)))
        .await;
}
