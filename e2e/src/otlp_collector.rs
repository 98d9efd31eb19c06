//! A minimal OTLP/gRPC trace collector for tests: the real `TraceService/Export` protocol served
//! by tonic on a loopback port, keeping every span it receives so a test can assert what the
//! project binaries exported (service, span name, trace and parent ids).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;

/// One received span, flattened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedSpan {
    /// `service.name` of the exporting process.
    pub service: String,
    /// Span name.
    pub name: String,
    /// Trace id (hex).
    pub trace_id: String,
    /// Span id (hex).
    pub span_id: String,
    /// Parent span id (hex; empty for a root span).
    pub parent_span_id: String,
}

#[derive(Default, Clone)]
struct Store(Arc<Mutex<Vec<ReceivedSpan>>>);

#[tonic::async_trait]
impl TraceService for Store {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.as_ref())
                .map(|v| match v {
                    Value::StringValue(s) => s.clone(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                spans.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The running collector; it stops when dropped.
pub struct OtlpCollector {
    addr: SocketAddr,
    store: Store,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpCollector {
    /// Serves OTLP/gRPC on a free loopback port.
    pub async fn start() -> anyhow::Result<OtlpCollector> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let store = Store::default();
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(store.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        let task = tokio::spawn(async move {
            if let Err(e) = server.await {
                eprintln!("test OTLP collector stopped: {e}");
            }
        });
        Ok(OtlpCollector { addr, store, task })
    }

    /// `HOST:PORT` to pass as `--otlp-address`.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.store
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for OtlpCollector {
    fn drop(&mut self) {
        self.task.abort();
    }
}
