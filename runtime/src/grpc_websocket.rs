//! gRPC over WebSocket on HTTP/1.1, for links whose proxies or load balancers do not pass HTTP/2
//! (`--enable-websocket` on both ends), wire-compatible with `golang.stackrox.io/grpc-http1`
//! v0.5.1, the library upstream argocd-agent v0.9.0 uses for the same flag.
//!
//! Each gRPC call gets a connection and a WebSocket of its own, opened by an HTTP/1.1 upgrade
//! that offers subprotocol `grpc-ws` and carries the call's request headers ([`handshake`]);
//! every WebSocket message is one gRPC frame: a message, or the headers and trailers as a header
//! block behind a flag byte of `0x80`, and from the client a bare `0x80 0 0 0 0` for the end of
//! its stream ([`frame`]). A server tells such a call from native gRPC before any HTTP: by the
//! ALPN protocol of the TLS handshake (`h2` or `http/1.1`) or, with none, by the first bytes
//! (the HTTP/2 preface or a request line, [`sniff`]).
//!
//! Owns the wire format and both ends: the server ([`server::WebSocketServer`], which answers
//! each call with the same tower service — tonic's routes — that serves native gRPC), the client
//! ([`client::WebSocketChannel`], a tower service under tonic's generated clients), and what they
//! share ([`socket`]: one call's WebSocket as bounded channels, with keepalive). Who the peer is,
//! which listener or dial uses this, and the flag are the callers'.

pub mod client;
pub mod frame;
pub mod handshake;
pub mod server;
pub mod sniff;
pub mod socket;
