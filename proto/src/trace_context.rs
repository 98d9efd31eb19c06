//! W3C trace context carried by events across the principal ↔ agent stream.
//!
//! Owns the CloudEvent `traceparent` / `tracestate` extensions: [`emit_span_context`] stamps an
//! outgoing event with the context of an `event.emit` span (a child of whatever span produced the
//! event), and [`handling_span`] opens the receiving side's `event.handle` span as a child of that
//! context, so one trace shows a change leaving one process and being applied in the other. Spans
//! are made only while an exporter is installed ([`set_exporting`], called by the process runtime's
//! OTLP exporter); otherwise both are no-ops and cost nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::event::Event;

/// Set while an exporter is installed; spans for events are only made then.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Records whether a trace exporter is installed in this process.
pub fn set_exporting(on: bool) {
    EXPORTING.store(on, Ordering::SeqCst);
}

/// Whether an exporter is installed.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Stamps `event` (unless it already carries one) with the trace context of a new `event.emit`
/// span, a child of the current span if there is one.
pub fn emit_span_context(event: &mut Event) {
    if !exporting() || event.traceparent.is_some() {
        return;
    }
    let span = tracing::info_span!(
        "event.emit",
        event_type = event.event_type.name(),
        resource = %event.resource_id,
    );
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    event.traceparent = carrier.remove("traceparent");
    event.tracestate = carrier.remove("tracestate").filter(|s| !s.is_empty());
}

/// The `event.handle` span for processing `event`, a child of the context the event carries.
pub fn handling_span(event: &Event) -> tracing::Span {
    if !exporting() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "event.handle",
        event_type = event.event_type.name(),
        resource = %event.resource_id,
    );
    if let Some(traceparent) = &event.traceparent {
        let mut carrier = HashMap::from([("traceparent".to_string(), traceparent.clone())]);
        if let Some(state) = &event.tracestate {
            carrier.insert("tracestate".to_string(), state.clone());
        }
        let parent = TraceContextPropagator::new().extract(&carrier);
        // A malformed traceparent leaves the span a root: tracing still works, the link is lost.
        let _ = span.set_parent(parent);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_exporter_events_carry_no_context_and_spans_are_disabled() {
        let mut ev = Event::new(
            crate::event::EventType::Create,
            crate::event::Target::Application,
            "test",
        );
        emit_span_context(&mut ev);
        assert!(ev.traceparent.is_none());
        assert!(handling_span(&ev).is_none());
    }
}
