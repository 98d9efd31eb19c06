//! rustls configuration shared by the principal and the agent.
//!
//! Owns: turning PEM files (certificate chain, private key, CA bundle) into rustls
//! [`ServerConfig`]/[`ClientConfig`] with the `ring` provider, the TLS version policy (TLS 1.3 only
//! unless told otherwise, like upstream's principal default), mandatory client-certificate
//! verification for mTLS, and hot reload of those files ([`reload`]). Errors name the file and
//! what is wrong with it. It does not decide who an authenticated peer is; that is
//! [`argocd_agent_proto::identity`]. Key material never appears in errors or logs.

pub mod expiry;
pub mod policy;
pub mod reload;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::prelude::{FromDer, X509Certificate};

pub use expiry::CertificateExpiry;
pub use policy::{TlsPolicy, TlsVersion};
pub use reload::{
    ReloadOutcome, ReloadingClientConfig, ReloadingConfig, ReloadingServerConfig,
    WeakReloadingConfig,
};

/// ALPN id for HTTP/2 (gRPC).
pub const ALPN_H2: &[u8] = b"h2";
/// ALPN id for HTTP/1.1 (gRPC over WebSocket, `--enable-websocket`).
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The crypto provider every config in this crate is built with (`ring`), explicit so that
/// the process-wide default provider never matters.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Whether a server asks for client certificates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// A client certificate signed by the client CA is mandatory (mTLS).
    Required,
    /// A client certificate is verified against the client CA if presented, but not required.
    Optional,
    /// No client certificate is requested.
    None,
}

/// Everything that can go wrong building a TLS config. `origin` is the file path (or a label
/// such as `secret argocd/argocd-agent-ca tls.crt` for in-memory PEM).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read (missing, permissions, ...).
    #[error("{}: cannot read file: {source}", path.display())]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The input holds no `CERTIFICATE` PEM block.
    #[error("{origin}: no PEM certificate (-----BEGIN CERTIFICATE-----) found")]
    NoCertificate {
        /// Where the PEM came from.
        origin: String,
    },
    /// The PEM is syntactically broken.
    #[error("{origin}: malformed PEM: {reason}")]
    MalformedPem {
        /// Where the PEM came from.
        origin: String,
        /// Parser message.
        reason: String,
    },
    /// A certificate is not valid X.509 DER.
    #[error("{origin}: certificate cannot be parsed: {reason}")]
    BadCertificate {
        /// Where the PEM came from.
        origin: String,
        /// Parser message.
        reason: String,
    },
    /// The input holds no private key block.
    #[error(
        "{origin}: no PEM private key found (expected PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)"
    )]
    NoPrivateKey {
        /// Where the PEM came from.
        origin: String,
    },
    /// The private key is of an unsupported type or corrupt.
    #[error("{origin}: private key is unsupported or corrupt: {reason}")]
    BadPrivateKey {
        /// Where the PEM came from.
        origin: String,
        /// Why.
        reason: String,
    },
    /// The private key does not belong to the leaf certificate.
    #[error("{key}: private key does not match the certificate in {cert}")]
    KeyMismatch {
        /// Certificate origin.
        cert: String,
        /// Key origin.
        key: String,
    },
    /// A CA bundle holds no certificate usable as a trust anchor.
    #[error("{origin}: not usable as a CA bundle: {reason}")]
    BadCa {
        /// Where the PEM came from.
        origin: String,
        /// Why.
        reason: String,
    },
    /// Client certificates were requested but no CA to verify them was configured.
    #[error("client certificates are required but no client CA file is configured")]
    MissingClientCa,
    /// A TLS version string is not one we know.
    #[error("unknown TLS version {value:?}; expected tls1.2 or tls1.3")]
    UnknownVersion {
        /// The rejected value.
        value: String,
    },
    /// The TLS version range or cipher suites cannot work together.
    #[error("{0}")]
    Policy(String),
    /// rustls refused the configuration.
    #[error("building TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A PEM input: its bytes and where they came from (for error messages).
#[derive(Clone, Copy)]
pub struct PemInput<'a> {
    /// Path or label used in errors.
    pub origin: &'a str,
    /// The PEM text.
    pub bytes: &'a [u8],
}

impl<'a> PemInput<'a> {
    /// Wrap `bytes` labelled with `origin`.
    pub fn new(origin: &'a str, bytes: &'a [u8]) -> Self {
        Self { origin, bytes }
    }
}

impl fmt::Debug for PemInput<'_> {
    // Never print the bytes: the input may be a private key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PemInput")
            .field("origin", &self.origin)
            .field("len", &self.bytes.len())
            .finish()
    }
}

/// A built config plus facts about the certificate it presents.
#[derive(Debug)]
pub struct LoadedTls<C> {
    /// The rustls config.
    pub config: Arc<C>,
    /// Earliest `notAfter` among the certificates this side presents (leaf and any
    /// intermediates in the same file); `None` when no certificate is presented.
    pub not_after: Option<DateTime<Utc>>,
    /// SHA-256 fingerprint (uppercase hex) of the presented leaf certificate.
    pub leaf_fingerprint: Option<String>,
}

