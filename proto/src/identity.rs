//! Agent identity: the validated [`AgentName`] and how it is read from a client certificate, or
//! from a request header a service mesh sets ([`HeaderIdentity`]).
//!
//! Owns: the DNS-1123 label rule for agent names (upstream requires agent ids to be DNS labels
//! because the name doubles as the hub namespace), extracting the name from a certificate's
//! subject CN, from a SPIFFE-style URI SAN, or with upstream's regexes over the subject (as Go
//! prints it) or the URI SANs, and the certificate fingerprint format used by the
//! TLS blocklist (SHA-256 over the DER, uppercase hex). It does not decide whether a certificate
//! is trusted: chain and validity checks happen in the TLS handshake (see the process runtime's `tls` module).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Longest allowed agent name (DNS-1123 label limit).
pub const MAX_AGENT_NAME_LEN: usize = 63;

/// Name of an agent, validated once as a DNS-1123 label: 1 to 63 characters of lowercase
/// ASCII letters, digits and '-', starting and ending with a letter or digit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AgentName(String);

/// Why a string is not a valid [`AgentName`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentNameError {
    /// The name is the empty string.
    #[error(
        "agent name is empty; it must be a DNS-1123 label (1 to 63 characters of a-z, 0-9, '-')"
    )]
    Empty,
    /// The name is longer than 63 characters.
    #[error("agent name {name:?} is {len} characters long; a DNS-1123 label allows at most 63")]
    TooLong {
        /// The rejected name.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The name contains a character other than a-z, 0-9 and '-'.
    #[error(
        "agent name {name:?} contains {ch:?} at position {position}; only lowercase letters a-z, digits 0-9 and '-' are allowed"
    )]
    InvalidCharacter {
        /// The rejected name.
        name: String,
        /// The first offending character.
        ch: char,
        /// Its character index (0-based).
        position: usize,
    },
    /// The name starts or ends with '-'.
    #[error("agent name {name:?} must start and end with a lowercase letter or digit, not '-'")]
    DashAtEdge {
        /// The rejected name.
        name: String,
    },
}

impl AgentName {
    /// Validate `name` as a DNS-1123 label and wrap it.
    pub fn new(name: impl Into<String>) -> Result<Self, AgentNameError> {
        let name = name.into();
        validate_dns_label(&name)?;
        Ok(Self(name))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Give back the inner string.
    pub fn into_string(self) -> String {
        self.0
    }
}

fn validate_dns_label(name: &str) -> Result<(), AgentNameError> {
    if name.is_empty() {
        return Err(AgentNameError::Empty);
    }
    if name.len() > MAX_AGENT_NAME_LEN {
        return Err(AgentNameError::TooLong {
            name: name.to_owned(),
            len: name.len(),
        });
    }
    if let Some((position, ch)) = name
        .chars()
        .enumerate()
        .find(|(_, c)| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(AgentNameError::InvalidCharacter {
            name: name.to_owned(),
            ch,
            position,
        });
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(AgentNameError::DashAtEdge {
            name: name.to_owned(),
        });
    }
    Ok(())
}

impl FromStr for AgentName {
    type Err = AgentNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<&str> for AgentName {
    type Error = AgentNameError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl TryFrom<String> for AgentName {
    type Error = AgentNameError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl From<AgentName> for String {
    fn from(name: AgentName) -> Self {
        name.0
    }
}

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for AgentName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for AgentName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for AgentName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// Where in a client certificate the agent name is found.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum IdentitySource {
    /// The subject's common name (upstream's default `mtls:subject:` mode).
    #[default]
    CommonName,
    /// A URI SAN starting with `prefix` (SPIFFE style, e.g. `spiffe://example.org/agents/`);
    /// the name is the last path segment after the prefix.
    UriSan {
        /// URI prefix the SAN must start with.
        prefix: String,
    },
    /// Upstream's `mtls:subject:<regex>`: the first capture group of the regex matched against
    /// the subject DN as Go prints it (`CN=agent1,O=acme`: last RDN first, RFC 2253 escaping).
    SubjectRegex(IdentityPattern),
    /// Upstream's `mtls:uri:<regex>`: the first capture group of the first URI SAN the regex
    /// matches.
    UriRegex(IdentityPattern),
}

/// A compiled agent-name pattern with at least one capture group (compared by its text).
#[derive(Clone, Debug)]
pub struct IdentityPattern(regex::Regex);

impl IdentityPattern {
    /// Compiles `pattern`; refused without a capture group (it would name no agent).
    pub fn new(pattern: &str) -> Result<IdentityPattern, String> {
        let regex = regex::Regex::new(pattern).map_err(|e| format!("invalid regex: {e}"))?;
        if regex.captures_len() < 2 {
            return Err(format!(
                "the regex {pattern:?} has no capture group: put the agent name in (...)"
            ));
        }
        Ok(IdentityPattern(regex))
    }

    /// The pattern's text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The first capture group of the first match in `text`.
    fn capture<'t>(&self, text: &'t str) -> Option<&'t str> {
        self.0.captures(text)?.get(1).map(|m| m.as_str())
    }
}

impl PartialEq for IdentityPattern {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for IdentityPattern {}

/// Upstream's `header:<header-name>:<regex>` auth: the agent name is the first capture group of
/// `pattern` matched against the first value of request header `header`, which a service mesh
/// sidecar sets after terminating the agent's mTLS (e.g. `x-forwarded-client-cert`). Trusting it
/// is only sound on a listener nobody but the sidecar can reach; the principal only reads it on its
/// `--insecure-plaintext` listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderIdentity {
    /// Header name, lowercase (gRPC metadata keys are).
    pub header: String,
    /// Where the agent name sits in the header value.
    pub pattern: IdentityPattern,
}

/// Why a request header names no agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderIdentityError {
    /// The header is absent (or not text).
    #[error("header {0:?} not found in request: the service mesh must set it")]
    Missing(String),
    /// The value does not match (its text is not echoed: it may carry a client certificate).
    #[error("header {header:?} does not match the extraction regex {pattern:?}")]
    NoMatch {
        /// Header name.
        header: String,
        /// The regex.
        pattern: String,
    },
    /// The extracted value is not a valid agent name.
    #[error("header {header:?} names an invalid agent: {source}")]
    InvalidName {
        /// Header name.
        header: String,
        /// Why the name is invalid.
        #[source]
        source: AgentNameError,
    },
}

