//! The process's own resource use on `/metrics`, under the names every Prometheus client library
//! exports (and upstream argocd-agent's Go binaries serve): `process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds` and `process_start_time_seconds`.
//!
//! Owns [`ProcessCollector`], which reads `/proc/self` (through the `procfs` crate) on each scrape.
//! A figure that cannot be read (not Linux, a restricted `/proc`) is left out of that scrape
//! rather than failing it.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Reads the process's figures on each scrape (see the module docs).
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// One scrape's figures; `None` where `/proc` did not say.
#[derive(Debug, Default, PartialEq)]
struct Figures {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<i64>,
    virtual_bytes: Option<i64>,
    start_time_seconds: Option<f64>,
    open_fds: Option<i64>,
    max_fds: Option<i64>,
}

impl Figures {
    fn read() -> Figures {
        let Ok(me) = procfs::process::Process::myself() else {
            return Figures::default();
        };
        let mut figures = Figures::default();
        if let Ok(stat) = me.stat() {
            let ticks = procfs::ticks_per_second() as f64;
            figures.cpu_seconds = Some((stat.utime + stat.stime) as f64 / ticks);
            figures.resident_bytes = Some(stat.rss as i64 * procfs::page_size() as i64);
            figures.virtual_bytes = Some(stat.vsize as i64);
            if let Ok(boot) = procfs::boot_time_secs() {
                figures.start_time_seconds = Some(boot as f64 + stat.starttime as f64 / ticks);
            }
        }
        figures.open_fds = me.fd_count().ok().map(|n| n as i64);
        figures.max_fds = me
            .limits()
            .ok()
            .and_then(|l| match l.max_open_files.soft_limit {
                procfs::process::LimitValue::Value(v) => Some(v as i64),
                procfs::process::LimitValue::Unlimited => None,
            });
        figures
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let f = Figures::read();
        if let Some(v) = f.cpu_seconds {
            let counter = ConstCounter::new(v);
            counter.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                counter.metric_type(),
            )?)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                f.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                f.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                f.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                f.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let gauge = ConstGauge::new(v);
                gauge.encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    gauge.metric_type(),
                )?)?;
            }
        }
        if let Some(v) = f.start_time_seconds {
            let gauge = ConstGauge::new(v);
            gauge.encode(encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                None,
                gauge.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_are_this_processs() {
        let f = Figures::read();
        let rss = f.resident_bytes.expect("resident memory");
        assert!(rss > 1 << 20, "{rss}");
        assert!(f.virtual_bytes.expect("virtual memory") >= rss);
        assert!(f.open_fds.expect("open fds") >= 3);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = f.start_time_seconds.expect("start time");
        assert!(
            started <= now + 1.0 && started > now - 3600.0,
            "{started} vs {now}"
        );
        // Burn some CPU: the counter moves.
        let before = f.cpu_seconds.expect("cpu");
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(200) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(Figures::read().cpu_seconds.unwrap() > before);
    }
}
