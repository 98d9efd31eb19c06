//! Accepting connections: the one accept loop behind every listener of our processes (the
//! principal's gRPC listener, resource proxy and Redis proxy; the ops server of every binary).
//!
//! Owns: taking connections off a bound [`TcpListener`] until shutdown, an accept error (out of
//! file descriptors, say) logged and retried after [`ACCEPT_RETRY_DELAY`] instead of ending the
//! listener, and each connection served in a task of its own, so that no connection holds up
//! another or the loop ([`serve_connections`]); for TLS listeners, the server side of the
//! handshake run first in that task under a deadline, its failure told apart from its timeout
//! ([`serve_tls_connections`], [`HandshakeFailure`]). Who the peer is, what its connection is then
//! used for, and what is counted about it are the caller's.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

use crate::tls::ReloadingServerConfig;

/// Pause after a failed accept before the next one (the failure is usually a resource limit that a
/// tight retry loop would only make worse).
pub const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);

/// Accepts connections on `listener` until `shutdown` resolves, running `serve(connection, peer)`
/// for each in a task of its own. `listener_name` names the listener in the accept failure log.
pub async fn serve_connections<F, Fut>(
    listener: TcpListener,
    listener_name: &'static str,
    shutdown: impl Future<Output = ()>,
    mut serve: F,
) where
    F: FnMut(TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => return,
        };
        match accepted {
            Ok((tcp, remote)) => {
                tokio::spawn(serve(tcp, remote));
            }
            Err(e) => {
                tracing::warn!(listener = listener_name, error = %e, "accepting a connection failed");
                tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
            }
        }
    }
}

/// Why a TLS handshake did not produce a connection.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeFailure {
    /// The handshake failed (no or untrusted client certificate, protocol version, ALPN, ...).
    #[error("{0}")]
    Failed(std::io::Error),
    /// The handshake did not finish within the deadline.
    #[error("TLS handshake not completed within {0:?}")]
    TimedOut(Duration),
}

/// [`serve_connections`] for a TLS listener: each connection (without Nagle's delay) first
/// completes the handshake with
/// the config `tls` holds at that moment, within `handshake_timeout`, and `serve` gets the
/// outcome (a failed handshake included, so the caller can count and log it) and the peer.
pub async fn serve_tls_connections<F, Fut>(
    listener: TcpListener,
    listener_name: &'static str,
    tls: ReloadingServerConfig,
    handshake_timeout: Duration,
    shutdown: impl Future<Output = ()>,
    serve: F,
) where
    F: Fn(Result<TlsStream<TcpStream>, HandshakeFailure>, SocketAddr) -> Fut
        + Send
        + Sync
        + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    serve_connections(listener, listener_name, shutdown, move |tcp, remote| {
        // Request/response traffic: no Nagle delay on small writes.
        let _ = tcp.set_nodelay(true);
        let acceptor = tls.acceptor();
        let serve = serve.clone();
        async move {
            let handshake =
                match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => Ok(stream),
                    Ok(Err(e)) => Err(HandshakeFailure::Failed(e)),
                    Err(_) => Err(HandshakeFailure::TimedOut(handshake_timeout)),
                };
            serve(handshake, remote).await;
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::tests::Pki;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    /// A TLS listener that reports each handshake outcome (`Ok` = the client's certificate CN).
    async fn reporting_listener(
        pki: &Pki,
        timeout: Duration,
    ) -> (SocketAddr, mpsc::UnboundedReceiver<Result<(), String>>) {
        let tls = ReloadingServerConfig::load(pki.server_options()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(serve_tls_connections(
            listener,
            "test",
            tls,
            timeout,
            std::future::pending(),
            move |handshake, _| {
                let tx = tx.clone();
                async move {
                    let outcome = match handshake {
                        Ok(mut stream) => {
                            let _ = stream.write_all(b"hi").await;
                            let _ = stream.flush().await;
                            Ok(())
                        }
                        Err(e) => Err(e.to_string()),
                    };
                    let _ = tx.send(outcome);
                }
            },
        ));
        (addr, rx)
    }

    #[tokio::test]
    async fn each_connection_gets_its_handshake_outcome_and_a_stalled_one_holds_up_no_other() {
        let pki = Pki::new();
        let (addr, mut outcomes) = reporting_listener(&pki, Duration::from_millis(500)).await;
        // A client that connects and never says hello.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let connector = tokio_rustls::TlsConnector::from(pki.client());
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        let mut buf = [0u8; 2];
        tls.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hi");
        assert_eq!(
            outcomes.recv().await,
            Some(Ok(())),
            "served before the stall ends"
        );
        let stalled = outcomes.recv().await.unwrap().unwrap_err();
        assert_eq!(stalled, "TLS handshake not completed within 500ms");
    }

    #[tokio::test]
    async fn a_failed_handshake_is_reported_as_such() {
        let pki = Pki::new();
        let (addr, mut outcomes) = reporting_listener(&pki, Duration::from_secs(10)).await;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let err = outcomes.recv().await.unwrap().unwrap_err();
        assert!(!err.contains("not completed within"), "{err}");
    }

    #[tokio::test]
    async fn the_loop_ends_at_shutdown() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_connections(
            listener,
            "test",
            async {
                let _ = stopped.await;
            },
            |_, _| async {},
        ));
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the loop ended")
            .unwrap();
    }
}
