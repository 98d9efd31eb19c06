//! The generated services answer on exactly upstream's full gRPC method paths.
//!
//! Each test server's handlers fail with a distinctive status (`AlreadyExists`, 6) without
//! reading the request; a request on the right path therefore answers 6, while a wrong path
//! answers `Unimplemented` (12) from tonic's router.

use argocd_agent_proto::pb;
use argocd_agent_proto::pb::{
    authapi, eventstreamapi, logstreamapi, terminalstreamapi, versionapi,
};
use tonic::codegen::{http, BoxStream, Service};
use tonic::{Request, Response, Status, Streaming};

struct Fail;

fn fail<T>() -> Result<T, Status> {
    Err(Status::already_exists("routed"))
}

#[tonic::async_trait]
impl authapi::authentication_server::Authentication for Fail {
    async fn authenticate(
        &self,
        _: Request<authapi::AuthRequest>,
    ) -> Result<Response<authapi::AuthResponse>, Status> {
        fail()
    }
    async fn refresh_token(
        &self,
        _: Request<authapi::RefreshTokenRequest>,
    ) -> Result<Response<authapi::AuthResponse>, Status> {
        fail()
    }
}

#[tonic::async_trait]
impl versionapi::version_server::Version for Fail {
    async fn version(
        &self,
        _: Request<versionapi::VersionRequest>,
    ) -> Result<Response<versionapi::VersionResponse>, Status> {
        fail()
    }
}

#[tonic::async_trait]
impl eventstreamapi::event_stream_server::EventStream for Fail {
    type SubscribeStream = BoxStream<eventstreamapi::Event>;
    async fn subscribe(
        &self,
        _: Request<Streaming<eventstreamapi::Event>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        fail()
    }
    async fn push(
        &self,
        _: Request<Streaming<eventstreamapi::Event>>,
    ) -> Result<Response<eventstreamapi::PushSummary>, Status> {
        fail()
    }
    async fn ping(
        &self,
        _: Request<eventstreamapi::PingRequest>,
    ) -> Result<Response<eventstreamapi::PongReply>, Status> {
        fail()
    }
}

#[tonic::async_trait]
impl logstreamapi::log_stream_service_server::LogStreamService for Fail {
    async fn stream_logs(
        &self,
        _: Request<Streaming<logstreamapi::LogStreamData>>,
    ) -> Result<Response<logstreamapi::LogStreamResponse>, Status> {
        fail()
    }
}

#[tonic::async_trait]
impl terminalstreamapi::terminal_stream_service_server::TerminalStreamService for Fail {
    type StreamTerminalStream = BoxStream<terminalstreamapi::TerminalStreamData>;
    async fn stream_terminal(
        &self,
        _: Request<Streaming<terminalstreamapi::TerminalStreamData>>,
    ) -> Result<Response<Self::StreamTerminalStream>, Status> {
        fail()
    }
}

fn request(path: &str) -> http::Request<tonic::body::Body> {
    http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        // One gRPC frame holding an empty message: uncompressed flag + zero length.
        .body(tonic::body::Body::new(String::from("\0\0\0\0\0")))
        .expect("request")
}

async fn grpc_status<S>(mut svc: S, path: &str) -> String
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>,
    S::Error: std::fmt::Debug,
{
    let resp = svc.call(request(path)).await.expect("service call");
    resp.headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap_or("?").to_string())
        .unwrap_or_else(|| "none".into())
}

#[test]
fn service_names_match_upstream() {
    assert_eq!(
        authapi::authentication_server::SERVICE_NAME,
        "authapi.Authentication"
    );
    assert_eq!(
        versionapi::version_server::SERVICE_NAME,
        "versionapi.Version"
    );
    assert_eq!(
        eventstreamapi::event_stream_server::SERVICE_NAME,
        "eventstreamapi.EventStream"
    );
    assert_eq!(
        logstreamapi::log_stream_service_server::SERVICE_NAME,
        "principal.apis.logstreamapi.LogStreamService"
    );
    assert_eq!(
        terminalstreamapi::terminal_stream_service_server::SERVICE_NAME,
        "terminalstreamapi.TerminalStreamService"
    );
    use tonic::server::NamedService;
    assert_eq!(
        <authapi::authentication_server::AuthenticationServer<Fail> as NamedService>::NAME,
        "authapi.Authentication"
    );
}

#[test]
fn path_constants() {
    assert_eq!(
        pb::paths::AUTHENTICATE,
        "/authapi.Authentication/Authenticate"
    );
    assert_eq!(
        pb::paths::REFRESH_TOKEN,
        "/authapi.Authentication/RefreshToken"
    );
    assert_eq!(pb::paths::VERSION, "/versionapi.Version/Version");
    assert_eq!(
        pb::paths::SUBSCRIBE,
        "/eventstreamapi.EventStream/Subscribe"
    );
    assert_eq!(pb::paths::PUSH, "/eventstreamapi.EventStream/Push");
    assert_eq!(pb::paths::PING, "/eventstreamapi.EventStream/Ping");
    assert_eq!(
        pb::paths::STREAM_LOGS,
        "/principal.apis.logstreamapi.LogStreamService/StreamLogs"
    );
    assert_eq!(
        pb::paths::STREAM_TERMINAL,
        "/terminalstreamapi.TerminalStreamService/StreamTerminal"
    );
}

#[tokio::test]
async fn servers_route_exact_upstream_paths() {
    use pb::paths::*;
    let auth = || authapi::authentication_server::AuthenticationServer::new(Fail);
    let version = || versionapi::version_server::VersionServer::new(Fail);
    let events = || eventstreamapi::event_stream_server::EventStreamServer::new(Fail);
    let logs = || logstreamapi::log_stream_service_server::LogStreamServiceServer::new(Fail);

    assert_eq!(grpc_status(auth(), AUTHENTICATE).await, "6");
    assert_eq!(grpc_status(auth(), REFRESH_TOKEN).await, "6");
    assert_eq!(grpc_status(version(), VERSION).await, "6");
    assert_eq!(grpc_status(events(), SUBSCRIBE).await, "6");
    assert_eq!(grpc_status(events(), PUSH).await, "6");
    assert_eq!(grpc_status(events(), PING).await, "6");
    assert_eq!(grpc_status(logs(), STREAM_LOGS).await, "6");
    let terminal = || {
        terminalstreamapi::terminal_stream_service_server::TerminalStreamServiceServer::new(Fail)
    };
    assert_eq!(grpc_status(terminal(), STREAM_TERMINAL).await, "6");

    // Near misses are not routed.
    assert_eq!(
        grpc_status(auth(), "/authapi.Authentication/authenticate").await,
        "12"
    );
    assert_eq!(
        grpc_status(events(), "/eventstream.EventStream/Subscribe").await,
        "12"
    );
    assert_eq!(
        grpc_status(logs(), "/logstreamapi.LogStreamService/StreamLogs").await,
        "12"
    );
}
