//! File-based PKI storage: one directory holding the CA, the principal's and resource
//! proxy's server certificates, agent client certificates and the JWT signing key.
//!
//! Layout (what `argocd-agentctl pki ... --dir D` writes and the e2e suite consumes):
//! `ca.crt`, `ca.key`, `principal.crt/key`, `resource-proxy.crt/key`, `agents/<name>.crt/key`,
//! `jwt.key`. Private keys are written with mode 0600, certificates 0644, new directories
//! 0700. Every file is written to a temporary name and renamed into place, so a process
//! watching the files (TLS hot reload) never sees a half-written file.

use std::io::Write;
use std::path::{Path, PathBuf};

use argocd_agent_proto::identity::AgentName;

use super::{CertRole, CertificateAuthority, IssuedCert, PkiError};

/// CA certificate file name.
pub const CA_CERT_FILE: &str = "ca.crt";
/// CA key file name.
pub const CA_KEY_FILE: &str = "ca.key";
/// JWT signing key file name.
pub const JWT_KEY_FILE: &str = "jwt.key";
/// Sub-directory holding agent client certificates.
pub const AGENTS_DIR: &str = "agents";

const KEY_MODE: u32 = 0o600;
const CERT_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o700;

/// Paths of a certificate and its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    /// Certificate (PEM).
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
}

/// A PKI directory.
#[derive(Clone, Debug)]
pub struct PkiDirectory {
    root: PathBuf,
}

impl PkiDirectory {
    /// Use `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the CA lives.
    pub fn ca_files(&self) -> CertFiles {
        CertFiles {
            cert: self.root.join(CA_CERT_FILE),
            key: self.root.join(CA_KEY_FILE),
        }
    }

    /// Where the certificate for `role` lives.
    pub fn role_files(&self, role: &CertRole) -> CertFiles {
        let (dir, stem) = match role {
            CertRole::Principal => (self.root.clone(), "principal"),
            CertRole::ResourceProxy => (self.root.clone(), "resource-proxy"),
            CertRole::Agent(name) => (self.root.join(AGENTS_DIR), name.as_str()),
        };
        CertFiles {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
        }
    }

    /// Where the JWT signing key lives.
    pub fn jwt_key_path(&self) -> PathBuf {
        self.root.join(JWT_KEY_FILE)
    }

    /// Load the CA; [`PkiError::CaNotInitialized`] if `ca.crt` does not exist.
    pub fn load_ca(&self) -> Result<CertificateAuthority, PkiError> {
        let files = self.ca_files();
        if !files.cert.exists() {
            return Err(PkiError::CaNotInitialized {
                location: self.root.display().to_string(),
            });
        }
        let cert = read_to_string(&files.cert)?;
        let key = read_to_string(&files.key)?;
        CertificateAuthority::from_pem_labelled(
            &cert,
            &files.cert.display().to_string(),
            &key,
            &files.key.display().to_string(),
        )
    }

    /// Write the CA's certificate and key.
    pub fn store_ca(
        &self,
        ca: &CertificateAuthority,
        overwrite: bool,
    ) -> Result<CertFiles, PkiError> {
        let files = self.ca_files();
        write_pair(&files, ca.cert_pem(), &ca.key_pem(), overwrite)?;
        Ok(files)
    }

    /// Write an issued certificate and key for `role`.
    pub fn store_issued(
        &self,
        role: &CertRole,
        issued: &IssuedCert,
        overwrite: bool,
    ) -> Result<CertFiles, PkiError> {
        let files = self.role_files(role);
        write_pair(&files, &issued.cert_pem, &issued.key_pem, overwrite)?;
        Ok(files)
    }

    /// Write the JWT signing key.
    pub fn store_jwt_key(&self, key_pem: &str, overwrite: bool) -> Result<PathBuf, PkiError> {
        let path = self.jwt_key_path();
        refuse_existing(&[&path], overwrite)?;
        write_atomic(&path, key_pem.as_bytes(), KEY_MODE)?;
        Ok(path)
    }

    /// The certificate PEM for `role`, if present.
    pub fn read_cert(&self, role: &CertRole) -> Result<Option<String>, PkiError> {
        let path = self.role_files(role).cert;
        if !path.exists() {
            return Ok(None);
        }
        read_to_string(&path).map(Some)
    }

    /// Agents that have a client certificate in `agents/`, sorted by name.
    pub fn agents(&self) -> Result<Vec<AgentName>, PkiError> {
        let dir = self.root.join(AGENTS_DIR);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(PkiError::Io { path: dir, source }),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| PkiError::Io {
                path: dir.clone(),
                source,
            })?;
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("crt") {
                continue;
            }
            if let Some(name) = path
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| AgentName::new(s).ok())
            {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }
}

fn read_to_string(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|source| PkiError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn refuse_existing(paths: &[&Path], overwrite: bool) -> Result<(), PkiError> {
    if overwrite {
        return Ok(());
    }
    match paths.iter().find(|p| p.exists()) {
        Some(p) => Err(PkiError::AlreadyExists {
            location: p.display().to_string(),
        }),
        None => Ok(()),
    }
}

fn write_pair(files: &CertFiles, cert: &str, key: &str, overwrite: bool) -> Result<(), PkiError> {
    refuse_existing(&[&files.cert, &files.key], overwrite)?;
    // Key first: a watcher that sees the new certificate then finds its key already there.
    write_atomic(&files.key, key.as_bytes(), KEY_MODE)?;
    write_atomic(&files.cert, cert.as_bytes(), CERT_MODE)
}

fn create_dirs(dir: &Path) -> Result<(), PkiError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, DIR_MODE);
    builder.create(dir).map_err(|source| PkiError::Io {
        path: dir.to_path_buf(),
        source,
    })
}

/// Write `contents` to a temporary file with `mode` in the same directory, then rename it
/// over `path`.
fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), PkiError> {
    let io = |source| PkiError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    create_dirs(dir)?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let result = (|| {
        let mut file = options.open(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::days;

    #[test]
    fn layout_modes_and_refusal_to_overwrite() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PkiDirectory::new(tmp.path().join("pki"));
        assert!(matches!(
            dir.load_ca(),
            Err(PkiError::CaNotInitialized { .. })
        ));
        let ca = CertificateAuthority::generate("test-ca", days(30)).unwrap();
        let files = dir.store_ca(&ca, false).unwrap();
        assert_eq!(files.cert, tmp.path().join("pki/ca.crt"));
        assert!(matches!(
            dir.store_ca(&ca, false),
            Err(PkiError::AlreadyExists { .. })
        ));
        dir.store_ca(&ca, true).unwrap();

        let agent = AgentName::new("spoke1").unwrap();
        let issued = ca.issue_agent(&agent, days(1)).unwrap();
        let files = dir
            .store_issued(&CertRole::Agent(agent.clone()), &issued, false)
            .unwrap();
        assert_eq!(files.key, tmp.path().join("pki/agents/spoke1.key"));
        assert_eq!(dir.agents().unwrap(), vec![agent]);

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&files.key), 0o600);
            assert_eq!(mode(&dir.ca_files().key), 0o600);
            assert_eq!(mode(&files.cert), 0o644);
        }

        let loaded = dir.load_ca().unwrap();
        assert_eq!(loaded.cert_pem(), ca.cert_pem());
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(dir.root())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty());
    }
}
