//! Outbound events of one peer connection, kept across disconnects.
//!
//! Coalescing (per `resourceid`): a later `spec-update`, `status-update` or resync message
//! (`request-update`, `request-synced-resource-list`, `response-synced-resource`,
//! `request-resource-resync`, which senders key by what they ask about, and
//! `cluster-cache-info-update`) replaces a queued one of
//! the same type; a `delete` supersedes everything queued for that resource; `create`,
//! `set-operation` and `terminate-operation` are never coalesced away (an event identical to one
//! already queued is not queued twice). The number of entries is therefore bounded by the number
//! of distinct resources, not by the event rate.
//!
//! Durability: [`Outbox::open`] keeps the outbox in a [`journal`](super::journal) under a
//! directory, so a process that restarts while its peer is away still delivers everything; a
//! damaged journal is reported in [`OpenReport::damage`] and the caller runs a full resync.
//! Live-view events (resource, Redis, container-log and terminal requests and answers) are not
//! journaled: the caller waiting for one waits on this process's stream and is gone after a
//! restart, so writing them (the largest events, answers of up to 512 KiB a part) would only cost.
//!
//! Delivery: at most one event per resource is in flight (sent, not yet ACKed), which keeps events
//! of one resource in order at the receiver. An in-flight event is resent with exponential backoff
//! until its ACK arrives, counted from when the peer could have answered it: an event sent behind
//! others still in flight is overdue only once the peer has ACKed as many events as were ahead of
//! it and then a whole resend delay passed, or once the peer has ACKed nothing for a whole resend
//! delay (a peer working through a full window is busy, not losing events). Time during which
//! our own reader could not take the peer's next message (its lanes were full: see
//! [`Outbox::reading_stalled`]) does not count: ACKs queued behind the events it could not take
//! yet are not late, so nothing is resent during a stall and every deadline moves out by its
//! length. After a reconnect everything in flight is resent at once.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::journal::{self, Journal, Record};
use crate::event::{Event, EventType, ExtensionValue, Target};

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
    /// Events sent but not yet ACKed at any one time (a window: a backlog of thousands is sent
    /// at the pace the peer ACKs, instead of all at once and then resent while it is still busy).
    pub max_in_flight: usize,
    /// Counts every resend of an un-ACKed event (register it to export it; shared by clones).
    pub resends: prometheus_client::metrics::counter::Counter,
    /// Set to the number of distinct resources with queued or in-flight events on every change
    /// (register it to export it; shared by clones, so give each outbox its own).
    pub size: prometheus_client::metrics::gauge::Gauge,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            resend_initial: Duration::from_secs(2),
            resend_max: Duration::from_secs(60),
            max_resources: 100_000,
            max_in_flight: 256,
            resends: Default::default(),
            size: Default::default(),
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
    /// The queue directory or journal cannot be used.
    #[error("outbox journal {path}: {message}")]
    Storage {
        /// The file or directory.
        path: String,
        /// What failed.
        message: String,
    },
}

/// What [`Outbox::open`] found on disk.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OpenReport {
    /// Events restored (after coalescing) from an earlier run.
    pub restored: usize,
    /// Why the journal was damaged, if it was: what it held past the damage is lost, so the
    /// caller must run a full resync with its peer.
    pub damage: Option<String>,
}

/// Event types a later event of the same type (and resource) replaces.
fn coalesces(t: &EventType) -> bool {
    matches!(
        t,
        EventType::SpecUpdate
            | EventType::StatusUpdate
            | EventType::RequestUpdate
            | EventType::RequestSyncedResourceList
            | EventType::ResponseSyncedResource
            | EventType::RequestResourceResync
            | EventType::ClusterCacheInfoUpdate
    )
}

/// Whether `event` is kept in the journal: everything but the live view's requests and answers
/// (see the module docs).
fn journaled(event: &Event) -> bool {
    !matches!(
        event.target,
        Target::Resource | Target::Redis | Target::ContainerLog | Target::Terminal
    )
}

