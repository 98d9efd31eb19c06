//! Connections to an Argo CD Redis, shared by the agent (its cluster's Redis, which answers the
//! principal's Redis proxy) and the principal (the hub Redis behind its Redis proxy, where it also
//! writes agents' cluster info).
//!
//! Owns how one connection is opened ([`RedisTarget::connect`]: TCP without Nagle's delay, TLS
//! when configured — verified against a CA bundle or, with upstream's `--redis-tls-insecure`, not
//! at all — then `AUTH` with the configured credentials as Argo CD's own components send it; the
//! password is never logged), and the rule turning upstream's Redis TLS flags (enabled, CA file,
//! CA Secret, insecure: one verification mode at most, the CA Secret `argocd-redis-tls` when none
//! is named) into a [`RedisTlsChoice`]. What is sent over the connection is the caller's. The
//! RESP codec is `redis-protocol`'s.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use redis_protocol::codec::Resp2;
use redis_protocol::resp2::types::BytesFrame as Frame;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_util::codec::Framed;

use crate::binary_config::{non_empty, ConfigError, FlagEnv};
use crate::redis_credentials::RedisCredentials;

/// How long a connection (TCP, then the TLS handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long Redis may take to answer `AUTH`.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// The Secret upstream reads the Redis CA from (field [`REDIS_CA_SECRET_FIELD`]) when TLS is on
/// and no other verification mode is given.
pub const DEFAULT_REDIS_CA_SECRET: &str = "argocd-redis-tls";
/// The field of the CA Secret holding the CA bundle (upstream's).
pub const REDIS_CA_SECRET_FIELD: &str = "ca.crt";

/// A byte stream to Redis, plaintext or TLS.
pub trait RedisIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> RedisIo for T {}

/// One open, authenticated connection to Redis.
pub type RedisConnection = Framed<Box<dyn RedisIo>, Resp2>;

/// How a Redis server certificate is verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTls {
    /// Against this CA bundle (PEM).
    Ca(PathBuf),
    /// Not at all (`--redis-tls-insecure`).
    Insecure,
}

/// What a binary's Redis TLS flags ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTlsChoice {
    /// Plaintext.
    Off,
    /// TLS verified against this CA file.
    CaFile(PathBuf),
    /// TLS verified against field [`REDIS_CA_SECRET_FIELD`] of this Secret (in the binary's
    /// namespace).
    CaSecret(String),
    /// TLS without verification.
    Insecure,
}

/// Names of one binary's Redis TLS flags (upstream names them differently in principal and agent).
pub struct RedisTlsFlags {
    /// Turns TLS on (`redis-tls-enabled`).
    pub enabled: &'static str,
    /// CA file (`redis-tls-ca-path` / `redis-ca-path`).
    pub ca_path: &'static str,
    /// CA Secret (`redis-tls-ca-secret-name` / `redis-ca-secret-name`).
    pub ca_secret: &'static str,
    /// No verification (`redis-tls-insecure`).
    pub insecure: &'static str,
}

/// The verification mode of a binary's Redis TLS flags, as upstream decides it: with TLS on, one of
/// `insecure`, `ca_path` or an explicitly named `ca_secret` at most, and the CA Secret
/// [`DEFAULT_REDIS_CA_SECRET`] when none is given. Unlike upstream (which ignores them), a mode
/// given without TLS on is refused: it would do nothing.
pub fn redis_tls_choice(
    flags: &FlagEnv,
    names: &RedisTlsFlags,
    enabled: bool,
    ca_path: Option<PathBuf>,
    ca_secret: Option<String>,
    insecure: bool,
) -> Result<RedisTlsChoice, ConfigError> {
    let ca_path = non_empty(ca_path);
    let ca_secret = non_empty(ca_secret);
    let given: Vec<&'static str> = [
        (insecure, names.insecure),
        (ca_path.is_some(), names.ca_path),
        (ca_secret.is_some(), names.ca_secret),
    ]
    .into_iter()
    .filter_map(|(set, flag)| set.then_some(flag))
    .collect();
    if !enabled {
        return match given.first() {
            Some(flag) => Err(flags.conflict(
                flag,
                names.enabled,
                format!("it only applies with TLS to Redis; add --{}", names.enabled),
            )),
            None => Ok(RedisTlsChoice::Off),
        };
    }
    if let [first, second, ..] = given[..] {
        return Err(flags.conflict(
            first,
            second,
            format!(
                "only one Redis TLS verification mode can be given: --{}, --{} or --{}",
                names.insecure, names.ca_path, names.ca_secret
            ),
        ));
    }
    Ok(if insecure {
        RedisTlsChoice::Insecure
    } else if let Some(path) = ca_path {
        RedisTlsChoice::CaFile(flags.readable_file(names.ca_path, &path)?)
    } else {
        RedisTlsChoice::CaSecret(ca_secret.unwrap_or_else(|| DEFAULT_REDIS_CA_SECRET.into()))
    })
}

