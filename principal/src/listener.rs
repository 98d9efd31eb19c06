//! The agent-facing TCP/TLS listener: accepts connections, completes the mutual-TLS handshake
//! (TLS 1.3, client certificate required, ALPN h2 only — an HTTP/1.1 client cannot negotiate), and
//! attaches the agent identity read from the verified client certificate to the connection, where
//! every RPC finds it as [`PeerIdentity`].
//!
//! A handshake that does not finish within the timeout is dropped (slowloris), and a failed
//! handshake is counted by reason; neither affects other connections.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use argocd_agent_proto::identity::{AgentIdentity, IdentitySource};
use argocd_agent_proto::tls::reload::ReloadingServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

use crate::metrics::PrincipalMetrics;

/// How long a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The identity of the peer of a connection, as established by its certificate.
#[derive(Debug, Clone)]
pub struct PeerIdentity {
    /// The agent identity, or why the verified certificate does not name a valid agent.
    pub identity: Result<AgentIdentity, String>,
    /// Remote address.
    pub remote: Option<std::net::SocketAddr>,
}

/// An accepted mutual-TLS connection.
pub struct AgentConnection {
    stream: TlsStream<TcpStream>,
    peer: PeerIdentity,
}

impl Connected for AgentConnection {
    type ConnectInfo = PeerIdentity;

    fn connect_info(&self) -> PeerIdentity {
        self.peer.clone()
    }
}

impl AsyncRead for AgentConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for AgentConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Reads the agent identity from the verified leaf certificate of a finished handshake.
fn peer_identity(stream: &TlsStream<TcpStream>, source: &IdentitySource) -> PeerIdentity {
    let (tcp, conn) = stream.get_ref();
    let identity = match conn.peer_certificates().and_then(|c| c.first()) {
        Some(leaf) => {
            AgentIdentity::from_cert_der(leaf.as_ref(), source).map_err(|e| e.to_string())
        }
        None => Err("no client certificate presented".to_string()),
    };
    PeerIdentity {
        identity,
        remote: tcp.peer_addr().ok(),
    }
}

/// Accepts connections on `listener` forever, handing finished mutual-TLS connections to the
/// returned channel (the gRPC server's incoming stream).
pub fn accept_loop(
    listener: TcpListener,
    tls: ReloadingServerConfig,
    source: IdentitySource,
    metrics: Arc<PrincipalMetrics>,
) -> mpsc::Receiver<Result<AgentConnection, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, remote) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a TCP connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            let source = source.clone();
            let metrics = metrics.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let peer = peer_identity(&stream, &source);
                        if let Err(reason) = &peer.identity {
                            metrics.auth_failure("certificate_identity");
                            tracing::warn!(%remote, %reason, "client certificate does not name a valid agent");
                        }
                        let _ = tx.send(Ok(AgentConnection { stream, peer })).await;
                    }
                    Ok(Err(e)) => {
                        metrics.auth_failure("tls_handshake");
                        tracing::info!(%remote, error = %e, "TLS handshake with a client failed");
                    }
                    Err(_) => {
                        metrics.auth_failure("tls_handshake_timeout");
                        tracing::info!(%remote, "TLS handshake not completed within {HANDSHAKE_TIMEOUT:?}; connection dropped");
                    }
                }
            });
        }
    });
    rx
}
