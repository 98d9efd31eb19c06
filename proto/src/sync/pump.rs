//! Drives one live event stream in both directions.
//!
//! Sending: the control lane (ACKs, heartbeats, request replies that must not wait) always goes
//! first; then the [`Outbox`] (resends and new events). Receiving: ACKs settle the outbox at once,
//! everything else goes to the [`Lanes`]. The stream ends when the peer closes it, on an error, or
//! on shutdown; the outbox keeps everything that was not ACKed for the next stream.

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;

use crate::event::Event;
use crate::pb::eventstreamapi::Event as WireEvent;
use crate::peer_input::{Truncated, REFUSED_INPUT};
use crate::sync::lanes::Lanes;
use crate::sync::outbox::Outbox;

/// Sender side of the control lane. Events are boxed: a channel allocates a block of 32 slots up
/// front, and every idle stream keeps one (32 pointers instead of 32 events).
pub type ControlSender = mpsc::Sender<Box<Event>>;

/// Why a stream ended.
#[derive(Debug, Clone)]
pub enum StreamEnd {
    /// The peer closed its sending side cleanly.
    PeerClosed,
    /// The transport failed or the peer sent something the transport refuses (e.g. too large).
    Error(tonic::Status),
    /// Our side shut down, or our outbound channel was closed.
    Shutdown,
}

/// Runs the stream until it ends. `inbound` is the peer's events, `outbound` feeds our side of the
/// stream. `on_event` is called for every decoded inbound event before dispatch (metrics, logging).
pub async fn run_stream<S, F>(
    inbound: S,
    outbound: mpsc::Sender<WireEvent>,
    outbox: &Outbox,
    control_rx: &mut mpsc::Receiver<Box<Event>>,
    lanes: &Lanes,
    shutdown: impl std::future::Future<Output = ()>,
    mut on_event: F,
) -> StreamEnd
where
    S: Stream<Item = Result<WireEvent, tonic::Status>> + Unpin,
    F: FnMut(&Event),
{
    outbox.set_connected(true);
    let send = async {
        loop {
            let ev = tokio::select! {
                biased;
                ctl = control_rx.recv() => match ctl {
                    Some(ev) => *ev,
                    None => return StreamEnd::Shutdown,
                },
                ev = outbox.next() => ev,
            };
            if outbound.send(ev.into_stream_event()).await.is_err() {
                return StreamEnd::Shutdown;
            }
        }
    };
    let recv = async {
        let mut inbound = inbound;
        loop {
            match inbound.next().await {
                None => return StreamEnd::PeerClosed,
                Some(Err(status)) => return StreamEnd::Error(status),
                Some(Ok(wire)) => match Event::try_from_stream_event(wire) {
                    Ok(ev) => {
                        on_event(&ev);
                        if ev.is_ack() {
                            if let Some(err) = ev.ack_error() {
                                if let Some(suppressed) = REFUSED_INPUT.admit() {
                                    tracing::warn!(event_id = %Truncated(&ev.event_id), error = %Truncated(err), suppressed, "peer rejected an event");
                                }
                            }
                            outbox.ack(&ev);
                        } else if lanes.dispatch(ev).await.is_err() {
                            return StreamEnd::Shutdown;
                        }
                    }
                    Err(e) => {
                        // Without a decodable envelope there is nothing to ACK; the stream survives.
                        match REFUSED_INPUT.admit() {
                            Some(suppressed) => {
                                tracing::warn!(error = %Truncated(&e.to_string()), suppressed, "dropping malformed event from peer")
                            }
                            None => {
                                tracing::debug!(error = %Truncated(&e.to_string()), "dropping malformed event from peer")
                            }
                        }
                    }
                },
            }
        }
    };
    let end = tokio::select! {
        e = send => e,
        e = recv => e,
        _ = shutdown => StreamEnd::Shutdown,
    };
    outbox.set_connected(false);
    end
}
