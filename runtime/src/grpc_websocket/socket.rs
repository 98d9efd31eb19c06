//! One call's WebSocket as two bounded channels of whole binary messages, with the connection's
//! liveness, for both ends ([`super::server`], [`super::client`]).
//!
//! Owns: a reader task that hands each binary message on only when the previous one was taken
//! (so a peer that sends faster than its call consumes waits in TCP, and at most one message per
//! direction is held here), answers pings (tungstenite queues the pong), and reports a text
//! message, an oversized one (closing with 1009) or a close with an error code as the call's
//! error; a writer task that sends what the call queues, then a normal close when the call drops
//! its sender; and, with a [`Keepalive`], a ping every interval from the writer and the link given
//! up when nothing at all is heard from the peer for the interval plus the timeout while the
//! reader is reading (time the reader waits on its own consumer does not count: that is
//! backpressure, not silence). After either side's close the connection is dropped within
//! [`CLOSE_WAIT`]. Also what both ends do with the gRPC body they send: queue its messages as
//! they are cut from it ([`queue_messages`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use super::frame::{FrameError, MessageSplitter};

/// Longest wait for the peer's part of a close (its answer to ours, or the end of the connection
/// after its own), and for a last error to be taken by the call.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Pings on an idle link: one every `interval`; the link is dead when nothing arrives from the
/// peer for `interval + timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Time between pings.
    pub interval: Duration,
    /// How long past the next ping's answer is waited for.
    pub timeout: Duration,
}

/// What the call queues for the peer.
#[derive(Debug)]
pub enum Outgoing {
    /// A binary message (one frame, [`super::frame`]).
    Message(Bytes),
    /// A close with this code and reason, after which nothing more is sent.
    Close(CloseCode, String),
}

/// Why the call's WebSocket failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SocketError {
    /// The connection failed (I/O, WebSocket protocol, a message over the limit).
    #[error("the WebSocket failed: {0}")]
    Transport(String),
    /// A text message: gRPC over WebSocket sends binary messages only.
    #[error("the peer sent a text WebSocket message (gRPC over WebSocket sends binary ones only)")]
    Text,
    /// The peer closed with an error code.
    #[error("the peer closed the WebSocket with code {code}: {reason}")]
    ClosedWith {
        /// The close code.
        code: u16,
        /// Its reason text.
        reason: String,
    },
    /// Nothing from the peer for the keepalive's interval plus timeout.
    #[error("nothing heard from the peer for {0:?} (keepalive): the link is dead")]
    Silent(Duration),
}

/// Both directions of one call's WebSocket.
pub struct CallSocket {
    /// The peer's binary messages, in order; an error is the last item. The channel ends when the
    /// connection does.
    pub incoming: mpsc::Receiver<Result<Bytes, SocketError>>,
    /// What to send; dropping every sender closes the WebSocket normally.
    pub outgoing: mpsc::Sender<Outgoing>,
    /// Cancelled when the connection is over (either side closed or it failed).
    pub ended: CancellationToken,
}

/// A close frame with `reason` cut to what a close frame holds (123 bytes, on a char boundary).
pub fn close_frame(code: CloseCode, reason: &str) -> Message {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    Message::Close(Some(CloseFrame {
        code,
        reason: reason[..end].to_string().into(),
    }))
}

impl CallSocket {
    /// Runs `ws` in two tasks, pinging per `keepalive` (`None`: no pings, no silence limit).
    pub fn spawn<S>(ws: WebSocketStream<S>, keepalive: Option<Keepalive>) -> CallSocket
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sink, stream) = ws.split();
        let (in_tx, in_rx) = mpsc::channel(1);
        let (out_tx, out_rx) = mpsc::channel(1);
        let ended = CancellationToken::new();
        // The close the reader wants sent when it gives up (over-size message, text, silence).
        let close: Arc<Mutex<Option<Message>>> = Arc::default();
        // Set once this side sent its close: the peer then has CLOSE_WAIT to finish.
        let closed_by_us = CancellationToken::new();
        tokio::spawn(write(
            sink,
            out_rx,
            keepalive,
            ended.clone(),
            close.clone(),
            closed_by_us.clone(),
        ));
        tokio::spawn(read(
            stream,
            in_tx,
            keepalive,
            ended.clone(),
            close,
            closed_by_us,
        ));
        CallSocket {
            incoming: in_rx,
            outgoing: out_tx,
            ended,
        }
    }
}

type Sink<S> = futures::stream::SplitSink<WebSocketStream<S>, Message>;
type Source<S> = futures::stream::SplitStream<WebSocketStream<S>>;

