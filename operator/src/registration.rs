//! Agent registration on the hub: the Argo CD cluster Secret and the agent's hub namespace.
//!
//! Owns: the layout of the cluster Secret `cluster-<agent>` that makes the hub's Argo CD see an
//! agent as a cluster reached through the principal's resource proxy (same layout as
//! upstream's `argocd-agentctl agent create`, built from Argo CD's `ClusterToSecret`), the
//! resource-proxy client certificate it carries (CN = agent name, signed by the fleet CA),
//! reading such Secrets back, and creating/listing/deleting them through the API. It does not
//! watch cluster Secrets at runtime; the principal does.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use argocd_agent_proto::identity::AgentName;
use base64::Engine;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde::{Deserialize, Serialize};

use crate::pki::{CertInfo, CertificateAuthority, PkiError};

/// Label Argo CD uses to find cluster Secrets.
pub const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";
/// Value of [`SECRET_TYPE_LABEL`] for clusters.
pub const SECRET_TYPE_CLUSTER: &str = "cluster";
/// Label mapping a cluster Secret (and the hub namespace) to its agent.
pub const AGENT_NAME_LABEL: &str = "argocd-agent.argoproj-labs.io/agent-name";
/// Argo CD's managed-by annotation key.
pub const MANAGED_BY_ANNOTATION: &str = "managed-by";
/// Value upstream puts in [`MANAGED_BY_ANNOTATION`].
pub const MANAGED_BY_VALUE: &str = "argocd-agent";
/// Tells the hub's application controller not to reconcile apps on this cluster (Argo CD
/// 3.4+); the agent on the spoke does that.
pub const SKIP_RECONCILE_ANNOTATION: &str = "argocd.argoproj.io/skip-reconcile";
/// Default address of the principal's resource proxy as seen from the hub's Argo CD.
pub const DEFAULT_RESOURCE_PROXY_ADDRESS: &str = "argocd-agent-resource-proxy:9090";
/// Default Argo CD namespace on the hub.
pub const DEFAULT_ARGOCD_NAMESPACE: &str = "argocd";
/// Default validity of the resource-proxy client certificate (upstream: 180 days).
pub const DEFAULT_CLIENT_CERT_DAYS: u32 = 180;

/// Errors of agent registration.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// The resource proxy address is not `host:port`.
    #[error("invalid resource proxy address {address:?}: {reason}")]
    InvalidAddress {
        /// The address.
        address: String,
        /// Why.
        reason: String,
    },
    /// The agent name is unusable in this installation.
    #[error("invalid agent name {agent:?}: {reason}")]
    InvalidAgent {
        /// The agent.
        agent: String,
        /// Why.
        reason: String,
    },
    /// The cluster Secret exists already.
    #[error("agent {agent} already exists (secret {namespace}/{name})")]
    AgentExists {
        /// The agent.
        agent: AgentName,
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
    },
    /// A Secret does not look like an agent cluster Secret.
    #[error("secret {name:?} is not an agent cluster secret: {reason}")]
    NotAClusterSecret {
        /// The Secret's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// Certificate issuance failed.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
}

/// Name of an agent's cluster Secret.
pub fn cluster_secret_name(agent: &AgentName) -> String {
    format!("cluster-{agent}")
}

