//! Kubernetes Secret storage for the PKI, with upstream's Secret names and keys.
//!
//! On the hub, in the principal's namespace: the CA `argocd-agent-ca` (`kubernetes.io/tls`,
//! `tls.crt`/`tls.key`), the principal's gRPC certificate `argocd-agent-principal-tls`, the
//! resource proxy's certificate `argocd-agent-resource-proxy-tls` and the JWT signing key
//! `argocd-agent-jwt` (`jwt.key`). On a spoke, in the agent's namespace: the client
//! certificate `argocd-agent-client-tls` (`tls.crt`/`tls.key`, plus `ca.crt` for convenience)
//! and the CA certificate alone as `argocd-agent-ca` (Opaque, `ca.crt`), which is what
//! upstream's `pki propagate` writes. The Secret objects are built by pure functions so they
//! can be tested (and embedded in ManifestWorks) without an apiserver.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, PostParams};

use super::{CertRole, CertificateAuthority, IssuedCert, PkiError};

/// CA Secret on the hub (`tls.crt` + `tls.key`); on a spoke the same name holds `ca.crt` only.
pub const CA_SECRET: &str = "argocd-agent-ca";
/// Principal gRPC server certificate.
pub const PRINCIPAL_TLS_SECRET: &str = "argocd-agent-principal-tls";
/// Resource proxy server certificate.
pub const RESOURCE_PROXY_TLS_SECRET: &str = "argocd-agent-resource-proxy-tls";
/// Agent client certificate (on the spoke).
pub const AGENT_CLIENT_TLS_SECRET: &str = "argocd-agent-client-tls";
/// CA certificate for the agent (on the spoke).
pub const AGENT_CA_SECRET: &str = "argocd-agent-ca";
/// JWT signing key.
pub const JWT_SECRET: &str = "argocd-agent-jwt";

/// Data key of a certificate in a TLS Secret.
pub const TLS_CERT_KEY: &str = "tls.crt";
/// Data key of a private key in a TLS Secret.
pub const TLS_KEY_KEY: &str = "tls.key";
/// Data key of a CA certificate.
pub const CA_CERT_KEY: &str = "ca.crt";
/// Data key of the JWT signing key.
pub const JWT_KEY_KEY: &str = "jwt.key";

/// Secret type for certificate + key.
pub const SECRET_TYPE_TLS: &str = "kubernetes.io/tls";
/// Generic Secret type.
pub const SECRET_TYPE_OPAQUE: &str = "Opaque";

/// Secret name for a certificate role.
pub fn role_secret_name(role: &CertRole) -> &'static str {
    match role {
        CertRole::Principal => PRINCIPAL_TLS_SECRET,
        CertRole::ResourceProxy => RESOURCE_PROXY_TLS_SECRET,
        CertRole::Agent(_) => AGENT_CLIENT_TLS_SECRET,
    }
}

fn secret(
    name: &str,
    namespace: &str,
    type_: &str,
    data: impl IntoIterator<Item = (&'static str, String)>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        type_: Some(type_.to_owned()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Secret::default()
    }
}

/// The hub's CA Secret.
pub fn ca_secret(namespace: &str, ca: &CertificateAuthority) -> Secret {
    secret(
        CA_SECRET,
        namespace,
        SECRET_TYPE_TLS,
        [
            (TLS_CERT_KEY, ca.cert_pem().to_owned()),
            (TLS_KEY_KEY, ca.key_pem()),
        ],
    )
}

/// A `kubernetes.io/tls` Secret for an issued certificate, with `ca.crt` if given.
pub fn tls_secret(
    name: &str,
    namespace: &str,
    issued: &IssuedCert,
    ca_pem: Option<&str>,
) -> Secret {
    let mut data = vec![
        (TLS_CERT_KEY, issued.cert_pem.clone()),
        (TLS_KEY_KEY, issued.key_pem.clone()),
    ];
    data.extend(ca_pem.map(|ca| (CA_CERT_KEY, ca.to_owned())));
    secret(name, namespace, SECRET_TYPE_TLS, data)
}

