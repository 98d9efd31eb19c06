//! Certificates the operator keeps current on the hub: the CA (created once, never silently
//! replaced), the principal's gRPC server certificate and the resource proxy's server
//! certificate (SANs from server discovery or explicit overrides), and the rule that decides when
//! any issued certificate must be reissued (missing, unreadable, not from the current CA, about
//! to expire, outliving the CA, or with other names than wanted).
//!
//! Owns the renewal policy and the hub Secrets' contents; the CA operations themselves are
//! [`crate::pki`], the Secret names and layouts [`crate::pki::secrets`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;

use crate::pki::secrets::{
    ca_from_secret, secret_text, tls_secret, SecretStore, CA_CERT_KEY, CA_SECRET,
    PRINCIPAL_TLS_SECRET, RESOURCE_PROXY_TLS_SECRET, TLS_CERT_KEY,
};
use crate::pki::{
    days, inspect, CertificateAuthority, IssuedCert, PkiError, DEFAULT_CA_COMMON_NAME,
    PRINCIPAL_COMMON_NAME, RESOURCE_PROXY_COMMON_NAME,
};

/// Secret with the CA certificate alone (no key), for whoever needs to trust the fleet CA.
pub const CA_BUNDLE_SECRET: &str = "argocd-agent-ca-bundle";
/// Default Service whose LoadBalancer ingress is the principal's public address (upstream's fixed
/// name; `--operator-principal-service` names another, e.g. the chart's release-named one).
pub const PRINCIPAL_SERVICE: &str = "argocd-agent-principal";
/// Service of the resource proxy (its in-cluster DNS names go into its certificate).
pub const RESOURCE_PROXY_SERVICE: &str = "argocd-agent-resource-proxy";

/// Lifetimes of the CA and issued certificates, and how early certificates are renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CertPolicy {
    /// Validity of a CA the operator creates (upstream: 1 year).
    pub ca_validity: Duration,
    /// Validity of issued certificates (upstream: 30 days).
    pub cert_validity: Duration,
    /// Reissue a certificate when less than this is left of it.
    pub renew_before: Duration,
}

impl Default for CertPolicy {
    fn default() -> Self {
        CertPolicy {
            ca_validity: days(365),
            cert_validity: days(30),
            renew_before: days(10),
        }
    }
}

impl CertPolicy {
    /// Validity for a certificate issued now by `ca`: the policy's, cut to end with the CA.
    pub fn leaf_validity(&self, ca: &CertificateAuthority, now: DateTime<Utc>) -> Duration {
        let ca_left = (ca.info().not_after - now)
            .to_std()
            .unwrap_or(Duration::ZERO);
        self.cert_validity.min(ca_left).max(Duration::from_secs(60))
    }
}

/// Why a certificate has to be (re)issued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reissue {
    /// There is none.
    Missing,
    /// It cannot be parsed.
    Unreadable(String),
    /// It was not issued by the current CA (e.g. the CA was rotated).
    NotFromCurrentCa,
    /// It expires within the renewal window.
    ExpiresSoon(DateTime<Utc>),
    /// Its subject CN or SANs are not the wanted ones.
    NamesChanged,
}

impl std::fmt::Display for Reissue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing => f.write_str("missing"),
            Self::Unreadable(e) => write!(f, "unreadable ({e})"),
            Self::NotFromCurrentCa => f.write_str("not issued by the current CA"),
            Self::ExpiresSoon(t) => write!(f, "expires {t}"),
            Self::NamesChanged => f.write_str("names changed"),
        }
    }
}

/// Whether `cert_pem` must be reissued to be a current certificate for `cn` (and exactly `sans`,
/// as `DNS:x`/`IP:y`, when given) from `ca`.
pub fn reissue_reason(
    cert_pem: Option<&str>,
    ca: &CertificateAuthority,
    policy: &CertPolicy,
    cn: &str,
    sans: Option<&[String]>,
    now: DateTime<Utc>,
) -> Option<Reissue> {
    let Some(pem) = cert_pem.filter(|p| !p.trim().is_empty()) else {
        return Some(Reissue::Missing);
    };
    let info = match inspect(pem) {
        Ok(i) => i,
        Err(e) => return Some(Reissue::Unreadable(e.to_string())),
    };
    if ca.verify_issued(pem).is_err() {
        return Some(Reissue::NotFromCurrentCa);
    }
    let renew_before =
        chrono::Duration::from_std(policy.renew_before).unwrap_or(chrono::Duration::zero());
    if info.not_after - renew_before <= now || info.not_after > ca.info().not_after {
        return Some(Reissue::ExpiresSoon(info.not_after));
    }
    if info.subject_cn.as_deref() != Some(cn) {
        return Some(Reissue::NamesChanged);
    }
    if let Some(wanted) = sans {
        let mut have = info.sans.clone();
        let mut want = wanted.to_vec();
        have.sort();
        want.sort();
        if have != want {
            return Some(Reissue::NamesChanged);
        }
    }
    None
}