/// Parse every `CERTIFICATE` block of a PEM input; errors if there is none.
pub fn parse_certificates(input: PemInput<'_>) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(input.bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::MalformedPem {
            origin: input.origin.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            origin: input.origin.to_owned(),
        });
    }
    for cert in &certs {
        X509Certificate::from_der(cert).map_err(|e| TlsError::BadCertificate {
            origin: input.origin.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(certs)
}

/// Parse the first private key (PKCS#8, PKCS#1 or SEC1) of a PEM input.
pub fn parse_private_key(input: PemInput<'_>) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(input.bytes).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            origin: input.origin.to_owned(),
        },
        other => TlsError::MalformedPem {
            origin: input.origin.to_owned(),
            reason: other.to_string(),
        },
    })
}

/// Build a root store from a CA bundle; every certificate in it must be a usable anchor.
pub fn parse_ca_bundle(input: PemInput<'_>) -> Result<RootCertStore, TlsError> {
    let certs = parse_certificates(input)?;
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| TlsError::BadCa {
            origin: input.origin.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

fn certified_key(
    cert: PemInput<'_>,
    key: PemInput<'_>,
    provider: &CryptoProvider,
) -> Result<(CertifiedKey, Option<DateTime<Utc>>, String), TlsError> {
    let chain = parse_certificates(cert)?;
    let key_der = parse_private_key(key)?;
    let not_after = earliest_not_after(&chain);
    let fingerprint = argocd_agent_proto::identity::cert_fingerprint(&chain[0]);
    if let Some(t) = not_after {
        if t < Utc::now() {
            tracing::warn!(file = cert.origin, not_after = %t, "TLS certificate has expired");
        }
    }
    let signing_key = provider
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| TlsError::BadPrivateKey {
            origin: key.origin.to_owned(),
            reason: e.to_string(),
        })?;
    let ck = CertifiedKey::new(chain, signing_key);
    match ck.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err(TlsError::KeyMismatch {
                cert: cert.origin.to_owned(),
                key: key.origin.to_owned(),
            })
        }
        Err(e) => {
            return Err(TlsError::BadCertificate {
                origin: cert.origin.to_owned(),
                reason: e.to_string(),
            })
        }
    }
    Ok((ck, not_after, fingerprint))
}

fn earliest_not_after(chain: &[CertificateDer<'_>]) -> Option<DateTime<Utc>> {
    chain
        .iter()
        .filter_map(|c| X509Certificate::from_der(c).ok())
        .filter_map(|(_, c)| DateTime::from_timestamp(c.validity().not_after.timestamp(), 0))
        .min()
}

/// Build a server config from in-memory PEM (files go through [`ServerTlsOptions`]).
pub fn server_config_from_pem(
    cert: PemInput<'_>,
    key: PemInput<'_>,
    client_ca: Option<PemInput<'_>>,
    client_auth: ClientAuth,
    alpn: &[Vec<u8>],
    policy: TlsPolicy,
) -> Result<LoadedTls<ServerConfig>, TlsError> {
    let provider = policy.provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&policy.versions())?;
    let builder = match client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Required | ClientAuth::Optional => {
            let ca = client_ca.ok_or(TlsError::MissingClientCa)?;
            let roots = Arc::new(parse_ca_bundle(ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
            let verifier = if client_auth == ClientAuth::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier.build().map_err(|e| TlsError::BadCa {
                origin: ca.origin.to_owned(),
                reason: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let (ck, not_after, fingerprint) = certified_key(cert, key, &provider)?;
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(ck)));
    config.alpn_protocols = alpn.to_vec();
    Ok(LoadedTls {
        config: Arc::new(config),
        not_after,
        leaf_fingerprint: Some(fingerprint),
    })
}

/// Build a client config from in-memory PEM (files go through [`ClientTlsOptions`]).
/// `identity` is the client certificate chain and key to present, if any.
pub fn client_config_from_pem(
    ca: PemInput<'_>,
    identity: Option<(PemInput<'_>, PemInput<'_>)>,
    alpn: &[Vec<u8>],
    policy: TlsPolicy,
) -> Result<LoadedTls<ClientConfig>, TlsError> {
    let provider = policy.provider();
    let roots = parse_ca_bundle(ca)?;
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&policy.versions())?
        .with_root_certificates(roots);
    let (mut config, not_after, fingerprint) = match identity {
        None => (builder.with_no_client_auth(), None, None),
        Some((cert, key)) => {
            let (ck, not_after, fp) = certified_key(cert, key, &provider)?;
            (
                builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(ck))),
                not_after,
                Some(fp),
            )
        }
    };
    config.alpn_protocols = alpn.to_vec();
    Ok(LoadedTls {
        config: Arc::new(config),
        not_after,
        leaf_fingerprint: fingerprint,
    })
}

/// Files and settings for one side's config: what that side presents and verifies (`side`:
/// [`ServerSide`] or [`ClientSide`]) and what both sides set alike, ALPN and the version policy.
/// [`TlsOptions::load`] reads and builds it, and [`ReloadingConfig`] rebuilds it when the files
/// change.
#[derive(Clone, Debug)]
pub struct TlsOptions<S> {
    /// What this side presents and verifies.
    pub side: S,
    /// ALPN protocols offered, in preference order.
    pub alpn: Vec<Vec<u8>>,
    /// Protocol version policy.
    pub policy: TlsPolicy,
}

