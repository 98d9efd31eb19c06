//! The event-delivery engine both ends of a stream share (principal per agent, agent towards its
//! principal): what to send next, what to resend, and how to process what arrives.
//!
//! - [`outbox`]: per-peer outbound events, coalesced per resource, one un-ACKed event per resource
//!   in flight, resent with backoff until ACKed; survives disconnects.
//! - [`journal`]: the outbox on disk (append-only, checksummed records, compaction), so a
//!   restart while the peer is away loses nothing; damage is detected and reported, never fatal.
//! - [`resync`]: the checksum an autonomous mirror carries, and resync message keys.
//! - [`lanes`]: inbound processing — events of one resource strictly in order, different resources
//!   concurrently — and the ACK (or ACK-with-error) after each.
//! - [`handling_metrics`]: how each handled event went and how long it took, with upstream's
//!   labels (`*_event_processing_time{status,..,resource_type}`, `*_errors{resource_type}`).
//! - [`pump`]: drives one live stream: ACKs and heartbeats on a priority lane that never waits
//!   behind bulk traffic, then resends, then new events.
//!
//! At DEBUG every event's path is logged with its type and `eventid` (`event queued`, `event
//! sent`, `event received`, `event handled` with how long the handler took), so one event's
//! timeline can be read across both processes' logs.

pub mod handling_metrics;
pub mod journal;
pub mod lanes;
pub mod outbox;
pub mod pump;

pub use handling_metrics::{HandlingMetrics, PeerHandling};
pub use lanes::{processing_time_histogram, EventHandler, HandleError, Instrumented, Lanes};
pub mod resync;

pub use outbox::{keyed_request, OpenReport, Outbox, OutboxConfig, OutboxError, DELIVERY_ID};
pub use pump::{run_stream, ControlSender, StreamEnd};
