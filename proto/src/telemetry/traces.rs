//! OpenTelemetry traces: export over OTLP/gRPC and trace context carried by events.
//!
//! Owns: the exporter behind `--otlp-address` ([`TraceExport`]: an OTLP/gRPC span exporter with a
//! batch processor, `service.name` set to the binary), and the W3C trace context that crosses the
//! principal ↔ agent stream in the CloudEvent `traceparent` / `tracestate` extensions:
//! [`emit_span_context`] stamps an outgoing event with the context of an `event.emit` span (a
//! child of whatever span produced the event), and [`handling_span`] opens the receiving side's
//! `event.handle` span as a child of that context, so one trace shows a change leaving one process
//! and being applied in the other. With no exporter configured both are no-ops and cost nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::event::Event;

/// Set once an exporter is installed; spans for events are only made then.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Why trace export could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to --otlp-address {endpoint}: {reason}")]
pub struct TraceExportError {
    endpoint: String,
    reason: String,
}

/// An installed OTLP exporter; dropping it flushes the spans still buffered.
pub struct TraceExport {
    provider: SdkTracerProvider,
}

impl std::fmt::Debug for TraceExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TraceExport")
    }
}

/// `host:port` → `http://host:port`; an explicit `http://` URL is kept. OTLP over TLS is not
/// offered (run a collector next to the process, as is usual).
pub fn otlp_endpoint(address: &str) -> Result<String, TraceExportError> {
    let refuse = |reason: &str| TraceExportError {
        endpoint: address.to_string(),
        reason: reason.to_string(),
    };
    if address.starts_with("https://") {
        return Err(refuse(
            "OTLP over TLS is not supported; point it at a local collector with http://HOST:PORT or HOST:PORT",
        ));
    }
    let url = if address.starts_with("http://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    let authority = url.trim_start_matches("http://").trim_end_matches('/');
    if authority.is_empty() || !authority.contains(':') {
        return Err(refuse("expected HOST:PORT, e.g. otel-collector:4317"));
    }
    Ok(url)
}

impl TraceExport {
    /// Builds the exporter for `address` (see [`otlp_endpoint`]) reporting as `service`, and the
    /// tracing layer that feeds it. Must be called inside the Tokio runtime.
    pub fn start<S>(
        address: &str,
        service: &'static str,
    ) -> Result<(TraceExport, impl tracing_subscriber::Layer<S>), TraceExportError>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let endpoint = otlp_endpoint(address)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .build()
            .map_err(|e| TraceExportError {
                endpoint: endpoint.clone(),
                reason: e.to_string(),
            })?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(service).build())
            .build();
        let tracer = provider.tracer(service);
        EXPORTING.store(true, Ordering::SeqCst);
        Ok((
            TraceExport { provider },
            tracing_opentelemetry::layer().with_tracer(tracer),
        ))
    }
}

impl Drop for TraceExport {
    fn drop(&mut self) {
        EXPORTING.store(false, Ordering::SeqCst);
        if let Err(e) = self.provider.shutdown() {
            eprintln!("flushing traces on exit failed: {e}");
        }
    }
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
    fn otlp_addresses_become_plain_grpc_urls() {
        assert_eq!(
            otlp_endpoint("collector:4317").unwrap(),
            "http://collector:4317"
        );
        assert_eq!(
            otlp_endpoint("http://127.0.0.1:4317").unwrap(),
            "http://127.0.0.1:4317"
        );
        let err = otlp_endpoint("https://collector:4317")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not supported"), "{err}");
        let err = otlp_endpoint("collector").unwrap_err().to_string();
        assert!(err.contains("HOST:PORT"), "{err}");
    }

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
