//! Operational telemetry shared by the binaries.
//!
//! Owns: log set-up ([`init_logging`], [`LogFormat`]), trace export ([`traces`]), the Prometheus
//! registry the binaries register their metrics into ([`MetricsRegistry`], with the process's own
//! figures from [`ProcessCollector`]), liveness/readiness
//! state ([`HealthState`]), the HTTP server for `/metrics`, `/healthz` and `/readyz`
//! ([`ops_router`], [`serve_ops`], [`start_ops_servers`]) and process shutdown signals. It does
//! not own any metric of a particular subsystem: those are declared next to the code that updates
//! them and registered here.

mod health;
mod metrics;
mod ops_server;
mod process_metrics;
pub mod traces;

use std::net::SocketAddr;

pub use health::HealthState;
pub use metrics::{MetricsRegistry, BUILD_INFO_METRIC};
pub use ops_server::{
    health_router, metrics_router, ops_router, serve_ops, shutdown_signal, start_ops_servers,
    OpsServer, OpsServers, HA_STATE_HEADER, OPENMETRICS_CONTENT_TYPE,
};
pub use process_metrics::ProcessCollector;

/// Failures of the operational scaffolding.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The log filter given to `--log-level` is not understood.
    #[error(
        "invalid log level filter {filter:?}: {reason}; use a level (trace, debug, info, warn, error, off) \
         or per-target directives such as \"argocd_agent_principal=debug,info\""
    )]
    InvalidLogFilter {
        /// The filter as given.
        filter: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A global tracing subscriber was already installed in this process.
    #[error("logging is already initialised in this process: {0}")]
    LoggingAlreadyInitialised(String),
    /// An ops endpoint could not bind its address.
    #[error("cannot bind {purpose} endpoint on {addr}: {source}")]
    Bind {
        /// What the listener serves ("metrics", "health", "metrics and health").
        purpose: String,
        /// The address that failed to bind.
        addr: SocketAddr,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The OTLP trace exporter could not be set up.
    #[error(transparent)]
    TraceExport(#[from] traces::TraceExportError),
    /// Installing a handler for SIGTERM/Ctrl-C failed.
    #[error("cannot install shutdown signal handler: {0}")]
    Signal(std::io::Error),
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

const LEVEL_NAMES: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Parses a log filter such as `info`, `debug` or `argocd_agent_principal=debug,info`.
///
/// Stricter than `EnvFilter` alone: a directive without `=` must be a level name, so a typo such as
/// `inf` is rejected instead of silently becoming a target name that matches nothing.
pub fn parse_log_filter(
    level_filter: &str,
) -> Result<tracing_subscriber::EnvFilter, TelemetryError> {
    let invalid = |reason: String| TelemetryError::InvalidLogFilter {
        filter: level_filter.to_string(),
        reason,
    };
    if level_filter.trim().is_empty() {
        return Err(invalid("it is empty".to_string()));
    }
    for directive in level_filter.split(',').map(str::trim) {
        if directive.is_empty() {
            return Err(invalid("it contains an empty directive".to_string()));
        }
        let level = match directive.rsplit_once('=') {
            Some((_, level)) => level,
            None => directive,
        };
        if !LEVEL_NAMES.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(invalid(format!("{level:?} is not a log level")));
        }
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(level_filter)
        .map_err(|e| invalid(e.to_string()))
}

/// Installs the process-wide tracing subscriber writing to stderr in `format`, filtered by
/// `level_filter` (see [`parse_log_filter`]); with `otlp = Some((address, service))` spans are also
/// exported over OTLP/gRPC (keep the returned [`traces::TraceExport`] alive: dropping it flushes).
/// Call it inside the Tokio runtime.
pub fn init_logging(
    format: LogFormat,
    level_filter: &str,
    otlp: Option<(&str, &'static str)>,
) -> Result<Option<traces::TraceExport>, TelemetryError> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = parse_log_filter(level_filter)?;
    // Colour codes only for a human at a terminal, never in collected container logs.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    };
    let (export, otel) = match otlp {
        Some((address, service)) => {
            let (export, layer) = traces::TraceExport::start(address, service)?;
            (Some(export), Some(layer))
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|e| TelemetryError::LoggingAlreadyInitialised(e.to_string()))?;
    Ok(export)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_filter_accepts_levels_and_target_directives() {
        for ok in [
            "info",
            "debug",
            "WARN",
            "argocd_agent_principal=debug,info",
            "off",
        ] {
            parse_log_filter(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn log_filter_rejects_typos_and_empty_directives() {
        for bad in ["", "inf", "info,", "argocd_agent_principal=loud"] {
            let err = parse_log_filter(bad).expect_err(bad).to_string();
            assert!(err.contains("invalid log level filter"), "{err}");
        }
    }
}
