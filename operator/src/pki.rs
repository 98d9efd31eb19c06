//! The fleet PKI: a small certificate authority and the certificates it issues.
//!
//! Owns: generating or loading the CA (ECDSA P-256 keys by default; an RSA CA key from
//! upstream's `argocd-agentctl` is accepted), issuing server certificates (principal gRPC,
//! resource proxy) and client certificates (agents, the hub's resource-proxy client), signing
//! client-auth-only CSRs for a fixed CN (the OCM add-on registration path), and summarising a
//! certificate ([`inspect`]). Storage lives in [`directory`] (files) and [`secrets`]
//! (Kubernetes Secrets with upstream's names); JWT signing keys in [`jwt`].
//!
//! Like upstream's `pki` command this is a convenience CA for getting started, not a
//! replacement for a managed PKI. Private keys never appear in `Debug` output or errors.

pub mod directory;
pub mod jwt;
pub mod secrets;

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use argocd_agent_proto::identity::{cert_fingerprint, AgentName};
use chrono::{DateTime, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData,
    SanType, SerialNumber,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde::Serialize;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::public_key::PublicKey;

/// Common name of a CA created by `argocd-agentctl pki init` (upstream uses the Secret name).
pub const DEFAULT_CA_COMMON_NAME: &str = "argocd-agent-ca";
/// Common name of the principal's gRPC server certificate (as upstream).
pub const PRINCIPAL_COMMON_NAME: &str = "argocd-agent-principal";
/// Common name of the resource proxy's server certificate (as upstream).
pub const RESOURCE_PROXY_COMMON_NAME: &str = "argocd-agent-resource-proxy";

/// Certificates are backdated this much so that small clock skew between machines does not
/// make a fresh certificate "not yet valid".
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Everything that can fail in the PKI and its storage.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen could not generate a key pair.
    #[error("generating a key pair: {0}")]
    KeyGeneration(#[source] rcgen::Error),
    /// rcgen refused the certificate parameters or failed to sign.
    #[error("issuing certificate for {cn:?}: {source}")]
    Issue {
        /// Common name of the certificate being issued.
        cn: String,
        /// rcgen's error.
        #[source]
        source: rcgen::Error,
    },
    /// The input holds no PEM certificate.
    #[error("{origin}: no PEM certificate (-----BEGIN CERTIFICATE-----) found")]
    NoCertificate {
        /// Where the PEM came from.
        origin: String,
    },
    /// A certificate cannot be parsed.
    #[error("{origin}: certificate cannot be parsed: {reason}")]
    BadCertificate {
        /// Where the PEM came from.
        origin: String,
        /// Parser message.
        reason: String,
    },
    /// A private key cannot be parsed or used for signing.
    #[error("{origin}: private key cannot be used: {reason}")]
    BadKey {
        /// Where the PEM came from.
        origin: String,
        /// Why (never contains key material).
        reason: String,
    },
    /// The CA key is not the key of the CA certificate.
    #[error("the CA private key ({key}) does not match the CA certificate ({cert})")]
    KeyMismatch {
        /// Certificate origin.
        cert: String,
        /// Key origin.
        key: String,
    },
    /// The CA certificate lacks `basicConstraints CA:TRUE`.
    #[error("{origin}: certificate is not a CA certificate (basicConstraints CA:TRUE missing)")]
    NotCa {
        /// Where the certificate came from.
        origin: String,
    },
    /// A validity period is zero or too long to represent.
    #[error("invalid validity period {days} days: {reason}")]
    BadValidity {
        /// Requested length in days.
        days: u64,
        /// Why.
        reason: &'static str,
    },
    /// A common name or SAN is not acceptable.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// What kind of name ("common name", "DNS SAN").
        what: &'static str,
        /// The value.
        value: String,
        /// Why.
        reason: String,
    },
    /// The CSR cannot be parsed or its self-signature does not verify.
    #[error("CSR cannot be parsed or its signature is invalid: {0}")]
    BadCsr(String),
    /// The CSR asks for something this CA will not sign.
    #[error("CSR refused: {0}")]
    CsrRefused(String),
    /// A certificate was not issued by this CA.
    #[error("certificate {subject:?} was not issued by this CA: {reason}")]
    NotIssuedByCa {
        /// Subject of the certificate checked.
        subject: String,
        /// Why.
        reason: String,
    },
    /// No CA exists at the given location yet.
    #[error("no CA found at {location}; initialise it first (argocd-agentctl pki init)")]
    CaNotInitialized {
        /// Directory or Secret that was looked at.
        location: String,
    },
    /// File I/O failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file or Secret exists and overwriting was not requested.
    #[error("{location} already exists; refusing to overwrite it (use --force)")]
    AlreadyExists {
        /// File path or `namespace/name` of the Secret.
        location: String,
    },
    /// Writing the spoke's CA-only Secret would replace a Secret holding the CA key.
    #[error(
        "{location} holds a private key (it is the hub CA); refusing to replace it with the agent's CA-only secret — use a different agent namespace or cluster"
    )]
    WouldReplaceCa {
        /// `secret namespace/name`.
        location: String,
    },
    /// A Secret lacks a data key we need.
    #[error("secret {namespace}/{name} has no data key {key:?}")]
    SecretMissingKey {
        /// Namespace.
        namespace: String,
        /// Secret name.
        name: String,
        /// Missing key.
        key: String,
    },
    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done (e.g. `reading secret argocd/argocd-agent-ca`).
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// JWT key generation or parsing failed.
    #[error("JWT signing key: {0}")]
    JwtKey(String),
}

