//! Dialling a server over TLS, and a gRPC channel over that: the one client transport of the
//! agent's link to its principal and of the test harness's agents.
//!
//! Owns: TCP connect (no Nagle delay) and the client side of the TLS handshake for a server name
//! ([`connect_tls`]), refusing a server that negotiated an ALPN protocol other than h2 and
//! building the tonic [`Channel`] with its connect timeout and HTTP/2 keepalive ([`dial_grpc`];
//! without TLS behind a service mesh, [`dial_grpc_plaintext`]); or, for links that pass only
//! HTTP/1.1, a gRPC-over-WebSocket channel, one connection per call, its keepalive pinging each
//! call's WebSocket ([`dial_grpc_websocket`], refusing a server that negotiated anything but
//! http/1.1; the connection made to check the server carries the first call); either one as a
//! [`GrpcChannel`] for tonic's clients;
//! the client TLS config taken afresh for every connection so certificate reloads apply
//! ([`ClientTlsSource`]), and finding the rustls error (or any other) inside a transport error's
//! chain ([`rustls_error_in`], [`error_in`]) so callers classify failures by their type, never by
//! their text.
//! What a failure means to an operator (which flag to check) is the caller's.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

use crate::grpc_websocket::client::{ChannelOptions, Dial, Io, WebSocketChannel};
use crate::grpc_websocket::socket::Keepalive;
use crate::tls::{ReloadingClientConfig, ALPN_H2, ALPN_HTTP1};

/// Where a dial takes its client TLS config from, asked again at each connection.
pub trait ClientTlsSource: Clone + Send + Sync + 'static {
    /// A connector with the config in force now.
    fn connector(&self) -> TlsConnector;
}

impl ClientTlsSource for ReloadingClientConfig {
    fn connector(&self) -> TlsConnector {
        ReloadingClientConfig::connector(self)
    }
}

impl ClientTlsSource for Arc<ClientConfig> {
    fn connector(&self) -> TlsConnector {
        TlsConnector::from(self.clone())
    }
}

/// A TLS server: where to connect and the name its certificate must carry (also sent as SNI).
#[derive(Debug, Clone)]
pub struct TlsTarget {
    /// `host:port` (a host that is a DNS name is resolved at each connection).
    pub address: String,
    /// The name the server's certificate is verified against.
    pub server_name: ServerName<'static>,
}

impl TlsTarget {
    /// `address` verified as `server_name`.
    pub fn new(address: impl Into<String>, server_name: ServerName<'static>) -> Self {
        TlsTarget {
            address: address.into(),
            server_name,
        }
    }
}

/// Why a TLS connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// TCP connect (or resolving the host) failed.
    #[error(transparent)]
    Tcp(std::io::Error),
    /// The TLS handshake failed; `source` carries the `rustls::Error` ([`rustls_error_in`]).
    #[error("TLS handshake (server name {server_name:?}) failed: {source}")]
    Handshake {
        /// The name the server was verified against.
        server_name: ServerName<'static>,
        /// The handshake's error.
        #[source]
        source: std::io::Error,
    },
    /// The server chose an application protocol other than HTTP/2.
    #[error("the server negotiated ALPN {0:?} instead of h2")]
    NotHttp2(String),
    /// The server chose an application protocol other than HTTP/1.1 for gRPC over WebSocket.
    #[error("the server negotiated ALPN {0:?} instead of http/1.1 (gRPC over WebSocket)")]
    NotHttp1(String),
}

/// Connects to `target` and completes the TLS handshake with `tls`.
pub async fn connect_tls(
    target: &TlsTarget,
    tls: &impl ClientTlsSource,
) -> Result<TlsStream<TcpStream>, ConnectError> {
    let tcp = TcpStream::connect(target.address.as_str())
        .await
        .map_err(ConnectError::Tcp)?;
    tcp.set_nodelay(true).map_err(ConnectError::Tcp)?;
    tls.connector()
        .connect(target.server_name.clone(), tcp)
        .await
        .map_err(|source| ConnectError::Handshake {
            server_name: target.server_name.clone(),
            source,
        })
}

/// HTTP/2 keepalive of a channel: a PING every `interval`, the link dead when one is not answered
/// within `timeout` (also while idle, so a half-open link is noticed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Keepalive {
    /// Time between PINGs.
    pub interval: Duration,
    /// How long a PING may go unanswered.
    pub timeout: Duration,
}