/// Gives a request event a stable resource id, so a newer request about the same thing replaces
/// a queued older one instead of piling up while the peer is away.
pub fn keyed_request(mut event: Event, key: impl Into<String>) -> Event {
    event.resource_id = key.into();
    event
}

#[derive(Debug)]
struct InFlight {
    event: Event,
    attempts: u32,
    /// When the current resend delay is up, unless the peer's progress pushes it out
    /// (see [`State::overdue`]).
    next_send: Instant,
    /// When it was last sent.
    sent: Instant,
    /// Events of other resources in flight when it was last sent: the peer answers about as many
    /// before it can answer this one.
    ahead: usize,
    /// [`State::acked`] when it was last sent.
    acked_at_send: u64,
    /// Set by a reconnect: resend now, whatever the peer's progress.
    resend_now: bool,
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
    /// Resources with an event in flight.
    in_flight: usize,
    /// Smoothed time the peer takes to answer an event once it could (from the event's
    /// [`progress`](State::progress) to its ACK), of events that were not resent (Karn's rule);
    /// the first resend waits at least three times this long.
    ack_time: Option<Duration>,
    /// ACKs matched so far.
    acked: u64,
    /// When the most recent ACKs arrived (at most [`ACK_LOG`] windows of them), oldest first:
    /// entry `i` is ACK number `acked - ack_log.len() + i`.
    ack_log: VecDeque<Instant>,
    journal: Option<Journal>,
    /// Last journal failure, logged once until writes work again.
    journal_failure: Option<String>,
    /// Since when our reader has been unable to take the peer's next message (see
    /// [`Outbox::reading_stalled`]).
    reading_stalled: Option<Instant>,
}

impl State {
    /// Adds `event` to its resource's queue under the coalescing rules; false if it was a
    /// duplicate of a queued event and dropped.
    fn enqueue(&mut self, key: &str, event: Event) -> bool {
        let q = self.resources.entry(key.to_string()).or_default();
        match &event.event_type {
            EventType::Delete => q.pending.clear(),
            t if coalesces(t) => q.pending.retain(|e| &e.event_type != t),
            t @ (EventType::SetOperation | EventType::TerminateOperation)
                if event.data.is_some()
                    && q.pending
                        .iter()
                        .any(|e| &e.event_type == t && e.data == event.data) =>
            {
                return false;
            }
            _ => {}
        }
        q.pending.push_back(event);
        let becomes_ready = q.in_flight.is_none() && q.pending.len() == 1;
        if becomes_ready && !self.ready.iter().any(|k| k == key) {
            self.ready.push_back(key.to_string());
        }
        true
    }

    fn live_events(&self) -> usize {
        self.resources
            .values()
            .map(|q| q.pending.len() + usize::from(q.in_flight.is_some()))
            .sum()
    }

    /// Runs a journal write; a failure is logged once and the outbox goes on in memory.
    fn journal_write(&mut self, write: impl FnOnce(&mut Journal) -> std::io::Result<()>) {
        let Some(j) = self.journal.as_mut() else {
            return;
        };
        match write(j) {
            Ok(()) => {
                if let Some(prev) = self.journal_failure.take() {
                    tracing::info!(journal = %j.path().display(), previous_error = %prev, "outbox journal writable again");
                }
            }
            Err(e) => {
                let msg = e.to_string();
                if self.journal_failure.as_deref() != Some(msg.as_str()) {
                    tracing::error!(journal = %j.path().display(), error = %msg, "cannot write the outbox journal; queued events survive only in memory until it works again");
                    self.journal_failure = Some(msg);
                }
            }
        }
        self.maybe_compact();
    }

    /// Rewrites the journal with only the live events once dead records dominate it.
    fn maybe_compact(&mut self) {
        let records = match &self.journal {
            Some(j) if j.records() >= COMPACT_MIN_RECORDS && j.records() % 64 == 0 => j.records(),
            _ => return,
        };
        if records < self.live_events() * 4 {
            return;
        }
        self.compact();
    }

