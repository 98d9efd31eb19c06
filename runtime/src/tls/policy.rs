//! Which TLS the principal and the agent speak: the protocol version range
//! (`--tls-min-version` / `--tls-max-version`) and the cipher suites (`--tls-ciphersuites`), as
//! upstream's flags of the same names.
//!
//! Owns [`TlsVersion`], [`TlsPolicy`] (checked once at start-up, then applied to every config this
//! crate builds: its versions and a `ring` provider narrowed to its suites) and the names of the
//! suites offered ([`available_cipher_suites`]). Suite names are IANA's, as Go's `tls.CipherSuites()`
//! prints them (`TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256`, `TLS_AES_128_GCM_SHA256`); rustls'
//! `TLS13_` spelling is accepted too. A TLS version none of the listed suites belongs to keeps all
//! of its suites (as in Go, where TLS 1.3 suites cannot be configured), so a Go configuration
//! listing only TLS 1.2 suites behaves the same here; unlike Go, TLS 1.3 suites can be narrowed
//! by listing them.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{ProtocolVersion, SupportedCipherSuite, SupportedProtocolVersion};

use super::{crypto_provider, TlsError};

/// A TLS protocol version a config may accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum TlsVersion {
    /// TLS 1.2.
    Tls12,
    /// TLS 1.3.
    #[default]
    Tls13,
}

impl TlsVersion {
    fn of(suite: &SupportedCipherSuite) -> TlsVersion {
        if suite.version().version == ProtocolVersion::TLSv1_3 {
            TlsVersion::Tls13
        } else {
            TlsVersion::Tls12
        }
    }
}

impl FromStr for TlsVersion {
    type Err = TlsError;
    /// Accepts upstream's spelling (`tls1.2`, `tls1.3`) and the bare numbers.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "tls1.2" | "1.2" => Ok(Self::Tls12),
            "tls1.3" | "1.3" => Ok(Self::Tls13),
            _ => Err(TlsError::UnknownVersion {
                value: s.to_owned(),
            }),
        }
    }
}

impl fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tls12 => "tls1.2",
            Self::Tls13 => "tls1.3",
        })
    }
}

/// Protocol versions and cipher suites applied to every config. The default is TLS 1.3 only
/// with every suite of the provider (upstream's principal default).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TlsPolicy {
    /// Lowest accepted protocol version.
    pub min_version: TlsVersion,
    /// Highest accepted protocol version.
    pub max_version: TlsVersion,
    /// The suites offered; empty: every suite of the provider.
    cipher_suites: Vec<SupportedCipherSuite>,
}

/// The IANA name of `suite` (rustls names TLS 1.3 suites `TLS13_…`).
fn iana_name(suite: &SupportedCipherSuite) -> String {
    let name = suite
        .suite()
        .as_str()
        .map_or_else(|| format!("{:?}", suite.suite()), str::to_string);
    match name.strip_prefix("TLS13_") {
        Some(rest) => format!("TLS_{rest}"),
        None => name,
    }
}

/// The names `--tls-ciphersuites` accepts, with the TLS version each belongs to.
pub fn available_cipher_suites() -> Vec<(String, TlsVersion)> {
    crypto_provider()
        .cipher_suites
        .iter()
        .map(|s| (iana_name(s), TlsVersion::of(s)))
        .collect()
}

impl TlsPolicy {
    /// Versions from `min` to `max`, every suite.
    pub fn versions_between(min: TlsVersion, max: TlsVersion) -> Result<TlsPolicy, TlsError> {
        TlsPolicy::new(min, max, &[])
    }

