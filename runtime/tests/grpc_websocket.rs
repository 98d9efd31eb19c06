//! gRPC over WebSocket end to end in one process: our server against a client that sends exactly
//! what grpc-http1's client sends, our client against a server that answers exactly as grpc-http1's
//! server answers (each vector's source named where it is built), and our two ends together —
//! unary and bidirectional calls, trailers-only errors, the per-method message limit, refused
//! upgrades and the keepalive.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_proto::pb::terminalstreamapi::terminal_stream_service_client::TerminalStreamServiceClient;
use argocd_agent_proto::pb::terminalstreamapi::terminal_stream_service_server::{
    TerminalStreamService, TerminalStreamServiceServer,
};
use argocd_agent_proto::pb::terminalstreamapi::TerminalStreamData;
use argocd_agent_proto::pb::versionapi::version_client::VersionClient;
use argocd_agent_proto::pb::versionapi::version_server::{Version, VersionServer};
use argocd_agent_proto::pb::versionapi::{VersionRequest, VersionResponse};
use argocd_agent_runtime::grpc_websocket::client::{ChannelOptions, Dial, Io, WebSocketChannel};
use argocd_agent_runtime::grpc_websocket::frame::{self, Frame, END_OF_STREAM};
use argocd_agent_runtime::grpc_websocket::server::WebSocketServer;
use argocd_agent_runtime::grpc_websocket::socket::Keepalive;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use prost::Message as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::ReceiverStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tonic::{Request, Response, Status, Streaming};

/// Answers Version with "v-test", and with Unauthenticated when asked with `authorization: bad`.
struct Answer;

#[tonic::async_trait]
impl Version for Answer {
    async fn version(
        &self,
        req: Request<VersionRequest>,
    ) -> Result<Response<VersionResponse>, Status> {
        if req
            .metadata()
            .get("authorization")
            .is_some_and(|v| v == "bad")
        {
            return Err(Status::unauthenticated("token expired"));
        }
        Ok(Response::new(VersionResponse {
            version: "v-test".into(),
        }))
    }
}

/// Echoes every terminal message back, with `stream_type` "echo".
struct Echo;

#[tonic::async_trait]
impl TerminalStreamService for Echo {
    type StreamTerminalStream = ReceiverStream<Result<TerminalStreamData, Status>>;

    async fn stream_terminal(
        &self,
        req: Request<Streaming<TerminalStreamData>>,
    ) -> Result<Response<Self::StreamTerminalStream>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            while let Some(item) = inbound.next().await {
                let reply = item.map(|mut m| {
                    m.stream_type = "echo".into();
                    m
                });
                if tx.send(reply).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Our server on a loopback port: Version and the echo, request messages of at most `limit`
/// bytes, pings per `keepalive`.
async fn our_server(limit: usize, keepalive: Option<Keepalive>) -> String {
    let routes = tonic::service::Routes::new(VersionServer::new(Answer))
        .add_service(TerminalStreamServiceServer::new(Echo));
    let server = WebSocketServer::new(
        routes,
        Arc::new(move |_: &str| limit),
        1 << 20,
        keepalive,
        Duration::from_secs(5),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let server = server.clone();
            tokio::spawn(async move { server.serve(tcp, http::Extensions::new()).await });
        }
    });
    address
}

/// A gRPC message frame: flag 0, big-endian length, the encoded message.
fn grpc_message(message: &impl prost::Message) -> Vec<u8> {
    let body = message.encode_to_vec();
    let mut framed = vec![0];
    framed.extend((body.len() as u32).to_be_bytes());
    framed.extend(body);
    framed
}