async fn write<S: AsyncRead + AsyncWrite + Unpin>(
    mut sink: Sink<S>,
    mut queue: mpsc::Receiver<Outgoing>,
    keepalive: Option<Keepalive>,
    ended: CancellationToken,
    close: Arc<Mutex<Option<Message>>>,
    closed_by_us: CancellationToken,
) {
    let mut ping = keepalive.map(|k| {
        let mut t = tokio::time::interval_at(Instant::now() + k.interval, k.interval);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    // Sends `message` unless the connection ends first; false when it did or the send failed.
    async fn send<S: AsyncRead + AsyncWrite + Unpin>(
        sink: &mut Sink<S>,
        message: Message,
        ended: &CancellationToken,
    ) -> bool {
        tokio::select! {
            sent = sink.send(message) => sent.is_ok(),
            () = ended.cancelled() => false,
        }
    }
    let last = loop {
        tokio::select! {
            biased;
            () = ended.cancelled() => {
                let pending = close.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(frame) = pending {
                    let _ = tokio::time::timeout(CLOSE_WAIT, sink.send(frame)).await;
                }
                return;
            }
            next = queue.recv() => match next {
                Some(Outgoing::Message(bytes)) => {
                    if !send(&mut sink, Message::Binary(bytes), &ended).await {
                        ended.cancel();
                        return;
                    }
                }
                Some(Outgoing::Close(code, reason)) => break close_frame(code, &reason),
                None => break close_frame(CloseCode::Normal, ""),
            },
            _ = async { ping.as_mut().expect("guarded").tick().await }, if ping.is_some() => {
                if !send(&mut sink, Message::Ping(Bytes::new()), &ended).await {
                    ended.cancel();
                    return;
                }
            }
        }
    };
    closed_by_us.cancel();
    if !send(&mut sink, last, &ended).await {
        ended.cancel();
    }
}

async fn read<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: Source<S>,
    consumer: mpsc::Sender<Result<Bytes, SocketError>>,
    keepalive: Option<Keepalive>,
    ended: CancellationToken,
    close: Arc<Mutex<Option<Message>>>,
    closed_by_us: CancellationToken,
) {
    let silence = keepalive.map(|k| k.interval + k.timeout);
    let mut consumer = Some(consumer);
    // Once either side closed, the peer has CLOSE_WAIT to finish.
    let mut closing_since: Option<Instant> = None;
    let give_up = |error: SocketError, frame: Option<Message>| {
        if let Some(frame) = frame {
            *close.lock().unwrap_or_else(|p| p.into_inner()) = Some(frame);
        }
        ended.cancel();
        error
    };
    let failure = loop {
        if closing_since.is_none() && closed_by_us.is_cancelled() {
            closing_since = Some(Instant::now());
        }
        let wake_at = match closing_since {
            Some(since) => Some(since + CLOSE_WAIT),
            None => silence.map(|s| Instant::now() + s),
        };
        let next = tokio::select! {
            biased;
            () = ended.cancelled() => break None,
            next = stream.next() => next,
            () = sleep_until(wake_at) => match (closing_since, silence) {
                (None, Some(s)) => break Some(give_up(
                    SocketError::Silent(s),
                    Some(close_frame(CloseCode::Away, "keepalive: the peer went silent")),
                )),
                // The close wait is over (or, without keepalive, never armed).
                _ => break None,
            },
            () = closed_by_us.cancelled(), if closing_since.is_none() => continue,
        };
        match next {
            None => break None,
            Some(Err(e)) => {
                let frame = match &e {
                    WsError::Capacity(c) => Some(close_frame(CloseCode::Size, &c.to_string())),
                    WsError::Protocol(p) => Some(close_frame(CloseCode::Protocol, &p.to_string())),
                    _ => None,
                };
                break Some(give_up(SocketError::Transport(e.to_string()), frame));
            }
            Some(Ok(Message::Binary(bytes))) => {
                if let Some(tx) = &consumer {
                    if tx.send(Ok(bytes)).await.is_err() {
                        // The call took what it needed; control frames are still answered.
                        consumer = None;
                    }
                }
            }
            Some(Ok(Message::Text(_))) => {
                break Some(give_up(
                    SocketError::Text,
                    Some(close_frame(
                        CloseCode::Unsupported,
                        "gRPC over WebSocket is binary",
                    )),
                ));
            }
            Some(Ok(Message::Close(frame))) => {
                closing_since.get_or_insert_with(Instant::now);
                if let Some(f) =
                    frame.filter(|f| !matches!(f.code, CloseCode::Normal | CloseCode::Away))
                {
                    if let Some(tx) = consumer.take() {
                        let error = SocketError::ClosedWith {
                            code: f.code.into(),
                            reason: f.reason.to_string(),
                        };
                        let _ = tokio::time::timeout(CLOSE_WAIT, tx.send(Err(error))).await;
                    }
                }
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
        }
    };
    if let (Some(error), Some(tx)) = (failure, consumer) {
        let _ = tokio::time::timeout(CLOSE_WAIT, tx.send(Err(error))).await;
    }
    ended.cancel();
}

/// Adds `chunk` of a gRPC body to `splitter` and queues every whole message it then holds on
/// `out`, one WebSocket message each (what both ends do with the body they send): `None` when the
/// WebSocket is gone, `Some(Err)` when the body does not cut into messages.
pub async fn queue_messages(
    splitter: &mut MessageSplitter,
    chunk: Bytes,
    out: &mpsc::Sender<Outgoing>,
) -> Option<Result<(), FrameError>> {
    splitter.push(chunk);
    loop {
        match splitter.next_message() {
            Ok(Some(message)) => out.send(Outgoing::Message(message)).await.ok()?,
            Ok(None) => return Some(Ok(())),
            Err(e) => return Some(Err(e)),
        }
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