/// A freshly issued certificate with its private key, both PEM. `Debug` hides the key.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedCert {
    /// PEM certificate.
    pub cert_pem: String,
    /// PEM private key (PKCS#8).
    pub key_pem: String,
}

impl fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCert")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// What a certificate is for; decides its file and Secret names and default CN.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertRole {
    /// Server certificate of the principal's gRPC endpoint.
    Principal,
    /// Server certificate of the principal's resource proxy.
    ResourceProxy,
    /// Client certificate of an agent (CN = agent name).
    Agent(AgentName),
}

impl CertRole {
    /// The common name a certificate for this role gets.
    pub fn common_name(&self) -> &str {
        match self {
            Self::Principal => PRINCIPAL_COMMON_NAME,
            Self::ResourceProxy => RESOURCE_PROXY_COMMON_NAME,
            Self::Agent(name) => name.as_str(),
        }
    }
}

impl fmt::Display for CertRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Principal => f.write_str("principal"),
            Self::ResourceProxy => f.write_str("resource-proxy"),
            Self::Agent(name) => write!(f, "agent {name}"),
        }
    }
}

/// A summary of one certificate, for `pki inspect` and checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertInfo {
    /// Subject DN, RFC 4514 style.
    pub subject: String,
    /// Subject common name, if any.
    pub subject_cn: Option<String>,
    /// Issuer DN.
    pub issuer: String,
    /// Issuer common name, if any.
    pub issuer_cn: Option<String>,
    /// SANs as `DNS:name`, `IP:addr`, `URI:uri`, `email:addr`.
    pub sans: Vec<String>,
    /// Start of validity.
    pub not_before: DateTime<Utc>,
    /// End of validity.
    pub not_after: DateTime<Utc>,
    /// SHA-256 of the DER, uppercase hex (the blocklist format).
    pub fingerprint_sha256: String,
    /// Whether basicConstraints says CA:TRUE.
    pub is_ca: bool,
    /// Extended key usages (`serverAuth`, `clientAuth`, ...).
    pub extended_key_usages: Vec<String>,
    /// Public key type and size, e.g. `ECDSA 256` or `RSA 4096`.
    pub public_key: String,
    /// Serial number, hex.
    pub serial: String,
}

/// The certificate authority: its certificate and signing key. `Debug` hides the key.
pub struct CertificateAuthority {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("fingerprint", &cert_fingerprint(&self.cert_der))
            .field("key", &"<redacted>")
            .finish()
    }
}

