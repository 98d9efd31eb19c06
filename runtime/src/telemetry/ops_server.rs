//! The HTTP server for operators: `/metrics`, `/healthz`, `/readyz`.
//!
//! Owns: the axum routers for the three endpoints, binding them (on one address or on two),
//! serving them until shutdown, and waiting for the process's shutdown signal (Ctrl-C/SIGTERM).

use std::future::Future;
use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{HealthState, MetricsRegistry, TelemetryError};

/// Content type of `/metrics` responses.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Router serving `GET /metrics` from `registry`.
pub fn metrics_router(registry: MetricsRegistry) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .with_state(registry)
}

/// Router serving `GET /healthz` (liveness) and `GET /readyz` (readiness) from `health`.
pub fn health_router(health: HealthState) -> Router {
    Router::new()
        .route("/healthz", get(serve_liveness))
        .route("/readyz", get(serve_readiness))
        .with_state(health)
}

/// Router serving all three endpoints on one address.
pub fn ops_router(registry: MetricsRegistry, health: HealthState) -> Router {
    metrics_router(registry).merge(health_router(health))
}

async fn serve_metrics(State(registry): State<MetricsRegistry>) -> Response {
    match registry.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response(),
    }
}

/// Header carrying the high-availability role, as upstream's principal sends it.
pub const HA_STATE_HEADER: &str = "X-HA-State";

fn with_role(health: &HealthState, status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    if let Some(role) = health.role() {
        if let Ok(value) = header::HeaderValue::from_str(&role) {
            response.headers_mut().insert(HA_STATE_HEADER, value);
        }
    }
    response
}

async fn serve_liveness(State(health): State<HealthState>) -> Response {
    if health.is_live() {
        with_role(&health, StatusCode::OK, "ok\n".to_string())
    } else {
        with_role(
            &health,
            StatusCode::SERVICE_UNAVAILABLE,
            "not live\n".to_string(),
        )
    }
}

async fn serve_readiness(State(health): State<HealthState>) -> Response {
    match health.readiness() {
        Ok(()) => with_role(&health, StatusCode::OK, "ok\n".to_string()),
        Err(reason) => with_role(
            &health,
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{reason}\n"),
        ),
    }
}

/// A running ops HTTP server.
#[derive(Debug)]
pub struct OpsServer {
    /// The address actually bound (differs from the requested one when port 0 was asked for).
    pub local_addr: SocketAddr,
    /// Resolves when the server has shut down, with the error that stopped it if any.
    pub task: JoinHandle<std::io::Result<()>>,
}

/// Binds `addr` and serves `router` on it until `shutdown` resolves.
///
/// Binding happens before this returns, so a port conflict is reported here, naming the address.
pub async fn serve_ops(
    addr: SocketAddr,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<OpsServer, TelemetryError> {
    let listener = bind("ops", addr).await?;
    spawn_server("ops", addr, listener, router, shutdown)
}

async fn bind(purpose: &str, addr: SocketAddr) -> Result<TcpListener, TelemetryError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| TelemetryError::Bind {
            purpose: purpose.to_string(),
            addr,
            source,
        })
}

fn spawn_server(
    purpose: &str,
    addr: SocketAddr,
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<OpsServer, TelemetryError> {
    let local_addr = listener
        .local_addr()
        .map_err(|source| TelemetryError::Bind {
            purpose: purpose.to_string(),
            addr,
            source,
        })?;
    let task = tokio::spawn(serve_connections(listener, router, shutdown));
    Ok(OpsServer { local_addr, task })
}

/// A client must send its request headers within this time, or the connection is closed (no
/// slowloris on the ops port).
pub const OPS_HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Accepts connections until `shutdown`, each served by hyper with a header read timeout, then
/// lets the requests in progress finish.
async fn serve_connections(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};

    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    crate::accept::serve_connections(listener, "ops", shutdown, |tcp, _| {
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        // HTTP/1 only (Prometheus and kubelet probes speak it): hyper's header read timeout
        // then also covers a client that never sends its first byte.
        let conn = graceful.watch(
            hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(OPS_HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(tcp), service),
        );
        async move {
            // Timeouts and resets end connections here; nothing to report.
            let _ = conn.await;
        }
    })
    .await;
    graceful.shutdown().await;
    Ok(())
}

/// The metrics and health servers of one process.
#[derive(Debug)]
pub struct OpsServers {
    /// Where `/metrics` is served.
    pub metrics_addr: SocketAddr,
    /// Where `/healthz` and `/readyz` are served.
    pub health_addr: SocketAddr,
    servers: Vec<OpsServer>,
}

