//! Outbound events of one peer connection, kept across disconnects.
//!
//! Coalescing (per `resourceid`): a later `spec-update` or `status-update` replaces a queued one of
//! the same type; a `delete` supersedes everything queued for that resource; `create`,
//! `set-operation`, `terminate-operation` and requests are never coalesced away. The number of
//! entries is therefore bounded by the number of distinct resources, not by the event rate.
//!
//! Delivery: at most one event per resource is in flight (sent, not yet ACKed), which keeps events
//! of one resource in order at the receiver. An in-flight event is resent with exponential backoff
//! until its ACK arrives; after a reconnect everything in flight is resent at once.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::event::{Event, EventType, ExtensionValue};

/// Our extension carrying a unique id per queued event. ACKs copy every extension (upstream's Go
/// peers too), so an ACK names exactly the delivery it confirms even when two events of one
/// resource share an `eventid` (e.g. a spec-update and a set-operation from the same update): a
/// late duplicate ACK can then never confirm the wrong event.
pub const DELIVERY_ID: &str = "deliveryid";

fn delivery_id(ev: &Event) -> Option<&str> {
    ev.extensions
        .get(DELIVERY_ID)
        .and_then(ExtensionValue::as_str)
}

/// Tuning of an [`Outbox`].
#[derive(Debug, Clone)]
pub struct OutboxConfig {
    /// First resend delay of an un-ACKed event.
    pub resend_initial: Duration,
    /// Upper bound of the resend delay.
    pub resend_max: Duration,
    /// Maximum number of distinct resources with queued or in-flight events.
    pub max_resources: usize,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            resend_initial: Duration::from_secs(2),
            resend_max: Duration::from_secs(60),
            max_resources: 100_000,
        }
    }
}

/// Why an event could not be queued.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OutboxError {
    /// The bound on distinct resources is reached; the event was not queued.
    #[error(
        "outbox full: {0} distinct resources are pending; raise the limit or reconnect the peer"
    )]
    Full(usize),
}

#[derive(Debug)]
struct InFlight {
    event: Event,
    attempts: u32,
    next_send: Instant,
}

#[derive(Debug, Default)]
struct ResourceQueue {
    pending: VecDeque<Event>,
    in_flight: Option<InFlight>,
}

#[derive(Debug, Default)]
struct State {
    resources: HashMap<String, ResourceQueue>,
    /// Resources with pending events and nothing in flight, in the order they became ready.
    ready: VecDeque<String>,
    connected: bool,
}

/// Outbound event store for one peer.
#[derive(Debug)]
pub struct Outbox {
    config: OutboxConfig,
    state: Mutex<State>,
    changed: Notify,
}

fn key_of(ev: &Event) -> String {
    if ev.resource_id.is_empty() {
        ev.event_id.clone()
    } else {
        ev.resource_id.clone()
    }
}

