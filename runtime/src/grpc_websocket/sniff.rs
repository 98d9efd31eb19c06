//! Telling native gRPC (HTTP/2) from HTTP/1.1 on a connection that negotiated no ALPN protocol
//! (plaintext behind a service mesh, or a TLS proxy that sends none): by its first bytes, the
//! HTTP/2 client preface or anything else (an HTTP/1.1 request line), which are then replayed
//! to whoever serves the connection ([`Rewind`]).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The HTTP version a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// HTTP/2: native gRPC.
    Http2,
    /// HTTP/1.x: gRPC over WebSocket, or anything else.
    Http1,
}

/// A stream whose first bytes, already read, are read again before the rest.
#[derive(Debug)]
pub struct Rewind<S> {
    prefix: Bytes,
    stream: S,
}

impl<S> Rewind<S> {
    /// `stream` with nothing to replay.
    pub fn new(stream: S) -> Self {
        Rewind {
            prefix: Bytes::new(),
            stream,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }
}

/// Reads the first bytes of `stream` until they tell HTTP/2 from HTTP/1 (at most the preface's
/// 24 bytes), and returns the version with the stream rewound to its start.
pub async fn sniff<S: AsyncRead + Unpin>(mut stream: S) -> io::Result<(Wire, Rewind<S>)> {
    let mut seen = Vec::with_capacity(H2_PREFACE.len());
    let wire = loop {
        if !H2_PREFACE.starts_with(&seen) {
            break Wire::Http1;
        }
        if seen.len() == H2_PREFACE.len() {
            break Wire::Http2;
        }
        let mut chunk = [0u8; 24];
        let want = H2_PREFACE.len() - seen.len();
        let n = stream.read(&mut chunk[..want]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection ended before its first request",
            ));
        }
        seen.extend_from_slice(&chunk[..n]);
    };
    Ok((
        wire,
        Rewind {
            prefix: Bytes::from(seen),
            stream,
        },
    ))
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.has_remaining() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn sniffed(first: &[u8]) -> (Wire, Vec<u8>) {
        let (mut client, server) = tokio::io::duplex(256);
        let bytes = first.to_vec();
        let writer = tokio::spawn(async move {
            // A byte at a time: the sniff must wait for enough of them.
            for b in bytes {
                client.write_all(&[b]).await.unwrap();
            }
            client
        });
        let (wire, mut rewound) = sniff(server).await.unwrap();
        drop(writer.await.unwrap());
        let mut all = Vec::new();
        rewound.read_to_end(&mut all).await.unwrap();
        (wire, all)
    }

    #[tokio::test]
    async fn the_h2_preface_is_http2_and_a_request_line_is_http1_both_replayed_whole() {
        let mut h2 = H2_PREFACE.to_vec();
        h2.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert_eq!(sniffed(&h2).await, (Wire::Http2, h2.clone()));
        let get = b"GET /versionapi.Version/Version HTTP/1.1\r\nHost: p\r\n\r\n".to_vec();
        assert_eq!(sniffed(&get).await, (Wire::Http1, get.clone()));
        // "PRI" followed by something else is no preface.
        let almost = b"PRI * HTTP/1.1\r\n\r\n".to_vec();
        assert_eq!(sniffed(&almost).await, (Wire::Http1, almost.clone()));
    }

    #[tokio::test]
    async fn a_connection_that_ends_before_its_first_bytes_is_an_error() {
        let (client, server) = tokio::io::duplex(16);
        drop(client);
        let err = sniff(server).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