fn is_dns_subdomain(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Check that `address` is `ip:port`, `[ipv6]:port` or `dns-name:port`.
pub fn validate_resource_proxy_address(address: &str) -> Result<(), RegistrationError> {
    let invalid = |reason: &str| RegistrationError::InvalidAddress {
        address: address.to_owned(),
        reason: reason.to_owned(),
    };
    if address.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| invalid("expected host:port"))?;
    if !is_dns_subdomain(host) {
        return Err(invalid(
            "host must be an IP address or a lowercase DNS name (RFC 1123 subdomain)",
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(invalid("port must be a number from 1 to 65535")),
    }
}

/// The cluster `server` URL for an agent: `https://<address>?agentName=<agent>`.
pub fn resource_proxy_server_url(
    address: &str,
    agent: &AgentName,
) -> Result<String, RegistrationError> {
    validate_resource_proxy_address(address)?;
    Ok(format!("https://{address}?agentName={agent}"))
}

/// The TLS material the hub's Argo CD uses to reach the resource proxy for one agent.
/// `Debug` hides the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterTlsMaterial {
    /// CA certificate (PEM) that signed the resource proxy's server certificate.
    pub ca_pem: String,
    /// Client certificate (PEM), CN = agent name.
    pub cert_pem: String,
    /// Client key (PEM).
    pub key_pem: String,
}

impl fmt::Debug for ClusterTlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterTlsMaterial")
            .field("ca_pem", &self.ca_pem)
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl ClusterTlsMaterial {
    /// Issue a fresh resource-proxy client certificate for `agent` from `ca`.
    pub fn issue(
        ca: &CertificateAuthority,
        agent: &AgentName,
        validity: Duration,
    ) -> Result<Self, PkiError> {
        let issued = ca.issue_agent(agent, validity)?;
        Ok(Self {
            ca_pem: ca.cert_pem().to_owned(),
            cert_pem: issued.cert_pem,
            key_pem: issued.key_pem,
        })
    }
}

/// Argo CD's `ClusterConfig` JSON, reduced to what agent clusters use. Field names and order
/// follow Argo CD's Go struct; byte fields are base64 as Go's `encoding/json` writes `[]byte`.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct ClusterConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bearer_token: Option<String>,
    #[serde(default)]
    tls_client_config: TlsClientConfig,
}