fn validity_window(
    validity: Duration,
) -> Result<(time::OffsetDateTime, time::OffsetDateTime), PkiError> {
    let days = validity.as_secs() / 86_400;
    if validity.is_zero() {
        return Err(PkiError::BadValidity {
            days,
            reason: "must be longer than zero",
        });
    }
    let length = time::Duration::try_from(validity).map_err(|_| PkiError::BadValidity {
        days,
        reason: "too long",
    })?;
    let now = time::OffsetDateTime::now_utc();
    let not_before = now - time::Duration::try_from(BACKDATE).unwrap_or(time::Duration::ZERO);
    let not_after = now.checked_add(length).ok_or(PkiError::BadValidity {
        days,
        reason: "too long",
    })?;
    if not_after.year() > 9999 {
        return Err(PkiError::BadValidity {
            days,
            reason: "ends after year 9999",
        });
    }
    Ok((not_before, not_after))
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // Positive and without a leading zero byte, so it encodes as exactly 16 bytes.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    SerialNumber::from_slice(&bytes)
}

fn dn_with_cn(cn: &str) -> Result<DistinguishedName, PkiError> {
    if cn.is_empty() {
        return Err(PkiError::InvalidName {
            what: "common name",
            value: cn.to_owned(),
            reason: "must not be empty".into(),
        });
    }
    if cn.len() > 64 {
        return Err(PkiError::InvalidName {
            what: "common name",
            value: cn.to_owned(),
            reason: "longer than 64 characters (X.509 upper bound)".into(),
        });
    }
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    Ok(dn)
}

fn leaf_params(cn: &str, validity: Duration) -> Result<CertificateParams, PkiError> {
    let (not_before, not_after) = validity_window(validity)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn_with_cn(cn)?;
    params.not_before = not_before;
    params.not_after = not_after;
    params.serial_number = Some(random_serial());
    params.is_ca = IsCa::ExplicitNoCa;
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    Ok(params)
}

fn generate_key() -> Result<KeyPair, PkiError> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(PkiError::KeyGeneration)
}

/// Parse the first certificate of a PEM text.
pub(crate) fn first_cert_der(pem: &str, origin: &str) -> Result<CertificateDer<'static>, PkiError> {
    match CertificateDer::pem_slice_iter(pem.as_bytes()).next() {
        None => Err(PkiError::NoCertificate {
            origin: origin.to_owned(),
        }),
        Some(Err(e)) => Err(PkiError::BadCertificate {
            origin: origin.to_owned(),
            reason: e.to_string(),
        }),
        Some(Ok(der)) => Ok(der),
    }
}

/// Load a private key for signing. ring only takes PKCS#8, so PKCS#1 RSA keys (as written by
/// upstream's Go tooling) are re-wrapped as PKCS#8 first.
pub(crate) fn load_signing_key(key_pem: &str, origin: &str) -> Result<KeyPair, PkiError> {
    let bad = |reason: String| PkiError::BadKey {
        origin: origin.to_owned(),
        reason,
    };
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| bad(format!("no usable PEM private key ({e})")))?;
    let pkcs8 = match key {
        rustls_pki_types::PrivateKeyDer::Pkcs8(k) => k.secret_pkcs8_der().to_vec(),
        rustls_pki_types::PrivateKeyDer::Pkcs1(k) => rsa_pkcs1_to_pkcs8(k.secret_pkcs1_der()),
        rustls_pki_types::PrivateKeyDer::Sec1(_) => {
            return Err(bad(
                "SEC1 'EC PRIVATE KEY' is not supported; convert it to PKCS#8 ('PRIVATE KEY')"
                    .into(),
            ))
        }
        _ => return Err(bad("unknown private key encoding".into())),
    };
    let der = rustls_pki_types::PrivatePkcs8KeyDer::from(pkcs8);
    KeyPair::try_from(&der).map_err(|e| bad(format!("unsupported key type or corrupt key: {e}")))
}

fn der_length(len: usize) -> Vec<u8> {
    if len < 0x80 {
        return vec![len as u8];
    }
    let bytes: Vec<u8> = len
        .to_be_bytes()
        .iter()
        .copied()
        .skip_while(|b| *b == 0)
        .collect();
    let mut out = vec![0x80 | bytes.len() as u8];
    out.extend(bytes);
    out
}

fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend(der_length(content.len()));
    out.extend_from_slice(content);
    out
}