impl OpsServers {
    /// Waits until every server has stopped; returns the first error any of them hit.
    pub async fn wait(self) -> std::io::Result<()> {
        let mut first_error = None;
        for server in self.servers {
            let outcome = match server.task.await {
                Ok(result) => result,
                Err(join_error) => Err(std::io::Error::other(join_error)),
            };
            if let Err(e) = outcome {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Serves `/metrics` on `metrics_addr` and `/healthz` + `/readyz` on `health_addr` (one listener
/// when the two addresses are equal) until `shutdown` resolves.
///
/// Both addresses are bound before anything is served, so a failure leaves nothing running.
pub async fn start_ops_servers(
    metrics_addr: SocketAddr,
    health_addr: SocketAddr,
    registry: MetricsRegistry,
    health: HealthState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<OpsServers, TelemetryError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut stop_rx = stop_rx.clone();
        async move {
            // A dropped sender also means stop.
            let _ = stop_rx.wait_for(|stop| *stop).await;
        }
    };

    let servers = if metrics_addr == health_addr {
        let listener = bind("metrics and health", metrics_addr).await?;
        vec![spawn_server(
            "metrics and health",
            metrics_addr,
            listener,
            ops_router(registry, health),
            stopped(),
        )?]
    } else {
        let metrics_listener = bind("metrics", metrics_addr).await?;
        let health_listener = bind("health", health_addr).await?;
        vec![
            spawn_server(
                "metrics",
                metrics_addr,
                metrics_listener,
                metrics_router(registry),
                stopped(),
            )?,
            spawn_server(
                "health",
                health_addr,
                health_listener,
                health_router(health),
                stopped(),
            )?,
        ]
    };
    let metrics_addr = servers[0].local_addr;
    let health_addr = servers[servers.len() - 1].local_addr;

    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    Ok(OpsServers {
        metrics_addr,
        health_addr,
        servers,
    })
}

/// Resolves when the process receives Ctrl-C (SIGINT) or SIGTERM; returns the signal's name.
pub async fn shutdown_signal() -> Result<&'static str, TelemetryError> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut sigterm = signal(SignalKind::terminate()).map_err(TelemetryError::Signal)?;
        tokio::select! {
            result = tokio::signal::ctrl_c() => result.map(|()| "SIGINT").map_err(TelemetryError::Signal),
            _ = sigterm.recv() => Ok("SIGTERM"),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c()
            .await
            .map_err(TelemetryError::Signal)?;
        Ok("Ctrl-C")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::oneshot;

    /// Minimal HTTP/1.1 GET: returns (status code, headers+body text).
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {response:?}"));
        (status, response)
    }

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    #[tokio::test]
    async fn one_address_serves_metrics_liveness_and_readiness() {
        let registry = MetricsRegistry::new("0.0.0-test");
        let requests = Counter::<u64>::default();
        registry.register("test_requests", "Requests seen", requests.clone());
        requests.inc();
        let health = HealthState::new();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let server = serve_ops(
            loopback(),
            ops_router(registry, health.clone()),
            async move {
                let _ = stop_rx.await;
            },
        )
        .await
        .unwrap();
        let addr = server.local_addr;

        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(body.contains("test_requests_total 1"), "{body}");
        assert!(body.contains("argocd_agent_build_info{version=\"0.0.0-test\"} 1"));
        assert!(body.contains("application/openmetrics-text"), "{body}");

        assert_eq!(get(addr, "/healthz").await.0, 200);
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        assert!(body.ends_with("starting\n"), "{body}");

        health.set_ready(true, "");
        assert_eq!(get(addr, "/readyz").await.0, 200);
        health.set_ready(false, "principal unreachable");
        let (status, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        assert!(body.contains("principal unreachable"), "{body}");
        assert!(
            !body.contains("x-ha-state"),
            "no role header unless replicated: {body}"
        );
        health.set_role("standby");
        let (_, body) = get(addr, "/healthz").await;
        assert!(body.contains("x-ha-state: standby"), "{body}");
        health.set_live(false);
        assert_eq!(get(addr, "/healthz").await.0, 503);
        assert_eq!(get(addr, "/nope").await.0, 404);

        stop_tx.send(()).unwrap();
        server.task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_client_that_sends_no_request_is_disconnected_after_the_header_timeout() {
        let (_stop_tx, stop_rx) = oneshot::channel::<()>();
        let server = serve_ops(
            loopback(),
            ops_router(MetricsRegistry::new("0.0.0-test"), HealthState::new()),
            async move {
                let _ = stop_rx.await;
            },
        )
        .await
        .unwrap();
        let started = std::time::Instant::now();
        let mut silent = TcpStream::connect(server.local_addr).await.unwrap();
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(
            OPS_HEADER_READ_TIMEOUT + std::time::Duration::from_secs(5),
            silent.read(&mut buf),
        )
        .await
        .expect("the server closes a silent connection");
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "closed without an answer: {read:?}"
        );
        assert!(started.elapsed() >= OPS_HEADER_READ_TIMEOUT - std::time::Duration::from_secs(1));
        assert_eq!(
            get(server.local_addr, "/healthz").await.0,
            200,
            "others are still served"
        );
    }

    #[tokio::test]
    async fn two_addresses_split_metrics_from_health_and_stop_together() {
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let servers = start_ops_servers(
            loopback(),
            SocketAddr::from(([127, 0, 0, 2], 0)),
            MetricsRegistry::new("0.0.0-test"),
            HealthState::new(),
            async move {
                let _ = stop_rx.await;
            },
        )
        .await
        .unwrap();
        assert_ne!(servers.metrics_addr, servers.health_addr);
        assert_eq!(get(servers.metrics_addr, "/metrics").await.0, 200);
        assert_eq!(get(servers.metrics_addr, "/healthz").await.0, 404);
        assert_eq!(get(servers.health_addr, "/healthz").await.0, 200);
        assert_eq!(get(servers.health_addr, "/metrics").await.0, 404);

        stop_tx.send(()).unwrap();
        servers.wait().await.unwrap();
    }

    #[tokio::test]
    async fn bind_failure_names_the_address() {
        let taken = TcpListener::bind(loopback()).await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = start_ops_servers(
            loopback(),
            addr,
            MetricsRegistry::empty(),
            HealthState::new(),
            std::future::pending(),
        )
        .await
        .expect_err("port is taken");
        let message = err.to_string();
        assert!(
            message.contains(&format!("cannot bind health endpoint on {addr}")),
            "{message}"
        );
    }
}
