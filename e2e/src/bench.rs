//! What the benchmark binaries share: the `--count` argument and other flags, percentiles of
//! latency samples, when objects arrive in a watch, process CPU/RSS readings (settled, and the peak
//! under an attack, [`RssUnderAttack`]) from `/proc`, the
//! open-file limit, the charts' font, and the common set-up (a hub and a spoke plane, a PKI with an
//! agent certificate `bench`, and a principal on the hub).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{watcher, WatchStreamExt};

use crate::control_plane::ControlPlane;
use crate::gateway::{text, Pki, Principal};

/// The value after `--count`, or `default`.
pub fn count_arg(default: usize) -> anyhow::Result<usize> {
    Ok(std::env::args()
        .skip_while(|a| a != "--count")
        .nth(1)
        .map(|c| c.parse())
        .transpose()?
        .unwrap_or(default))
}

/// The `p` percentile (0.0..=1.0) of already sorted, non-empty samples (nearest rank).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// When each object of a watched namespace first satisfied a predicate (by name).
#[derive(Clone, Default)]
pub struct Arrivals(Arc<Mutex<HashMap<String, Instant>>>);

impl Arrivals {
    /// Watches `api` in the background, recording when each object first satisfies `pred`.
    pub fn watch(api: Api<DynamicObject>, pred: fn(&serde_json::Value) -> bool) -> Arrivals {
        let arrivals = Arrivals::default();
        let out = arrivals.clone();
        tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(obj)) = stream.next().await {
                let now = Instant::now();
                let v = serde_json::to_value(&obj).unwrap_or_default();
                if pred(&v) {
                    out.0
                        .lock()
                        .unwrap()
                        .entry(text(&v, "/metadata/name"))
                        .or_insert(now);
                }
            }
        });
        arrivals
    }

    /// When `name` arrived, waiting for it at most `timeout`.
    pub async fn wait(&self, name: &str, timeout: Duration) -> anyhow::Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(t) = self.0.lock().unwrap().get(name) {
                return Ok(*t);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{name} did not arrive within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The font charts are drawn with (Debian's fonts-dejavu-core, which hack/bench.sh installs).
const CHART_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Registers [`CHART_FONT`] as plotters' `sans-serif` (plotters is built without a font loader).
pub fn register_chart_font() -> anyhow::Result<()> {
    use plotters::style::FontStyle;
    let font = std::fs::read(CHART_FONT).map_err(|e| {
        anyhow::anyhow!(
            "{CHART_FONT}: {e} (install Debian's fonts-dejavu-core; hack/bench.sh does)"
        )
    })?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("{CHART_FONT} is not a usable font"))
}

/// The value after `--<name>` (or in `--<name>=value`), if given.
pub fn flag_value(name: &str) -> Option<String> {
    let flag = format!("--{name}");
    let prefixed = format!("{flag}=");
    let args: Vec<String> = std::env::args().collect();
    args.iter().enumerate().find_map(|(i, a)| {
        if a == &flag {
            args.get(i + 1).cloned()
        } else {
            a.strip_prefix(&prefixed).map(str::to_string)
        }
    })
}

/// Whether `--<name>` is on the command line.
pub fn has_flag(name: &str) -> bool {
    let flag = format!("--{name}");
    std::env::args().any(|a| a == flag)
}

/// Resident set size of process `pid` in KiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    status_kib(pid, "VmRSS")
}

