//! Self-registration of agent clusters (`--enable-self-cluster-registration`): when an agent
//! connects and the hub has no Argo CD cluster Secret `cluster-<agent>` for it, the principal
//! creates one, so that agents need no `argocd-agentctl agent create` step.
//!
//! Owns [`SelfRegistration`]: the Secret's content (the layout of
//! [`argocd_agent_operator::registration::build_cluster_secret`], labelled
//! [`SELF_REGISTERED_LABEL`]`: "true"`, carrying the shared resource-proxy client certificate from
//! the `--self-registration-client-cert-secret` Secret and a bearer JWT whose `sub` names the
//! agent; the resource proxy identifies the agent by that token), and the rule that an existing
//! Secret is never overwritten (whoever made it, `argocd-agentctl` or an earlier registration).
//! The token is never logged.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_operator::registration::{
    build_cluster_secret, cluster_secret_name, resource_proxy_server_url, ClusterTlsMaterial,
    DEFAULT_RESOURCE_PROXY_ADDRESS,
};
use argocd_agent_proto::identity::AgentName;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use tracing::{debug, info, warn};

use crate::tokens::TokenIssuer;

/// Label marking a cluster Secret the principal created by self-registration.
pub const SELF_REGISTERED_LABEL: &str = "argocd-agent.argoproj-labs.io/self-registered-cluster";
/// Lifetime of the bearer token in a self-registered Secret. The Secret is never rewritten, so
/// the token must outlive the registration; delete the Secret to have a fresh one issued on the
/// agent's next connection.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// Errors of one registration; messages carry no key or token material.
#[derive(Debug, thiserror::Error)]
pub enum SelfRegistrationError {
    /// The shared client certificate Secret is missing or incomplete.
    #[error("shared resource-proxy client certificate secret {namespace}/{name}: {reason}")]
    ClientCert {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The CA file for the cluster Secret cannot be read.
    #[error("reading the resource proxy CA {path}: {source}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A token or URL could not be made.
    #[error("{0}")]
    Build(String),
    /// A hub API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
}

/// What self-registration needs from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfRegistrationConfig {
    /// Secret (in the principal's namespace) holding the shared client certificate: `tls.crt`,
    /// `tls.key`, and optionally `ca.crt` (the CA of the resource proxy's server certificate).
    pub client_cert_secret: String,
    /// CA used when the Secret has no `ca.crt` (the resource proxy's client CA, which in an
    /// `argocd-agentctl` PKI also signed the proxy's server certificate).
    pub fallback_ca: PathBuf,
    /// The resource proxy's listen address.
    pub proxy_listen_address: SocketAddr,
}

/// The address the hub's Argo CD reaches the resource proxy at: the listen address, or the
/// proxy's Service name with the listen port when it listens on all interfaces.
pub fn advertised_proxy_address(listen: SocketAddr) -> String {
    if listen.ip().is_unspecified() {
        let host = DEFAULT_RESOURCE_PROXY_ADDRESS
            .rsplit_once(':')
            .map_or(DEFAULT_RESOURCE_PROXY_ADDRESS, |(h, _)| h);
        format!("{host}:{}", listen.port())
    } else {
        listen.to_string()
    }
}

/// Creates missing cluster Secrets of connecting agents (see the module docs).
pub struct SelfRegistration {
    client: kube::Client,
    namespace: String,
    config: SelfRegistrationConfig,
    issuer: Arc<TokenIssuer>,
}

/// What [`SelfRegistration::ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    /// The Secret was created now.
    Created,
    /// A Secret existed already and was left alone.
    Existing,
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .filter(|s| !s.trim().is_empty())
}

impl SelfRegistration {
    /// Registration into the principal's `namespace` on the hub, with tokens from `issuer`.
    pub fn new(
        client: kube::Client,
        namespace: String,
        config: SelfRegistrationConfig,
        issuer: Arc<TokenIssuer>,
    ) -> Arc<Self> {
        Arc::new(SelfRegistration {
            client,
            namespace,
            config,
            issuer,
        })
    }

    /// The hook to run when an agent's stream starts: registers it in the background.
    pub fn on_connect(self: &Arc<Self>) -> crate::live::ConnectHook {
        let me = self.clone();
        Arc::new(move |agent: &str| {
            let Ok(agent) = AgentName::new(agent) else {
                return;
            };
            let me = me.clone();
            tokio::spawn(async move {
                if let Err(e) = me.ensure(&agent).await {
                    warn!(agent = %agent, error = %e, "self-registration of the agent's cluster failed; it is retried on the agent's next connection");
                }
            });
        })
    }