/// The WebSocket a grpc-http1 client opens for `path` (client/ws_proxy.go: websocket.Dial with
/// the gRPC request's headers and Subprotocols ["grpc-ws"]; grpc-go sends content-type and te),
/// the call's `metadata` among the headers.
async fn go_shaped_client(
    address: &str,
    path: &str,
    metadata: &[(&'static str, &str)],
) -> tokio_tungstenite::WebSocketStream<TcpStream> {
    let mut request = format!("ws://{address}{path}")
        .into_client_request()
        .unwrap();
    let h = request.headers_mut();
    h.insert("content-type", "application/grpc".parse().unwrap());
    h.insert("te", "trailers".parse().unwrap());
    h.insert("user-agent", "grpc-go/1.75.0".parse().unwrap());
    h.insert("sec-websocket-protocol", "grpc-ws".parse().unwrap());
    for (name, value) in metadata {
        h.insert(*name, value.parse().unwrap());
    }
    let tcp = TcpStream::connect(address).await.unwrap();
    let (ws, answer) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
    assert_eq!(answer.headers()["sec-websocket-protocol"], "grpc-ws");
    ws
}

/// Sends a unary request as grpc-http1's client does (ws_proxy.go writeToServer): the message as
/// one binary WebSocket message, then EndStreamHeader.
async fn send_unary(
    ws: &mut tokio_tungstenite::WebSocketStream<TcpStream>,
    request: &impl prost::Message,
) {
    ws.send(Message::binary(grpc_message(request)))
        .await
        .unwrap();
    ws.send(Message::binary(Bytes::from_static(&END_OF_STREAM)))
        .await
        .unwrap();
}

/// The next binary message's frame.
async fn next_frame(ws: &mut tokio_tungstenite::WebSocketStream<TcpStream>) -> Frame {
    loop {
        match ws.next().await.expect("a message").expect("no error") {
            Message::Binary(b) => return frame::decode(b).expect("a well-formed frame"),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("expected a binary message, got {other:?}"),
        }
    }
}

fn metadata(frame: Frame) -> http::HeaderMap {
    match frame {
        Frame::Metadata(block) => frame::parse_metadata(&block).unwrap(),
        Frame::Message(m) => panic!("expected metadata, got a message of {} bytes", m.len()),
    }
}

#[tokio::test]
async fn our_server_answers_a_grpc_http1_shaped_unary_call_with_headers_message_trailers_and_a_normal_close(
) {
    let address = our_server(64 << 10, None).await;
    let mut ws = go_shaped_client(&address, "/versionapi.Version/Version", &[]).await;
    send_unary(&mut ws, &VersionRequest {}).await;
    // websocket_writer.go: WriteHeader sends the headers as a metadata frame first...
    let headers = metadata(next_frame(&mut ws).await);
    assert_eq!(headers["content-type"], "application/grpc");
    assert!(!headers.contains_key("grpc-status"), "not trailers-only");
    // ...then each gRPC message as written by the server (grpcwebsocket.Write: one per message)...
    let Frame::Message(message) = next_frame(&mut ws).await else {
        panic!("expected the response message");
    };
    assert_eq!(message[0], 0, "uncompressed");
    let reply = VersionResponse::decode(&message[5..]).unwrap();
    assert_eq!(reply.version, "v-test");
    // ...then Close() sends the trailers, and the handler closes with StatusNormalClosure.
    let trailers = metadata(next_frame(&mut ws).await);
    assert_eq!(trailers["grpc-status"], "0");
    match ws.next().await {
        Some(Ok(Message::Close(Some(close)))) => assert_eq!(close.code, CloseCode::Normal),
        other => panic!("expected a normal close, got {other:?}"),
    }
}

#[tokio::test]
async fn an_error_before_any_message_is_one_trailers_only_metadata_frame() {
    let address = our_server(64 << 10, None).await;
    let mut ws = go_shaped_client(
        &address,
        "/versionapi.Version/Version",
        &[("authorization", "bad")],
    )
    .await;
    send_unary(&mut ws, &VersionRequest {}).await;
    // ws_proxy.go readFromServer: Grpc-Status in the first metadata frame = Trailers-Only.
    let only = metadata(next_frame(&mut ws).await);
    assert_eq!(only["grpc-status"], "16");
    assert_eq!(only["grpc-message"], "token%20expired");
}

#[tokio::test]
async fn a_request_message_over_the_methods_limit_is_refused_from_its_frame_header() {
    let address = our_server(64, None).await;
    let mut raw = raw_upgrade(&address, "/versionapi.Version/Version").await;
    // Only the frame header and a few bytes of a message declaring 16 MiB: refused before the
    // rest arrives (tungstenite checks the declared length), with 1009 "message too big".
    let declared: u64 = 16 << 20;
    let mut header = vec![0x82u8, 0x80 | 127];
    header.extend(declared.to_be_bytes());
    header.extend([1, 2, 3, 4]); // mask key
    header.extend([0u8; 64]);
    raw.write_all(&header).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the server closed the connection");
    // An unmasked close frame from the server: 0x88, length, then the code 1009.
    let close = answer
        .windows(4)
        .position(|w| w[0] == 0x88 && w[2..4] == 1009u16.to_be_bytes())
        .map(|at| answer[at + 2..at + 4].to_vec());
    assert_eq!(close, Some(1009u16.to_be_bytes().to_vec()), "{answer:?}");
}

/// An upgrade request for `path` as grpc-http1's client sends it (RFC 6455's example key).
fn upgrade_request(path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: p\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Protocol: grpc-ws\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\ncontent-type: application/grpc\r\n\r\n"
    )
}

/// A connection upgraded for `path` by hand, the 101 answer read off it.
async fn raw_upgrade(address: &str, path: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(address).await.unwrap();
    tcp.write_all(upgrade_request(path).as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(tcp.read(&mut byte).await.unwrap(), 1, "the server answers");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    tcp
}

/// Sends `request` raw and returns the server's whole answer.
async fn raw_http(address: &str, request: &str) -> String {
    let mut tcp = TcpStream::connect(address).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer))
        .await
        .expect("the server answers and closes")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn requests_that_are_not_grpc_websocket_calls_are_answered_with_the_reason() {
    let address = our_server(64 << 10, None).await;
    // No grpc-ws subprotocol (a gRPC-Web or plain HTTP request).
    let answer = raw_http(
        &address,
        "POST /versionapi.Version/Version HTTP/1.1\r\nHost: p\r\ncontent-type: application/grpc-web\r\ncontent-length: 0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("only gRPC over WebSocket (subprotocol grpc-ws"),
        "{answer}"
    );
    // The subprotocol, but a proxy dropped the Upgrade headers: server.go's own reason.
    let answer = raw_http(
        &address,
        "GET /versionapi.Version/Version HTTP/1.1\r\nHost: p\r\nSec-WebSocket-Protocol: grpc-ws\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("missing 'Connection: Upgrade' header in gRPC-websocket request"),
        "{answer}"
    );
    // Positive control: the same request with the Upgrade headers is switched.
    let mut tcp = TcpStream::connect(&address).await.unwrap();
    tcp.write_all(upgrade_request("/versionapi.Version/Version").as_bytes())
        .await
        .unwrap();
    let mut head = vec![0u8; 512];
    let n = tcp.read(&mut head).await.unwrap();
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // RFC 6455's example key and its accept value.
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
}

#[tokio::test]
async fn a_silent_peer_is_dropped_after_the_keepalive_and_a_talking_one_is_not() {
    // Pings every 300 ms; silent for 1.3 s is dead (slack for a loaded machine).
    let keepalive = Keepalive {
        interval: Duration::from_millis(300),
        timeout: Duration::from_secs(1),
    };
    let address = our_server(64 << 10, Some(keepalive)).await;
    // A client that upgrades and then never reads (so never answers a ping): dropped.
    let mut silent = raw_upgrade(
        &address,
        "/terminalstreamapi.TerminalStreamService/StreamTerminal",
    )
    .await;
    let mut sink = Vec::new();
    let dropped =
        tokio::time::timeout(Duration::from_secs(10), silent.read_to_end(&mut sink)).await;
    assert!(dropped.is_ok(), "a silent peer is dropped");
    // A client that answers pings (tungstenite does while it reads) stays connected.
    let mut talking = go_shaped_client(
        &address,
        "/terminalstreamapi.TerminalStreamService/StreamTerminal",
        &[],
    )
    .await;
    // The response headers come at once (a streaming answer); then only pings, one per interval,
    // each answered while this client reads.
    let headers = metadata(next_frame(&mut talking).await);
    assert_eq!(headers["content-type"], "application/grpc");
    let pinged = tokio::time::timeout(Duration::from_secs(10), async {
        let mut pings = 0;
        while pings < 6 {
            match talking.next().await {
                Some(Ok(Message::Ping(_))) => pings += 1,
                other => panic!("expected pings only, got {other:?}"),
            }
        }
    })
    .await;
    assert!(
        pinged.is_ok(),
        "pinged every interval and answered: still open"
    );
    talking
        .send(Message::binary(grpc_message(&TerminalStreamData {
            request_uuid: "alive".into(),
            ..Default::default()
        })))
        .await
        .unwrap();
    let Frame::Message(echo) = next_frame(&mut talking).await else {
        panic!("expected the echo");
    };
    let echo = TerminalStreamData::decode(&echo[5..]).unwrap();
    assert_eq!(echo.request_uuid, "alive");
}

/// Our client's channel to `address` (plaintext), messages up to `max` bytes.
fn our_channel(address: &str, max: usize) -> WebSocketChannel {
    let target = address.to_string();
    let dial: Dial = Arc::new(move || {
        let target = target.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect(target)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Box::new(tcp) as Box<dyn Io>)
        })
    });
    WebSocketChannel::new(
        dial,
        ChannelOptions {
            host: address.to_string(),
            max_message_size: max,
            keepalive: None,
            connect_timeout: Some(Duration::from_secs(5)),
        },
        None,
    )
}

