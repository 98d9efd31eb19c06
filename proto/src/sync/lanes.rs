//! Inbound event processing with per-resource ordering.
//!
//! Every event goes to one of N sequential lanes chosen by hashing its resource key, so events of one
//! resource are handled strictly in arrival order while different resources proceed concurrently (no
//! per-agent serialisation: upstream #1051). After handling, the event is ACKed on the control lane
//! (or ACKed with an error if it was rejected; a retryable failure sends no ACK so the peer resends).

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::event::{Event, EventType};
use crate::peer_input::{Truncated, REFUSED_INPUT};
use crate::sync::handling_metrics::PeerHandling;
use crate::sync::pump::ControlSender;

/// Outcome of a handler that did not succeed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum HandleError {
    /// A transient failure (apiserver unavailable, conflict): no ACK, the peer resends.
    #[error("retryable: {0}")]
    Retryable(String),
    /// The event can never succeed (malformed, refused, unknown type): ACKed with this error.
    #[error("rejected: {0}")]
    Rejected(String),
    /// A well-formed event of a type this end never takes from a peer in its mode (upstream's
    /// "not allowed" / "discarded"): ACKed with this error as a rejection is, but counted apart
    /// from failures ([`super::handling_metrics`]).
    #[error("not allowed: {0}")]
    NotAllowed(String),
}

impl HandleError {
    /// The refusal of `ev` because this end does not take it in the peer's mode: `NotAllowed`
    /// for a known event type and target, `Rejected` for an unknown one (not a mode question).
    pub fn for_mode(ev: &Event, msg: String) -> HandleError {
        let unknown = matches!(
            ev.event_type,
            EventType::Unknown(_) | EventType::HttpMethod(_)
        ) || matches!(ev.target, crate::event::Target::Unknown(_));
        if unknown {
            HandleError::Rejected(msg)
        } else {
            HandleError::NotAllowed(msg)
        }
    }
}

/// Processes one inbound event.
pub trait EventHandler: Send + Sync + 'static {
    /// Handles `event`; the lane ACKs according to the result.
    fn handle(&self, event: Event) -> impl Future<Output = Result<(), HandleError>> + Send;
}

impl<H: EventHandler> EventHandler for Arc<H> {
    fn handle(&self, event: Event) -> impl Future<Output = Result<(), HandleError>> + Send {
        (**self).handle(event)
    }
}

/// A handler that records how each event's handling went and how long it took (the
/// `*_event_processing_time` histograms and `*_errors` counters both ends export, see
/// [`super::handling_metrics`]) and handles it inside an `event.handle` span that continues the
/// sender's trace ([`crate::trace_context`]); otherwise it behaves as the handler it wraps.
pub struct Instrumented<H> {
    inner: H,
    handling: PeerHandling,
    errors: Option<ErrorCounter>,
}

/// Failed events by `reason` (`retryable` or `rejected`: a bounded label, never the peer's text).
pub type ErrorCounter = prometheus_client::metrics::family::Family<
    Vec<(String, String)>,
    prometheus_client::metrics::counter::Counter,
>;

impl<H: EventHandler> Instrumented<H> {
    /// Wraps `inner`; every handled event is observed in `handling`.
    pub fn new(inner: H, handling: PeerHandling) -> Self {
        Self {
            inner,
            handling,
            errors: None,
        }
    }

    /// Also counts every event that fails in `errors`, by kind of failure.
    pub fn counting_errors(mut self, errors: ErrorCounter) -> Self {
        self.errors = Some(errors);
        self
    }
}

impl<H: EventHandler> EventHandler for Instrumented<H> {
    async fn handle(&self, event: Event) -> Result<(), HandleError> {
        use tracing::Instrument;
        let span = crate::trace_context::handling_span(&event);
        let target = event.target.clone();
        let logged = tracing::enabled!(tracing::Level::DEBUG)
            .then(|| (event.event_type.clone(), event.event_id.clone()));
        let started = std::time::Instant::now();
        let result = self.inner.handle(event).instrument(span).await;
        let took = started.elapsed();
        self.handling.observe(&target, &result, took);
        if let Some((event_type, event_id)) = logged {
            tracing::debug!(event_type = %Truncated(event_type.name()), event_id = %Truncated(&event_id),
                took_ms = took.as_secs_f64() * 1e3, ok = result.is_ok(), "event handled");
        }
        if let (Err(e), Some(errors)) = (&result, &self.errors) {
            let reason = match e {
                HandleError::Retryable(_) => "retryable",
                HandleError::Rejected(_) | HandleError::NotAllowed(_) => "rejected",
            };
            errors
                .get_or_create(&vec![("reason".to_string(), reason.to_string())])
                .inc();
        }
        result
    }
}

/// Buckets of an event processing-time histogram: 1 ms .. ~16 s.
pub fn processing_time_histogram() -> prometheus_client::metrics::histogram::Histogram {
    prometheus_client::metrics::histogram::Histogram::new(
        prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 15),
    )
}

