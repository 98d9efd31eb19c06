//! The principal's persistent identity, upstream's `principaluid`: a UUID kept in ConfigMap
//! `argocd-agent-principal-identity` (key `principal-uid`) in the principal's namespace — the same
//! object upstream principals read and create, so replicas and a mixed upstream/ours deployment
//! share one identity — and stamped on every event sent to agents, so an agent can tell a move to
//! a different principal from a reconnect to the same one.
//!
//! Obtained in the background with retries: an unreachable hub at start-up must not keep the
//! principal from serving (events sent before it is known carry no `principaluid`, which upstream
//! agents read as "same principal").

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};

/// Name of the ConfigMap holding the identity.
pub const IDENTITY_CONFIGMAP: &str = "argocd-agent-principal-identity";
/// Its key.
pub const IDENTITY_KEY: &str = "principal-uid";

/// The identity once known; cheap to clone and read on the send path.
#[derive(Clone, Default)]
pub struct PrincipalIdentity(Arc<OnceLock<String>>);

impl PrincipalIdentity {
    /// Fetches or creates the identity in `namespace`, retrying every `retry` until it succeeds.
    pub fn spawn(client: kube::Client, namespace: String, retry: Duration) -> PrincipalIdentity {
        let identity = PrincipalIdentity::default();
        let slot = identity.0.clone();
        tokio::spawn(async move {
            loop {
                match get_or_create(&client, &namespace).await {
                    Ok(uid) => {
                        tracing::info!(principal_uid = %uid, "principal identity");
                        let _ = slot.set(uid);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, configmap = IDENTITY_CONFIGMAP, "cannot read or create the principal identity yet; retrying");
                        tokio::time::sleep(retry).await;
                    }
                }
            }
        });
        identity
    }

    /// The identity, if known yet.
    pub fn get(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }
}

/// Why the identity cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("reading or creating ConfigMap {IDENTITY_CONFIGMAP}: {0}")]
    Kube(#[from] kube::Error),
    #[error("ConfigMap {IDENTITY_CONFIGMAP} exists without a {IDENTITY_KEY} value: set one (any UUID) or delete the ConfigMap")]
    Empty,
}

/// The identity in `namespace`: the existing one, else a new UUID stored there (a concurrent
/// creator's value wins).
pub async fn get_or_create(
    client: &kube::Client,
    namespace: &str,
) -> Result<String, IdentityError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    loop {
        if let Some(cm) = api.get_opt(IDENTITY_CONFIGMAP).await? {
            return match cm.data.and_then(|mut d| d.remove(IDENTITY_KEY)) {
                Some(uid) if !uid.is_empty() => Ok(uid),
                _ => Err(IdentityError::Empty),
            };
        }
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(IDENTITY_CONFIGMAP.to_string()),
                ..Default::default()
            },
            data: Some(
                [(IDENTITY_KEY.to_string(), uuid::Uuid::new_v4().to_string())]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &cm).await {
            Ok(created) => {
                return Ok(created
                    .data
                    .and_then(|mut d| d.remove(IDENTITY_KEY))
                    .unwrap_or_default())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