/// What a gRPC dial sets beyond its target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GrpcDialOptions {
    /// Limit on TCP connect + TLS handshake (`None` = none).
    pub connect_timeout: Option<Duration>,
    /// HTTP/2 keepalive (`None` = off).
    pub keepalive: Option<Http2Keepalive>,
}

/// The tonic endpoint for `address` with `options` (the connector decides about TLS).
fn endpoint(address: &str, options: GrpcDialOptions) -> Result<Endpoint, tonic::transport::Error> {
    let mut endpoint = Endpoint::from_shared(format!("http://{address}"))?.tcp_nodelay(true);
    if let Some(limit) = options.connect_timeout {
        endpoint = endpoint.connect_timeout(limit);
    }
    if let Some(k) = options.keepalive {
        endpoint = endpoint
            .http2_keep_alive_interval(k.interval)
            .keep_alive_timeout(k.timeout)
            .keep_alive_while_idle(true);
    }
    Ok(endpoint)
}

/// Opens a gRPC channel to `address` WITHOUT TLS (HTTP/2 with prior knowledge), for a link whose
/// transport security a service mesh sidecar provides (`--insecure-plaintext`).
pub async fn dial_grpc_plaintext(
    address: &str,
    options: GrpcDialOptions,
) -> Result<Channel, tonic::transport::Error> {
    endpoint(address, options)?.connect().await
}

/// Opens a gRPC channel to `target`: TCP, TLS with `tls` (h2, or no ALPN at all), HTTP/2.
pub async fn dial_grpc(
    target: &TlsTarget,
    tls: impl ClientTlsSource,
    options: GrpcDialOptions,
) -> Result<Channel, tonic::transport::Error> {
    let endpoint = endpoint(&target.address, options)?;
    let target = target.clone();
    let connector = tower::service_fn(move |_: http::Uri| {
        let target = target.clone();
        let tls = tls.clone();
        async move {
            let stream = connect_tls(&target, &tls).await?;
            if let Some(alpn) = stream.get_ref().1.alpn_protocol() {
                if alpn != ALPN_H2 {
                    return Err(ConnectError::NotHttp2(
                        String::from_utf8_lossy(alpn).into_owned(),
                    ));
                }
            }
            Ok(TokioIo::new(stream))
        }
    });
    endpoint.connect_with_connector(connector).await
}

/// Where a gRPC-over-WebSocket dial connects: a TLS server, or a plaintext address behind a
/// service mesh.
#[derive(Clone)]
pub enum WebSocketTarget<T: ClientTlsSource> {
    /// TLS (ALPN http/1.1, or none) with `tls`.
    Tls(TlsTarget, T),
    /// Plain TCP to `host:port`.
    Plaintext(String),
}

impl<T: ClientTlsSource> WebSocketTarget<T> {
    fn address(&self) -> &str {
        match self {
            WebSocketTarget::Tls(target, _) => &target.address,
            WebSocketTarget::Plaintext(address) => address,
        }
    }

    /// One connection, TLS completed and its ALPN protocol checked.
    async fn connect(&self) -> Result<Box<dyn Io>, ConnectError> {
        match self {
            WebSocketTarget::Tls(target, tls) => {
                let stream = connect_tls(target, tls).await?;
                match stream.get_ref().1.alpn_protocol() {
                    None | Some(ALPN_HTTP1) => Ok(Box::new(stream)),
                    Some(other) => Err(ConnectError::NotHttp1(
                        String::from_utf8_lossy(other).into_owned(),
                    )),
                }
            }
            WebSocketTarget::Plaintext(address) => {
                let tcp = TcpStream::connect(address.as_str())
                    .await
                    .map_err(ConnectError::Tcp)?;
                tcp.set_nodelay(true).map_err(ConnectError::Tcp)?;
                Ok(Box::new(tcp))
            }
        }
    }
}

