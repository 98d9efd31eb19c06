//! The HTTP/1.1 upgrade that opens each gRPC-over-WebSocket call, both sides of it.
//!
//! grpc-http1's client (`client/ws_proxy.go`) dials `GET <scheme>://<host>/<service>/<method>`
//! with every header of the gRPC request (content-type, te, grpc-timeout, grpc-encoding, the
//! call's metadata such as `authorization`) beside the WebSocket ones, offering subprotocol
//! [`SUBPROTOCOL`] and no compression extension. Its server (`server/server.go`) takes a request
//! as such a call when `Sec-WebSocket-Protocol` is `grpc-ws`, and then insists on
//! `Connection: upgrade` and `Upgrade: websocket`, answering 400 with a message that blames the
//! proxy otherwise; the call's gRPC request is the upgrade request turned into a POST with the
//! WebSocket headers removed ([`call_headers`]).
//!
//! Owns: reading an offer ([`offer`]) and the `101 Switching Protocols` answer
//! ([`switching_protocols`], also what the principal's web terminal answers with), the client's
//! upgrade request ([`upgrade_headers`]) and its check of the answer ([`check_answer`]).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use super::frame::SUBPROTOCOL;

/// The only WebSocket version (RFC 6455).
const WEBSOCKET_VERSION: &str = "13";

/// Why an HTTP/1.1 request is not a gRPC-over-WebSocket call this server takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotACall {
    /// The HTTP status to answer with.
    pub status: StatusCode,
    /// The reason, sent as the answer's text.
    pub reason: String,
}

/// Whether comma-separated header `name` lists `token` (case-insensitive).
fn lists(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// The `Sec-WebSocket-Key` of an upgrade request offering gRPC over WebSocket, or why the
/// request is not one.
pub fn offer(method: &http::Method, headers: &HeaderMap) -> Result<HeaderValue, NotACall> {
    let refuse = |status, reason: &str| NotACall {
        status,
        reason: reason.to_string(),
    };
    if !lists(headers, &header::SEC_WEBSOCKET_PROTOCOL, SUBPROTOCOL) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "this port serves gRPC over HTTP/2, and over HTTP/1.1 only gRPC over WebSocket \
             (subprotocol grpc-ws, agents started with --enable-websocket); gRPC-Web is not served",
        ));
    }
    // grpc-http1's own wording: the usual cause is a proxy that dropped the hop-by-hop headers.
    if !lists(headers, &header::CONNECTION, "upgrade") {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "missing 'Connection: Upgrade' header in gRPC-websocket request (this usually means \
             your proxy or load balancer does not support websockets)",
        ));
    }
    if !lists(headers, &header::UPGRADE, "websocket") {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "missing 'Upgrade: websocket' header in gRPC-websocket request (this usually means \
             your proxy or load balancer does not support websockets)",
        ));
    }
    if method != http::Method::GET {
        return Err(refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "a WebSocket upgrade is a GET request",
        ));
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .map(HeaderValue::as_bytes)
        != Some(WEBSOCKET_VERSION.as_bytes())
    {
        return Err(refuse(
            StatusCode::UPGRADE_REQUIRED,
            "only WebSocket version 13 is supported",
        ));
    }
    headers
        .get(header::SEC_WEBSOCKET_KEY)
        .filter(|k| !k.is_empty())
        .cloned()
        .ok_or_else(|| refuse(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key"))
}

/// The headers of `101 Switching Protocols` accepting the WebSocket offered with `key`, speaking
/// `protocol`.
pub fn switching_protocols(key: &HeaderValue, protocol: &'static str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    h.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(protocol),
    );
    h
}

/// Whether `name` belongs to the HTTP/1.1 connection or the WebSocket handshake rather than to
/// the gRPC call (grpc-http1 removes Connection, Upgrade, Sec-Websocket-* and Content-Length;
/// Host becomes the request's authority, and the other hop-by-hop headers mean nothing to it).
fn is_handshake_header(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::UPGRADE
        || name == header::HOST
        || name == header::CONTENT_LENGTH
        || name == header::TRANSFER_ENCODING
        || matches!(name.as_str(), "keep-alive" | "proxy-connection")
        || name.as_str().starts_with("sec-websocket-")
}

/// The gRPC request headers an upgrade request carries (everything but the handshake's own).
pub fn call_headers(upgrade: &HeaderMap) -> HeaderMap {
    let mut call = HeaderMap::with_capacity(upgrade.len());
    for (name, value) in upgrade {
        if !is_handshake_header(name) {
            call.append(name.clone(), value.clone());
        }
    }
    call
}

/// The upgrade request's headers for a gRPC request with `grpc` headers: the call's own (without
/// any that belong to a connection) and the WebSocket offer of `key` for `host`.
pub fn upgrade_headers(grpc: &HeaderMap, host: &str, key: &str) -> Result<HeaderMap, String> {
    let mut h = call_headers(grpc);
    let value = |v: &str| HeaderValue::from_str(v).map_err(|e| format!("{v:?}: {e}"));
    h.insert(header::HOST, value(host)?);
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(
        header::SEC_WEBSOCKET_VERSION,
        HeaderValue::from_static(WEBSOCKET_VERSION),
    );
    h.insert(header::SEC_WEBSOCKET_KEY, value(key)?);
    h.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(SUBPROTOCOL),
    );
    Ok(h)
}

/// Checks a `101` answer to the offer of `key`: the accept key must match, and a subprotocol, when
/// the server names one (grpc-http1's server names none), must be ours.
pub fn check_answer(headers: &HeaderMap, key: &str) -> Result<(), String> {
    let expected = derive_accept_key(key.as_bytes());
    match headers.get(header::SEC_WEBSOCKET_ACCEPT) {
        Some(accept) if accept.as_bytes() == expected.as_bytes() => {}
        Some(accept) => {
            return Err(format!(
                "Sec-WebSocket-Accept {accept:?} does not answer our key (expected {expected})"
            ))
        }
        None => return Err("the answer has no Sec-WebSocket-Accept".into()),
    }
    match headers.get(header::SEC_WEBSOCKET_PROTOCOL) {
        Some(p) if p.as_bytes() != SUBPROTOCOL.as_bytes() => Err(format!(
            "the server chose subprotocol {p:?}, not {SUBPROTOCOL}"
        )),
        _ => Ok(()),
    }
}