/// How connections to one Redis are opened (see the module docs).
#[derive(Clone)]
pub struct RedisTarget {
    /// `host:port`.
    pub address: String,
    /// Sent with `AUTH` right after connecting.
    pub credentials: Option<RedisCredentials>,
    /// Names the Redis in errors ("local redis", "hub redis").
    role: &'static str,
    /// TLS client config and the name the server certificate is checked against.
    tls: Option<(
        Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    )>,
    /// Why the TLS settings cannot be used (every connection then fails with this).
    unusable: Option<String>,
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget")
            .field("address", &self.address)
            .field("credentials", &self.credentials)
            .field("role", &self.role)
            .field("tls", &self.tls.is_some())
            .field("unusable", &self.unusable)
            .finish()
    }
}

impl RedisTarget {
    /// A target at `address` (`host:port`, the host also being the TLS server name); `role` names
    /// it in errors. A TLS setting that cannot be used (an unreadable CA) is logged once and
    /// reported by every [`connect`](Self::connect) rather than stopping the process.
    pub fn new(
        role: &'static str,
        address: impl Into<String>,
        credentials: Option<RedisCredentials>,
        tls: Option<&RedisTls>,
    ) -> Self {
        let address = address.into();
        let mut target = RedisTarget {
            role,
            tls: None,
            unusable: None,
            credentials,
            address,
        };
        if let Some(tls) = tls {
            let host = target
                .address
                .rsplit_once(':')
                .map_or(target.address.as_str(), |(host, _)| host)
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            match tls_config(tls, &host) {
                Ok(tls) => target.tls = Some(tls),
                Err(e) => {
                    tracing::error!(redis = role, error = %e, "TLS to redis is unusable; every connection to it will fail");
                    target.unusable = Some(format!("TLS to the {role} is unusable: {e}"));
                }
            }
        }
        target
    }

    /// A plaintext target at `address`.
    pub fn plain(
        role: &'static str,
        address: impl Into<String>,
        credentials: Option<RedisCredentials>,
    ) -> Self {
        RedisTarget::new(role, address, credentials, None)
    }

    /// What the Redis is called in errors ("local redis", "hub redis").
    pub fn role(&self) -> &'static str {
        self.role
    }

    /// Opens a connection: TCP, TLS if configured, then `AUTH` if credentials are configured.
    pub async fn connect(&self) -> Result<RedisConnection, String> {
        if let Some(reason) = &self.unusable {
            return Err(reason.clone());
        }
        let (role, addr) = (self.role, &self.address);
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                format!("{role} {addr} did not accept a connection within {CONNECT_TIMEOUT:?}")
            })?
            .map_err(|e| format!("{role} {addr}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn RedisIo> = match &self.tls {
            None => Box::new(tcp),
            Some((config, name)) => {
                let tls = tokio_rustls::TlsConnector::from(config.clone());
                let stream = tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(name.clone(), tcp))
                    .await
                    .map_err(|_| format!("{role} {addr}: TLS handshake timed out"))?
                    .map_err(|e| format!("{role} {addr}: TLS handshake: {e}"))?;
                Box::new(stream)
            }
        };
        let mut conn = Framed::new(io, Resp2::default());
        if let Some(creds) = &self.credentials {
            conn.send(auth_command(creds))
                .await
                .map_err(|e| format!("{role} {addr}: {e}"))?;
            match tokio::time::timeout(AUTH_TIMEOUT, conn.next()).await {
                Ok(Some(Ok(Frame::SimpleString(ok)))) if ok.as_ref() == b"OK" => {}
                // Redis's own message (WRONGPASS, NOAUTH...) never repeats the password.
                Ok(Some(Ok(Frame::Error(e)))) => {
                    return Err(format!(
                        "{role} {addr} refused the credentials (--redis-password / --redis-creds-dir-path): {e}"
                    ))
                }
                Ok(Some(Ok(other))) => {
                    return Err(format!("{role} {addr} answered AUTH with {other:?}"))
                }
                Ok(Some(Err(e))) => return Err(format!("{role} {addr}: {e}")),
                Ok(None) => return Err(format!("{role} {addr} closed the connection")),
                Err(_) => {
                    return Err(format!(
                        "{role} {addr} did not answer AUTH within {AUTH_TIMEOUT:?}"
                    ))
                }
            }
        }
        Ok(conn)
    }
}

