//! TLS material and keys read from Kubernetes Secrets (upstream's `--tls-secret-name`, root CA
//! and JWT key Secret flags), kept as files so the one file-based path of the processes (loading,
//! hot reload on rotation, expiry metrics, CA-rotation checks) serves Secrets too.
//!
//! Owns: which Secret field goes to which file ([`SecretFile`], [`SecretContent`], with
//! upstream's rules: a key pair from a `kubernetes.io/tls` Secret's `tls.crt`/`tls.key`, a CA
//! bundle from the named fields or from every field, one named field of any Secret), what a
//! missing Secret's message tells the user to do ([`SecretFile::with_remedy`]), the private
//! directory they are written to
//! (created `0700` with files `0600`, written atomically by rename so a reader never sees half a
//! file, removed when the [`SecretFiles`] is dropped), the first read at start-up (an unusable
//! Secret is an error that names it and says what to do), and re-reading the Secrets every
//! interval so a rotation lands in the files, where the file reloader picks it up as it would a
//! rotated Secret volume. Whether a new certificate is usable is the TLS loader's to decide.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

/// Upstream's Secret type for key pairs.
pub const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";

/// The private directory process `process` keeps its Secret-backed TLS files in (per process id,
/// under the temp directory).
pub fn private_dir_for(process: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{process}-{}-tls-secrets", std::process::id()))
}

/// The PEM line that starts a certificate.
const CERT_PEM: &[u8] = b"-----BEGIN CERTIFICATE-----";

/// What a file holds, taken from a Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretContent {
    /// `tls.crt` of a `kubernetes.io/tls` Secret.
    TlsCert,
    /// `tls.key` of a `kubernetes.io/tls` Secret.
    TlsKey,
    /// The concatenated PEM of these fields (those present that hold certificates; at least one),
    /// or of every certificate field when empty — upstream's `X509CertPoolFromSecret`, except that
    /// a field without a certificate (a CA's `tls.key`) is skipped rather than an error.
    CaBundle(Vec<String>),
    /// One named field of a Secret of any type (upstream's JWT key Secret: `jwt.key`).
    Field(String),
}

/// One file kept from one Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretFile {
    /// The Secret's name (in the process's namespace).
    pub secret: String,
    /// The flag naming the Secret, for error messages.
    pub flag: &'static str,
    /// What the file holds.
    pub content: SecretContent,
    /// Where it is written.
    pub path: PathBuf,
    /// What a "not found" message tells the user to do (see [`Self::with_remedy`]).
    pub remedy: Option<String>,
}

impl SecretFile {
    /// `content` of Secret `secret` (named by `--<flag>`), kept in `dir`.
    pub fn new(dir: &Path, flag: &'static str, secret: &str, content: SecretContent) -> Self {
        let file = match &content {
            SecretContent::TlsCert => "tls.crt",
            SecretContent::TlsKey => "tls.key",
            SecretContent::CaBundle(_) => "ca.crt",
            SecretContent::Field(field) => field.as_str(),
        };
        SecretFile {
            secret: secret.to_string(),
            flag,
            path: dir.join(secret).join(file),
            content,
            remedy: None,
        }
    }

    /// The same file, whose "not found" message says `remedy` (e.g. the command creating the
    /// Secret) instead of the generic advice.
    pub fn with_remedy(mut self, remedy: impl Into<String>) -> Self {
        self.remedy = Some(remedy.into());
        self
    }

    /// What a "not found" message says.
    fn not_found(&self) -> String {
        match &self.remedy {
            Some(remedy) => format!("not found: {remedy}"),
            None => format!(
                "not found: create it (e.g. with argocd-agentctl pki), name another with --{}, or give the PEM files instead",
                self.flag
            ),
        }
    }

    /// The file's bytes from `secret`, or why it cannot give them.
    fn extract(&self, secret: &Secret) -> Result<Vec<u8>, String> {
        let data = secret.data.clone().unwrap_or_default();
        if data.is_empty() {
            return Err("the Secret is empty".into());
        }
        let field = |name: &str| data.get(name).map(|b| b.0.clone());
        match &self.content {
            SecretContent::TlsCert | SecretContent::TlsKey => {
                if secret.type_.as_deref() != Some(TLS_SECRET_TYPE) {
                    return Err(format!(
                        "not a TLS Secret (type {:?}): create it with type {TLS_SECRET_TYPE} and fields tls.crt, tls.key",
                        secret.type_.as_deref().unwrap_or("")
                    ));
                }
                let name = if self.content == SecretContent::TlsCert {
                    "tls.crt"
                } else {
                    "tls.key"
                };
                field(name).ok_or_else(|| format!("field {name} is missing"))
            }
            SecretContent::CaBundle(fields) => {
                let mut bundle = Vec::new();
                let mut found = 0;
                for (name, bytes) in &data {
                    // Only certificates: a CA Secret's tls.key never ends up in a trust bundle.
                    let is_certificate = bytes.0.windows(CERT_PEM.len()).any(|w| w == CERT_PEM);
                    if is_certificate && (fields.is_empty() || fields.contains(name)) {
                        bundle.extend_from_slice(&bytes.0);
                        if !bytes.0.ends_with(b"\n") {
                            bundle.push(b'\n');
                        }
                        found += 1;
                    }
                }
                if found == 0 {
                    return Err(format!(
                        "none of the fields {fields:?} holds a CA certificate"
                    ));
                }
                Ok(bundle)
            }
            SecretContent::Field(name) => {
                field(name).ok_or_else(|| format!("field {name} is missing"))
            }
        }
    }
}