/// PrivateKeyInfo { version 0, AlgorithmIdentifier { rsaEncryption, NULL }, OCTET STRING pkcs1 }.
fn rsa_pkcs1_to_pkcs8(pkcs1: &[u8]) -> Vec<u8> {
    const RSA_ALG_ID: &[u8] = &[
        0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
    ];
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend_from_slice(RSA_ALG_ID);
    body.extend(der_tlv(0x04, pkcs1));
    der_tlv(0x30, &body)
}

fn parse_cert<'a>(der: &'a [u8], origin: &str) -> Result<X509Certificate<'a>, PkiError> {
    X509Certificate::from_der(der)
        .map(|(_, c)| c)
        .map_err(|e| PkiError::BadCertificate {
            origin: origin.to_owned(),
            reason: e.to_string(),
        })
}

impl CertificateAuthority {
    /// Create a new self-signed CA with an ECDSA P-256 key.
    pub fn generate(common_name: &str, validity: Duration) -> Result<Self, PkiError> {
        let (not_before, not_after) = validity_window(validity)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = dn_with_cn(common_name)?;
        params.not_before = not_before;
        params.not_after = not_after;
        params.serial_number = Some(random_serial());
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = generate_key()?;
        let cert = params.self_signed(&key).map_err(|source| PkiError::Issue {
            cn: common_name.to_owned(),
            source,
        })?;
        Ok(Self {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        })
    }