/// `AUTH [username] password`: the username only when one is configured, so Redis before 6
/// (single password) understands it too.
fn auth_command(creds: &RedisCredentials) -> Frame {
    let bulk = |s: &str| Frame::BulkString(Bytes::copy_from_slice(s.as_bytes()));
    let mut args = vec![bulk("AUTH")];
    if let Some(user) = &creds.username {
        args.push(bulk(user));
    }
    args.push(bulk(creds.password.expose()));
    Frame::Array(args)
}

/// The client config of `tls` for a server named `host`.
fn tls_config(
    tls: &RedisTls,
    host: &str,
) -> Result<
    (
        Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    ),
    String,
> {
    let provider = crate::tls::crypto_provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let config = match tls {
        RedisTls::Ca(path) => {
            let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let origin = path.display().to_string();
            let roots = crate::tls::parse_ca_bundle(crate::tls::PemInput::new(&origin, &pem))
                .map_err(|e| e.to_string())?;
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        RedisTls::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServerCertificate(provider)))
            .with_no_client_auth(),
    };
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host:?} is not a TLS server name: {e}"))?;
    Ok((Arc::new(config), name))
}

/// `--redis-tls-insecure`: any certificate is accepted (the handshake signatures still are checked).
#[derive(Debug)]
struct AnyServerCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot server on loopback answering the first request with `reply`; returns its address
    /// and what it received.
    async fn fake_redis(reply: &'static [u8]) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 256];
            let n = s.read(&mut buf).await.unwrap();
            s.write_all(reply).await.unwrap();
            buf.truncate(n);
            buf
        });
        (addr, task)
    }

    #[tokio::test]
    async fn connections_authenticate_with_the_configured_credentials() {
        let (addr, server) = fake_redis(b"+OK\r\n").await;
        let creds = RedisCredentials {
            username: Some("argo".into()),
            password: "pw".parse().unwrap(),
        };
        RedisTarget::plain("local redis", addr, Some(creds))
            .connect()
            .await
            .unwrap();
        assert_eq!(
            server.await.unwrap(),
            b"*3\r\n$4\r\nAUTH\r\n$4\r\nargo\r\n$2\r\npw\r\n"
        );

        let (addr, _server) = fake_redis(b"-WRONGPASS invalid username-password pair\r\n").await;
        let creds = RedisCredentials {
            username: None,
            password: "not-it".parse().unwrap(),
        };
        let err = RedisTarget::plain("hub redis", addr, Some(creds))
            .connect()
            .await
            .err()
            .unwrap();
        assert!(
            err.contains("WRONGPASS") && err.starts_with("hub redis"),
            "{err}"
        );
        assert!(!err.contains("not-it"), "{err}");
    }

    #[test]
    fn an_unreadable_ca_fails_every_connection_with_the_reason() {
        let target = RedisTarget::new(
            "local redis",
            "argocd-redis:6379",
            None,
            Some(&RedisTls::Ca("/nonexistent/ca.crt".into())),
        );
        let err = futures::executor::block_on(target.connect()).err().unwrap();
        assert!(
            err.contains("TLS to the local redis is unusable")
                && err.contains("/nonexistent/ca.crt"),
            "{err}"
        );
    }

    #[test]
    fn tls_choice_is_one_mode_with_the_ca_secret_by_default() {
        const F: FlagEnv = FlagEnv::new("ARGOCD_AGENT_");
        let names = RedisTlsFlags {
            enabled: "redis-tls-enabled",
            ca_path: "redis-tls-ca-path",
            ca_secret: "redis-tls-ca-secret-name",
            insecure: "redis-tls-insecure",
        };
        let choice = |enabled, path: Option<&str>, secret: Option<&str>, insecure| {
            redis_tls_choice(
                &F,
                &names,
                enabled,
                path.map(PathBuf::from),
                secret.map(str::to_string),
                insecure,
            )
        };
        assert_eq!(
            choice(false, None, None, false).unwrap(),
            RedisTlsChoice::Off
        );
        assert_eq!(
            choice(true, None, None, false).unwrap(),
            RedisTlsChoice::CaSecret(DEFAULT_REDIS_CA_SECRET.into())
        );
        assert_eq!(
            choice(true, None, Some("mine"), false).unwrap(),
            RedisTlsChoice::CaSecret("mine".into())
        );
        assert_eq!(
            choice(true, None, None, true).unwrap(),
            RedisTlsChoice::Insecure
        );
        let ca = tempfile::NamedTempFile::new().unwrap();
        assert_eq!(
            choice(true, ca.path().to_str(), None, false).unwrap(),
            RedisTlsChoice::CaFile(ca.path().into())
        );
        let both = choice(true, ca.path().to_str(), Some("mine"), false)
            .unwrap_err()
            .to_string();
        assert!(
            both.contains("only one Redis TLS verification mode"),
            "{both}"
        );
        let off = choice(false, None, None, true).unwrap_err().to_string();
        assert!(off.contains("--redis-tls-enabled"), "{off}");
    }
}
