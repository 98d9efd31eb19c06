//! `--enable-websocket` on the principal: the runtime's gRPC-over-WebSocket server
//! ([`argocd_agent_runtime::grpc_websocket::server`]) answering HTTP/1.1 connections of the gRPC
//! listener ([`crate::listener::Http1Calls`]) with the principal's own gRPC routes, so every
//! service, interceptor, decoding limit and compression rule of native gRPC applies as it is.
//!
//! Owns what that server must know before a call reaches the routes: the largest request message
//! of each method ([`request_limit`], the same limits the services are built with in
//! [`crate::app`]: a message over it is refused from its WebSocket frame header, before it is
//! buffered — 64 KiB for the calls made before a session), and the connection's identity handed
//! to every call as the native server hands it ([`crate::listener::PeerIdentity`] in the request
//! extensions).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_proto::pb::authapi::authentication_server::AuthenticationServer;
use argocd_agent_proto::pb::eventstreamapi::event_stream_server::EventStreamServer;
use argocd_agent_proto::pb::logstreamapi::log_stream_service_server::LogStreamServiceServer;
use argocd_agent_proto::pb::terminalstreamapi::terminal_stream_service_server::TerminalStreamServiceServer;
use argocd_agent_proto::pb::versionapi::version_server::VersionServer;
use argocd_agent_runtime::grpc_websocket::server::WebSocketServer;
use argocd_agent_runtime::grpc_websocket::socket::Keepalive;
use tonic::server::NamedService;
use tonic::transport::server::Connected;

use crate::auth::{AuthService, VersionService, AUTH_MAX_MESSAGE_SIZE};
use crate::eventstream::EventStreamService;
use crate::listener::Http1Calls;
use crate::log_stream::LogStreamRelay;
use crate::terminal::TerminalStreamRelay;

/// What the gRPC-over-WebSocket calls are served with.
pub struct WebSocketSettings {
    /// The principal's gRPC routes (the native server's too).
    pub routes: tonic::service::Routes,
    /// `--grpc-max-message-size`.
    pub max_message_size: usize,
    /// Pings on each call's WebSocket (the native server's HTTP/2 keepalive).
    pub keepalive: Keepalive,
    /// `--request-header-timeout`: for the upgrade request.
    pub header_timeout: Duration,
}

/// Whether `path` is a method of service `S`.
fn of_service<S: NamedService>(path: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|p| p.strip_prefix(S::NAME))
        .is_some_and(|rest| rest.starts_with('/'))
}

/// The largest request message the method at `path` decodes, `max` being
/// `--grpc-max-message-size`: Authenticate, RefreshToken, Version and the event stream's Ping
/// come before a session and get [`AUTH_MAX_MESSAGE_SIZE`], a terminal session its own bound,
/// the event stream and pod logs `max`; an unknown path (answered `Unimplemented`) the smallest.
pub fn request_limit(path: &str, max: usize) -> usize {
    if of_service::<AuthenticationServer<AuthService>>(path)
        || of_service::<VersionServer<VersionService>>(path)
        || path == crate::eventstream::PING_PATH
    {
        AUTH_MAX_MESSAGE_SIZE
    } else if of_service::<TerminalStreamServiceServer<TerminalStreamRelay>>(path) {
        crate::terminal::MAX_CALL_MESSAGE
    } else if of_service::<EventStreamServer<EventStreamService>>(path)
        || of_service::<LogStreamServiceServer<LogStreamRelay>>(path)
    {
        max
    } else {
        AUTH_MAX_MESSAGE_SIZE
    }
}

/// Serves an HTTP/1.1 connection's gRPC-over-WebSocket calls with `settings`.
pub fn http1_calls(settings: WebSocketSettings) -> Http1Calls {
    let max = settings.max_message_size;
    let server = WebSocketServer::new(
        settings.routes,
        Arc::new(move |path: &str| request_limit(path, max)),
        max,
        Some(settings.keepalive),
        settings.header_timeout,
    );
    Arc::new(move |connection| {
        let server = server.clone();
        let call: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
            let mut extensions = http::Extensions::new();
            extensions.insert(connection.connect_info());
            server.serve(connection, extensions).await;
        });
        call
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_before_a_session_get_the_small_limit_and_the_streams_the_flag() {
        let max = 200 << 20;
        for path in [
            "/authapi.Authentication/Authenticate",
            "/authapi.Authentication/RefreshToken",
            "/versionapi.Version/Version",
            "/eventstreamapi.EventStream/Ping",
            "/nosuch.Service/Call",
            "/authapi.AuthenticationX/Authenticate",
        ] {
            assert_eq!(request_limit(path, max), AUTH_MAX_MESSAGE_SIZE, "{path}");
        }
        for path in [
            "/eventstreamapi.EventStream/Subscribe",
            "/eventstreamapi.EventStream/Push",
            "/principal.apis.logstreamapi.LogStreamService/StreamLogs",
        ] {
            assert_eq!(request_limit(path, max), max, "{path}");
        }
        assert_eq!(
            request_limit(
                "/terminalstreamapi.TerminalStreamService/StreamTerminal",
                max
            ),
            crate::terminal::MAX_CALL_MESSAGE
        );
    }
}