impl Outbox {
    /// An empty outbox.
    pub fn new(config: OutboxConfig) -> Outbox {
        Outbox {
            config,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues an event, coalescing it with what is already queued for the same resource.
    pub fn push(&self, mut event: Event) -> Result<(), OutboxError> {
        event.extensions.insert(
            DELIVERY_ID.to_string(),
            ExtensionValue::String(uuid::Uuid::new_v4().to_string()),
        );
        let key = key_of(&event);
        let mut st = self.lock();
        if !st.resources.contains_key(&key) && st.resources.len() >= self.config.max_resources {
            return Err(OutboxError::Full(st.resources.len()));
        }
        let q = st.resources.entry(key.clone()).or_default();
        match &event.event_type {
            EventType::Delete => q.pending.clear(),
            t @ (EventType::SpecUpdate | EventType::StatusUpdate) => {
                q.pending.retain(|e| &e.event_type != t)
            }
            _ => {}
        }
        q.pending.push_back(event);
        let becomes_ready = q.in_flight.is_none() && q.pending.len() == 1;
        if becomes_ready && !st.ready.contains(&key) {
            st.ready.push_back(key);
        }
        drop(st);
        self.changed.notify_one();
        Ok(())
    }

    /// Takes the next event to send: a due resend first, else the oldest ready resource's next
    /// event (which then counts as in flight). `None` if nothing is due now.
    pub fn take_next(&self, now: Instant) -> Option<Event> {
        let mut st = self.lock();
        if !st.connected {
            return None;
        }
        let initial = self.config.resend_initial;
        let max = self.config.resend_max;
        if let Some(f) = st
            .resources
            .values_mut()
            .filter_map(|q| q.in_flight.as_mut())
            .find(|f| f.next_send <= now)
        {
            f.attempts += 1;
            f.next_send = now + backoff(initial, max, f.attempts);
            return Some(f.event.clone());
        }
        while let Some(key) = st.ready.pop_front() {
            let Some(q) = st.resources.get_mut(&key) else {
                continue;
            };
            if q.in_flight.is_some() {
                continue;
            }
            let Some(event) = q.pending.pop_front() else {
                continue;
            };
            q.in_flight = Some(InFlight {
                event: event.clone(),
                attempts: 1,
                next_send: now + initial,
            });
            return Some(event);
        }
        None
    }

    /// Waits until [`take_next`](Self::take_next) returns an event.
    pub async fn next(&self) -> Event {
        loop {
            let notified = self.changed.notified();
            let now = Instant::now();
            if let Some(ev) = self.take_next(now) {
                return ev;
            }
            let wake = self
                .next_resend_at()
                .map(|t| t.saturating_duration_since(now))
                .unwrap_or(Duration::from_secs(3600));
            let _ = tokio::time::timeout(wake, notified).await;
        }
    }

    fn next_resend_at(&self) -> Option<Instant> {
        let st = self.lock();
        if !st.connected {
            return None;
        }
        st.resources
            .values()
            .filter_map(|q| q.in_flight.as_ref())
            .map(|f| f.next_send)
            .min()
    }

    /// Records the peer's ACK; returns true if it matched the in-flight event of its resource (by
    /// delivery id when the ACK carries one, else by `eventid`). The resource's next queued event
    /// becomes ready.
    pub fn ack(&self, ack: &Event) -> bool {
        let key = key_of(ack);
        let key = key.as_str();
        let mut st = self.lock();
        let Some(q) = st.resources.get_mut(key) else {
            return false;
        };
        let matches = q
            .in_flight
            .as_ref()
            .is_some_and(|f| match delivery_id(ack) {
                Some(d) => delivery_id(&f.event) == Some(d),
                None => f.event.event_id == ack.event_id,
            });
        if !matches {
            return false;
        }
        q.in_flight = None;
        if q.pending.is_empty() {
            st.resources.remove(key);
        } else {
            st.ready.push_back(key.to_string());
        }
        drop(st);
        self.changed.notify_one();
        true
    }

    /// Marks the stream up (resending everything in flight at once) or down (nothing is sent,
    /// nothing is dropped).
    pub fn set_connected(&self, connected: bool) {
        let mut st = self.lock();
        st.connected = connected;
        if connected {
            let now = Instant::now();
            for f in st
                .resources
                .values_mut()
                .filter_map(|q| q.in_flight.as_mut())
            {
                f.next_send = now;
            }
        }
        drop(st);
        self.changed.notify_one();
    }

    /// Number of distinct resources with queued or in-flight events.
    pub fn resources(&self) -> usize {
        self.lock().resources.len()
    }

    /// Number of events queued or in flight.
    pub fn len(&self) -> usize {
        self.lock()
            .resources
            .values()
            .map(|q| q.pending.len() + usize::from(q.in_flight.is_some()))
            .sum()
    }

    /// True when nothing is queued or in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn backoff(initial: Duration, max: Duration, attempts: u32) -> Duration {
    let factor = 2u32.saturating_pow(attempts.saturating_sub(1).min(16));
    initial.saturating_mul(factor).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Target;

    fn ev(t: EventType, key: &str, id: &str) -> Event {
        Event::new(t, Target::Application, "test").with_ids(key, id)
    }

    fn connected() -> Outbox {
        let o = Outbox::new(OutboxConfig::default());
        o.set_connected(true);
        o
    }

    #[test]
    fn updates_of_one_resource_coalesce_but_creates_and_operations_do_not() {
        let o = connected();
        o.push(ev(EventType::Create, "a", "1")).unwrap();
        o.push(ev(EventType::SpecUpdate, "a", "2")).unwrap();
        o.push(ev(EventType::SetOperation, "a", "3")).unwrap();
        o.push(ev(EventType::SpecUpdate, "a", "4")).unwrap();
        let now = Instant::now();
        let sent: Vec<String> = std::iter::from_fn(|| {
            let e = o.take_next(now)?;
            o.ack(&e.ack());
            Some(e.event_id)
        })
        .collect();
        assert_eq!(sent, ["1", "3", "4"]);
        assert!(o.is_empty());
    }

    #[test]
    fn delete_supersedes_everything_queued() {
        let o = connected();
        let now = Instant::now();
        o.push(ev(EventType::Create, "a", "1")).unwrap();
        let first = o.take_next(now).unwrap();
        o.push(ev(EventType::SpecUpdate, "a", "2")).unwrap();
        o.push(ev(EventType::SetOperation, "a", "3")).unwrap();
        o.push(ev(EventType::Delete, "a", "4")).unwrap();
        assert!(
            o.take_next(now).is_none(),
            "one event per resource in flight"
        );
        assert!(o.ack(&first.ack()));
        assert_eq!(o.take_next(now).unwrap().event_id, "4");
    }

    #[test]
    fn one_in_flight_per_resource_and_resources_interleave() {
        let o = connected();
        let now = Instant::now();
        o.push(ev(EventType::Create, "a", "a1")).unwrap();
        o.push(ev(EventType::Create, "a", "a2")).unwrap();
        o.push(ev(EventType::Create, "b", "b1")).unwrap();
        let a1 = o.take_next(now).unwrap();
        assert_eq!(a1.event_id, "a1");
        assert_eq!(o.take_next(now).unwrap().event_id, "b1");
        assert!(o.take_next(now).is_none());
        assert!(
            !o.ack(&ev(EventType::Processed, "a", "zz")),
            "an ACK for an unknown event id matches nothing"
        );
        assert!(o.ack(&a1.ack()));
        assert_eq!(o.take_next(now).unwrap().event_id, "a2");
    }

    #[test]
    fn unacked_event_is_resent_with_backoff_and_at_once_after_reconnect() {
        let o = connected();
        let t0 = Instant::now();
        o.push(ev(EventType::Create, "a", "1")).unwrap();
        assert_eq!(o.take_next(t0).unwrap().event_id, "1");
        assert!(o.take_next(t0 + Duration::from_millis(1900)).is_none());
        assert_eq!(
            o.take_next(t0 + Duration::from_secs(2)).unwrap().event_id,
            "1"
        );
        // Second resend waits twice as long.
        assert!(o.take_next(t0 + Duration::from_secs(5)).is_none());
        assert_eq!(
            o.take_next(t0 + Duration::from_secs(6)).unwrap().event_id,
            "1"
        );
        o.set_connected(false);
        assert!(
            o.take_next(t0 + Duration::from_secs(100)).is_none(),
            "nothing is sent while disconnected"
        );
        assert_eq!(o.len(), 1, "nothing is dropped while disconnected");
        o.set_connected(true);
        assert_eq!(o.take_next(Instant::now()).unwrap().event_id, "1");
    }

    #[test]
    fn duplicate_ack_of_an_earlier_event_with_the_same_eventid_does_not_confirm_the_next() {
        let o = connected();
        let now = Instant::now();
        o.push(ev(EventType::SpecUpdate, "a", "same")).unwrap();
        o.push(ev(EventType::SetOperation, "a", "same")).unwrap();
        let spec = o.take_next(now).unwrap();
        assert!(o.ack(&spec.ack()));
        let op = o.take_next(now).unwrap();
        assert_eq!(op.event_type, EventType::SetOperation);
        assert!(
            !o.ack(&spec.ack()),
            "a late duplicate ACK of the spec-update must not confirm the operation"
        );
        assert!(o.ack(&op.ack()));
        assert!(o.is_empty());
    }

    #[test]
    fn bound_is_on_distinct_resources_not_events() {
        let o = Outbox::new(OutboxConfig {
            max_resources: 2,
            ..Default::default()
        });
        for i in 0..100 {
            o.push(ev(EventType::StatusUpdate, "a", &format!("a{i}")))
                .unwrap();
        }
        o.push(ev(EventType::StatusUpdate, "b", "b")).unwrap();
        assert_eq!(
            o.push(ev(EventType::StatusUpdate, "c", "c")),
            Err(OutboxError::Full(2))
        );
        assert_eq!(o.len(), 2);
    }

    #[tokio::test]
    async fn next_wakes_up_when_an_event_is_pushed() {
        let o = std::sync::Arc::new(connected());
        let o2 = o.clone();
        let waiter = tokio::spawn(async move { o2.next().await.event_id });
        tokio::task::yield_now().await;
        o.push(ev(EventType::Create, "x", "x1")).unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, "x1");
    }
}
