//! The agent-facing TCP/TLS listener: accepts connections, completes the mutual-TLS handshake
//! (TLS 1.3 unless `--tls-min-version=tls1.2`, client certificate required, ALPN h2 only — an
//! HTTP/1.1 client cannot negotiate), and attaches the agent identity read from the verified
//! client certificate to the connection, where every RPC finds it as [`PeerIdentity`].
//!
//! Also owns what every TLS listener of the principal (this one and the resource proxy) does
//! around the handshake, [`ConnectionPolicy`]: a handshake that does not finish within
//! `--tls-handshake-timeout` is dropped, and so is a connection that sends no request bytes within
//! `--request-header-timeout` after it (slowloris); a certificate on the blocklist is refused after
//! the handshake and a live connection is closed as soon as its certificate gets listed
//! ([`GuardedStream`]); a client certificate whose key usage does not allow digital signatures
//! names no agent. Failures are counted by reason; none affects other connections.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use argocd_agent_proto::identity::{cert_fingerprint, AgentIdentity, IdentitySource};
use argocd_agent_proto::tls::reload::ReloadingServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::blocklist::Blocklist;
use crate::metrics::PrincipalMetrics;

/// Default `--tls-handshake-timeout`: how long a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--request-header-timeout`: how long a connection may stay silent after its handshake
/// before the first bytes of its first request (HTTP/2 preface, HTTP/1 request line, RESP command).
pub const REQUEST_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What every principal listener enforces around the TLS handshake.
#[derive(Debug, Clone)]
pub struct ConnectionPolicy {
    /// Longest TLS handshake.
    pub handshake_timeout: Duration,
    /// Longest silence between the handshake and the first request bytes; on the Redis proxy,
    /// also the longest a command may take to arrive once started.
    pub request_header_timeout: Duration,
    /// Refused client certificates.
    pub blocklist: Arc<Blocklist>,
}

impl Default for ConnectionPolicy {
    fn default() -> Self {
        ConnectionPolicy {
            handshake_timeout: HANDSHAKE_TIMEOUT,
            request_header_timeout: REQUEST_HEADER_TIMEOUT,
            blocklist: Blocklist::empty(),
        }
    }
}

/// Why a connection was dropped before it could carry a request; the metric reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The TLS handshake failed (no or untrusted client certificate, protocol, ALPN, ...).
    Handshake,
    /// The TLS handshake did not finish in time.
    HandshakeTimeout,
    /// The client certificate is on the blocklist.
    Blocklisted,
    /// The blocklist could not be read yet, so no certificate can be admitted.
    BlocklistUnavailable,
}

impl Refusal {
    /// The `reason` label of `argocd_principal_auth_failures_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Handshake => "tls_handshake",
            Refusal::HandshakeTimeout => "tls_handshake_timeout",
            Refusal::Blocklisted => "blocklisted",
            Refusal::BlocklistUnavailable => "blocklist_unavailable",
        }
    }
}

/// A stream that fails reads with `TimedOut` when no byte arrives before its first-request
/// deadline, and fails every operation once its certificate is blocklisted.
pub struct GuardedStream<S> {
    stream: S,
    first_request: Option<Pin<Box<Sleep>>>,
    revoked: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    closed: bool,
}

impl<S> GuardedStream<S> {
    /// Wraps `stream`: it must send within `header_timeout`, and closes when `fingerprint` gets
    /// listed in `blocklist`.
    pub fn new(
        stream: S,
        header_timeout: Duration,
        blocklist: Option<(Arc<Blocklist>, String)>,
    ) -> Self {
        GuardedStream {
            stream,
            first_request: Some(Box::pin(tokio::time::sleep(header_timeout))),
            revoked: blocklist.map(|(list, fp)| {
                Box::pin(async move {
                    list.listed(fp.clone()).await;
                    tracing::warn!(fingerprint = %fp, "closing a connection: its client certificate was blocklisted");
                }) as Pin<Box<dyn Future<Output = ()> + Send>>
            }),
            closed: false,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    fn check_revoked(&mut self, cx: &mut Context<'_>) -> Result<(), std::io::Error> {
        if !self.closed {
            if let Some(revoked) = self.revoked.as_mut() {
                if revoked.as_mut().poll(cx).is_ready() {
                    self.closed = true;
                    self.revoked = None;
                }
            }
        }
        if self.closed {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the client certificate was blocklisted",
            ));
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for GuardedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.check_revoked(cx)?;
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.first_request = None;
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if let Some(deadline) = self.first_request.as_mut() {
                    if deadline.as_mut().poll(cx).is_ready() {
                        self.first_request = None;
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no request within the request header timeout",
                        )));
                    }
                }
                Poll::Pending
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GuardedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.check_revoked(cx)?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.check_revoked(cx)?;
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
        self.check_revoked(cx)?;
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// A finished, admitted TLS connection of any principal listener.
pub struct Admitted {
    /// The connection, guarded by the policy.
    pub stream: GuardedStream<TlsStream<TcpStream>>,
    /// The verified client certificate (DER), if one was presented.
    pub leaf: Option<Vec<u8>>,
}