/// Logs a rejected event: peer-chosen text truncated, at WARN only within [`REFUSED_INPUT`]'s
/// budget (the rest at DEBUG, counted in the next WARN line).
fn log_rejected(ev: &Event, msg: &str) {
    let (event_type, target) = (
        Truncated(ev.event_type.name()),
        Truncated(ev.target.as_str()),
    );
    let subject = Truncated(ev.subject.as_deref().unwrap_or(""));
    match REFUSED_INPUT.admit() {
        Some(suppressed) => tracing::warn!(%event_type, %target, %subject, error = %Truncated(msg),
            suppressed, "event rejected (suppressed: similar lines not logged at WARN since the last one)"),
        None => {
            tracing::debug!(%event_type, %target, %subject, error = %Truncated(msg), "event rejected")
        }
    }
}

/// Starts one lane's worker in the given set and returns its sender.
type LaneStarter = Box<dyn Fn(&mut JoinSet<()>) -> mpsc::Sender<Box<Event>> + Send + Sync>;

/// The lanes of one live stream. A lane's worker (its channel and task) starts on the first event
/// for it, so an idle stream costs no lane memory (this matters with thousands of idle agents).
/// A started lane stays small while idle: its channel holds boxed events (a channel allocates a
/// block of 32 slots up front, 32 pointers instead of 32 events) and its task boxes each
/// handler future while the event is handled instead of reserving room for the largest one.
pub struct Lanes {
    senders: Vec<std::sync::OnceLock<mpsc::Sender<Box<Event>>>>,
    start_lane: LaneStarter,
    tasks: std::sync::Mutex<JoinSet<()>>,
}

/// Key that decides the lane: events with the same key are processed in order.
pub fn ordering_key(ev: &Event) -> &str {
    if !ev.resource_id.is_empty() {
        &ev.resource_id
    } else if let Some(s) = ev.subject.as_deref() {
        s
    } else {
        &ev.event_id
    }
}

impl Lanes {
    /// Starts `lanes` sequential workers, each buffering up to `depth` events.
    pub fn start<H: EventHandler>(
        handler: Arc<H>,
        lanes: usize,
        depth: usize,
        control: ControlSender,
    ) -> Lanes {
        let start_lane: LaneStarter = Box::new(move |tasks: &mut JoinSet<()>| {
            let (tx, mut rx) = mpsc::channel::<Box<Event>>(depth.max(1));
            let handler = handler.clone();
            let control = control.clone();
            tasks.spawn(async move {
                    while let Some(ev) = rx.recv().await {
                        let handled = Box::pin(handler.handle((*ev).clone())).await;
                        let reply = match handled {
                            Ok(()) => Some(ev.ack()),
                            Err(HandleError::Rejected(msg) | HandleError::NotAllowed(msg)) => {
                                log_rejected(&ev, &msg);
                                Some(ev.ack_with_error(msg))
                            }
                            Err(HandleError::Retryable(msg)) => {
                                tracing::info!(event_type = %Truncated(ev.event_type.name()), error = %Truncated(&msg),
                                    "event processing failed transiently; waiting for the peer to resend");
                                None
                            }
                        };
                        let needs_ack = !matches!(ev.event_type, EventType::Ping | EventType::Pong | EventType::Processed);
                        if let (Some(ack), true) = (reply, needs_ack) {
                            if control.send(Box::new(ack)).await.is_err() {
                                break;
                            }
                        }
                    }
                });
            tx
        });
        Lanes {
            senders: (0..lanes.max(1))
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            start_lane,
            tasks: std::sync::Mutex::new(JoinSet::new()),
        }
    }

    /// The sender of the lane `ev` belongs to (the lane starts on its first event).
    fn lane(&self, ev: &Event) -> &mpsc::Sender<Box<Event>> {
        let mut h = DefaultHasher::new();
        ordering_key(ev).hash(&mut h);
        let lane = &self.senders[(h.finish() % self.senders.len() as u64) as usize];
        match lane.get() {
            Some(tx) => tx,
            None => {
                let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
                lane.get_or_init(|| (self.start_lane)(&mut tasks))
            }
        }
    }

    /// Hands `ev` to its lane, waiting for room (backpressure on the stream reader).
    pub async fn dispatch(&self, ev: Event) -> Result<(), Event> {
        self.lane(&ev).send(Box::new(ev)).await.map_err(|e| *e.0)
    }

    /// Hands `ev` to its lane if it has room now; else gives it back (boxed, as lanes queue it),
    /// with whether the lane is full (then [`dispatch`](Self::dispatch) waits for room) or gone.
    pub fn try_dispatch(&self, ev: Event) -> Result<(), mpsc::error::TrySendError<Box<Event>>> {
        self.lane(&ev).try_send(Box::new(ev))
    }

