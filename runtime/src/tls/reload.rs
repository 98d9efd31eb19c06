//! Hot reload of TLS certificate files.
//!
//! Owns: holding the current config behind an [`ArcSwap`] so each new handshake picks up the
//! latest one while established connections keep theirs, and a polling watcher that re-reads
//! the files, rebuilds on change, and keeps the old config (with one warning per bad content)
//! when the new files are unusable — e.g. while a Secret volume update has replaced the
//! certificate but not yet the key. Polling content rather than inotify works through the
//! symlink swaps Kubernetes uses for Secret volumes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use chrono::{DateTime, Utc};
use rustls::{ClientConfig, ServerConfig};
use sha2::{Digest, Sha256};

use super::{
    client_config_from_pem, server_config_from_pem, ClientTlsOptions, LoadedTls, PemInput,
    ServerTlsOptions, TlsError,
};

/// Contents of a set of files, read once so that the digest and the built config always
/// describe the same bytes.
pub struct FileSet {
    files: BTreeMap<PathBuf, Vec<u8>>,
}

impl FileSet {
    /// Read every path; the first unreadable file is the error.
    pub fn read(paths: &[PathBuf]) -> Result<Self, TlsError> {
        let mut files = BTreeMap::new();
        for path in paths {
            let bytes = std::fs::read(path).map_err(|source| TlsError::ReadFile {
                path: path.clone(),
                source,
            })?;
            files.insert(path.clone(), bytes);
        }
        Ok(Self { files })
    }

    /// The bytes of `path` (empty if it was not part of the set).
    pub fn get(&self, path: &Path) -> &[u8] {
        self.files.get(path).map(Vec::as_slice).unwrap_or_default()
    }

    fn digest(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        for (path, bytes) in &self.files {
            h.update(path.as_os_str().as_encoded_bytes());
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        }
        h.finalize().into()
    }
}

/// A description of TLS files that can be (re)built into a config.
pub trait TlsFiles: Clone + Send + Sync + 'static {
    /// The rustls config type produced.
    type Config: Send + Sync + 'static;
    /// Every file the config is built from.
    fn paths(&self) -> Vec<PathBuf>;
    /// Build from already-read file contents.
    fn build(&self, files: &FileSet) -> Result<LoadedTls<Self::Config>, TlsError>;
}

fn origin(path: &Path) -> String {
    path.display().to_string()
}

impl TlsFiles for ServerTlsOptions {
    type Config = ServerConfig;

    fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.side.cert_path.clone(), self.side.key_path.clone()];
        paths.extend(self.side.client_ca_path.clone());
        paths
    }

    fn build(&self, files: &FileSet) -> Result<LoadedTls<ServerConfig>, TlsError> {
        let cert_origin = origin(&self.side.cert_path);
        let key_origin = origin(&self.side.key_path);
        let ca_origin = self.side.client_ca_path.as_deref().map(origin);
        let ca = self
            .side
            .client_ca_path
            .as_ref()
            .zip(ca_origin.as_deref())
            .map(|(p, o)| PemInput::new(o, files.get(p)));
        server_config_from_pem(
            PemInput::new(&cert_origin, files.get(&self.side.cert_path)),
            PemInput::new(&key_origin, files.get(&self.side.key_path)),
            ca,
            self.side.client_auth,
            &self.alpn,
            self.policy.clone(),
        )
    }
}

impl TlsFiles for ClientTlsOptions {
    type Config = ClientConfig;

    fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.side.ca_path.clone()];
        if let Some(id) = &self.side.identity {
            paths.push(id.cert_path.clone());
            paths.push(id.key_path.clone());
        }
        paths
    }

    fn build(&self, files: &FileSet) -> Result<LoadedTls<ClientConfig>, TlsError> {
        let ca_origin = origin(&self.side.ca_path);
        let id_origins = self
            .side
            .identity
            .as_ref()
            .map(|id| (origin(&id.cert_path), origin(&id.key_path)));
        let identity = self.side.identity.as_ref().zip(id_origins.as_ref()).map(
            |(id, (cert_origin, key_origin))| {
                (
                    PemInput::new(cert_origin, files.get(&id.cert_path)),
                    PemInput::new(key_origin, files.get(&id.key_path)),
                )
            },
        );
        client_config_from_pem(
            PemInput::new(&ca_origin, files.get(&self.side.ca_path)),
            identity,
            &self.alpn,
            self.policy.clone(),
        )
    }
}

/// What a reload attempt did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The files are byte-for-byte what is loaded; nothing was rebuilt.
    Unchanged,
    /// The files changed and the new config is now current.
    Reloaded,
}