/// Why the CA cannot be used; reported on every GitOpsCluster, never repaired silently.
#[derive(Debug, thiserror::Error)]
pub enum CaProblem {
    /// The CA Secret exists but is not a usable CA: somebody changed it.
    #[error(
        "CA secret {location} is not a usable CA ({reason}); restore it, or delete it to have a new CA created (every agent then gets new certificates)"
    )]
    Tampered {
        /// `namespace/name`.
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// The CA has expired.
    #[error("CA secret {location} expired at {not_after}; delete it to have a new CA created")]
    Expired {
        /// `namespace/name`.
        location: String,
        /// When it expired.
        not_after: DateTime<Utc>,
    },
    /// The apiserver failed.
    #[error("{0}")]
    Pki(#[from] PkiError),
}

/// Loads the CA from `argocd-agent-ca`, creating it when absent, and keeps the CA-only bundle
/// Secret in step. Returns the CA and whether it was created now.
pub async fn ensure_ca(
    store: &SecretStore,
    policy: &CertPolicy,
) -> Result<(CertificateAuthority, bool), CaProblem> {
    let location = format!("{}/{CA_SECRET}", store.namespace());
    let (ca, created) = match store.get(CA_SECRET).await? {
        Some(secret) => {
            let ca = ca_from_secret(&secret).map_err(|e| CaProblem::Tampered {
                location: location.clone(),
                reason: e.to_string(),
            })?;
            (ca, false)
        }
        None => {
            let ca = CertificateAuthority::generate(DEFAULT_CA_COMMON_NAME, policy.ca_validity)?;
            match store
                .write(
                    &crate::pki::secrets::ca_secret(store.namespace(), &ca),
                    false,
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = %location, "created the fleet CA");
                    (ca, true)
                }
                // Another replica won the race: use its CA.
                Err(PkiError::AlreadyExists { .. }) => (store.load_ca().await?, false),
                Err(e) => return Err(e.into()),
            }
        }
    };
    let not_after = ca.info().not_after;
    if not_after <= Utc::now() {
        return Err(CaProblem::Expired {
            location,
            not_after,
        });
    }
    let bundle = ca_bundle_secret(store.namespace(), ca.cert_pem());
    let current = store.get(CA_BUNDLE_SECRET).await?;
    if current
        .as_ref()
        .and_then(|s| secret_text(s, CA_CERT_KEY).ok())
        .as_deref()
        != Some(ca.cert_pem())
    {
        store.write(&bundle, true).await?;
    }
    Ok((ca, created))
}

/// The CA-only Secret `argocd-agent-ca-bundle` (`ca.crt`).
pub fn ca_bundle_secret(namespace: &str, ca_pem: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(CA_BUNDLE_SECRET.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            CA_CERT_KEY.to_owned(),
            ByteString(ca_pem.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}

/// The names a server certificate carries, as `DNS:x` / `IP:y`.
pub fn server_sans(service: &str, namespace: &str, extra_hosts: &[String]) -> Vec<String> {
    let mut hosts = vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    hosts.extend(extra_hosts.iter().cloned());
    let mut sans: Vec<String> = hosts
        .iter()
        .filter(|h| !h.is_empty())
        .map(|h| match h.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(ip) => format!("IP:{ip}"),
            Err(_) => format!("DNS:{h}"),
        })
        .collect();
    sans.sort();
    sans.dedup();
    sans
}

/// The names the principal's gRPC certificate carries: its Service's in-cluster names and
/// `hosts` (where agents dial it).
pub fn principal_sans(opts: &super::OperatorOptions, hosts: &[String]) -> Vec<String> {
    server_sans(&opts.principal_service, &opts.namespace, hosts)
}

/// The names the resource proxy's certificate carries: its Service's in-cluster names and the
/// host of `--operator-resource-proxy-address` (where the hub Argo CD reaches it).
pub fn resource_proxy_sans(opts: &super::OperatorOptions) -> Vec<String> {
    let proxy_host = opts
        .resource_proxy_address
        .rsplit_once(':')
        .map(|(h, _)| h.trim_matches(['[', ']']).to_owned())
        .unwrap_or_default();
    server_sans(RESOURCE_PROXY_SERVICE, &opts.namespace, &[proxy_host])
}

fn split_sans(sans: &[String]) -> (Vec<String>, Vec<IpAddr>) {
    let dns = sans
        .iter()
        .filter_map(|s| s.strip_prefix("DNS:").map(str::to_owned))
        .collect();
    let ips = sans
        .iter()
        .filter_map(|s| s.strip_prefix("IP:").and_then(|ip| ip.parse().ok()))
        .collect();
    (dns, ips)
}

/// What [`ensure_server_cert`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerCertState {
    /// Secret name.
    pub secret: &'static str,
    /// Why it was (re)issued now, if it was.
    pub reissued: Option<Reissue>,
    /// End of validity of the current certificate.
    pub not_after: DateTime<Utc>,
}