impl HeaderIdentity {
    /// Parses upstream's `<header-name>:<extraction-regex>` (the part after `header:`).
    pub fn parse(config: &str) -> Result<HeaderIdentity, String> {
        let (header, pattern) = config.split_once(':').ok_or_else(|| {
            format!(
                "header auth config must be in format <header-name>:<extraction-regex>, got: {config}"
            )
        })?;
        let header = header.trim();
        if header.is_empty() {
            return Err("header name cannot be empty".into());
        }
        if http_token(header).is_none() {
            return Err(format!("{header:?} is not a valid HTTP header name"));
        }
        let pattern = pattern.trim();
        if pattern.is_empty() {
            return Err("extraction regex cannot be empty".into());
        }
        Ok(HeaderIdentity {
            header: header.to_ascii_lowercase(),
            pattern: IdentityPattern::new(pattern)
                .map_err(|e| format!("invalid extraction regex: {e}"))?,
        })
    }

    /// The agent named by `value`, the header's first value (`None` = header absent).
    pub fn agent_of(&self, value: Option<&str>) -> Result<AgentName, HeaderIdentityError> {
        let value = value.ok_or_else(|| HeaderIdentityError::Missing(self.header.clone()))?;
        let raw = self
            .pattern
            .capture(value)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| HeaderIdentityError::NoMatch {
                header: self.header.clone(),
                pattern: self.pattern.as_str().to_owned(),
            })?;
        AgentName::new(raw).map_err(|source| HeaderIdentityError::InvalidName {
            header: self.header.clone(),
            source,
        })
    }
}

/// `name` if it is an RFC 9110 token (what a header name may be).
fn http_token(name: &str) -> Option<&str> {
    name.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        .then_some(name)
}

/// The identity of a connected agent, derived from its verified client certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentIdentity {
    /// The agent's name.
    pub name: AgentName,
    /// SHA-256 of the certificate DER, uppercase hex (the TLS blocklist format).
    pub fingerprint: String,
    /// End of the certificate's validity period.
    pub not_after: DateTime<Utc>,
}