/// Opens a gRPC-over-WebSocket channel to `target`, messages of at most `max_message_size` bytes
/// either way: connects once (under the connect timeout) so that a server that cannot be reached
/// fails here, as an HTTP/2 dial does, and keeps that connection for the first call; each later
/// call dials its own. The keepalive of `options` pings each call's WebSocket.
pub async fn dial_grpc_websocket<T: ClientTlsSource>(
    target: WebSocketTarget<T>,
    options: GrpcDialOptions,
    max_message_size: usize,
) -> Result<WebSocketChannel, ConnectError> {
    let first = match options.connect_timeout {
        Some(limit) => tokio::time::timeout(limit, target.connect())
            .await
            .map_err(|_| {
                ConnectError::Tcp(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection to {} within {limit:?}", target.address()),
                ))
            })??,
        None => target.connect().await?,
    };
    let channel_options = ChannelOptions {
        host: target.address().to_string(),
        max_message_size,
        keepalive: options.keepalive.map(|k| Keepalive {
            interval: k.interval,
            timeout: k.timeout,
        }),
        connect_timeout: options.connect_timeout,
    };
    let dial: Dial = Arc::new(move || {
        let target = target.clone();
        Box::pin(async move { target.connect().await.map_err(|e| e.to_string()) })
    });
    Ok(WebSocketChannel::new(dial, channel_options, Some(first)))
}

/// A gRPC channel over HTTP/2 or over WebSocket, for tonic's generated clients.
#[derive(Clone)]
pub enum GrpcChannel {
    /// Native gRPC.
    Http2(Channel),
    /// gRPC over WebSocket on HTTP/1.1.
    WebSocket(WebSocketChannel),
}

impl tower::Service<http::Request<tonic::body::Body>> for GrpcChannel {
    type Response = http::Response<tonic::body::Body>;
    type Error = tower::BoxError;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        match self {
            GrpcChannel::Http2(c) => c.poll_ready(cx).map_err(Into::into),
            GrpcChannel::WebSocket(c) => c.poll_ready(cx).map_err(Into::into),
        }
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        use futures::TryFutureExt;
        match self {
            GrpcChannel::Http2(c) => Box::pin(c.call(request).map_err(Into::into)),
            GrpcChannel::WebSocket(c) => Box::pin(c.call(request).map_err(Into::into)),
        }
    }
}

/// The `rustls::Error` somewhere in `error`'s chain, looking inside `std::io::Error`s too (their
/// `source()` skips the error they wrap, which is where tokio-rustls puts rustls's).
pub fn rustls_error_in<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    error_in(error)
}

/// The error of type `E` somewhere in `error`'s chain, looking inside `std::io::Error`s too.
pub fn error_in<'a, E: StdError + 'static>(error: &'a (dyn StdError + 'static)) -> Option<&'a E> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<E>() {
            return Some(found);
        }
        if let Some(wrapped) = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            if let Some(found) = error_in(wrapped) {
                return Some(found);
            }
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accept::serve_tls_connections;
    use crate::tls::tests::Pki;
    use crate::tls::ReloadingServerConfig;

    /// A TLS listener of `pki`'s server certificate that keeps each connection a moment.
    async fn tls_listener(pki: &Pki) -> TlsTarget {
        let tls = ReloadingServerConfig::load(pki.server_options()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_tls_connections(
            listener,
            "test",
            tls,
            Duration::from_secs(10),
            std::future::pending(),
            |stream, _| async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                drop(stream);
            },
        ));
        TlsTarget::new(addr.to_string(), ServerName::try_from("localhost").unwrap())
    }

    #[test]
    fn the_rustls_error_is_found_inside_io_errors_and_sources() {
        let untrusted = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, untrusted.clone());
        let wrapped = ConnectError::Handshake {
            server_name: ServerName::try_from("p").unwrap(),
            source: io,
        };
        let outer = std::io::Error::other(wrapped);
        assert_eq!(rustls_error_in(&outer), Some(&untrusted));
        let plain = std::io::Error::other("connection refused");
        assert_eq!(rustls_error_in(&plain), None);
    }

    #[tokio::test]
    async fn an_untrusted_server_fails_the_dial_with_its_rustls_error() {
        let target = tls_listener(&Pki::new()).await;
        // A client that trusts another CA.
        let other = Pki::new().client();
        let err = dial_grpc(&target, other.clone(), GrpcDialOptions::default())
            .await
            .unwrap_err();
        // Both test CAs have the same name, so rustls sees a bad signature, not an unknown issuer.
        assert!(
            matches!(
                rustls_error_in(&err),
                Some(rustls::Error::InvalidCertificate(_))
            ),
            "{err:?}"
        );
        let err = connect_tls(&target, &other).await.unwrap_err();
        assert!(
            err.to_string().starts_with("TLS handshake (server name ")
                && err.to_string().contains("localhost"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_trusted_server_is_connected_with_h2() {
        let pki = Pki::new();
        let target = tls_listener(&pki).await;
        let stream = connect_tls(&target, &pki.client()).await.unwrap();
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(ALPN_H2));
    }
}