    /// Stops accepting events and waits for the lanes to finish what they hold.
    pub async fn drain(mut self) {
        self.senders.clear();
        let mut tasks = std::mem::take(self.tasks.get_mut().unwrap_or_else(|e| e.into_inner()));
        while tasks.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Target;
    use std::sync::Mutex;
    use std::time::Duration;

    struct Recorder {
        seen: Mutex<Vec<String>>,
    }

    impl EventHandler for Recorder {
        async fn handle(&self, event: Event) -> Result<(), HandleError> {
            if event.resource_id == "slow" {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            self.seen.lock().unwrap().push(event.event_id.clone());
            match event.event_type {
                EventType::Unknown(_) => Err(HandleError::Rejected("unknown event type".into())),
                EventType::Error => Err(HandleError::Retryable("try later".into())),
                _ => Ok(()),
            }
        }
    }

    fn ev(t: EventType, key: &str, id: &str) -> Event {
        Event::new(t, Target::Application, "t").with_ids(key, id)
    }

    #[test]
    fn a_known_event_refused_for_the_peers_mode_is_not_allowed_an_unknown_one_rejected() {
        let refuse = |t: EventType, target: Target| {
            HandleError::for_mode(&Event::new(t, target, "t"), "no".into())
        };
        assert_eq!(
            refuse(EventType::Create, Target::Application),
            HandleError::NotAllowed("no".into())
        );
        assert_eq!(
            refuse(EventType::Unknown("x".into()), Target::Application),
            HandleError::Rejected("no".into())
        );
        assert_eq!(
            refuse(EventType::Create, Target::Unknown("x".into())),
            HandleError::Rejected("no".into())
        );
    }

    #[tokio::test]
    async fn instrumented_counts_failures_by_kind_never_by_the_peers_text() {
        let errors = ErrorCounter::default();
        let handler = Instrumented::new(
            Recorder {
                seen: Mutex::new(Vec::new()),
            },
            crate::sync::handling_metrics::HandlingMetrics::principal().for_peer("agent_name", "a"),
        )
        .counting_errors(errors.clone());
        let count = |reason: &str| {
            errors
                .get_or_create(&vec![("reason".to_string(), reason.to_string())])
                .get()
        };
        handler
            .handle(ev(EventType::Create, "a", "1"))
            .await
            .unwrap();
        assert_eq!((count("rejected"), count("retryable")), (0, 0));
        for i in 0..3 {
            let unknown = EventType::Unknown(format!("made-up-{i}"));
            assert!(handler.handle(ev(unknown, "a", "2")).await.is_err());
        }
        assert!(handler
            .handle(ev(EventType::Error, "a", "3"))
            .await
            .is_err());
        assert_eq!((count("rejected"), count("retryable")), (3, 1));
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("errors", "", errors.clone());
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains("made-up"), "{text}");
    }

    #[tokio::test]
    async fn one_resource_in_order_others_not_blocked_and_acks_follow_results() {
        let rec = Arc::new(Recorder {
            seen: Mutex::new(Vec::new()),
        });
        let (ctl_tx, mut ctl_rx) = mpsc::channel(16);
        let lanes = Lanes::start(rec.clone(), 4, 8, ctl_tx);
        lanes
            .dispatch(ev(EventType::Create, "slow", "s1"))
            .await
            .unwrap();
        lanes
            .dispatch(ev(EventType::SpecUpdate, "slow", "s2"))
            .await
            .unwrap();
        // Find a key on another lane than "slow".
        let other = (0..100)
            .map(|i| format!("k{i}"))
            .find(|k| {
                let lane = |s: &str| {
                    let mut h = DefaultHasher::new();
                    s.hash(&mut h);
                    h.finish() % 4
                };
                lane(k) != lane("slow")
            })
            .unwrap();
        lanes
            .dispatch(ev(EventType::Unknown("x".into()), &other, "o1"))
            .await
            .unwrap();
        lanes
            .dispatch(ev(EventType::Error, &other, "o2"))
            .await
            .unwrap();
        let first = tokio::time::timeout(Duration::from_secs(5), ctl_rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            first.event_id, "o1",
            "a fast resource is not stuck behind a slow one"
        );
        assert_eq!(first.ack_error(), Some("unknown event type"));
        lanes.drain().await;
        let mut acks = Vec::new();
        while let Ok(a) = ctl_rx.try_recv() {
            acks.push(a.event_id);
        }
        assert_eq!(
            acks,
            ["s1", "s2"],
            "retryable failure (o2) is not ACKed; slow resource ACKed in order"
        );
        let seen = rec.seen.lock().unwrap().clone();
        let s1 = seen.iter().position(|s| s == "s1").unwrap();
        let s2 = seen.iter().position(|s| s == "s2").unwrap();
        assert!(s1 < s2);
    }
}
