//! Where a managed agent keeps each hub Application on the spoke, and which hub namespace its
//! events name.
//!
//! Owns [`AppPlacement`]: by default (namespace mapping) every Application lives in the agent's
//! `--namespace`. With `--destination-based-mapping` (the principal routes by
//! `spec.destination.name`) an Application keeps its hub namespace, which must be the agent's
//! namespace or match `--allowed-namespaces`; an Application of the principal's own namespace
//! (learnt at login, [`PrincipalNamespace`]) moves into the agent's namespace and is marked with
//! [`NAMESPACE_REMAPPED_ANNOTATION`], as upstream's agent does, so events name the principal's
//! namespace again. With `--create-namespace` a missing namespace is created before the
//! Application is written. Also owns which spoke namespaces the Application watch keeps.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};

use argocd_agent_kube::errors::{handle_error, is_conflict};
use argocd_agent_proto::sync::HandleError;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use tracing::info;

use crate::config::AgentConfig;

/// Annotation on a spoke Application moved from the principal's namespace into the agent's
/// (upstream's name and meaning: its events name the principal's namespace).
pub const NAMESPACE_REMAPPED_ANNOTATION: &str = "argocd.argoproj.io/namespace-remapped";

/// The principal's namespace, as its last login answer said.
#[derive(Debug, Default)]
pub struct PrincipalNamespace(RwLock<String>);

impl PrincipalNamespace {
    /// Records the namespace a login answer named.
    pub fn set(&self, namespace: &str) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = namespace.to_string();
    }

    /// The namespace; empty before the first login.
    pub fn get(&self) -> String {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Where a hub Application is kept on the spoke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The spoke namespace.
    pub namespace: String,
    /// Moved from the principal's namespace into the agent's (marked on the spoke copy).
    pub remapped: bool,
}

/// Placement of hub Applications on the spoke (see the module docs).
pub struct AppPlacement {
    agent_namespace: String,
    destination_mapping: bool,
    allowed: Vec<String>,
    create_namespace: bool,
    principal_namespace: Arc<PrincipalNamespace>,
    client: Option<kube::Client>,
    /// Namespaces known to exist (created or found), so each is checked once.
    known: Mutex<HashSet<String>>,
}

impl AppPlacement {
    /// The placement the configuration chooses; namespaces are created through `client`.
    pub fn from_config(
        config: &AgentConfig,
        client: kube::Client,
        principal_namespace: Arc<PrincipalNamespace>,
    ) -> AppPlacement {
        AppPlacement {
            agent_namespace: config.namespace.clone(),
            destination_mapping: config.destination_based_mapping,
            allowed: config.allowed_namespaces.clone(),
            create_namespace: config.create_namespace,
            principal_namespace,
            client: Some(client),
            known: Mutex::new(HashSet::new()),
        }
    }

    /// Namespace mapping: everything in `agent_namespace` (no client needed).
    pub fn namespaced(agent_namespace: &str) -> AppPlacement {
        AppPlacement {
            agent_namespace: agent_namespace.to_string(),
            destination_mapping: false,
            allowed: Vec::new(),
            create_namespace: false,
            principal_namespace: Arc::default(),
            client: None,
            known: Mutex::new(HashSet::new()),
        }
    }

    /// Destination-based mapping for `agent_namespace`, admitting `allowed`, with the principal
    /// in `principal_namespace`; no namespace is ever created (no client).
    #[cfg(test)]
    pub(crate) fn destination_for_tests(
        agent_namespace: &str,
        allowed: &[&str],
        principal_namespace: &str,
    ) -> AppPlacement {
        let p = AppPlacement {
            destination_mapping: true,
            allowed: allowed.iter().map(|s| s.to_string()).collect(),
            ..AppPlacement::namespaced(agent_namespace)
        };
        p.principal_namespace.set(principal_namespace);
        p
    }

    /// Whether Applications keep their hub namespace (`--destination-based-mapping`).
    pub fn destination_mapping(&self) -> bool {
        self.destination_mapping
    }

    /// Whether Applications in spoke namespace `namespace` are the agent's to keep: its own
    /// namespace, or (destination mapping) one `--allowed-namespaces` admits.
    pub fn admits(&self, namespace: &str) -> bool {
        namespace == self.agent_namespace
            || (self.destination_mapping
                && argocd_agent_proto::glob::match_in_list(&self.allowed, namespace))
    }