/// [`rss_kib`] once the process has settled: read every second until two readings are within 1%
/// (at most 10 s), the last reading then.
pub async fn settled_rss(pid: u32) -> anyhow::Result<u64> {
    let mut last = rss_kib(pid)?;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = rss_kib(pid)?;
        if now.abs_diff(last) * 100 <= last {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

/// A size line (`<field>: <n> kB`) of `/proc/<pid>/status`.
fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no {field} in /proc/{pid}/status"))
}

/// How much a process may grow under an attack: the bound the README's threat model states.
pub const ATTACK_RSS_BOUND_KIB: u64 = 32 * 1024;

/// A process's memory under an attack: its resident set when the attack starts and the peak
/// since (the kernel's high-water mark `VmHWM`, reset at the start through `clear_refs`, so no
/// spike between two readings is missed).
pub struct RssUnderAttack {
    pid: u32,
    attack: String,
    /// Resident set at the start, KiB.
    pub baseline: u64,
}

impl RssUnderAttack {
    /// Starts watching process `pid` (one the caller may write `/proc/<pid>/clear_refs` of).
    pub fn start(pid: u32, attack: &str) -> anyhow::Result<RssUnderAttack> {
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
        Ok(RssUnderAttack {
            pid,
            attack: attack.to_string(),
            baseline: rss_kib(pid)?,
        })
    }

    /// The peak resident set since the start, KiB.
    pub fn peak(&self) -> anyhow::Result<u64> {
        status_kib(self.pid, "VmHWM")
    }

    /// Prints `RSS under <attack>: baseline X KiB, peak Y KiB, now Z KiB` and fails when the
    /// peak is [`ATTACK_RSS_BOUND_KIB`] or more above the baseline; returns the peak.
    pub fn check_bound(&self) -> anyhow::Result<u64> {
        let peak = self.peak()?;
        let now = rss_kib(self.pid)?;
        eprintln!(
            "RSS under {}: baseline {} KiB, peak {peak} KiB (+{} KiB; bound +{ATTACK_RSS_BOUND_KIB} \
             KiB), now {now} KiB",
            self.attack,
            self.baseline,
            peak.saturating_sub(self.baseline)
        );
        anyhow::ensure!(
            peak < self.baseline + ATTACK_RSS_BOUND_KIB,
            "RSS under {} grew {} KiB, over the bound of {ATTACK_RSS_BOUND_KIB} KiB",
            self.attack,
            peak - self.baseline
        );
        Ok(peak)
    }
}

/// CPU time (user + system) process `pid` has used, from `/proc/<pid>/stat` (utime + stime).
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) start at state (field 3).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow::anyhow!("unreadable /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i)
            .ok_or_else(|| anyhow::anyhow!("short /proc/{pid}/stat"))?
            .parse::<f64>()?)
    };
    // utime is field 14, stime field 15 (1-based); `rest` starts at field 3.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks(11)? + ticks(12)?) / hz)
}

/// Raises this process's open-file limit to its hard limit (children inherit it); returns the
/// new soft limit.
pub fn raise_fd_limit() -> anyhow::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    unsafe {
        anyhow::ensure!(
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0,
            "getrlimit: {}",
            std::io::Error::last_os_error()
        );
        lim.rlim_cur = lim.rlim_max;
        anyhow::ensure!(
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0,
            "setrlimit: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(lim.rlim_cur)
}

/// The 1-minute load average and the number of CPUs, for printing next to figures.
pub fn machine_load() -> (f64, usize) {
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN);
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (load, cpus)
}

/// Hub and spoke planes with a principal on the hub, ready for an agent named `bench`.
pub struct BenchSetup {
    /// `[hub, spoke]`.
    pub planes: Vec<ControlPlane>,
    /// Working directory (logs, PKI).
    pub dir: PathBuf,
    /// The PKI (CA, principal certificate, agent `bench`).
    pub pki: Pki,
    /// The principal, logging at info.
    pub principal: Principal,
}

impl BenchSetup {
    /// Starts everything; `label` names the working directory.
    pub async fn start(label: &str) -> anyhow::Result<BenchSetup> {
        eprintln!("==> starting hub and spoke control planes");
        let planes =
            tokio::task::spawn_blocking(|| ControlPlane::start_many(&["hub", "spoke"])).await??;
        let dir = crate::process::temp_dir(label)?;
        let pki = Pki::create(&dir.join("pki"))?;
        pki.issue_agent("bench")?;
        let principal = Principal::start(
            "bench",
            &dir,
            &planes[0],
            &pki,
            "argocd",
            &["--log-level=info"],
        )
        .await?;
        Ok(BenchSetup {
            planes,
            dir,
            pki,
            principal,
        })
    }

    /// The hub plane.
    pub fn hub(&self) -> &ControlPlane {
        &self.planes[0]
    }

    /// The spoke plane.
    pub fn spoke(&self) -> &ControlPlane {
        &self.planes[1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_has_cpu_time_and_rss() {
        let pid = std::process::id();
        assert!(rss_kib(pid).unwrap() > 0);
        assert!(cpu_seconds(pid).unwrap() >= 0.0);
        assert!(rss_kib(u32::MAX).is_err());
    }

    #[test]
    fn the_peak_under_an_attack_counts_from_its_start() {
        let pid = std::process::id();
        let watch = RssUnderAttack::start(pid, "a test allocation").unwrap();
        assert!(watch.peak().unwrap() >= watch.baseline);
        // 64 MiB touched and freed: gone from VmRSS, still in the peak, over the bound.
        let big = vec![1u8; 64 << 20];
        assert_eq!(std::hint::black_box(&big)[12345], 1);
        drop(big);
        let err = watch.check_bound().unwrap_err();
        assert!(err.to_string().contains("over the bound"), "{err}");
    }

    #[test]
    fn percentile_takes_the_nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&s, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&s, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&s, 0.0), Duration::from_millis(1));
        assert_eq!(
            percentile(&[Duration::from_millis(7)], 0.99),
            Duration::from_millis(7)
        );
    }
}