/// Files and settings for a server config.
pub type ServerTlsOptions = TlsOptions<ServerSide>;
/// Files and settings for a client config.
pub type ClientTlsOptions = TlsOptions<ClientSide>;

/// What a server presents and whom it lets in.
#[derive(Clone, Debug)]
pub struct ServerSide {
    /// PEM certificate chain, leaf first.
    pub cert_path: PathBuf,
    /// PEM private key of the leaf.
    pub key_path: PathBuf,
    /// PEM CA bundle that client certificates must chain to.
    pub client_ca_path: Option<PathBuf>,
    /// Whether client certificates are required.
    pub client_auth: ClientAuth,
}

/// What a client trusts and presents.
#[derive(Clone, Debug)]
pub struct ClientSide {
    /// PEM CA bundle the server certificate must chain to.
    pub ca_path: PathBuf,
    /// Client certificate chain and key to present, if any.
    pub identity: Option<ClientIdentityFiles>,
}

/// Paths of a client certificate chain and its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIdentityFiles {
    /// PEM certificate chain, leaf first.
    pub cert_path: PathBuf,
    /// PEM private key.
    pub key_path: PathBuf,
}

impl<S> TlsOptions<S> {
    /// `side` with no ALPN and the default policy (TLS 1.3 only).
    fn of(side: S) -> Self {
        Self {
            side,
            alpn: Vec::new(),
            policy: TlsPolicy::default(),
        }
    }

    /// Set the ALPN protocols.
    pub fn with_alpn(mut self, alpn: &[&[u8]]) -> Self {
        self.alpn = alpn.iter().map(|p| p.to_vec()).collect();
        self
    }

    /// Set the version policy.
    pub fn with_policy(mut self, policy: TlsPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Read the files and build the config.
    pub fn load(&self) -> Result<LoadedTls<<Self as reload::TlsFiles>::Config>, TlsError>
    where
        Self: reload::TlsFiles,
    {
        use reload::TlsFiles;
        let files = reload::FileSet::read(&self.paths())?;
        self.build(&files)
    }
}

impl ServerTlsOptions {
    /// Server presenting `cert_path`/`key_path`, no client auth, TLS 1.3 only, no ALPN.
    pub fn new(cert_path: impl Into<PathBuf>, key_path: impl Into<PathBuf>) -> Self {
        Self::of(ServerSide {
            cert_path: cert_path.into(),
            key_path: key_path.into(),
            client_ca_path: None,
            client_auth: ClientAuth::None,
        })
    }

    /// Require client certificates signed by the CA bundle at `ca_path`.
    pub fn require_client_certs(mut self, ca_path: impl Into<PathBuf>) -> Self {
        self.side.client_ca_path = Some(ca_path.into());
        self.side.client_auth = ClientAuth::Required;
        self
    }
}

impl ClientTlsOptions {
    /// Client trusting `ca_path`, presenting no certificate, TLS 1.3 only, no ALPN.
    pub fn new(ca_path: impl Into<PathBuf>) -> Self {
        Self::of(ClientSide {
            ca_path: ca_path.into(),
            identity: None,
        })
    }

    /// Present the certificate at `cert_path` with the key at `key_path`.
    pub fn with_client_cert(
        mut self,
        cert_path: impl Into<PathBuf>,
        key_path: impl Into<PathBuf>,
    ) -> Self {
        self.side.identity = Some(ClientIdentityFiles {
            cert_path: cert_path.into(),
            key_path: key_path.into(),
        });
        self
    }
}

/// Build a server config from files with the default policy (TLS 1.3 only).
/// `client_ca_pem_path` is required when `client_auth` is not [`ClientAuth::None`].
pub fn server_config(
    cert_pem_path: &Path,
    key_pem_path: &Path,
    client_ca_pem_path: Option<&Path>,
    client_auth: ClientAuth,
    alpn: &[&[u8]],
) -> Result<ServerConfig, TlsError> {
    let mut options = ServerTlsOptions::new(cert_pem_path, key_pem_path).with_alpn(alpn);
    options.side.client_ca_path = client_ca_pem_path.map(Path::to_path_buf);
    options.side.client_auth = client_auth;
    let loaded = options.load()?;
    Ok(Arc::unwrap_or_clone(loaded.config))
}

/// Build a client config from files with the default policy: the server is verified against
/// `ca_pem_path` and the client presents `client_cert_path`/`client_key_path`.
pub fn client_config(
    ca_pem_path: &Path,
    client_cert_path: &Path,
    client_key_path: &Path,
    alpn: &[&[u8]],
) -> Result<ClientConfig, TlsError> {
    let loaded = ClientTlsOptions::new(ca_pem_path)
        .with_client_cert(client_cert_path, client_key_path)
        .with_alpn(alpn)
        .load()?;
    Ok(Arc::unwrap_or_clone(loaded.config))
}

#[cfg(test)]
pub(crate) mod tests;
