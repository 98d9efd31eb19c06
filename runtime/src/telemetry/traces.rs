//! OpenTelemetry trace export over OTLP/gRPC.
//!
//! Owns the exporter behind `--otlp-address` ([`TraceExport`]: an OTLP/gRPC span exporter with a
//! batch processor, `service.name` set to the binary). While one is installed, the trace context
//! carried by events ([`argocd_agent_proto::trace_context`]) makes spans; without it that costs
//! nothing.

use argocd_agent_proto::trace_context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

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
        trace_context::set_exporting(true);
        Ok((
            TraceExport { provider },
            tracing_opentelemetry::layer().with_tracer(tracer),
        ))
    }
}

impl Drop for TraceExport {
    fn drop(&mut self) {
        trace_context::set_exporting(false);
        if let Err(e) = self.provider.shutdown() {
            eprintln!("flushing traces on exit failed: {e}");
        }
    }
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
}
