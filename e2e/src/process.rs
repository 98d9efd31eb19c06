//! Lifecycle of every child process a test starts (etcd, kube-apiserver, redis-server, the project's
//! binaries) and of the temporary directories they use.
//!
//! Guarantees, so that no test run leaves orphans behind:
//! - children are forked from one long-lived spawner thread with `PR_SET_PDEATHSIG=SIGKILL`, so the
//!   kernel kills them if the test process dies for any reason (the signal follows the forking
//!   *thread*, hence the dedicated thread rather than the test's own);
//! - a registry of live children and temporary directories is cleaned at `exit()` (the test harness
//!   exits through it, also after panics) and on SIGINT/SIGTERM/SIGHUP;
//! - a [`ManagedProcess`] stops its child when dropped and, if the test is panicking, prints the tail
//!   of the child's log first.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

/// Every path this harness creates contains this marker, so leftovers are easy to find with `pgrep -f`.
pub const MARKER: &str = "argocd-agent-e2e";

/// How to start a child process; kept so the process can be restarted identically.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// Short name used in logs and failure output.
    pub name: String,
    /// The executable.
    pub program: PathBuf,
    /// Arguments.
    pub args: Vec<OsString>,
    /// Extra environment variables.
    pub env: Vec<(OsString, OsString)>,
    /// Where stdout and stderr go (appended, so restarts keep history).
    pub log: PathBuf,
}

impl ProcessSpec {
    /// A spec with no arguments yet, logging to `log`.
    pub fn new(
        name: impl Into<String>,
        program: impl Into<PathBuf>,
        log: impl Into<PathBuf>,
    ) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            log: log.into(),
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable.
    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
}

#[derive(Default)]
struct Registry {
    /// pid -> name of every child that has not been stopped yet.
    children: BTreeMap<u32, String>,
    /// Temporary directories to remove at exit.
    dirs: Vec<PathBuf>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
static HOOKS: Once = Once::new();

fn with_registry<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut guard = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(Registry::default))
}

extern "C" fn cleanup_at_exit() {
    cleanup_everything();
}

fn install_hooks() {
    HOOKS.call_once(|| {
        // SAFETY: registering a plain extern "C" function with no captured state.
        unsafe {
            libc::atexit(cleanup_at_exit);
        }
        let _ = ctrlc::set_handler(|| {
            eprintln!(
                "[e2e] interrupted: stopping child processes and removing temporary directories"
            );
            cleanup_everything();
            std::process::exit(130);
        });
    });
}