    /// Load an existing CA from PEM; checks that the certificate is a CA and that the key
    /// belongs to it. PKCS#8 keys (EC or RSA) and PKCS#1 RSA keys are accepted.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        Self::from_pem_labelled(cert_pem, "CA certificate", key_pem, "CA key")
    }

    /// [`from_pem`](Self::from_pem) with file or Secret names for error messages.
    pub fn from_pem_labelled(
        cert_pem: &str,
        cert_origin: &str,
        key_pem: &str,
        key_origin: &str,
    ) -> Result<Self, PkiError> {
        let cert_der = first_cert_der(cert_pem, cert_origin)?;
        let key = load_signing_key(key_pem, key_origin)?;
        {
            let cert = parse_cert(&cert_der, cert_origin)?;
            if !cert.is_ca() {
                return Err(PkiError::NotCa {
                    origin: cert_origin.to_owned(),
                });
            }
            if cert.public_key().raw != key.subject_public_key_info().as_slice() {
                return Err(PkiError::KeyMismatch {
                    cert: cert_origin.to_owned(),
                    key: key_origin.to_owned(),
                });
            }
        }
        let issuer =
            Issuer::from_ca_cert_der(&cert_der, key).map_err(|e| PkiError::BadCertificate {
                origin: cert_origin.to_owned(),
                reason: e.to_string(),
            })?;
        let cert_pem = pem_encode_cert(&cert_der);
        Ok(Self {
            cert_pem,
            cert_der,
            issuer,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// The CA private key, PEM (PKCS#8). Handle with care: this is the root of trust.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// Summary of the CA certificate.
    pub fn info(&self) -> CertInfo {
        inspect_der(&self.cert_der, "CA certificate").expect("CA certificate was parsed at load")
    }

    /// Issue a server certificate (serverAuth) for `cn` with the given DNS and IP SANs.
    pub fn issue_server(
        &self,
        cn: &str,
        dns: &[String],
        ips: &[IpAddr],
        validity: Duration,
    ) -> Result<IssuedCert, PkiError> {
        let mut params = leaf_params(cn, validity)?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        for name in dns {
            let ia5 = name
                .clone()
                .try_into()
                .map_err(|e: rcgen::Error| PkiError::InvalidName {
                    what: "DNS SAN",
                    value: name.clone(),
                    reason: e.to_string(),
                })?;
            params.subject_alt_names.push(SanType::DnsName(ia5));
        }
        params
            .subject_alt_names
            .extend(ips.iter().copied().map(SanType::IpAddress));
        self.sign_with_new_key(cn, params)
    }

    /// Issue a client certificate (clientAuth) whose subject CN is `cn`.
    pub fn issue_client(&self, cn: &str, validity: Duration) -> Result<IssuedCert, PkiError> {
        let mut params = leaf_params(cn, validity)?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign_with_new_key(cn, params)
    }

    /// Issue the client certificate for an agent (CN = agent name).
    pub fn issue_agent(
        &self,
        agent: &AgentName,
        validity: Duration,
    ) -> Result<IssuedCert, PkiError> {
        self.issue_client(agent.as_str(), validity)
    }

    fn sign_with_new_key(
        &self,
        cn: &str,
        params: CertificateParams,
    ) -> Result<IssuedCert, PkiError> {
        let key = generate_key()?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|source| PkiError::Issue {
                cn: cn.to_owned(),
                source,
            })?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Sign a PEM CSR as a client certificate for `expected_cn`. Refused unless the subject
    /// CN equals `expected_cn` and the request asks for nothing beyond client authentication
    /// (no SANs, no CA, no serverAuth or other EKUs, no certificate/CRL signing). The issued
    /// certificate carries only the CN, clientAuth and digitalSignature, whatever else the
    /// CSR subject contains.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        expected_cn: &str,
        validity: Duration,
    ) -> Result<String, PkiError> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| PkiError::BadCsr(e.to_string()))?;
        let requested = &csr.params;
        let cns: Vec<String> = requested
            .distinguished_name
            .iter()
            .filter(|(t, _)| **t == DnType::CommonName)
            .map(|(_, v)| dn_value_string(v))
            .collect();
        match cns.as_slice() {
            [cn] if cn == expected_cn => {}
            [cn] => {
                return Err(PkiError::CsrRefused(format!(
                    "subject CN is {cn:?}, expected {expected_cn:?}"
                )))
            }
            [] => return Err(PkiError::CsrRefused("subject has no CN".into())),
            _ => return Err(PkiError::CsrRefused("subject has several CNs".into())),
        }
        if !requested.subject_alt_names.is_empty() {
            return Err(PkiError::CsrRefused(format!(
                "requests {} subject alternative name(s); client certificates get none",
                requested.subject_alt_names.len()
            )));
        }
        if matches!(requested.is_ca, IsCa::Ca(_)) {
            return Err(PkiError::CsrRefused("requests a CA certificate".into()));
        }
        if let Some(eku) = requested
            .extended_key_usages
            .iter()
            .find(|u| **u != ExtendedKeyUsagePurpose::ClientAuth)
        {
            return Err(PkiError::CsrRefused(format!(
                "requests extended key usage {eku:?}; only clientAuth is allowed"
            )));
        }
        if let Some(ku) = requested.key_usages.iter().find(|u| {
            !matches!(
                u,
                KeyUsagePurpose::DigitalSignature
                    | KeyUsagePurpose::KeyEncipherment
                    | KeyUsagePurpose::KeyAgreement
            )
        }) {
            return Err(PkiError::CsrRefused(format!(
                "requests key usage {ku:?}; only digitalSignature, keyEncipherment and keyAgreement are allowed"
            )));
        }
        let mut params = leaf_params(expected_cn, validity)?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&csr.public_key, &self.issuer)
            .map_err(|source| PkiError::Issue {
                cn: expected_cn.to_owned(),
                source,
            })?;
        Ok(cert.pem())
    }

    /// Check that `cert_pem` (first certificate) was signed by this CA's key and names this
    /// CA as issuer. Does not check validity dates.
    pub fn verify_issued(&self, cert_pem: &str) -> Result<(), PkiError> {
        let der = first_cert_der(cert_pem, "certificate")?;
        let cert = parse_cert(&der, "certificate")?;
        let ca = parse_cert(&self.cert_der, "CA certificate")?;
        let subject = cert.subject().to_string();
        if cert.issuer().as_raw() != ca.subject().as_raw() {
            return Err(PkiError::NotIssuedByCa {
                subject,
                reason: format!(
                    "issuer is {:?}, the CA is {:?}",
                    cert.issuer().to_string(),
                    ca.subject().to_string()
                ),
            });
        }
        cert.verify_signature(Some(ca.public_key()))
            .map_err(|e| PkiError::NotIssuedByCa {
                subject,
                reason: format!("signature does not verify with the CA key: {e}"),
            })
    }
}

