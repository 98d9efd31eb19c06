//! Drives one live event stream in both directions.
//!
//! Sending: the control lane (ACKs, heartbeats, request replies that must not wait) always goes
//! first; then the [`Outbox`] (resends and new events). Receiving: ACKs settle the outbox at once,
//! everything else goes to the [`Lanes`]; while a full lane keeps the reader waiting, the outbox
//! is told ([`Outbox::reading_stalled`]): the ACKs behind are unread, not late. The stream ends when the peer closes it, on an error, or
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

/// Hands `ev` to its lane; while the lane has no room, the outbox knows the reader is stalled.
async fn dispatch(lanes: &Lanes, outbox: &Outbox, ev: Event) -> Result<(), Event> {
    use tokio::sync::mpsc::error::TrySendError;
    let ev = match lanes.try_dispatch(ev) {
        Ok(()) => return Ok(()),
        Err(TrySendError::Closed(ev)) => return Err(*ev),
        Err(TrySendError::Full(ev)) => *ev,
    };
    outbox.reading_stalled(std::time::Instant::now());
    let handed = lanes.dispatch(ev).await;
    outbox.reading_resumed(std::time::Instant::now());
    handed
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
            // Per-event timing at DEBUG: with the peer's "received" line and the handler's
            // "handled" line it gives each event's timeline across both processes.
            let logged = tracing::enabled!(tracing::Level::DEBUG)
                .then(|| (ev.event_type.clone(), ev.event_id.clone()));
            if outbound.send(ev.into_stream_event()).await.is_err() {
                return StreamEnd::Shutdown;
            }
            if let Some((event_type, event_id)) = logged {
                tracing::debug!(event_type = %Truncated(event_type.name()), event_id = %Truncated(&event_id), "event sent");
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
                        tracing::debug!(event_type = %Truncated(ev.event_type.name()), event_id = %Truncated(&ev.event_id), "event received");
                        on_event(&ev);
                        if ev.is_ack() {
                            if let Some(err) = ev.ack_error() {
                                if let Some(suppressed) = REFUSED_INPUT.admit() {
                                    tracing::warn!(event_id = %Truncated(&ev.event_id), error = %Truncated(err), suppressed, "peer rejected an event");
                                }
                            }
                            outbox.ack(&ev);
                        } else if dispatch(lanes, outbox, ev).await.is_err() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EventType, Target};
    use crate::sync::lanes::{EventHandler, HandleError};
    use crate::sync::outbox::OutboxConfig;
    use std::sync::Arc;
    use std::time::Duration;

    /// Takes 20 ms per event, as a lane answering resync requests with an apiserver read does.
    struct Slow;

    impl EventHandler for Slow {
        async fn handle(&self, _event: Event) -> Result<(), HandleError> {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(())
        }
    }

    #[tokio::test]
    async fn an_ack_queued_behind_requests_our_lanes_are_slow_to_take_is_not_resent_for() {
        let resends = prometheus_client::metrics::counter::Counter::<u64>::default();
        let outbox = Outbox::new(OutboxConfig {
            resend_initial: Duration::from_millis(100),
            resends: resends.clone(),
            ..OutboxConfig::default()
        });
        outbox
            .push(
                Event::new(EventType::Create, Target::Application, "t")
                    .with_ids("mine", "m1")
                    .with_json(&"x")
                    .unwrap(),
            )
            .unwrap();
        let (ctl_tx, mut ctl_rx) = mpsc::channel(64);
        let lanes = Lanes::start(Arc::new(Slow), 1, 1, ctl_tx);
        let (peer_tx, inbound) = futures::channel::mpsc::unbounded();
        let (out_tx, mut out_rx) = mpsc::channel(64);
        let outbox_ref = &outbox;
        let peer = async move {
            let mine = Event::try_from_stream_event(out_rx.recv().await.unwrap()).unwrap();
            // 30 requests (600 ms of lane work, 6 resend delays) ahead of the ACK of ours.
            for i in 0..30 {
                let req = Event::new(EventType::RequestUpdate, Target::Application, "p")
                    .with_ids(format!("r{i}"), format!("p{i}"))
                    .with_json(&"x")
                    .unwrap();
                peer_tx.unbounded_send(Ok(req.into_stream_event())).unwrap();
            }
            peer_tx
                .unbounded_send(Ok(mine.ack().into_stream_event()))
                .unwrap();
            while !outbox_ref.is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // Whatever else we sent meanwhile: resends of ours.
            let mut again = 0;
            while let Ok(ev) = out_rx.try_recv() {
                again += usize::from(Event::try_from_stream_event(ev).unwrap().event_id == "m1");
            }
            drop(peer_tx);
            again
        };
        let (end, again) = tokio::join!(
            tokio::time::timeout(
                Duration::from_secs(10),
                run_stream(
                    inbound,
                    out_tx,
                    &outbox,
                    &mut ctl_rx,
                    &lanes,
                    std::future::pending(),
                    |_| {}
                )
            ),
            peer
        );
        assert!(matches!(end, Ok(StreamEnd::PeerClosed)), "{end:?}");
        assert_eq!(
            (again, resends.get()),
            (0, 0),
            "resent while the ACK sat unread"
        );
    }
}