/// Completes the TLS handshake of `tcp` under `policy` and checks the client certificate against
/// the blocklist (waiting up to the handshake timeout for the blocklist's first read).
pub async fn admit(
    tcp: TcpStream,
    tls: &ReloadingServerConfig,
    policy: &ConnectionPolicy,
) -> Result<Admitted, (Refusal, String)> {
    let _ = tcp.set_nodelay(true);
    let stream =
        match tokio::time::timeout(policy.handshake_timeout, tls.acceptor().accept(tcp)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err((Refusal::Handshake, e.to_string())),
            Err(_) => {
                return Err((
                    Refusal::HandshakeTimeout,
                    format!(
                        "TLS handshake not completed within {:?}",
                        policy.handshake_timeout
                    ),
                ))
            }
        };
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec());
    let mut watch = None;
    if let Some(der) = &leaf {
        if tokio::time::timeout(policy.handshake_timeout, policy.blocklist.synced())
            .await
            .is_err()
        {
            return Err((
                Refusal::BlocklistUnavailable,
                "the certificate blocklist has not been read yet".into(),
            ));
        }
        let fingerprint = cert_fingerprint(der);
        if policy.blocklist.contains(&fingerprint) {
            return Err((
                Refusal::Blocklisted,
                format!("client certificate {fingerprint} is blocklisted"),
            ));
        }
        watch = Some((policy.blocklist.clone(), fingerprint));
    }
    Ok(Admitted {
        stream: GuardedStream::new(stream, policy.request_header_timeout, watch),
        leaf,
    })
}

/// Refuses a client certificate whose keyUsage extension, when present, does not allow digital
/// signatures (the TLS client signs the handshake with that key). The extended key usage
/// (clientAuth when present) is already enforced by the handshake's verifier.
pub fn check_key_usage(der: &[u8]) -> Result<(), String> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| format!("cannot be parsed: {e}"))?;
    match cert.key_usage() {
        Ok(Some(ku)) if !ku.value.digital_signature() => Err(
            "its keyUsage does not include digitalSignature, so it may not authenticate a TLS client"
                .into(),
        ),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("its keyUsage extension is malformed: {e}")),
    }
}

/// The agent named by a verified client certificate (`None` = no certificate).
pub fn agent_of_certificate(
    leaf: Option<&[u8]>,
    source: &IdentitySource,
) -> Result<AgentIdentity, String> {
    let der = leaf.ok_or_else(|| "no client certificate presented".to_string())?;
    check_key_usage(der).map_err(|e| format!("client certificate refused: {e}"))?;
    AgentIdentity::from_cert_der(der, source).map_err(|e| e.to_string())
}

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
    stream: GuardedStream<TlsStream<TcpStream>>,
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

/// Accepts connections on `listener` forever, handing finished mutual-TLS connections that
/// `policy` admits to the returned channel (the gRPC server's incoming stream).
pub fn accept_loop(
    listener: TcpListener,
    tls: ReloadingServerConfig,
    source: IdentitySource,
    metrics: Arc<PrincipalMetrics>,
    policy: ConnectionPolicy,
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
            let tls = tls.clone();
            let tx = tx.clone();
            let source = source.clone();
            let metrics = metrics.clone();
            let policy = policy.clone();
            tokio::spawn(async move {
                match admit(tcp, &tls, &policy).await {
                    Ok(admitted) => {
                        let identity = agent_of_certificate(admitted.leaf.as_deref(), &source);
                        if let Err(reason) = &identity {
                            metrics.auth_failure("certificate_identity");
                            tracing::warn!(%remote, %reason, "client certificate does not name a valid agent");
                        }
                        let peer = PeerIdentity {
                            identity,
                            remote: Some(remote),
                        };
                        let _ = tx
                            .send(Ok(AgentConnection {
                                stream: admitted.stream,
                                peer,
                            }))
                            .await;
                    }
                    Err((refusal, reason)) => {
                        metrics.auth_failure(refusal.reason());
                        if refusal == Refusal::Blocklisted {
                            tracing::warn!(%remote, %reason, "connection refused");
                        } else {
                            tracing::info!(%remote, %reason, "connection dropped");
                        }
                    }
                }
            });
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn cert_with(usages: Vec<rcgen::KeyUsagePurpose>) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.key_usages = usages;
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn key_usage_must_allow_signatures_when_present() {
        assert!(check_key_usage(&cert_with(vec![])).is_ok(), "no extension");
        assert!(
            check_key_usage(&cert_with(vec![rcgen::KeyUsagePurpose::DigitalSignature])).is_ok()
        );
        let err =
            check_key_usage(&cert_with(vec![rcgen::KeyUsagePurpose::KeyEncipherment])).unwrap_err();
        assert!(err.contains("digitalSignature"), "{err}");
    }

    #[tokio::test]
    async fn a_silent_connection_times_out_and_a_talking_one_does_not() {
        let (client, server) = tokio::io::duplex(64);
        let mut guarded = GuardedStream::new(server, Duration::from_millis(100), None);
        let mut buf = [0u8; 8];
        let err = guarded.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        drop(client);

        let (mut client, server) = tokio::io::duplex(64);
        let mut guarded = GuardedStream::new(server, Duration::from_millis(100), None);
        client.write_all(b"x").await.unwrap();
        assert_eq!(guarded.read(&mut buf).await.unwrap(), 1);
        // After the first bytes, silence is the protocol's business, not the guard's.
        let idle = tokio::time::timeout(Duration::from_millis(300), guarded.read(&mut buf)).await;
        assert!(
            idle.is_err(),
            "the guard timed out a connection that had spoken"
        );
    }

    #[tokio::test]
    async fn a_connection_closes_when_its_certificate_gets_listed() {
        let list = Blocklist::empty();
        let (_client, server) = tokio::io::duplex(64);
        let mut guarded = GuardedStream::new(
            server,
            Duration::from_secs(60),
            Some((list.clone(), "FP".to_string())),
        );
        let mut buf = [0u8; 8];
        let reader = async { guarded.read(&mut buf).await };
        let lister = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            list.replace(BTreeSet::from(["FP".to_string()]));
        };
        let (read, ()) = tokio::join!(reader, lister);
        assert_eq!(
            read.unwrap_err().kind(),
            std::io::ErrorKind::ConnectionAborted
        );
    }
}