fn dn_value_string(v: &rcgen::DnValue) -> String {
    match v {
        rcgen::DnValue::Utf8String(s) => s.clone(),
        rcgen::DnValue::PrintableString(s) => s.as_str().to_owned(),
        rcgen::DnValue::Ia5String(s) => s.as_str().to_owned(),
        rcgen::DnValue::TeletexString(s) => s.as_str().to_owned(),
        // BMP/Universal strings: never produced by our tooling or by OCM's CSRs.
        _ => "<unsupported string type>".to_owned(),
    }
}

fn pem_encode_cert(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Summarise the first certificate in a PEM text.
pub fn inspect(cert_pem: &str) -> Result<CertInfo, PkiError> {
    inspect_labelled(cert_pem, "certificate")
}

/// [`inspect`] with a file or Secret name for error messages.
pub fn inspect_labelled(cert_pem: &str, origin: &str) -> Result<CertInfo, PkiError> {
    let der = first_cert_der(cert_pem, origin)?;
    inspect_der(&der, origin)
}

/// Summarise a DER certificate.
pub fn inspect_der(der: &[u8], origin: &str) -> Result<CertInfo, PkiError> {
    let cert = parse_cert(der, origin)?;
    let bad = |reason: String| PkiError::BadCertificate {
        origin: origin.to_owned(),
        reason,
    };
    let first_cn = |name: &x509_parser::x509::X509Name<'_>| {
        name.iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned)
    };
    let sans = cert
        .subject_alternative_name()
        .map_err(|e| bad(format!("subjectAltName: {e}")))?
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .map(|n| match n {
                    GeneralName::DNSName(d) => format!("DNS:{d}"),
                    GeneralName::URI(u) => format!("URI:{u}"),
                    GeneralName::RFC822Name(m) => format!("email:{m}"),
                    GeneralName::IPAddress(ip) => match ip.len() {
                        4 => format!("IP:{}", IpAddr::from(<[u8; 4]>::try_from(*ip).unwrap())),
                        16 => format!("IP:{}", IpAddr::from(<[u8; 16]>::try_from(*ip).unwrap())),
                        _ => format!("IP:<{} bytes>", ip.len()),
                    },
                    other => format!("{other}"),
                })
                .collect()
        })
        .unwrap_or_default();
    let extended_key_usages = cert
        .extended_key_usage()
        .map_err(|e| bad(format!("extendedKeyUsage: {e}")))?
        .map(|ext| {
            let u = ext.value;
            let mut out = Vec::new();
            for (set, name) in [
                (u.any, "any"),
                (u.server_auth, "serverAuth"),
                (u.client_auth, "clientAuth"),
                (u.code_signing, "codeSigning"),
                (u.email_protection, "emailProtection"),
                (u.time_stamping, "timeStamping"),
                (u.ocsp_signing, "ocspSigning"),
            ] {
                if set {
                    out.push(name.to_owned());
                }
            }
            out.extend(u.other.iter().map(|oid| oid.to_id_string()));
            out
        })
        .unwrap_or_default();
    let public_key = match cert.public_key().parsed() {
        Ok(PublicKey::RSA(k)) => format!("RSA {}", k.key_size()),
        Ok(PublicKey::EC(p)) => format!("ECDSA {}", p.key_size()),
        Ok(_) | Err(_) => cert.public_key().algorithm.algorithm.to_id_string(),
    };
    let ts = |t: i64| {
        DateTime::<Utc>::from_timestamp(t, 0).ok_or_else(|| bad("validity out of range".into()))
    };
    Ok(CertInfo {
        subject: cert.subject().to_string(),
        subject_cn: first_cn(cert.subject()),
        issuer: cert.issuer().to_string(),
        issuer_cn: first_cn(cert.issuer()),
        sans,
        not_before: ts(cert.validity().not_before.timestamp())?,
        not_after: ts(cert.validity().not_after.timestamp())?,
        fingerprint_sha256: cert_fingerprint(der),
        is_ca: cert.is_ca(),
        extended_key_usages,
        public_key,
        serial: cert.raw_serial_as_string().replace(':', ""),
    })
}

/// `days` as a [`Duration`].
pub fn days(days: u32) -> Duration {
    Duration::from_secs(u64::from(days) * 86_400)
}

#[cfg(test)]
mod tests;