#[derive(Serialize, Deserialize, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct TlsClientConfig {
    #[serde(default)]
    insecure: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    server_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cert_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_data: Option<String>,
    #[serde(default, rename = "caData", skip_serializing_if = "Option::is_none")]
    ca_data: Option<String>,
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Build the cluster Secret for `agent` in `argocd_namespace`.
pub fn build_cluster_secret(
    agent: &AgentName,
    argocd_namespace: &str,
    server_url: &str,
    tls: &ClusterTlsMaterial,
    extra_labels: &BTreeMap<String, String>,
) -> Secret {
    let config = ClusterConfig {
        bearer_token: None,
        tls_client_config: TlsClientConfig {
            insecure: false,
            server_name: None,
            cert_data: Some(b64(&tls.cert_pem)),
            key_data: Some(b64(&tls.key_pem)),
            ca_data: Some(b64(&tls.ca_pem)),
        },
    };
    let config = serde_json::to_string(&config).expect("cluster config serialises");
    let mut labels = extra_labels.clone();
    labels.insert(AGENT_NAME_LABEL.to_owned(), agent.to_string());
    labels.insert(SECRET_TYPE_LABEL.to_owned(), SECRET_TYPE_CLUSTER.to_owned());
    let annotations = BTreeMap::from([
        (
            MANAGED_BY_ANNOTATION.to_owned(),
            MANAGED_BY_VALUE.to_owned(),
        ),
        (SKIP_RECONCILE_ANNOTATION.to_owned(), "true".to_owned()),
    ]);
    let data = BTreeMap::from([
        (
            "name".to_owned(),
            ByteString(agent.to_string().into_bytes()),
        ),
        (
            "server".to_owned(),
            ByteString(server_url.trim_end_matches('/').as_bytes().to_vec()),
        ),
        ("config".to_owned(), ByteString(config.into_bytes())),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(cluster_secret_name(agent)),
            namespace: Some(argocd_namespace.to_owned()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The hub namespace of an agent (namespace name == agent name).
pub fn build_agent_namespace(agent: &AgentName) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(agent.to_string()),
            labels: Some(BTreeMap::from([(
                AGENT_NAME_LABEL.to_owned(),
                agent.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

/// An agent cluster Secret read back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisteredCluster {
    /// The agent (from the agent-name label).
    pub agent: AgentName,
    /// Cluster name in Argo CD.
    pub name: String,
    /// Cluster server URL.
    pub server: String,
    /// Summary of the resource-proxy client certificate, if present and parseable.
    pub client_cert: Option<CertInfo>,
}

/// Read an agent cluster Secret.
pub fn parse_cluster_secret(secret: &Secret) -> Result<RegisteredCluster, RegistrationError> {
    let secret_name = secret.metadata.name.clone().unwrap_or_default();
    let not_ours = |reason: String| RegistrationError::NotAClusterSecret {
        name: secret_name.clone(),
        reason,
    };
    let agent = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(AGENT_NAME_LABEL))
        .ok_or_else(|| not_ours(format!("no {AGENT_NAME_LABEL} label")))?;
    let agent = AgentName::new(agent.as_str()).map_err(|e| not_ours(e.to_string()))?;
    let field = |key: &str| -> Result<String, RegistrationError> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| not_ours(format!("no data key {key:?}")))?;
        String::from_utf8(bytes.0.clone()).map_err(|_| not_ours(format!("{key} is not UTF-8")))
    };
    let name = field("name")?;
    let server = field("server")?;
    let config: ClusterConfig = serde_json::from_str(&field("config")?)
        .map_err(|e| not_ours(format!("config is not Argo CD cluster config JSON: {e}")))?;
    let client_cert = config
        .tls_client_config
        .cert_data
        .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
        .and_then(|pem| String::from_utf8(pem).ok())
        .and_then(|pem| crate::pki::inspect_labelled(&pem, &secret_name).ok());
    Ok(RegisteredCluster {
        agent,
        name,
        server,
        client_cert,
    })
}

/// The resource-proxy TLS material of an agent cluster Secret (certificate, key and CA, PEM).
pub fn cluster_tls_material(secret: &Secret) -> Result<ClusterTlsMaterial, RegistrationError> {
    let secret_name = secret.metadata.name.clone().unwrap_or_default();
    let not_ours = |reason: String| RegistrationError::NotAClusterSecret {
        name: secret_name.clone(),
        reason,
    };
    let config = secret
        .data
        .as_ref()
        .and_then(|d| d.get("config"))
        .ok_or_else(|| not_ours("no data key \"config\"".into()))?;
    let config: ClusterConfig = serde_json::from_slice(&config.0)
        .map_err(|e| not_ours(format!("config is not Argo CD cluster config JSON: {e}")))?;
    let pem = |field: Option<String>, what: &str| -> Result<String, RegistrationError> {
        let encoded =
            field.ok_or_else(|| not_ours(format!("config has no tlsClientConfig.{what}")))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| not_ours(format!("tlsClientConfig.{what} is not base64: {e}")))?;
        String::from_utf8(bytes)
            .map_err(|_| not_ours(format!("tlsClientConfig.{what} is not UTF-8")))
    };
    let tls = config.tls_client_config;
    Ok(ClusterTlsMaterial {
        cert_pem: pem(tls.cert_data, "certData")?,
        key_pem: pem(tls.key_data, "keyData")?,
        ca_pem: pem(tls.ca_data, "caData")?,
    })
}

/// Result of [`AgentRegistry::create`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedAgent {
    /// `namespace/name` of the cluster Secret.
    pub secret: String,
    /// The cluster server URL.
    pub server_url: String,
    /// The hub namespace (agent name).
    pub namespace: String,
    /// Whether the namespace was created now (false: it existed).
    pub namespace_created: bool,
}

/// Result of [`AgentRegistry::delete`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeletedAgent {
    /// The cluster Secret existed and was deleted.
    pub secret_deleted: bool,
    /// The hub namespace was deleted.
    pub namespace_deleted: bool,
}

/// Agent cluster Secrets in the hub's Argo CD namespace.
#[derive(Clone)]
pub struct AgentRegistry {
    client: kube::Client,
    argocd_namespace: String,
}

impl AgentRegistry {
    /// Registry over `argocd_namespace` on the cluster `client` talks to.
    pub fn new(client: kube::Client, argocd_namespace: &str) -> Self {
        Self {
            client,
            argocd_namespace: argocd_namespace.to_owned(),
        }
    }

    /// The client this registry uses.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.argocd_namespace)
    }

    /// Create the hub namespace and the cluster Secret for `agent`, with a new resource-proxy
    /// client certificate from `ca`. Fails if the Secret exists.
    pub async fn create(
        &self,
        agent: &AgentName,
        ca: &CertificateAuthority,
        resource_proxy_address: &str,
        validity: Duration,
        extra_labels: &BTreeMap<String, String>,
    ) -> Result<CreatedAgent, RegistrationError> {
        if agent.as_str() == self.argocd_namespace {
            return Err(RegistrationError::InvalidAgent {
                agent: agent.to_string(),
                reason:
                    "it equals the Argo CD namespace; agents get a hub namespace of their own name"
                        .into(),
            });
        }
        let server_url = resource_proxy_server_url(resource_proxy_address, agent)?;
        let name = cluster_secret_name(agent);
        let exists = |_| RegistrationError::AgentExists {
            agent: agent.clone(),
            namespace: self.argocd_namespace.clone(),
            name: name.clone(),
        };
        let secrets = self.secrets();
        if secrets
            .get_opt(&name)
            .await
            .map_err(|source| {
                self.kube_err(
                    format!("reading secret {}/{name}", self.argocd_namespace),
                    source,
                )
            })?
            .is_some()
        {
            return Err(exists(()));
        }
        let tls = ClusterTlsMaterial::issue(ca, agent, validity)?;
        let secret = build_cluster_secret(
            agent,
            &self.argocd_namespace,
            &server_url,
            &tls,
            extra_labels,
        );

        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let namespace_created = match namespaces
            .create(&PostParams::default(), &build_agent_namespace(agent))
            .await
        {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.is_already_exists() => false,
            Err(source) => return Err(self.kube_err(format!("creating namespace {agent}"), source)),
        };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_already_exists() => return Err(exists(())),
            Err(source) => {
                return Err(self.kube_err(
                    format!("creating secret {}/{name}", self.argocd_namespace),
                    source,
                ))
            }
        }
        Ok(CreatedAgent {
            secret: format!("{}/{name}", self.argocd_namespace),
            server_url,
            namespace: agent.to_string(),
            namespace_created,
        })
    }

    /// All agent cluster Secrets, sorted by agent name. Secrets carrying the agent-name label
    /// but not parseable are skipped with a warning.
    pub async fn list(&self) -> Result<Vec<RegisteredCluster>, RegistrationError> {
        let lp = ListParams::default().labels(AGENT_NAME_LABEL);
        let list = self.secrets().list(&lp).await.map_err(|source| {
            self.kube_err(
                format!("listing cluster secrets in {}", self.argocd_namespace),
                source,
            )
        })?;
        let mut out = Vec::new();
        for secret in &list.items {
            match parse_cluster_secret(secret) {
                Ok(c) => out.push(c),
                Err(e) => tracing::warn!(error = %e, "skipping secret"),
            }
        }
        out.sort_by(|a, b| a.agent.cmp(&b.agent));
        Ok(out)
    }

    /// Delete the agent's cluster Secret and, if asked, its hub namespace (which deletes the
    /// agent's Applications on the hub).
    pub async fn delete(
        &self,
        agent: &AgentName,
        delete_namespace: bool,
    ) -> Result<DeletedAgent, RegistrationError> {
        let name = cluster_secret_name(agent);
        let secret_deleted = match self.secrets().delete(&name, &DeleteParams::default()).await {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.is_not_found() => false,
            Err(source) => {
                return Err(self.kube_err(
                    format!("deleting secret {}/{name}", self.argocd_namespace),
                    source,
                ))
            }
        };
        let mut namespace_deleted = false;
        if delete_namespace {
            let namespaces: Api<Namespace> = Api::all(self.client.clone());
            namespace_deleted = match namespaces
                .delete(agent.as_str(), &DeleteParams::default())
                .await
            {
                Ok(_) => true,
                Err(kube::Error::Api(s)) if s.is_not_found() => false,
                Err(source) => {
                    return Err(self.kube_err(format!("deleting namespace {agent}"), source))
                }
            };
        }
        Ok(DeletedAgent {
            secret_deleted,
            namespace_deleted,
        })
    }

    /// The cluster Secret of `agent`, if registered.
    pub async fn get(&self, agent: &AgentName) -> Result<Option<Secret>, RegistrationError> {
        let name = cluster_secret_name(agent);
        self.secrets().get_opt(&name).await.map_err(|source| {
            self.kube_err(
                format!("reading secret {}/{name}", self.argocd_namespace),
                source,
            )
        })
    }

    /// Rewrites `agent`'s cluster Secret `secret` (as read by [`AgentRegistry::get`]) with
    /// `server` and `tls`, keeping its labels and annotations; a concurrent change conflicts.
    pub async fn reconfigure(
        &self,
        agent: &AgentName,
        secret: &Secret,
        server: &str,
        tls: &ClusterTlsMaterial,
    ) -> Result<(), RegistrationError> {
        let mut rebuilt =
            build_cluster_secret(agent, &self.argocd_namespace, server, tls, &BTreeMap::new());
        rebuilt.metadata = secret.metadata.clone();
        rebuilt.metadata.managed_fields = None;
        let name = cluster_secret_name(agent);
        self.secrets()
            .replace(&name, &PostParams::default(), &rebuilt)
            .await
            .map_err(|source| {
                self.kube_err(
                    format!("replacing secret {}/{name}", self.argocd_namespace),
                    source,
                )
            })?;
        Ok(())
    }

    fn kube_err(&self, action: String, source: kube::Error) -> RegistrationError {
        RegistrationError::Kube { action, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::days;

    fn agent() -> AgentName {
        AgentName::new("spoke1").unwrap()
    }

    #[test]
    fn server_url_matches_upstream_and_validates_the_address() {
        assert_eq!(
            resource_proxy_server_url("127.0.0.1:9090", &agent()).unwrap(),
            "https://127.0.0.1:9090?agentName=spoke1"
        );
        assert_eq!(
            resource_proxy_server_url(DEFAULT_RESOURCE_PROXY_ADDRESS, &agent()).unwrap(),
            "https://argocd-agent-resource-proxy:9090?agentName=spoke1"
        );
        assert!(resource_proxy_server_url("[::1]:9090", &agent()).is_ok());
        for bad in [
            "noport",
            "Host:9090",
            "host:0",
            "host:99999",
            "host:x",
            ":9090",
        ] {
            let err = resource_proxy_server_url(bad, &agent()).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn cluster_secret_has_upstream_layout() {
        let ca = CertificateAuthority::generate("argocd-agent-ca", days(10)).unwrap();
        let tls = ClusterTlsMaterial::issue(&ca, &agent(), days(1)).unwrap();
        let url = resource_proxy_server_url("127.0.0.1:9090", &agent()).unwrap();
        let extra = BTreeMap::from([("env".to_owned(), "prod".to_owned())]);
        let s = build_cluster_secret(&agent(), "argocd", &url, &tls, &extra);

        assert_eq!(s.metadata.name.as_deref(), Some("cluster-spoke1"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("argocd"));
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["argocd.argoproj.io/secret-type"], "cluster");
        assert_eq!(labels["argocd-agent.argoproj-labs.io/agent-name"], "spoke1");
        assert_eq!(labels["env"], "prod");
        let ann = s.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann["managed-by"], "argocd-agent");
        assert_eq!(ann["argocd.argoproj.io/skip-reconcile"], "true");

        let data = s.data.as_ref().unwrap();
        let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
        assert_eq!(text("name"), "spoke1");
        assert_eq!(text("server"), "https://127.0.0.1:9090?agentName=spoke1");
        let config: serde_json::Value = serde_json::from_str(&text("config")).unwrap();
        let tcc = &config["tlsClientConfig"];
        assert_eq!(tcc["insecure"], false);
        let decode = |k: &str| {
            String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(tcc[k].as_str().unwrap())
                    .unwrap(),
            )
            .unwrap()
        };
        assert_eq!(decode("caData"), ca.cert_pem());
        assert_eq!(decode("keyData"), tls.key_pem);
        let cert = decode("certData");
        ca.verify_issued(&cert).unwrap();
        let info = crate::pki::inspect(&cert).unwrap();
        assert_eq!(info.subject_cn.as_deref(), Some("spoke1"));
        assert_eq!(info.extended_key_usages, ["clientAuth"]);
        // Exactly the keys Argo CD's Go struct would write, in its field order.
        assert!(text("config").starts_with(r#"{"tlsClientConfig":{"insecure":false,"certData":""#));

        let back = parse_cluster_secret(&s).unwrap();
        assert_eq!(back.agent, agent());
        assert_eq!(back.server, "https://127.0.0.1:9090?agentName=spoke1");
        assert_eq!(
            back.client_cert.unwrap().subject_cn.as_deref(),
            Some("spoke1")
        );
        assert!(!format!("{tls:?}").contains(tls.key_pem.lines().nth(1).unwrap()));
    }

    #[test]
    fn agent_namespace_is_named_after_the_agent() {
        let ns = build_agent_namespace(&agent());
        assert_eq!(ns.metadata.name.as_deref(), Some("spoke1"));
        assert_eq!(
            ns.metadata.labels.unwrap()[AGENT_NAME_LABEL],
            "spoke1".to_owned()
        );
    }

    #[test]
    fn foreign_secrets_are_not_parsed_as_agents() {
        let s = Secret {
            metadata: ObjectMeta {
                name: Some("cluster-x".into()),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        };
        assert!(matches!(
            parse_cluster_secret(&s),
            Err(RegistrationError::NotAClusterSecret { .. })
        ));
    }
}