    fn compact(&mut self) {
        let Some(path) = self.journal.as_ref().map(|j| j.path().to_path_buf()) else {
            return;
        };
        let events: Vec<&Event> = self
            .resources
            .values()
            .flat_map(|q| q.in_flight.iter().map(|f| &f.event).chain(q.pending.iter()))
            .filter(|e| journaled(e))
            .collect();
        match Journal::rewrite(&path, events.into_iter()) {
            Ok(j) => self.journal = Some(j),
            Err(e) => {
                tracing::error!(journal = %path.display(), error = %e, "cannot compact the outbox journal; it keeps growing until it can")
            }
        }
    }
}

/// The ACK log keeps this many windows (`max_in_flight`) of ACK times.
const ACK_LOG: usize = 2;

impl State {
    /// When the peer was last seen making progress on `f`'s behalf: the send itself when nothing
    /// was ahead of `f`; once the peer has ACKed `f.ahead` events since `f` was sent, the time of
    /// that ACK (the peer had reached `f`; an ACK older than the log counts as the log's oldest,
    /// which is later); before that, its latest ACK since `f` was sent, or the send. `f` is
    /// overdue a resend delay after this.
    fn progress(&self, f: &InFlight) -> Instant {
        let since = self.acked.saturating_sub(f.acked_at_send);
        let logged_from = self.acked - self.ack_log.len() as u64;
        let at = |n: u64| {
            let i = n.saturating_sub(logged_from) as usize;
            self.ack_log.get(i).copied()
        };
        let reached = match f.ahead as u64 {
            0 => None,
            ahead if since >= ahead => at(f.acked_at_send + ahead - 1),
            _ if since > 0 => self.ack_log.back().copied(),
            _ => None,
        };
        reached.map_or(f.sent, |t| t.max(f.sent))
    }

    /// Records an ACK that arrived at `now`, keeping at most `cap` ACK times.
    fn log_ack(&mut self, now: Instant, cap: usize) {
        self.acked += 1;
        self.ack_log.push_back(now);
        while self.ack_log.len() > cap {
            self.ack_log.pop_front();
        }
    }
}

