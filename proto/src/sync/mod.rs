//! The event-delivery engine both ends of a stream share (principal per agent, agent towards its
//! principal): what to send next, what to resend, and how to process what arrives.
//!
//! - [`outbox`]: per-peer outbound events, coalesced per resource, one un-ACKed event per resource
//!   in flight, resent with backoff until ACKed; survives disconnects.
//! - [`lanes`]: inbound processing — events of one resource strictly in order, different resources
//!   concurrently — and the ACK (or ACK-with-error) after each.
//! - [`pump`]: drives one live stream: ACKs and heartbeats on a priority lane that never waits
//!   behind bulk traffic, then resends, then new events.

pub mod lanes;
pub mod outbox;
pub mod pump;

pub use lanes::{EventHandler, HandleError, Lanes};
pub use outbox::{Outbox, OutboxConfig, OutboxError, DELIVERY_ID};
pub use pump::{run_stream, ControlSender, StreamEnd};