/// Why no agent identity could be read from a certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The bytes are not a DER X.509 certificate.
    #[error("client certificate cannot be parsed: {reason}")]
    Unparseable {
        /// Parser message.
        reason: String,
    },
    /// The subject has no common name.
    #[error("client certificate subject {subject:?} has no common name (CN)")]
    NoCommonName {
        /// The subject DN as text.
        subject: String,
    },
    /// The subject has more than one common name, so the identity is ambiguous.
    #[error("client certificate subject {subject:?} has more than one common name")]
    AmbiguousCommonName {
        /// The subject DN as text.
        subject: String,
    },
    /// No URI SAN starts with the configured prefix.
    #[error("client certificate has no URI SAN starting with {prefix:?} (found: {found:?})")]
    NoMatchingUriSan {
        /// Configured prefix.
        prefix: String,
        /// URI SANs present in the certificate.
        found: Vec<String>,
    },
    /// More than one URI SAN matches the prefix.
    #[error("client certificate has several URI SANs starting with {prefix:?}: {found:?}")]
    AmbiguousUriSan {
        /// Configured prefix.
        prefix: String,
        /// The matching URIs.
        found: Vec<String>,
    },
    /// The agent-name regex does not match.
    #[error("client certificate {what} {found:?} does not match the agent name regex {pattern:?}")]
    NoRegexMatch {
        /// What was matched: the subject, or the URI SANs.
        what: &'static str,
        /// The text(s) matched against.
        found: Vec<String>,
        /// The regex.
        pattern: String,
    },
    /// The extracted value is not a valid agent name.
    #[error("client certificate names an invalid agent: {0}")]
    InvalidName(#[from] AgentNameError),
    /// The certificate's notAfter cannot be represented.
    #[error("client certificate has an out-of-range notAfter")]
    BadValidity,
}

impl AgentIdentity {
    /// Read the agent identity from a DER certificate (normally the verified peer leaf).
    pub fn from_cert_der(der: &[u8], source: &IdentitySource) -> Result<Self, IdentityError> {
        let (_, cert) = X509Certificate::from_der(der).map_err(|e| IdentityError::Unparseable {
            reason: e.to_string(),
        })?;
        let raw_name = match source {
            IdentitySource::CommonName => common_name(&cert)?,
            IdentitySource::UriSan { prefix } => uri_san_name(&cert, prefix)?,
            IdentitySource::SubjectRegex(pattern) => {
                let subject = go_subject(&cert);
                pattern
                    .capture(&subject)
                    .map(str::to_owned)
                    .ok_or_else(|| IdentityError::NoRegexMatch {
                        what: "subject",
                        found: vec![subject.clone()],
                        pattern: pattern.as_str().to_owned(),
                    })?
            }
            IdentitySource::UriRegex(pattern) => {
                let uris = uri_sans(&cert)?;
                uris.iter()
                    .find_map(|u| pattern.capture(u))
                    .map(str::to_owned)
                    .ok_or_else(|| IdentityError::NoRegexMatch {
                        what: "URI SANs",
                        found: uris.clone(),
                        pattern: pattern.as_str().to_owned(),
                    })?
            }
        };
        let name = AgentName::new(raw_name)?;
        let not_after = DateTime::<Utc>::from_timestamp(cert.validity().not_after.timestamp(), 0)
            .ok_or(IdentityError::BadValidity)?;
        Ok(Self {
            name,
            fingerprint: cert_fingerprint(der),
            not_after,
        })
    }
}

fn common_name(cert: &X509Certificate<'_>) -> Result<String, IdentityError> {
    let subject = cert.subject();
    let mut cns = subject.iter_common_name();
    let first = cns.next().ok_or_else(|| IdentityError::NoCommonName {
        subject: subject.to_string(),
    })?;
    if cns.next().is_some() {
        return Err(IdentityError::AmbiguousCommonName {
            subject: subject.to_string(),
        });
    }
    first
        .as_str()
        .map(str::to_owned)
        .map_err(|e| IdentityError::Unparseable {
            reason: format!("subject CN is not a string: {e}"),
        })
}