struct Snapshot<C> {
    loaded: LoadedTls<C>,
    digest: [u8; 32],
}

struct Inner<F: TlsFiles> {
    files: F,
    current: ArcSwap<Snapshot<F::Config>>,
    /// Message of the last failed attempt, so the watcher warns once per distinct problem.
    last_failure: Mutex<Option<String>>,
}

/// A TLS config that follows its files: [`current`](Self::current) for each new handshake,
/// [`spawn_watcher`](Self::spawn_watcher) to poll for changes. Cloning shares the state.
pub struct ReloadingConfig<F: TlsFiles> {
    inner: Arc<Inner<F>>,
}

impl<F: TlsFiles> Clone for ReloadingConfig<F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// A [`ReloadingConfig`] that does not keep it alive ([`ReloadingConfig::downgrade`]).
pub struct WeakReloadingConfig<F: TlsFiles> {
    inner: Weak<Inner<F>>,
}

impl<F: TlsFiles> WeakReloadingConfig<F> {
    /// The config, if any clone of it is still alive.
    pub fn upgrade(&self) -> Option<ReloadingConfig<F>> {
        self.inner.upgrade().map(|inner| ReloadingConfig { inner })
    }
}

/// Server config that reloads its certificate, key and client CA files.
pub type ReloadingServerConfig = ReloadingConfig<ServerTlsOptions>;
/// Client config that reloads its CA, certificate and key files.
pub type ReloadingClientConfig = ReloadingConfig<ClientTlsOptions>;

impl<F: TlsFiles> ReloadingConfig<F> {
    /// Load the files now; fails if they do not make a valid config.
    pub fn load(files: F) -> Result<Self, TlsError> {
        let set = FileSet::read(&files.paths())?;
        let loaded = files.build(&set)?;
        Ok(Self {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(Snapshot {
                    loaded,
                    digest: set.digest(),
                }),
                files,
                last_failure: Mutex::new(None),
            }),
        })
    }

    /// The config to use for a new handshake.
    pub fn current(&self) -> Arc<F::Config> {
        self.inner.current.load().loaded.config.clone()
    }

    /// Earliest `notAfter` of the certificates currently presented (None if none are).
    pub fn not_after(&self) -> Option<DateTime<Utc>> {
        self.inner.current.load().loaded.not_after
    }

    /// Fingerprint (SHA-256, uppercase hex) of the leaf certificate currently presented.
    pub fn leaf_fingerprint(&self) -> Option<String> {
        self.inner.current.load().loaded.leaf_fingerprint.clone()
    }

    /// A handle for background tasks that does not keep this config alive.
    pub fn downgrade(&self) -> WeakReloadingConfig<F> {
        WeakReloadingConfig {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// The file description this config is built from.
    pub fn files(&self) -> &F {
        &self.inner.files
    }

    /// Re-read the files and swap in a new config if they changed. On error the current
    /// config stays in place.
    pub fn reload(&self) -> Result<ReloadOutcome, TlsError> {
        self.inner.reload()
    }

    /// Poll the files every `interval` on the tokio runtime and reload on change. Bad files
    /// are logged once (warn) and the old config is kept. The task ends once every
    /// [`ReloadingConfig`] clone is dropped; abort the handle to stop it earlier.
    pub fn spawn_watcher(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner<F>> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                if let Err(err) = inner.reload() {
                    let msg = err.to_string();
                    let mut last = inner.last_failure.lock().unwrap_or_else(|p| p.into_inner());
                    if last.as_deref() != Some(msg.as_str()) {
                        tracing::warn!(error = %msg, "TLS files changed but cannot be loaded; keeping the previous configuration");
                        *last = Some(msg);
                    }
                }
            }
        })
    }
}

impl<F: TlsFiles> Inner<F> {
    fn reload(&self) -> Result<ReloadOutcome, TlsError> {
        let set = FileSet::read(&self.files.paths())?;
        let digest = set.digest();
        if digest == self.current.load().digest {
            return Ok(ReloadOutcome::Unchanged);
        }
        let loaded = self.files.build(&set)?;
        tracing::info!(
            files = ?self.files.paths(),
            leaf_fingerprint = loaded.leaf_fingerprint.as_deref().unwrap_or("-"),
            not_after = ?loaded.not_after,
            "reloaded TLS configuration"
        );
        self.current.store(Arc::new(Snapshot { loaded, digest }));
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Ok(ReloadOutcome::Reloaded)
    }
}

impl ReloadingServerConfig {
    /// A tokio-rustls acceptor over the current config (take one per accepted connection).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current())
    }
}

impl ReloadingClientConfig {
    /// A tokio-rustls connector over the current config (take one per connection attempt).
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.current())
    }
}