/// Kills every registered child (SIGTERM to its process group, SIGKILL after a grace period) and
/// removes every registered temporary directory. Idempotent.
pub fn cleanup_everything() {
    let (children, dirs) =
        with_registry(|r| (std::mem::take(&mut r.children), std::mem::take(&mut r.dirs)));
    for pid in children.keys() {
        signal_group(*pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    for pid in children.keys() {
        while process_alive(*pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if process_alive(*pid) {
            signal_group(*pid, libc::SIGKILL);
        }
    }
    for dir in dirs {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn signal_group(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a pid/process group we started; errors (ESRCH) are harmless.
    unsafe {
        libc::kill(-(pid as libc::pid_t), sig);
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// True while `pid` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // Field 3 (after the parenthesised command name) is the state; Z = zombie, X = dead.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("e2e-spawner".into())
            .spawn(move || {
                // Lives as long as the process: PDEATHSIG fires when this thread exits.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("start e2e spawner thread");
        Mutex::new(tx)
    })
}

fn spawn_child(spec: &ProcessSpec) -> io::Result<Child> {
    install_hooks();
    if let Some(parent) = spec.log.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let log = File::options().create(true).append(true).open(&spec.log)?;
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            libc::setpgid(0, 0);
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, tx))
        .map_err(|_| io::Error::other("e2e spawner thread is gone"))?;
    let child = rx
        .recv()
        .map_err(|_| io::Error::other("e2e spawner thread did not answer"))??;
    with_registry(|r| r.children.insert(child.id(), spec.name.clone()));
    Ok(child)
}

/// A child process owned by a test: stopped on drop, restartable, with its log kept on disk.
pub struct ManagedProcess {
    spec: ProcessSpec,
    child: Option<Child>,
}

impl ManagedProcess {
    /// Starts the process described by `spec`.
    pub fn spawn(spec: ProcessSpec) -> anyhow::Result<Self> {
        let child = spawn_child(&spec).map_err(|e| {
            anyhow::anyhow!(
                "failed to start {} ({}): {e}",
                spec.name,
                spec.program.display()
            )
        })?;
        Ok(Self {
            spec,
            child: Some(child),
        })
    }

    /// The component's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The pid of the running child, if any.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Path of the combined stdout/stderr log.
    pub fn log_path(&self) -> &Path {
        &self.spec.log
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        log_tail(&self.spec.log, n)
    }

    /// The whole log ("" if unreadable), for a failure that needs more than the tail.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.spec.log).unwrap_or_default()
    }

    /// Graceful stop: SIGTERM, then SIGKILL after 5 s.
    pub fn stop(&mut self) {
        self.terminate(libc::SIGTERM, Duration::from_secs(5));
    }

    /// SIGTERM, then SIGKILL after `grace`; whether the process exited by itself within `grace`
    /// (false also when it was not running).
    pub fn stop_within(&mut self, grace: Duration) -> bool {
        self.terminate(libc::SIGTERM, grace)
    }

    /// Immediate SIGKILL, as a crash would be (fault injection).
    pub fn kill(&mut self) {
        self.terminate(libc::SIGKILL, Duration::from_secs(5));
    }

    /// Freezes the process where it is (SIGSTOP to its process group), as a starved or
    /// debugged process: it holds its connections and does nothing until [`resume`](Self::resume).
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            signal_group(pid, libc::SIGSTOP);
        }
    }

    /// Lets a [`pause`](Self::pause)d process run again (SIGCONT).
    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            signal_group(pid, libc::SIGCONT);
        }
    }

    /// Stops (gracefully) and starts the same command again; the log is appended to.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        let child = spawn_child(&self.spec)
            .map_err(|e| anyhow::anyhow!("failed to restart {}: {e}", self.spec.name))?;
        self.child = Some(child);
        Ok(())
    }

    /// Starts the process again after [`stop`](Self::stop) or [`kill`](Self::kill).
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "{} is still running", self.spec.name);
        self.child = Some(
            spawn_child(&self.spec)
                .map_err(|e| anyhow::anyhow!("failed to start {}: {e}", self.spec.name))?,
        );
        Ok(())
    }

    /// Sends `sig` to the process group, SIGKILL after `grace`; whether it exited within `grace`.
    fn terminate(&mut self, sig: libc::c_int, grace: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        let pid = child.id();
        signal_group(pid, sig);
        // A paused process handles the signal only once it runs again.
        signal_group(pid, libc::SIGCONT);
        let deadline = Instant::now() + grace;
        let exited = loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break true,
                Ok(None) if Instant::now() >= deadline => {
                    signal_group(pid, libc::SIGKILL);
                    let _ = child.wait();
                    break false;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        with_registry(|r| r.children.remove(&pid));
        exited
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log_tail(&self.spec.name, &self.spec.log, 40);
        }
        self.stop();
    }
}

/// The last `n` lines of a log file ("" if unreadable).
pub fn log_tail(path: &Path, n: usize) -> String {
    let Ok(f) = File::open(path) else {
        return String::new();
    };
    let lines: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}

/// Prints the tail of a component's log to stderr, framed so it stands out in test output.
pub fn print_log_tail(name: &str, path: &Path, n: usize) {
    eprintln!("----- last {n} lines of {name} ({}) -----", path.display());
    eprintln!("{}", log_tail(path, n));
    eprintln!("----- end of {name} -----");
}

/// A fresh directory for this test process, removed at exit. Prefers /dev/shm (tmpfs: etcd fsyncs
/// are free there) and falls back to the system temp dir.
pub fn temp_dir(label: &str) -> anyhow::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    install_hooks();
    let base = BASE.get_or_init(|| {
        let root = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let base = root.join(format!("{MARKER}-{}", std::process::id()));
        with_registry(|r| r.dirs.push(base.clone()));
        base
    });
    let dir = base.join(format!(
        "{label}-{}",
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("create {}: {e}", dir.display()))?;
    Ok(dir)
}