/// The Secret for `role`: server certificates as upstream (no `ca.crt`), the agent client
/// certificate with `ca.crt`.
pub fn role_secret(
    role: &CertRole,
    namespace: &str,
    issued: &IssuedCert,
    ca: &CertificateAuthority,
) -> Secret {
    let ca_pem = matches!(role, CertRole::Agent(_)).then(|| ca.cert_pem());
    tls_secret(role_secret_name(role), namespace, issued, ca_pem)
}

/// The spoke's CA Secret: the CA certificate only.
pub fn agent_ca_secret(namespace: &str, ca_pem: &str) -> Secret {
    secret(
        AGENT_CA_SECRET,
        namespace,
        SECRET_TYPE_OPAQUE,
        [(CA_CERT_KEY, ca_pem.to_owned())],
    )
}

/// The JWT signing key Secret.
pub fn jwt_secret(namespace: &str, key_pem: &str) -> Secret {
    secret(
        JWT_SECRET,
        namespace,
        SECRET_TYPE_OPAQUE,
        [(JWT_KEY_KEY, key_pem.to_owned())],
    )
}

fn location(secret: &Secret) -> String {
    format!(
        "secret {}/{}",
        secret.metadata.namespace.as_deref().unwrap_or(""),
        secret.metadata.name.as_deref().unwrap_or("")
    )
}

/// A data value of a Secret as UTF-8 text.
pub fn secret_text(secret: &Secret, key: &str) -> Result<String, PkiError> {
    let missing = || PkiError::SecretMissingKey {
        namespace: secret.metadata.namespace.clone().unwrap_or_default(),
        name: secret.metadata.name.clone().unwrap_or_default(),
        key: key.to_owned(),
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(missing)?;
    String::from_utf8(bytes).map_err(|_| PkiError::BadCertificate {
        origin: format!("{} key {key}", location(secret)),
        reason: "not UTF-8 PEM text".into(),
    })
}

/// Load the CA from the hub's CA Secret.
pub fn ca_from_secret(secret: &Secret) -> Result<CertificateAuthority, PkiError> {
    let cert = secret_text(secret, TLS_CERT_KEY)?;
    let key = secret_text(secret, TLS_KEY_KEY)?;
    let at = location(secret);
    CertificateAuthority::from_pem_labelled(
        &cert,
        &format!("{at} {TLS_CERT_KEY}"),
        &key,
        &format!("{at} {TLS_KEY_KEY}"),
    )
}

/// Whether a write created a Secret or replaced an existing one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The Secret did not exist.
    Created,
    /// An existing Secret was replaced.
    Replaced,
}

/// Secrets in one namespace of one cluster.
#[derive(Clone)]
pub struct SecretStore {
    client: kube::Client,
    api: Api<Secret>,
    namespace: String,
}