    async fn tls_material(&self) -> Result<ClusterTlsMaterial, SelfRegistrationError> {
        let name = &self.config.client_cert_secret;
        let bad = |reason: String| SelfRegistrationError::ClientCert {
            namespace: self.namespace.clone(),
            name: name.clone(),
            reason,
        };
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = secrets
            .get_opt(name)
            .await
            .map_err(|e| bad(format!("cannot be read: {e}")))?
            .ok_or_else(|| bad("does not exist; create it with tls.crt and tls.key".into()))?;
        let cert_pem = text(&secret, "tls.crt").ok_or_else(|| bad("has no tls.crt".into()))?;
        let key_pem = text(&secret, "tls.key").ok_or_else(|| bad("has no tls.key".into()))?;
        let ca_pem = match text(&secret, "ca.crt") {
            Some(ca) => ca,
            None => std::fs::read_to_string(&self.config.fallback_ca).map_err(|source| {
                SelfRegistrationError::CaFile {
                    path: self.config.fallback_ca.clone(),
                    source,
                }
            })?,
        };
        Ok(ClusterTlsMaterial {
            ca_pem,
            cert_pem,
            key_pem,
        })
    }

    /// The self-registered cluster Secret of `agent` (with a freshly issued token).
    pub async fn cluster_secret(&self, agent: &AgentName) -> Result<Secret, SelfRegistrationError> {
        let tls = self.tls_material().await?;
        let address = advertised_proxy_address(self.config.proxy_listen_address);
        let url = resource_proxy_server_url(&address, agent)
            .map_err(|e| SelfRegistrationError::Build(e.to_string()))?;
        let token = self
            .issuer
            .issue_resource_proxy(agent.as_str(), TOKEN_LIFETIME)
            .map_err(|e| SelfRegistrationError::Build(e.to_string()))?;
        let labels = BTreeMap::from([(SELF_REGISTERED_LABEL.to_string(), "true".to_string())]);
        let mut secret = build_cluster_secret(agent, &self.namespace, &url, &tls, &labels);
        with_bearer_token(&mut secret, &token).map_err(SelfRegistrationError::Build)?;
        Ok(secret)
    }

    /// Creates `agent`'s cluster Secret unless one exists.
    pub async fn ensure(&self, agent: &AgentName) -> Result<Registered, SelfRegistrationError> {
        let name = cluster_secret_name(agent);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let kube_err =
            |action: String| move |source| SelfRegistrationError::Kube { action, source };
        if secrets
            .get_opt(&name)
            .await
            .map_err(kube_err(format!(
                "reading secret {}/{name}",
                self.namespace
            )))?
            .is_some()
        {
            debug!(agent = %agent, secret = %name, "cluster secret exists; self-registration leaves it alone");
            return Ok(Registered::Existing);
        }
        let secret = self.cluster_secret(agent).await?;
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                info!(agent = %agent, namespace = %self.namespace, secret = %name, "self-registered the agent's cluster secret");
                Ok(Registered::Created)
            }
            // Another stream of the same agent won the race; its Secret stands.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Registered::Existing),
            Err(e) => Err(kube_err(format!(
                "creating secret {}/{name}",
                self.namespace
            ))(e)),
        }
    }
}

/// Adds `bearerToken` to the Argo CD cluster config JSON in `secret`'s `config`.
fn with_bearer_token(secret: &mut Secret, token: &str) -> Result<(), String> {
    let data = secret.data.get_or_insert_with(BTreeMap::new);
    let config = data
        .get("config")
        .ok_or_else(|| "the cluster secret has no config".to_string())?;
    let mut config: serde_json::Value =
        serde_json::from_slice(&config.0).map_err(|e| format!("cluster config: {e}"))?;
    config
        .as_object_mut()
        .ok_or_else(|| "the cluster config is not an object".to_string())?
        .insert("bearerToken".into(), token.into());
    data.insert("config".into(), ByteString(config.to_string().into_bytes()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advertised_address_is_the_service_when_listening_everywhere() {
        assert_eq!(
            advertised_proxy_address("0.0.0.0:9090".parse().unwrap()),
            "argocd-agent-resource-proxy:9090"
        );
        assert_eq!(
            advertised_proxy_address("127.0.0.1:19090".parse().unwrap()),
            "127.0.0.1:19090"
        );
    }

    #[test]
    fn the_bearer_token_joins_the_tls_config() {
        let agent = AgentName::new("spoke1").unwrap();
        let tls = ClusterTlsMaterial {
            ca_pem: "ca".into(),
            cert_pem: "cert".into(),
            key_pem: "key".into(),
        };
        let mut secret = build_cluster_secret(
            &agent,
            "argocd",
            "https://127.0.0.1:9090?agentName=spoke1",
            &tls,
            &BTreeMap::new(),
        );
        with_bearer_token(&mut secret, "t0k3n").unwrap();
        let config: serde_json::Value =
            serde_json::from_slice(&secret.data.unwrap()["config"].0).unwrap();
        assert_eq!(config["bearerToken"], "t0k3n");
        assert_eq!(config["tlsClientConfig"]["certData"], "Y2VydA==");
    }
}