fn uri_sans(cert: &X509Certificate<'_>) -> Result<Vec<String>, IdentityError> {
    let ext = cert
        .subject_alternative_name()
        .map_err(|e| IdentityError::Unparseable {
            reason: format!("subjectAltName: {e}"),
        })?;
    Ok(ext
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(uri) => Some((*uri).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default())
}

fn uri_san_name(cert: &X509Certificate<'_>, prefix: &str) -> Result<String, IdentityError> {
    let uris = uri_sans(cert)?;
    let matching: Vec<&String> = uris.iter().filter(|u| u.starts_with(prefix)).collect();
    match matching.as_slice() {
        [] => Err(IdentityError::NoMatchingUriSan {
            prefix: prefix.to_owned(),
            found: uris.clone(),
        }),
        [uri] => {
            let rest = &uri[prefix.len()..];
            let last = rest.trim_end_matches('/').rsplit('/').next().unwrap_or("");
            Ok(last.to_owned())
        }
        many => Err(IdentityError::AmbiguousUriSan {
            prefix: prefix.to_owned(),
            found: many.iter().map(|s| (*s).clone()).collect(),
        }),
    }
}

/// The subject DN as Go's `pkix.Name.String()` prints it, which upstream's subject regexes are
/// written against: attributes Go does not parse into fields first (as `OID=#<DER hex>`), then C,
/// ST, L, STREET, POSTALCODE, O, OU (each one RDN, several values joined by `+`), the last CN and
/// the last SERIALNUMBER; printed last RDN first, joined by `,`, values escaped as RFC 2253.
fn go_subject(cert: &X509Certificate<'_>) -> String {
    use x509_parser::der_parser::asn1_rs::ToDer;
    const FIELDS: [(&str, &str); 7] = [
        ("2.5.4.6", "C"),
        ("2.5.4.8", "ST"),
        ("2.5.4.7", "L"),
        ("2.5.4.9", "STREET"),
        ("2.5.4.17", "POSTALCODE"),
        ("2.5.4.10", "O"),
        ("2.5.4.11", "OU"),
    ];
    const CN: &str = "2.5.4.3";
    const SERIAL: &str = "2.5.4.5";
    let attributes: Vec<(String, Option<&str>, Vec<u8>)> = cert
        .subject()
        .iter()
        .flat_map(|rdn| rdn.iter())
        .map(|atv| {
            let der = atv.attr_value().to_der_vec().unwrap_or_default();
            (atv.attr_type().to_id_string(), atv.as_str().ok(), der)
        })
        .collect();
    let escape = |value: &str| {
        let last = value.chars().count().saturating_sub(1);
        let mut out = String::with_capacity(value.len());
        for (i, c) in value.chars().enumerate() {
            let escaped = match c {
                ',' | '+' | '"' | '\\' | '<' | '>' | ';' => true,
                ' ' => i == 0 || i == last,
                '#' => i == 0,
                _ => false,
            };
            if escaped {
                out.push('\\');
            }
            out.push(c);
        }
        out
    };
    let mut rdns: Vec<String> = attributes
        .iter()
        .filter(|(oid, ..)| !FIELDS.iter().any(|(o, _)| o == oid) && oid != CN && oid != SERIAL)
        .map(|(oid, _, der)| format!("{oid}=#{}", hex::encode(der)))
        .collect();
    for (oid, name) in FIELDS {
        let values: Vec<String> = attributes
            .iter()
            .filter(|(o, ..)| o == oid)
            .filter_map(|(_, v, _)| v.map(|v| format!("{name}={}", escape(v))))
            .collect();
        if !values.is_empty() {
            rdns.push(values.join("+"));
        }
    }
    for (oid, name) in [(CN, "CN"), (SERIAL, "SERIALNUMBER")] {
        if let Some(v) = attributes
            .iter()
            .filter(|(o, ..)| o == oid)
            .filter_map(|(_, v, _)| *v)
            .next_back()
        {
            rdns.push(format!("{name}={}", escape(v)));
        }
    }
    rdns.reverse();
    rdns.join(",")
}

/// SHA-256 fingerprint of a DER certificate as uppercase hex, the format upstream's TLS
/// blocklist ConfigMap uses for its keys.
pub fn cert_fingerprint(der: &[u8]) -> String {
    hex::encode_upper(Sha256::digest(der))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_identity_reads_the_first_capture_group_as_upstream_does() {
        let xfcc = HeaderIdentity::parse(
            "X-Forwarded-Client-Cert:^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)",
        )
        .unwrap();
        assert_eq!(xfcc.header, "x-forwarded-client-cert");
        let value = "By=spiffe://c/ns/p/sa/principal;Hash=ab;URI=spiffe://c/ns/agents/sa/spoke-1";
        assert_eq!(xfcc.agent_of(Some(value)).unwrap().as_str(), "spoke-1");
        assert_eq!(
            xfcc.agent_of(None).unwrap_err(),
            HeaderIdentityError::Missing("x-forwarded-client-cert".into())
        );
        let e = xfcc.agent_of(Some("Hash=ab")).unwrap_err();
        assert!(matches!(e, HeaderIdentityError::NoMatch { .. }), "{e}");
        assert!(
            !e.to_string().contains("Hash=ab"),
            "the value is not echoed: {e}"
        );
        let plain = HeaderIdentity::parse("x-agent-id:^(.+)$").unwrap();
        assert!(matches!(
            plain.agent_of(Some("Not_A_Label")).unwrap_err(),
            HeaderIdentityError::InvalidName { .. }
        ));
    }

    #[test]
    fn header_identity_config_errors_say_what_is_wrong() {
        for (config, expected) in [
            ("x-agent-id", "format <header-name>:<extraction-regex>"),
            (" :(.+)", "header name cannot be empty"),
            ("x-agent-id: ", "extraction regex cannot be empty"),
            ("x-agent-id:(", "invalid extraction regex"),
            ("x-agent-id:.+", "no capture group"),
            ("x agent:(.+)", "not a valid HTTP header name"),
        ] {
            let e = HeaderIdentity::parse(config).unwrap_err();
            assert!(e.contains(expected), "{config}: {e}");
        }
    }
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

    fn cert_with(cn: Option<&str>, uris: &[&str]) -> Vec<u8> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        if let Some(cn) = cn {
            dn.push(DnType::CommonName, cn);
        }
        params.distinguished_name = dn;
        params.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI((*u).try_into().unwrap()))
            .collect();
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn cert_with_subject(dn_parts: &[(DnType, &str)], uris: &[&str]) -> Vec<u8> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        for (t, v) in dn_parts {
            dn.push(t.clone(), *v);
        }
        params.distinguished_name = dn;
        params.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI((*u).try_into().unwrap()))
            .collect();
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn subject_of(der: &[u8]) -> String {
        go_subject(&X509Certificate::from_der(der).unwrap().1)
    }

    #[test]
    fn the_subject_is_printed_as_go_prints_it() {
        let der = cert_with_subject(
            &[
                (DnType::CommonName, "agent1"),
                (DnType::OrganizationName, "acme, inc"),
                (DnType::CountryName, "DE"),
                (DnType::OrganizationalUnitName, " fleet"),
            ],
            &[],
        );
        // Go: C, O, OU, then CN, printed last first; ',' and a leading space escaped.
        assert_eq!(subject_of(&der), "CN=agent1,OU=\\ fleet,O=acme\\, inc,C=DE");
    }

    #[test]
    fn upstreams_subject_and_uri_regexes_name_the_agent_by_their_first_group() {
        let der = cert_with_subject(
            &[
                (DnType::OrganizationName, "acme"),
                (DnType::CommonName, "agent1"),
            ],
            &["spiffe://example.org/ns/argocd-agent/sa/spoke-7"],
        );
        let subject = |re: &str| {
            AgentIdentity::from_cert_der(
                &der,
                &IdentitySource::SubjectRegex(IdentityPattern::new(re).unwrap()),
            )
        };
        assert_eq!(subject("CN=([^,]+)").unwrap().name.as_str(), "agent1");
        assert_eq!(subject("^CN=[^,]+,O=(.+)$").unwrap().name.as_str(), "acme");
        let err = subject("OU=([^,]+)").unwrap_err();
        assert!(
            matches!(&err, IdentityError::NoRegexMatch { found, .. } if found == &["CN=agent1,O=acme"]),
            "{err}"
        );
        let uri = |re: &str| {
            AgentIdentity::from_cert_der(
                &der,
                &IdentitySource::UriRegex(IdentityPattern::new(re).unwrap()),
            )
        };
        assert_eq!(
            uri("spiffe://example\\.org/ns/argocd-agent/sa/(.+)")
                .unwrap()
                .name
                .as_str(),
            "spoke-7"
        );
        assert!(matches!(
            uri("spiffe://other/(.+)").unwrap_err(),
            IdentityError::NoRegexMatch {
                what: "URI SANs",
                ..
            }
        ));
        // A group naming something that is not a DNS label is still refused.
        assert!(matches!(
            subject("(CN=[^,]+)").unwrap_err(),
            IdentityError::InvalidName(_)
        ));
        assert!(IdentityPattern::new("CN=.+")
            .unwrap_err()
            .contains("no capture group"));
        assert!(IdentityPattern::new("CN=(")
            .unwrap_err()
            .contains("invalid regex"));
    }

    #[test]
    fn agent_name_accepts_dns_labels() {
        for ok in ["a", "spoke1", "my-agent-0", &"a".repeat(63)] {
            assert_eq!(AgentName::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn agent_name_rejections_say_what_is_wrong() {
        assert_eq!(AgentName::new(""), Err(AgentNameError::Empty));
        let e = AgentName::new("a".repeat(64)).unwrap_err();
        assert!(e.to_string().contains("64 characters"), "{e}");
        let e = AgentName::new("Spoke").unwrap_err();
        assert!(matches!(
            e,
            AgentNameError::InvalidCharacter {
                ch: 'S',
                position: 0,
                ..
            }
        ));
        let e = AgentName::new("a.b").unwrap_err();
        assert!(e.to_string().contains("'.'"), "{e}");
        assert!(matches!(
            AgentName::new("-a").unwrap_err(),
            AgentNameError::DashAtEdge { .. }
        ));
        assert!(matches!(
            AgentName::new("a-").unwrap_err(),
            AgentNameError::DashAtEdge { .. }
        ));
    }

    #[test]
    fn agent_name_serde_round_trips_and_validates() {
        let n: AgentName = serde_json::from_str("\"spoke1\"").unwrap();
        assert_eq!(serde_json::to_string(&n).unwrap(), "\"spoke1\"");
        assert!(serde_json::from_str::<AgentName>("\"Bad_Name\"").is_err());
        let parsed: AgentName = "spoke2".parse().unwrap();
        assert_eq!(parsed.to_string(), "spoke2");
        assert_eq!(AgentName::try_from("x").unwrap(), "x");
    }

    #[test]
    fn identity_from_common_name() {
        let der = cert_with(Some("spoke1"), &[]);
        let id = AgentIdentity::from_cert_der(&der, &IdentitySource::CommonName).unwrap();
        assert_eq!(id.name, "spoke1");
        assert_eq!(id.fingerprint, cert_fingerprint(&der));
        assert_eq!(id.fingerprint.len(), 64);
        assert_eq!(id.fingerprint, id.fingerprint.to_uppercase());
    }

    #[test]
    fn identity_requires_a_valid_common_name() {
        let der = cert_with(None, &[]);
        assert!(matches!(
            AgentIdentity::from_cert_der(&der, &IdentitySource::CommonName),
            Err(IdentityError::NoCommonName { .. })
        ));
        let der = cert_with(Some("Not_A_Label"), &[]);
        assert!(matches!(
            AgentIdentity::from_cert_der(&der, &IdentitySource::CommonName),
            Err(IdentityError::InvalidName(_))
        ));
    }

    #[test]
    fn identity_from_spiffe_uri_san_takes_last_segment() {
        let der = cert_with(
            Some("ignored"),
            &[
                "https://other.example/x",
                "spiffe://example.org/ns/argocd/agent/spoke7",
            ],
        );
        let src = IdentitySource::UriSan {
            prefix: "spiffe://example.org/".into(),
        };
        let id = AgentIdentity::from_cert_der(&der, &src).unwrap();
        assert_eq!(id.name, "spoke7");

        let src = IdentitySource::UriSan {
            prefix: "spiffe://other.org/".into(),
        };
        let err = AgentIdentity::from_cert_der(&der, &src).unwrap_err();
        assert!(
            matches!(err, IdentityError::NoMatchingUriSan { .. }),
            "{err}"
        );
    }

    #[test]
    fn garbage_is_not_a_certificate() {
        assert!(matches!(
            AgentIdentity::from_cert_der(b"nope", &IdentitySource::CommonName),
            Err(IdentityError::Unparseable { .. })
        ));
    }
}