/// Why the Secrets could not be turned into files.
#[derive(Debug, thiserror::Error)]
pub enum SecretFilesError {
    /// A Secret could not be read or is unusable.
    #[error("--{flag}: Secret {namespace}/{secret}: {problem}")]
    Secret {
        /// The flag naming it.
        flag: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        secret: String,
        /// What is wrong and what to do.
        problem: String,
    },
    /// The private directory or a file could not be written.
    #[error("writing TLS material from Secrets to {path}: {source}")]
    Write {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Files kept from Secrets in a private directory, removed on drop.
pub struct SecretFiles {
    api: Api<Secret>,
    namespace: String,
    files: Vec<SecretFile>,
    dir: PathBuf,
}

impl SecretFiles {
    /// Reads every Secret `files` need from `namespace` and writes the files under `dir` (created
    /// private; it must be the common parent of every file).
    pub async fn materialize(
        client: kube::Client,
        namespace: &str,
        dir: &Path,
        files: Vec<SecretFile>,
    ) -> Result<SecretFiles, SecretFilesError> {
        create_private_dir(dir)?;
        let kept = SecretFiles {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            files,
            dir: dir.to_path_buf(),
        };
        kept.refresh().await?;
        for f in &kept.files {
            tracing::info!(secret = %format!("{}/{}", kept.namespace, f.secret), flag = f.flag,
                path = %f.path.display(), "TLS material from a Kubernetes Secret");
        }
        Ok(kept)
    }

    /// Reads the Secrets again and rewrites the files whose content changed.
    pub async fn refresh(&self) -> Result<(), SecretFilesError> {
        for f in &self.files {
            let problem = |problem: String| SecretFilesError::Secret {
                flag: f.flag,
                namespace: self.namespace.clone(),
                secret: f.secret.clone(),
                problem,
            };
            let secret = match self.api.get_opt(&f.secret).await {
                Ok(Some(s)) => s,
                Ok(None) => return Err(problem(f.not_found())),
                Err(e) => {
                    return Err(problem(format!(
                        "cannot be read ({e}): the service account needs get on secrets in this namespace"
                    )))
                }
            };
            let bytes = f.extract(&secret).map_err(problem)?;
            write_if_changed(&f.path, &bytes)?;
        }
        Ok(())
    }

    /// Re-reads the Secrets every `interval` until the returned task is aborted; a failure is
    /// logged once per distinct message and the files keep their last good content.
    pub fn spawn_refresh(
        self: std::sync::Arc<Self>,
        interval: Duration,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut last_failure: Option<String> = None;
            loop {
                tokio::time::sleep(interval).await;
                match self.refresh().await {
                    Ok(()) => last_failure = None,
                    Err(e) => {
                        let msg = e.to_string();
                        if last_failure.as_deref() != Some(msg.as_str()) {
                            tracing::warn!(error = %msg, "cannot re-read a TLS Secret; keeping the last good material");
                            last_failure = Some(msg);
                        }
                    }
                }
            }
        })
    }
}

/// Secret-backed files kept up to date in the background ([`keep`]); the refresh stops, and the
/// files go, when this is dropped.
pub struct KeptSecretFiles {
    refresh: tokio::task::JoinHandle<()>,
    _files: std::sync::Arc<SecretFiles>,
}

impl Drop for KeptSecretFiles {
    fn drop(&mut self) {
        self.refresh.abort();
    }
}

/// Writes `files` from their Secrets in `namespace` under `dir` and re-reads them every
/// `interval` (`None` when no file comes from a Secret).
pub async fn keep(
    client: kube::Client,
    namespace: &str,
    dir: &Path,
    files: Vec<SecretFile>,
    interval: Duration,
) -> Result<Option<KeptSecretFiles>, SecretFilesError> {
    if files.is_empty() {
        return Ok(None);
    }
    let files = std::sync::Arc::new(SecretFiles::materialize(client, namespace, dir, files).await?);
    Ok(Some(KeptSecretFiles {
        refresh: files.clone().spawn_refresh(interval),
        _files: files,
    }))
}