    /// Versions from `min` to `max` and the suites named in `cipher_suites` (IANA names; empty:
    /// all). Refused: `min` above `max`, an unknown name, a suite of a version outside the range.
    pub fn new(
        min: TlsVersion,
        max: TlsVersion,
        cipher_suites: &[String],
    ) -> Result<TlsPolicy, TlsError> {
        if min > max {
            return Err(TlsError::Policy(format!(
                "--tls-min-version {min} is above --tls-max-version {max}; lower the minimum or raise the maximum"
            )));
        }
        let offered = crypto_provider().cipher_suites.clone();
        let mut chosen = Vec::new();
        for name in cipher_suites
            .iter()
            .map(|n| n.trim())
            .filter(|n| !n.is_empty())
        {
            let wanted = name.to_ascii_uppercase().replacen("TLS13_", "TLS_", 1);
            let Some(suite) = offered.iter().find(|s| iana_name(s) == wanted) else {
                let names: Vec<String> =
                    available_cipher_suites().into_iter().map(|s| s.0).collect();
                return Err(TlsError::Policy(format!(
                    "--tls-ciphersuites: no such cipher suite {name}; available: {}",
                    names.join(", ")
                )));
            };
            let version = TlsVersion::of(suite);
            if version < min || version > max {
                return Err(TlsError::Policy(format!(
                    "--tls-ciphersuites: {name} is a {version} suite, outside --tls-min-version {min} .. --tls-max-version {max}"
                )));
            }
            if !chosen.contains(suite) {
                chosen.push(*suite);
            }
        }
        if !chosen.is_empty() {
            // A version none of the listed suites belongs to keeps all of its suites.
            for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
                if !chosen.iter().any(|s| TlsVersion::of(s) == version) {
                    chosen.extend(offered.iter().filter(|s| TlsVersion::of(s) == version));
                }
            }
        }
        Ok(TlsPolicy {
            min_version: min,
            max_version: max,
            cipher_suites: chosen,
        })
    }

    /// The protocol versions in the range.
    pub(super) fn versions(&self) -> Vec<&'static SupportedProtocolVersion> {
        let mut versions = Vec::new();
        if self.max_version >= TlsVersion::Tls13 {
            versions.push(&rustls::version::TLS13);
        }
        if self.min_version <= TlsVersion::Tls12 {
            versions.push(&rustls::version::TLS12);
        }
        versions
    }

    /// The `ring` provider narrowed to the policy's suites.
    pub(super) fn provider(&self) -> Arc<CryptoProvider> {
        if self.cipher_suites.is_empty() {
            return crypto_provider();
        }
        Arc::new(CryptoProvider {
            cipher_suites: self.cipher_suites.clone(),
            ..rustls::crypto::ring::default_provider()
        })
    }

    /// The IANA names of the suites offered under this policy, within its versions.
    pub fn cipher_suite_names(&self) -> Vec<String> {
        self.provider()
            .cipher_suites
            .iter()
            .filter(|s| (self.min_version..=self.max_version).contains(&TlsVersion::of(s)))
            .map(iana_name)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_version_range_is_checked_and_applied() {
        let both = TlsPolicy::versions_between(TlsVersion::Tls12, TlsVersion::Tls13).unwrap();
        assert_eq!(both.versions().len(), 2);
        let only12 = TlsPolicy::versions_between(TlsVersion::Tls12, TlsVersion::Tls12).unwrap();
        assert_eq!(only12.versions(), vec![&rustls::version::TLS12]);
        assert_eq!(
            TlsPolicy::default().versions(),
            vec![&rustls::version::TLS13]
        );
        let err = TlsPolicy::versions_between(TlsVersion::Tls13, TlsVersion::Tls12).unwrap_err();
        assert!(err.to_string().contains("above --tls-max-version"), "{err}");
    }

    #[test]
    fn suites_are_named_as_iana_and_go_name_them_and_narrow_only_their_own_version() {
        let available = available_cipher_suites();
        assert!(available.contains(&("TLS_AES_128_GCM_SHA256".into(), TlsVersion::Tls13)));
        assert!(available.contains(&(
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".into(),
            TlsVersion::Tls12
        )));
        // A Go configuration listing TLS 1.2 suites only: TLS 1.3 keeps all of its suites.
        let policy = TlsPolicy::new(
            TlsVersion::Tls12,
            TlsVersion::Tls13,
            &names(&["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"]),
        )
        .unwrap();
        let offered = policy.cipher_suite_names();
        assert!(offered.contains(&"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384".into()));
        assert!(!offered.contains(&"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".into()));
        assert!(offered.contains(&"TLS_AES_128_GCM_SHA256".into()));
        // TLS 1.3 narrowed, in either spelling.
        let policy = TlsPolicy::new(
            TlsVersion::Tls13,
            TlsVersion::Tls13,
            &names(&["TLS13_AES_256_GCM_SHA384"]),
        )
        .unwrap();
        assert_eq!(
            policy.cipher_suite_names(),
            names(&["TLS_AES_256_GCM_SHA384"])
        );
    }

    #[test]
    fn unknown_suites_and_suites_outside_the_range_are_refused_with_what_to_do() {
        let err = TlsPolicy::new(
            TlsVersion::Tls13,
            TlsVersion::Tls13,
            &names(&["TLS_RSA_WITH_RC4"]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("no such cipher suite") && err.contains("TLS_AES_128_GCM_SHA256"),
            "{err}"
        );
        let err = TlsPolicy::new(
            TlsVersion::Tls13,
            TlsVersion::Tls13,
            &names(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("is a tls1.2 suite, outside"), "{err}");
    }
}