    /// Where the hub Application of hub namespace `hub_namespace` is kept, or why it may not be.
    pub fn place(&self, hub_namespace: &str) -> Result<Placed, String> {
        if !self.destination_mapping {
            return Ok(self.own());
        }
        let principal = self.principal_namespace.get();
        if hub_namespace.is_empty()
            || (hub_namespace == principal && hub_namespace != self.agent_namespace)
        {
            return Ok(Placed {
                namespace: self.agent_namespace.clone(),
                remapped: !hub_namespace.is_empty(),
            });
        }
        if !self.admits(hub_namespace) {
            return Err(format!(
                "namespace {hub_namespace:?} is not permitted on this agent: it is neither \
                 --namespace {:?} nor matched by --allowed-namespaces {:?}",
                self.agent_namespace, self.allowed
            ));
        }
        Ok(Placed {
            namespace: hub_namespace.to_string(),
            remapped: false,
        })
    }

    fn own(&self) -> Placed {
        Placed {
            namespace: self.agent_namespace.clone(),
            remapped: false,
        }
    }

    /// The hub namespace that spoke Application `live` stands for, as the agent's events name it:
    /// the agent's namespace under namespace mapping (upstream's), else its own namespace, or the
    /// principal's when it was remapped.
    pub fn hub_namespace_of(&self, live: &ObjectMeta) -> String {
        if !self.destination_mapping {
            return self.agent_namespace.clone();
        }
        let remapped = live
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(NAMESPACE_REMAPPED_ANNOTATION));
        if remapped {
            return self.principal_namespace.get();
        }
        live.namespace
            .clone()
            .unwrap_or_else(|| self.agent_namespace.clone())
    }

    /// Makes sure spoke namespace `namespace` exists before an Application is written into it:
    /// created with `--create-namespace`, else a message saying what is missing.
    pub async fn ensure_namespace(&self, namespace: &str) -> Result<(), HandleError> {
        if namespace == self.agent_namespace || self.is_known(namespace) {
            return Ok(());
        }
        let Some(client) = &self.client else {
            return Ok(());
        };
        let api: Api<Namespace> = Api::all(client.clone());
        let exists = api
            .get_opt(namespace)
            .await
            .map_err(|e| handle_error(format!("reading spoke namespace {namespace}"), e))?
            .is_some();
        if !exists {
            if !self.create_namespace {
                return Err(HandleError::Rejected(format!(
                    "spoke namespace {namespace:?} does not exist; create it or start the agent \
                     with --create-namespace"
                )));
            }
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: Some(namespace.to_string()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            match api.create(&PostParams::default(), &ns).await {
                Ok(_) => info!(namespace, "created the namespace of a hub Application"),
                Err(e) if is_conflict(&e) => {}
                Err(e) => {
                    return Err(handle_error(
                        format!("creating spoke namespace {namespace}"),
                        e,
                    ))
                }
            }
        }
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(namespace.to_string());
        Ok(())
    }

    fn is_known(&self, namespace: &str) -> bool {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Metadata of a spoke object in `namespace` with `annotations`.
    fn meta(namespace: &str, annotations: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(namespace.to_string()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    fn destination(allowed: &[&str], principal: &str) -> AppPlacement {
        AppPlacement::destination_for_tests("agent-ns", allowed, principal)
    }

    #[test]
    fn namespace_mapping_keeps_everything_in_the_agent_namespace() {
        let p = AppPlacement::namespaced("agent-ns");
        assert_eq!(p.place("team-a").unwrap().namespace, "agent-ns");
        assert_eq!(p.hub_namespace_of(&meta("agent-ns", &[])), "agent-ns");
        assert!(!p.admits("team-a"));
    }

    #[test]
    fn destination_mapping_keeps_allowed_hub_namespaces_and_refuses_others() {
        let p = destination(&["team-*"], "argocd");
        assert_eq!(
            p.place("team-a").unwrap(),
            Placed {
                namespace: "team-a".into(),
                remapped: false
            }
        );
        assert_eq!(p.place("agent-ns").unwrap().namespace, "agent-ns");
        let err = p.place("kube-system").unwrap_err();
        assert!(
            err.contains("\"kube-system\" is not permitted") && err.contains("team-*"),
            "{err}"
        );
        assert!(p.admits("team-b") && !p.admits("other"));
    }

    #[test]
    fn the_principals_namespace_moves_into_the_agents_and_maps_back() {
        let p = destination(&[], "argocd");
        let placed = p.place("argocd").unwrap();
        assert_eq!(
            placed,
            Placed {
                namespace: "agent-ns".into(),
                remapped: true
            }
        );
        let live = meta("agent-ns", &[(NAMESPACE_REMAPPED_ANNOTATION, "true")]);
        assert_eq!(p.hub_namespace_of(&live), "argocd");
        assert_eq!(p.hub_namespace_of(&meta("team-a", &[])), "team-a");
        // Agent and principal share a namespace: nothing to move.
        let same = destination(&[], "agent-ns");
        assert!(!same.place("agent-ns").unwrap().remapped);
    }
}