#[tokio::test]
async fn our_client_and_server_carry_unary_calls_errors_and_a_bidi_stream() {
    let address = our_server(64 << 10, None).await;
    let channel = our_channel(&address, 1 << 20);
    let mut version = VersionClient::new(channel.clone());
    let answer = version.version(VersionRequest {}).await.unwrap();
    assert_eq!(answer.into_inner().version, "v-test");
    let mut bad = Request::new(VersionRequest {});
    bad.metadata_mut()
        .insert("authorization", "bad".parse().unwrap());
    let refused = version.version(bad).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert_eq!(refused.message(), "token expired");

    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut terminal = TerminalStreamServiceClient::new(channel);
    let mut replies = terminal
        .stream_terminal(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for i in 0..3 {
        tx.send(TerminalStreamData {
            request_uuid: format!("m{i}"),
            data: vec![b'x'; 1000 * i],
            ..Default::default()
        })
        .await
        .unwrap();
        let echo = replies.message().await.unwrap().expect("an echo");
        assert_eq!(
            (echo.request_uuid.as_str(), echo.data.len()),
            (&*format!("m{i}"), 1000 * i)
        );
        assert_eq!(echo.stream_type, "echo");
    }
    // Half-close: the server's stream ends, and the call ends with OK trailers.
    drop(tx);
    assert!(replies.message().await.unwrap().is_none());
}

#[tokio::test]
async fn our_client_refuses_to_send_a_message_over_the_servers_limit_with_the_reason() {
    let address = our_server(1024, None).await;
    let mut terminal = TerminalStreamServiceClient::new(our_channel(&address, 1 << 20));
    let big = TerminalStreamData {
        data: vec![0; 4096],
        ..Default::default()
    };
    let outcome = async {
        let mut replies = terminal
            .stream_terminal(futures::stream::iter([big]))
            .await?
            .into_inner();
        replies.message().await
    }
    .await;
    let status = outcome.expect_err("refused");
    assert!(
        status.message().contains("1009") || status.message().contains("too long"),
        "{status:?}"
    );
}

/// What a grpc-http1 server received and answers: answers in Go's header format.
struct GoShapedServer {
    address: String,
    seen: Arc<Mutex<Vec<(String, http::HeaderMap)>>>,
}

/// A server that answers like grpc-http1's (nhooyr's Accept without Subprotocols: no
/// Sec-WebSocket-Protocol in the 101) with `headers` as its first metadata frame, then, unless
/// that carries Grpc-Status, `message` and Go-written trailers.
// tungstenite's handshake callback returns its large error response type by value.
#[allow(clippy::result_large_err)]
async fn go_shaped_server(headers: &'static str, message: Vec<u8>) -> GoShapedServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let seen: Arc<Mutex<Vec<(String, http::HeaderMap)>>> = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let record = record.clone();
            let message = message.clone();
            tokio::spawn(async move {
                let callback = |req: &http::Request<()>, resp| {
                    record
                        .lock()
                        .unwrap()
                        .push((req.uri().path().to_string(), req.headers().clone()));
                    Ok(resp)
                };
                let mut ws = tokio_tungstenite::accept_hdr_async(tcp, callback)
                    .await
                    .unwrap();
                // The request: one message, then the end of stream.
                let first = ws.next().await.unwrap().unwrap().into_data();
                assert!(matches!(frame::decode(first), Ok(Frame::Message(_))));
                let eos = ws.next().await.unwrap().unwrap().into_data();
                assert!(frame::is_end_of_stream(&eos));
                let go_frame = |block: &[u8]| {
                    let mut f = vec![0x80];
                    f.extend((block.len() as u32).to_be_bytes());
                    f.extend(block);
                    Message::binary(f)
                };
                ws.send(go_frame(headers.as_bytes())).await.unwrap();
                if !headers.contains("Grpc-Status") {
                    ws.send(Message::binary(message)).await.unwrap();
                    ws.send(go_frame(b"Grpc-Status: 0\r\n")).await.unwrap();
                }
                let _ = ws.close(None).await;
            });
        }
    });
    GoShapedServer { address, seen }
}