/// Journals shorter than this are never compacted.
const COMPACT_MIN_RECORDS: usize = 1024;

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

    /// An outbox kept in `dir` (created if missing): restores what an earlier run left queued,
    /// then journals every change. A damaged journal is not an error: it is reported in
    /// [`OpenReport::damage`] (what preceded the damage is restored) and rewritten clean.
    pub fn open(dir: &Path, config: OutboxConfig) -> Result<(Outbox, OpenReport), OutboxError> {
        let storage = |path: &Path, e: std::io::Error| OutboxError::Storage {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(|e| storage(dir, e))?;
        let path = dir.join(journal::JOURNAL_FILE);
        let replay = journal::replay(&path).map_err(|e| storage(&path, e))?;
        let mut st = State::default();
        for record in replay.records {
            match record {
                Record::Queued(ev) => {
                    let key = key_of(&ev);
                    st.enqueue(&key, *ev);
                }
                Record::Confirmed { key, delivery } => {
                    if let Some(q) = st.resources.get_mut(&key) {
                        q.pending
                            .retain(|e| delivery_id(e) != Some(delivery.as_str()));
                        if q.pending.is_empty() {
                            st.resources.remove(&key);
                        }
                    }
                }
            }
        }
        st.ready.retain(|k| st.resources.contains_key(k));
        let events: Vec<&Event> = st
            .resources
            .values()
            .flat_map(|q| q.pending.iter())
            .collect();
        let restored = events.len();
        st.journal =
            Some(Journal::rewrite(&path, events.into_iter()).map_err(|e| storage(&path, e))?);
        let report = OpenReport {
            restored,
            damage: replay.damage,
        };
        config.size.set(st.resources.len() as i64);
        Ok((
            Outbox {
                config,
                state: Mutex::new(st),
                changed: Notify::new(),
            },
            report,
        ))
    }

    /// Queues an event, coalescing it with what is already queued for the same resource.
    pub fn push(&self, mut event: Event) -> Result<(), OutboxError> {
        event.extensions.insert(
            DELIVERY_ID.to_string(),
            ExtensionValue::String(uuid::Uuid::new_v4().to_string()),
        );
        crate::trace_context::emit_span_context(&mut event);
        tracing::debug!(event_type = event.event_type.name(), event_id = %event.event_id, "event queued");
        let key = key_of(&event);
        let mut st = self.lock();
        if !st.resources.contains_key(&key) && st.resources.len() >= self.config.max_resources {
            return Err(OutboxError::Full(st.resources.len()));
        }
        let journaled = (st.journal.is_some() && journaled(&event)).then(|| event.clone());
        if st.enqueue(&key, event) {
            if let Some(event) = journaled {
                st.journal_write(|j| j.queued(&event));
            }
        }
        self.config.size.set(st.resources.len() as i64);
        drop(st);
        self.changed.notify_one();
        Ok(())
    }

    /// Takes the next event to send: a due resend first, else the oldest ready resource's next
    /// event (which then counts as in flight). `None` if nothing is due now.
    pub fn take_next(&self, now: Instant) -> Option<Event> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if !st.connected {
            return None;
        }
        let max = self.config.resend_max;
        let initial = st
            .ack_time
            .map_or(self.config.resend_initial, |t| {
                self.config.resend_initial.max(t.saturating_mul(3))
            })
            .min(max);
        // Timers that ran out: resend what is overdue given the peer's progress; push the
        // others out to when they will be. None while our reader is stalled: an ACK that is
        // late then may be one we have not read yet.
        let mut overdue = None;
        let mut postponed = Vec::new();
        let resending = st.reading_stalled.is_none();
        for (key, q) in st.resources.iter().filter(|_| resending) {
            let Some(f) = q.in_flight.as_ref().filter(|f| f.next_send <= now) else {
                continue;
            };
            let due = progress_due(st, f, initial, max);
            if f.resend_now || due <= now {
                overdue.get_or_insert_with(|| key.clone());
            } else {
                postponed.push((key.clone(), due));
            }
        }
        for (key, due) in postponed {
            if let Some(f) = st
                .resources
                .get_mut(&key)
                .and_then(|q| q.in_flight.as_mut())
            {
                f.next_send = due;
            }
        }
        if let Some(key) = overdue {
            let ahead = st.in_flight.saturating_sub(1);
            let acked = st.acked;
            let f = st
                .resources
                .get_mut(&key)
                .and_then(|q| q.in_flight.as_mut())
                .expect("found above");
            f.attempts += 1;
            f.next_send = now + backoff(initial, max, f.attempts);
            f.sent = now;
            f.ahead = ahead;
            f.acked_at_send = acked;
            f.resend_now = false;
            self.config.resends.inc();
            return Some(f.event.clone());
        }
        while st.in_flight < self.config.max_in_flight {
            let key = st.ready.pop_front()?;
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
                sent: now,
                ahead: st.in_flight,
                acked_at_send: st.acked,
                resend_now: false,
            });
            st.in_flight += 1;
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
        if !st.connected || st.reading_stalled.is_some() {
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
        self.ack_at(ack, Instant::now())
    }

    /// [`ack`](Self::ack) of an ACK that arrived at `now`.
    pub fn ack_at(&self, ack: &Event, now: Instant) -> bool {
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
        let settled = q.in_flight.take();
        let done = q.pending.is_empty();
        let sample = settled
            .as_ref()
            .filter(|f| f.attempts == 1)
            .map(|f| now.saturating_duration_since(st.progress(f)));
        let confirmed = settled
            .filter(|f| journaled(&f.event))
            .and_then(|f| delivery_id(&f.event).map(str::to_string));
        if done {
            st.resources.remove(key);
        } else {
            st.ready.push_back(key.to_string());
        }
        st.in_flight = st.in_flight.saturating_sub(1);
        st.log_ack(now, self.config.max_in_flight.max(1) * ACK_LOG);
        if let Some(sample) = sample {
            st.ack_time = Some(match st.ack_time {
                Some(t) => (t * 4 + sample) / 5,
                None => sample,
            });
        }
        if let Some(delivery) = confirmed {
            st.journal_write(|j| j.confirmed(key, &delivery));
        }
        self.config.size.set(st.resources.len() as i64);
        drop(st);
        self.changed.notify_one();
        true
    }

    /// Marks the stream up (resending everything in flight at once) or down (nothing is sent,
    /// nothing is dropped).
    pub fn set_connected(&self, connected: bool) {
        let mut st = self.lock();
        st.connected = connected;
        st.reading_stalled = None;
        if connected {
            let now = Instant::now();
            for f in st
                .resources
                .values_mut()
                .filter_map(|q| q.in_flight.as_mut())
            {
                f.next_send = now;
                f.resend_now = true;
            }
        }
        drop(st);
        self.changed.notify_one();
    }

    /// Our reader of the peer's messages cannot take the next one (it waits for room to hand the
    /// last one on) since `now`: until [`reading_resumed`](Self::reading_resumed), nothing is
    /// resent, as the ACKs of what is in flight may be waiting unread behind it.
    pub fn reading_stalled(&self, now: Instant) {
        self.lock().reading_stalled.get_or_insert(now);
    }

    /// Our reader takes the peer's messages again at `now`: the stall's length is added to every
    /// in-flight event's deadline and to the times of the ACKs before it, as if the clock had
    /// stopped while no ACK could be read.
    pub fn reading_resumed(&self, now: Instant) {
        let mut st = self.lock();
        let Some(since) = st.reading_stalled.take() else {
            return;
        };
        let stalled = now.saturating_duration_since(since);
        for f in st
            .resources
            .values_mut()
            .filter_map(|q| q.in_flight.as_mut())
        {
            f.sent += stalled;
            f.next_send += stalled;
        }
        for t in st.ack_log.iter_mut() {
            *t += stalled;
        }
        drop(st);
        self.changed.notify_one();
    }

    /// Whether the stream is up (events are being sent).
    pub fn is_connected(&self) -> bool {
        self.lock().connected
    }

    /// Number of distinct resources with queued or in-flight events.
    pub fn resources(&self) -> usize {
        self.lock().resources.len()
    }

    /// Whether an event about `resource_id` is queued or in flight (not yet ACKed).
    pub fn holds(&self, resource_id: &str) -> bool {
        self.lock().resources.contains_key(resource_id)
    }

    /// Number of events queued or in flight.
    pub fn len(&self) -> usize {
        self.lock().live_events()
    }

    /// True when nothing is queued or in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// When in-flight `f` is overdue: its current resend delay after the peer's progress on its