impl SecretStore {
    /// Secrets in `namespace`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client.clone(), namespace),
            client,
            namespace: namespace.to_owned(),
        }
    }

    /// Secrets in another namespace of the same cluster.
    pub fn with_namespace(&self, namespace: &str) -> Self {
        Self::new(self.client.clone(), namespace)
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn kube_err(&self, action: &str, name: &str, source: kube::Error) -> PkiError {
        PkiError::Kube {
            action: format!("{action} secret {}/{name}", self.namespace),
            source,
        }
    }

    /// The Secret `name`, if it exists.
    pub async fn get(&self, name: &str) -> Result<Option<Secret>, PkiError> {
        self.api
            .get_opt(name)
            .await
            .map_err(|e| self.kube_err("reading", name, e))
    }

    /// Load the CA from `argocd-agent-ca`.
    pub async fn load_ca(&self) -> Result<CertificateAuthority, PkiError> {
        match self.get(CA_SECRET).await? {
            None => Err(PkiError::CaNotInitialized {
                location: format!("secret {}/{CA_SECRET}", self.namespace),
            }),
            Some(secret) => ca_from_secret(&secret),
        }
    }

    /// Create `secret`; if it exists, replace it when `overwrite`, else fail with
    /// [`PkiError::AlreadyExists`].
    pub async fn write(&self, secret: &Secret, overwrite: bool) -> Result<WriteOutcome, PkiError> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        match self.api.create(&PostParams::default(), secret).await {
            Ok(_) => Ok(WriteOutcome::Created),
            Err(kube::Error::Api(status)) if status.is_already_exists() => {
                if !overwrite {
                    return Err(PkiError::AlreadyExists {
                        location: format!("secret {}/{name}", self.namespace),
                    });
                }
                let existing = self.get(&name).await?.ok_or_else(|| PkiError::Kube {
                    action: format!("replacing secret {}/{name}", self.namespace),
                    source: kube::Error::Api(status),
                })?;
                let mut replacement = secret.clone();
                replacement.metadata.resource_version = existing.metadata.resource_version;
                self.api
                    .replace(&name, &PostParams::default(), &replacement)
                    .await
                    .map_err(|e| self.kube_err("replacing", &name, e))?;
                Ok(WriteOutcome::Replaced)
            }
            Err(e) => Err(self.kube_err("creating", &name, e)),
        }
    }

    /// Write the spoke's CA-only Secret, refusing to replace a Secret of the same name that
    /// holds a private key (that would be the hub CA itself, e.g. when agent and principal
    /// share a cluster and namespace).
    pub async fn write_agent_ca(
        &self,
        ca_pem: &str,
        overwrite: bool,
    ) -> Result<WriteOutcome, PkiError> {
        if let Some(existing) = self.get(AGENT_CA_SECRET).await? {
            if existing
                .data
                .as_ref()
                .is_some_and(|d| d.contains_key(TLS_KEY_KEY))
            {
                return Err(PkiError::WouldReplaceCa {
                    location: format!("secret {}/{AGENT_CA_SECRET}", self.namespace),
                });
            }
        }
        self.write(&agent_ca_secret(&self.namespace, ca_pem), overwrite)
            .await
    }

    /// Delete the Secret `name`; `false` if it did not exist.
    pub async fn delete(&self, name: &str) -> Result<bool, PkiError> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(false),
            Err(e) => Err(self.kube_err("deleting", name, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::days;
    use argocd_agent_proto::identity::AgentName;

    #[test]
    fn secrets_use_upstream_names_types_and_keys() {
        let ca = CertificateAuthority::generate("argocd-agent-ca", days(10)).unwrap();
        let s = ca_secret("argocd", &ca);
        assert_eq!(s.metadata.name.as_deref(), Some("argocd-agent-ca"));
        assert_eq!(s.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(secret_text(&s, "tls.crt").unwrap(), ca.cert_pem());
        let back = ca_from_secret(&s).unwrap();
        assert_eq!(back.cert_pem(), ca.cert_pem());

        let issued = ca
            .issue_server(
                "argocd-agent-principal",
                &["localhost".into()],
                &[],
                days(1),
            )
            .unwrap();
        let s = role_secret(&CertRole::Principal, "argocd", &issued, &ca);
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("argocd-agent-principal-tls")
        );
        let keys: Vec<_> = s.data.as_ref().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["tls.crt", "tls.key"]);

        let s = role_secret(&CertRole::ResourceProxy, "argocd", &issued, &ca);
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("argocd-agent-resource-proxy-tls")
        );

        let agent = AgentName::new("spoke1").unwrap();
        let issued = ca.issue_agent(&agent, days(1)).unwrap();
        let s = role_secret(&CertRole::Agent(agent), "argocd", &issued, &ca);
        assert_eq!(s.metadata.name.as_deref(), Some("argocd-agent-client-tls"));
        assert_eq!(secret_text(&s, "ca.crt").unwrap(), ca.cert_pem());

        let s = agent_ca_secret("argocd", ca.cert_pem());
        assert_eq!(s.type_.as_deref(), Some("Opaque"));
        let keys: Vec<_> = s.data.as_ref().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["ca.crt"]);

        let s = jwt_secret("argocd", "PEM");
        assert_eq!(s.metadata.name.as_deref(), Some("argocd-agent-jwt"));
        assert_eq!(secret_text(&s, "jwt.key").unwrap(), "PEM");
        assert!(matches!(
            secret_text(&s, "nope"),
            Err(PkiError::SecretMissingKey { .. })
        ));
    }
}