/// Keeps the principal's or the resource proxy's server certificate Secret current.
pub async fn ensure_server_cert(
    store: &SecretStore,
    ca: &CertificateAuthority,
    policy: &CertPolicy,
    secret_name: &'static str,
    sans: &[String],
) -> Result<ServerCertState, PkiError> {
    let cn = match secret_name {
        PRINCIPAL_TLS_SECRET => PRINCIPAL_COMMON_NAME,
        RESOURCE_PROXY_TLS_SECRET => RESOURCE_PROXY_COMMON_NAME,
        other => other,
    };
    let existing = store.get(secret_name).await?;
    let pem = existing
        .as_ref()
        .and_then(|s| secret_text(s, TLS_CERT_KEY).ok());
    let now = Utc::now();
    match reissue_reason(pem.as_deref(), ca, policy, cn, Some(sans), now) {
        None => Ok(ServerCertState {
            secret: secret_name,
            reissued: None,
            not_after: inspect(pem.as_deref().unwrap_or_default())?.not_after,
        }),
        Some(reason) => {
            let (dns, ips) = split_sans(sans);
            let issued: IssuedCert =
                ca.issue_server(cn, &dns, &ips, policy.leaf_validity(ca, now))?;
            store
                .write(
                    &tls_secret(secret_name, store.namespace(), &issued, None),
                    true,
                )
                .await?;
            tracing::info!(secret = %format!("{}/{secret_name}", store.namespace()), %reason, "issued server certificate");
            Ok(ServerCertState {
                secret: secret_name,
                not_after: inspect(&issued.cert_pem)?.not_after,
                reissued: Some(reason),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> CertificateAuthority {
        CertificateAuthority::generate("argocd-agent-ca", days(365)).unwrap()
    }

    #[test]
    fn a_current_certificate_is_kept_and_each_defect_forces_reissue() {
        let ca = ca();
        let policy = CertPolicy::default();
        let now = Utc::now();
        let sans = server_sans("argocd-agent-principal", "argocd", &["127.0.0.1".into()]);
        let (dns, ips) = split_sans(&sans);
        let good = ca
            .issue_server("argocd-agent-principal", &dns, &ips, days(30))
            .unwrap();
        let check = |pem: Option<&str>, ca: &CertificateAuthority, sans: &[String], now| {
            reissue_reason(pem, ca, &policy, "argocd-agent-principal", Some(sans), now)
        };
        assert_eq!(check(Some(&good.cert_pem), &ca, &sans, now), None);
        assert_eq!(check(None, &ca, &sans, now), Some(Reissue::Missing));
        assert!(matches!(
            check(Some("garbage"), &ca, &sans, now),
            Some(Reissue::Unreadable(_))
        ));
        assert_eq!(
            check(Some(&good.cert_pem), &self::ca(), &sans, now),
            Some(Reissue::NotFromCurrentCa)
        );
        let in_25_days = now + chrono::Duration::days(25);
        assert!(matches!(
            check(Some(&good.cert_pem), &ca, &sans, in_25_days),
            Some(Reissue::ExpiresSoon(_))
        ));
        let other = server_sans("argocd-agent-principal", "argocd", &["10.0.0.1".into()]);
        assert_eq!(
            check(Some(&good.cert_pem), &ca, &other, now),
            Some(Reissue::NamesChanged)
        );
    }

    #[test]
    fn certificates_never_outlive_their_ca() {
        let short_ca = CertificateAuthority::generate("argocd-agent-ca", days(5)).unwrap();
        let policy = CertPolicy {
            renew_before: days(1),
            ..CertPolicy::default()
        };
        let v = policy.leaf_validity(&short_ca, Utc::now());
        assert!(v <= days(5), "{v:?}");
        let issued = short_ca.issue_client("c1", v).unwrap();
        assert_eq!(
            reissue_reason(
                Some(&issued.cert_pem),
                &short_ca,
                &policy,
                "c1",
                None,
                Utc::now()
            ),
            None
        );
        // Issued by a long CA for 30 days, then the CA's window shrinks: reissue.
        let long_cert = short_ca.issue_client("c1", days(30)).unwrap();
        assert!(matches!(
            reissue_reason(
                Some(&long_cert.cert_pem),
                &short_ca,
                &policy,
                "c1",
                None,
                Utc::now()
            ),
            Some(Reissue::ExpiresSoon(_))
        ));
    }

    #[test]
    fn server_names_include_service_dns_and_overrides() {
        let sans = server_sans(
            "argocd-agent-principal",
            "gitops",
            &["principal.example.com".into(), "[::1]".into()],
        );
        assert!(sans.contains(&"DNS:argocd-agent-principal.gitops.svc".to_string()));
        assert!(sans.contains(&"DNS:principal.example.com".to_string()));
        assert!(sans.contains(&"IP:::1".to_string()));
    }
}