#[tokio::test]
async fn our_client_speaks_to_a_grpc_http1_shaped_server_without_an_echoed_subprotocol() {
    let reply = grpc_message(&VersionResponse {
        version: "v0.9.0".into(),
    });
    let server = go_shaped_server(
        "Content-Type: application/grpc\r\nGrpc-Accept-Encoding: gzip\r\n",
        reply,
    )
    .await;
    let mut client = VersionClient::new(our_channel(&server.address, 1 << 20));
    let mut request = Request::new(VersionRequest {});
    request
        .metadata_mut()
        .insert("authorization", "a.jwt.token".parse().unwrap());
    let answer = client.version(request).await.unwrap();
    assert_eq!(answer.into_inner().version, "v0.9.0");
    // The upgrade carried the call: its path, the gRPC headers and metadata, the subprotocol.
    let seen = server.seen.lock().unwrap().clone();
    let (path, headers) = &seen[0];
    assert_eq!(path, "/versionapi.Version/Version");
    assert_eq!(headers["sec-websocket-protocol"], "grpc-ws");
    assert_eq!(headers["content-type"], "application/grpc");
    assert_eq!(headers["authorization"], "a.jwt.token");
    assert_eq!(headers["upgrade"], "websocket");

    // A trailers-only answer in Go's format is the call's status.
    let refusing = go_shaped_server(
        "Content-Type: application/grpc\r\nGrpc-Message: not%20the%20active%20principal\r\nGrpc-Status: 14\r\n",
        Vec::new(),
    )
    .await;
    let mut client = VersionClient::new(our_channel(&refusing.address, 1 << 20));
    let status = client.version(VersionRequest {}).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(status.message(), "not the active principal");
}

#[tokio::test]
async fn a_refused_upgrade_is_an_unavailable_call_quoting_the_servers_answer() {
    // What grpc-http1's stand-in in e2e/peers answers (and a proxy's error page looks alike).
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = tcp.read(&mut buf).await;
        let text = "gRPC over HTTP/1 is not available in this build\n";
        let answer = format!(
            "HTTP/1.1 501 Not Implemented\r\ncontent-length: {}\r\n\r\n{text}",
            text.len()
        );
        tcp.write_all(answer.as_bytes()).await.unwrap();
    });
    let mut client = VersionClient::new(our_channel(&address, 1 << 20));
    let status = client.version(VersionRequest {}).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status.message().contains("refused the WebSocket upgrade of /versionapi.Version/Version: HTTP 501 Not Implemented: gRPC over HTTP/1 is not available in this build"),
        "{status:?}"
    );
}