/// behalf ([`State::progress`]).
fn progress_due(st: &State, f: &InFlight, initial: Duration, max: Duration) -> Instant {
    st.progress(f) + backoff(initial, max, f.attempts)
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
        Event::new(t, Target::Application, "test")
            .with_ids(key, id)
            .with_json(&serde_json::json!({}))
            .unwrap()
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
    fn the_size_gauge_follows_every_push_and_ack() {
        let o = connected();
        let size = o.config.size.clone();
        o.push(ev(EventType::Create, "a", "1")).unwrap();
        o.push(ev(EventType::SpecUpdate, "a", "2")).unwrap();
        o.push(ev(EventType::Create, "b", "3")).unwrap();
        assert_eq!(size.get(), 2);
        let first = o.take_next(Instant::now()).unwrap();
        assert!(o.ack(&first.ack()));
        assert_eq!(size.get(), 2, "a still has its update queued");
        while let Some(e) = o.take_next(Instant::now()) {
            assert!(o.ack(&e.ack()));
        }
        assert_eq!(size.get(), 0);
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
        assert_eq!(o.config.resends.get(), 2, "both resends are counted");
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
    fn at_most_max_in_flight_events_wait_for_an_ack_and_the_resend_timer_follows_ack_times() {
        let o = Outbox::new(OutboxConfig {
            max_in_flight: 2,
            ..OutboxConfig::default()
        });
        o.set_connected(true);
        let now = Instant::now();
        for (key, id) in [("a", "1"), ("b", "2"), ("c", "3")] {
            o.push(ev(EventType::Create, key, id)).unwrap();
        }
        let first = o.take_next(now).unwrap();
        let second = o.take_next(now).unwrap();
        assert_eq!(second.event_id, "2");
        assert!(o.take_next(now).is_none(), "the window of two is full");
        assert!(o.ack(&first.ack()));
        let third = o.take_next(now).unwrap();
        assert_eq!(third.event_id, "3", "an ACK opens the window");
        assert!(o.take_next(now + Duration::from_millis(1900)).is_none());
        assert!(
            o.take_next(now + Duration::from_secs(2)).is_some(),
            "resent after 2 s"
        );
        assert!(o.ack(&second.ack()) && o.ack(&third.ack()));
        // A slow peer: ACK times of 5 s push the first resend out to 15 s.
        o.lock().ack_time = Some(Duration::from_secs(5));
        o.push(ev(EventType::Create, "d", "4")).unwrap();
        assert_eq!(o.take_next(now).unwrap().event_id, "4");
        assert!(o.take_next(now + Duration::from_secs(14)).is_none());
        assert_eq!(
            o.take_next(now + Duration::from_secs(15)).unwrap().event_id,
            "4"
        );
        assert_eq!(o.config.resends.get(), 2);
    }

    /// A window of ten events sent at once to a peer that ACKs one every 300 ms, in order: what
    /// the sender resends, polling every 100 ms, with `lost` never ACKed.
    fn resends_to_a_busy_peer(lost: Option<usize>) -> Vec<(Duration, String)> {
        let o = Outbox::new(OutboxConfig {
            max_in_flight: 10,
            ..OutboxConfig::default()
        });
        o.set_connected(true);
        for i in 0..10 {
            o.push(ev(EventType::Create, &format!("r{i}"), &i.to_string()))
                .unwrap();
        }
        let t0 = Instant::now();
        let sent: Vec<Event> = (0..10).map(|_| o.take_next(t0).unwrap()).collect();
        let mut acks = sent
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != lost)
            .map(|(_, e)| e);
        let mut resent = Vec::new();
        for step in 1..=80u64 {
            let now = t0 + Duration::from_millis(100 * step);
            if step % 3 == 0 {
                if let Some(e) = acks.next() {
                    assert!(o.ack_at(&e.ack(), now));
                }
            }
            while let Some(e) = o.take_next(now) {
                resent.push((now - t0, e.event_id));
            }
        }
        assert_eq!(o.config.resends.get(), resent.len() as u64);
        resent
    }

    #[test]
    fn a_peer_working_through_a_full_window_gets_no_resends() {
        // The window takes 3 s to answer, longer than the 2 s resend delay, yet every event is
        // answered within 2 s of the ones ahead of it.
        assert_eq!(resends_to_a_busy_peer(None), []);
    }

    #[test]
    fn an_event_the_busy_peer_dropped_is_resent_a_resend_delay_after_the_ones_ahead_of_it() {
        // Event 3 is never ACKed; the three ahead of it are by 0.9 s, so it is resent at 2.9 s,
        // while the peer is still ACKing the others (and again 4 s later, the backoff).
        assert_eq!(
            resends_to_a_busy_peer(Some(3)),
            [
                (Duration::from_millis(2900), "3".to_string()),
                (Duration::from_millis(6900), "3".to_string())
            ]
        );
    }

    #[test]
    fn nothing_is_resent_while_our_reader_is_stalled_and_deadlines_move_out_by_the_stall() {
        // The bench-compare waste (226 resends in an autonomous catch-up): our reader waited for
        // lane room behind thousands of the peer's resync requests while the peer's ACKs queued
        // unread behind them; the window's ACKs were late only because we had not read them.
        let o = Outbox::new(OutboxConfig {
            max_in_flight: 3,
            ..OutboxConfig::default()
        });
        o.set_connected(true);
        for i in 0..3 {
            o.push(ev(EventType::Create, &format!("r{i}"), &i.to_string()))
                .unwrap();
        }
        let t0 = Instant::now();
        let sent: Vec<Event> = (0..3).map(|_| o.take_next(t0).unwrap()).collect();
        let secs = |s: u64| t0 + Duration::from_secs(s);
        o.reading_stalled(secs(1));
        assert!(
            o.take_next(secs(9)).is_none(),
            "no resend during an 8 s stall"
        );
        o.reading_resumed(secs(9));
        assert!(
            o.take_next(t0 + Duration::from_millis(9900)).is_none(),
            "1 s of reading before the stall and 0.9 s after it: not yet due"
        );
        assert!(o.ack_at(&sent[0].ack(), secs(9)));
        // The other two are genuinely un-ACKed: resent a resend delay (3 x the 1 s the first
        // ACK took) after the peer's last progress.
        assert!(o.take_next(t0 + Duration::from_millis(11900)).is_none());
        let mut resent: Vec<String> = std::iter::from_fn(|| o.take_next(secs(12)))
            .map(|e| e.event_id)
            .collect();
        resent.sort();
        assert_eq!(resent, ["1", "2"]);
        assert_eq!(o.config.resends.get(), 2);
        // A stall cut short by a disconnect does not stop resends on the next stream.
        o.reading_stalled(secs(13));
        o.set_connected(false);
        o.set_connected(true);
        let mut after: Vec<String> = std::iter::from_fn(|| o.take_next(Instant::now()))
            .map(|e| e.event_id)
            .collect();
        after.sort();
        assert_eq!(after, ["1", "2"]);
    }

    #[test]
    fn a_silent_peer_gets_the_whole_window_resent_after_the_resend_delay() {
        let o = Outbox::new(OutboxConfig {
            max_in_flight: 3,
            ..OutboxConfig::default()
        });
        o.set_connected(true);
        for i in 0..3 {
            o.push(ev(EventType::Create, &format!("r{i}"), &i.to_string()))
                .unwrap();
        }
        let t0 = Instant::now();
        for _ in 0..3 {
            o.take_next(t0).unwrap();
        }
        assert!(o.take_next(t0 + Duration::from_millis(1900)).is_none());
        let at = t0 + Duration::from_secs(2);
        let resent: Vec<String> = std::iter::from_fn(|| o.take_next(at))
            .map(|e| e.event_id)
            .collect();
        assert_eq!(resent.len(), 3, "{resent:?}");
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

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn queued_events_survive_a_restart_and_confirmed_ones_do_not() {
        let d = dir();
        {
            let (o, report) = Outbox::open(d.path(), OutboxConfig::default()).unwrap();
            assert_eq!(report, OpenReport::default());
            o.set_connected(true);
            o.push(ev(EventType::Create, "a", "a1").with_json(&"x").unwrap())
                .unwrap();
            o.push(ev(EventType::SpecUpdate, "a", "a2")).unwrap();
            o.push(ev(EventType::SpecUpdate, "b", "b1")).unwrap();
            o.push(ev(EventType::SpecUpdate, "b", "b2")).unwrap();
            o.push(ev(EventType::SetOperation, "c", "c1")).unwrap();
            let first = o.take_next(Instant::now()).unwrap();
            assert_eq!(first.event_id, "a1");
            assert!(o.ack(&first.ack()));
        }
        let (o, report) = Outbox::open(d.path(), OutboxConfig::default()).unwrap();
        assert_eq!(report.damage, None, "{report:?}");
        assert_eq!(report.restored, 3);
        o.set_connected(true);
        let now = Instant::now();
        let mut ids: Vec<String> = std::iter::from_fn(|| {
            let e = o.take_next(now)?;
            o.ack(&e.ack());
            Some(e.event_id)
        })
        .collect();
        ids.sort();
        assert_eq!(ids, ["a2", "b2", "c1"]);
        drop(o);
        let (o, _) = Outbox::open(d.path(), OutboxConfig::default()).unwrap();
        assert!(o.is_empty(), "everything was confirmed before this restart");
    }

    #[test]
    fn live_view_requests_and_answers_are_not_journaled() {
        let d = dir();
        let path = d.path().join(journal::JOURNAL_FILE);
        {
            let (o, _) = Outbox::open(d.path(), OutboxConfig::default()).unwrap();
            o.set_connected(true);
            let empty = std::fs::metadata(&path).unwrap().len();
            for target in [
                Target::Resource,
                Target::Redis,
                Target::ContainerLog,
                Target::Terminal,
            ] {
                let id = format!("{target:?}");
                let answer = Event::new(EventType::Response, target, "test")
                    .with_ids("", &id)
                    .with_json(&"x".repeat(64 << 10))
                    .unwrap();
                o.push(answer).unwrap();
            }
            assert_eq!(o.len(), 4, "live events are queued and sent as any other");
            let sent = o.take_next(Instant::now()).unwrap();
            assert!(o.ack(&sent.ack()));
            assert_eq!(
                std::fs::metadata(&path).unwrap().len(),
                empty,
                "neither the live events nor their ACK were written"
            );
            o.push(ev(EventType::SpecUpdate, "a", "a1")).unwrap();
            assert!(std::fs::metadata(&path).unwrap().len() > empty);
        }
        let (o, report) = Outbox::open(d.path(), OutboxConfig::default()).unwrap();
        assert_eq!(report.restored, 1, "{report:?}");
        o.set_connected(true);
        assert_eq!(o.take_next(Instant::now()).unwrap().event_id, "a1");
    }

    #[test]
    fn truncated_or_corrupted_journal_is_reported_and_the_intact_prefix_kept() {
        let d = dir();
        {
            let (o, _) = Outbox::open(d.path(), OutboxConfig::default()).unwrap();
            for i in 0..10 {
                o.push(ev(EventType::SpecUpdate, &format!("r{i}"), "x"))
                    .unwrap();
            }
        }
        let path = d.path().join(journal::JOURNAL_FILE);
        let len = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 5).unwrap();
        drop(f);
        let (o, report) = Outbox::open(d.path(), OutboxConfig::default()).unwrap();
        assert!(report.damage.unwrap().contains("truncated"));
        assert_eq!(o.len(), 9, "the intact records are kept");
        drop(o);
        let (_, report) = Outbox::open(d.path(), OutboxConfig::default()).unwrap();
        assert_eq!(report.damage, None, "the journal was rewritten clean");

        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (_, report) = Outbox::open(d.path(), OutboxConfig::default()).unwrap();
        assert!(report.damage.is_some());

        std::fs::write(&path, b"garbage that is not a journal").unwrap();
        let (o, report) = Outbox::open(d.path(), OutboxConfig::default()).unwrap();
        assert!(report.damage.unwrap().contains("header"));
        assert!(o.is_empty());
    }

    #[test]
    fn journal_is_compacted_to_the_live_events() {
        let d = dir();
        let (o, _) = Outbox::open(d.path(), OutboxConfig::default()).unwrap();
        for i in 0..5000 {
            o.push(ev(EventType::StatusUpdate, &format!("r{}", i % 3), "x"))
                .unwrap();
        }
        let size = std::fs::metadata(d.path().join(journal::JOURNAL_FILE))
            .unwrap()
            .len();
        assert!(
            size < 400_000,
            "journal of 3 live events after 5,000 pushes (~1.2 MB uncompacted) is {size} bytes"
        );
        drop(o);
        let (o, _) = Outbox::open(d.path(), OutboxConfig::default()).unwrap();
        assert_eq!(o.len(), 3);
    }

    #[test]
    fn keyed_requests_coalesce_and_identical_operations_are_queued_once() {
        let o = Outbox::new(OutboxConfig::default());
        for _ in 0..10 {
            o.push(keyed_request(
                Event::new(EventType::RequestUpdate, Target::ResourceResync, "t")
                    .with_json(&serde_json::json!({}))
                    .unwrap(),
                "resync/a",
            ))
            .unwrap();
            o.push(
                ev(EventType::SetOperation, "op", "1")
                    .with_json(&"sync")
                    .unwrap(),
            )
            .unwrap();
        }
        assert_eq!(o.len(), 2);
    }
}