/// [`keep`], waiting for Secrets that are missing or unusable: while one is, `waiting` is told
/// why (every `interval`, the same error again until it changes) and the Secrets are read again
/// after `interval`. Only a file that cannot be written ends the wait with an error.
pub async fn keep_when_available(
    client: kube::Client,
    namespace: &str,
    dir: &Path,
    files: Vec<SecretFile>,
    interval: Duration,
    mut waiting: impl FnMut(&SecretFilesError),
) -> Result<Option<KeptSecretFiles>, SecretFilesError> {
    loop {
        match keep(client.clone(), namespace, dir, files.clone(), interval).await {
            Err(e @ SecretFilesError::Secret { .. }) => waiting(&e),
            done => return done,
        }
        tokio::time::sleep(interval).await;
    }
}

impl Drop for SecretFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn create_private_dir(dir: &Path) -> Result<(), SecretFilesError> {
    use std::os::unix::fs::DirBuilderExt;
    let err = |source| SecretFilesError::Write {
        path: dir.to_path_buf(),
        source,
    };
    // A leftover of an earlier process with the same id holds nothing this one trusts.
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(err)?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(err)
}

/// Writes `bytes` to `path` (mode 0600) through a rename, unless it already holds them.
fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<(), SecretFilesError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if std::fs::read(path).is_ok_and(|current| current == bytes) {
        return Ok(());
    }
    let err = |source| SecretFilesError::Write {
        path: path.to_path_buf(),
        source,
    };
    let parent = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(parent)
        .map_err(err)?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(type_: Option<&str>, fields: &[(&str, &str)]) -> Secret {
        Secret {
            type_: type_.map(str::to_string),
            data: Some(
                fields
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn key_pairs_need_a_tls_secret_and_ca_bundles_take_the_named_or_all_fields() {
        let dir = Path::new("/x");
        let cert = SecretFile::new(dir, "tls-secret-name", "p", SecretContent::TlsCert);
        assert_eq!(cert.path, Path::new("/x/p/tls.crt"));
        let tls = secret(Some(TLS_SECRET_TYPE), &[("tls.crt", "C"), ("tls.key", "K")]);
        assert_eq!(cert.extract(&tls).unwrap(), b"C");
        let opaque = secret(Some("Opaque"), &[("tls.crt", "C")]);
        assert!(cert
            .extract(&opaque)
            .unwrap_err()
            .contains("not a TLS Secret"));

        let ca = SecretFile::new(
            dir,
            "tls-ca-secret-name",
            "ca",
            SecretContent::CaBundle(vec!["tls.crt".into(), "ca.crt".into()]),
        );
        let a = "-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n";
        let b = "-----BEGIN CERTIFICATE-----\nB\n-----END CERTIFICATE-----";
        let key = "-----BEGIN PRIVATE KEY-----\nK\n-----END PRIVATE KEY-----\n";
        let with_key = secret(Some(TLS_SECRET_TYPE), &[("tls.crt", a), ("tls.key", key)]);
        assert_eq!(ca.extract(&with_key).unwrap(), a.as_bytes());
        let other = secret(None, &[("other", a)]);
        assert!(ca
            .extract(&other)
            .unwrap_err()
            .contains("none of the fields"));
        let all = SecretFile::new(
            dir,
            "root-ca-secret-name",
            "ca",
            SecretContent::CaBundle(vec![]),
        );
        let bundle = all
            .extract(&secret(None, &[("a", a), ("b", b), ("k", key)]))
            .unwrap();
        assert_eq!(
            bundle,
            format!("{a}{b}\n").into_bytes(),
            "the key is never kept"
        );
    }

    #[test]
    fn a_named_field_comes_from_any_secret_type_and_a_remedy_replaces_the_generic_advice() {
        let jwt = SecretFile::new(
            Path::new("/x"),
            "jwt-secret-name",
            "argocd-agent-jwt",
            SecretContent::Field("jwt.key".into()),
        );
        assert_eq!(jwt.path, Path::new("/x/argocd-agent-jwt/jwt.key"));
        assert_eq!(
            jwt.extract(&secret(Some("Opaque"), &[("jwt.key", "K")]))
                .unwrap(),
            b"K"
        );
        assert_eq!(
            jwt.extract(&secret(None, &[("other", "K")])).unwrap_err(),
            "field jwt.key is missing"
        );
        assert!(jwt.not_found().contains("--jwt-secret-name"));
        let jwt = jwt.with_remedy("create it with `argocd-agentctl jwt create-key`");
        assert_eq!(
            jwt.not_found(),
            "not found: create it with `argocd-agentctl jwt create-key`"
        );
    }

    #[test]
    fn files_are_private_and_rewritten_only_on_change() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("secrets");
        create_private_dir(&dir).unwrap();
        let path = dir.join("s/tls.key");
        write_if_changed(&path, b"one").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&path), 0o600);
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        write_if_changed(&path, b"one").unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().modified().unwrap(),
            before
        );
        write_if_changed(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
    }
}
