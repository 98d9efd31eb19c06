//! The process-wide Prometheus registry.
//!
//! Owns: [`MetricsRegistry`], a cheap-clone handle around one `prometheus_client` registry that any
//! component registers its metrics into (metrics are declared next to the code that updates them),
//! and the `argocd_agent_build_info` gauge and `process_*` figures every binary exports.

use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Metric;
use prometheus_client::registry::Registry;

/// Name of the build information gauge (value 1, label `version`).
pub const BUILD_INFO_METRIC: &str = "argocd_agent_build_info";

/// Shared handle to the registry served on `/metrics`.
#[derive(Debug, Clone)]
pub struct MetricsRegistry {
    registry: Arc<Mutex<Registry>>,
}

impl MetricsRegistry {
    /// A registry holding `argocd_agent_build_info{version="<version>"} 1` and the process's
    /// `process_*` figures ([`super::ProcessCollector`]).
    pub fn new(version: &str) -> Self {
        let this = Self::empty();
        let build_info = Family::<Vec<(String, String)>, Gauge>::default();
        build_info
            .get_or_create(&vec![("version".to_string(), version.to_string())])
            .set(1);
        this.register(
            BUILD_INFO_METRIC,
            "Build information of this argocd-agent binary; the value is always 1",
            build_info,
        );
        this.lock()
            .register_collector(Box::new(super::ProcessCollector));
        this
    }

    /// A registry with no metrics at all.
    pub fn empty() -> Self {
        Self {
            registry: Arc::new(Mutex::new(Registry::default())),
        }
    }

    /// Registers `metric` under `name`. Keep the handle to `metric` (metrics are cheap clones of
    /// shared atomics) and update that. Counters get the `_total` suffix added on exposition.
    pub fn register(&self, name: impl Into<String>, help: impl Into<String>, metric: impl Metric) {
        self.lock().register(name, help, metric);
    }

    /// Gives `f` the underlying registry, for anything [`MetricsRegistry::register`] does not cover
    /// (units, sub-registries, collectors). Do not block inside `f`.
    pub fn with_registry<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        f(&mut self.lock())
    }

    /// Encodes every registered metric in the OpenMetrics text format (ending in `# EOF`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode(&mut out, &self.lock())?;
        Ok(out)
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Registration and encoding never leave the registry half-updated on panic.
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn build_info_carries_the_version() {
        let text = MetricsRegistry::new("1.2.3").encode().unwrap();
        assert!(
            text.contains("argocd_agent_build_info{version=\"1.2.3\"} 1"),
            "{text}"
        );
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
        ] {
            assert!(text.lines().any(|l| l.starts_with(name)), "{name}:\n{text}");
        }
    }

    #[test]
    fn metrics_registered_through_a_clone_are_exposed() {
        let registry = MetricsRegistry::empty();
        let counter = Counter::<u64>::default();
        registry.clone().register(
            "argocd_agent_connections",
            "Connections made",
            counter.clone(),
        );
        counter.inc_by(3);
        let text = registry.encode().unwrap();
        assert!(text.contains("argocd_agent_connections_total 3"), "{text}");
    }
}
