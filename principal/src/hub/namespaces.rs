//! The hub namespaces of autonomous agents: an agent's Application mirrors live in namespace
//! `<agent>`.
//!
//! Owns making sure that namespace exists before mirrors are written into it: created with
//! `--namespace-create-enable` when the name matches `--namespace-create-pattern` (if set),
//! labelled with `--namespace-create-labels`; else a message saying what is missing. Which
//! namespace is made, or why none is, is decided without the apiserver
//! ([`NamespaceCreation::namespace`]); [`Namespaces::ensure`] only reads and writes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use regex::Regex;

/// Whether and how the principal creates autonomous agents' hub namespaces (upstream's
/// `WithAutoNamespaceCreate`).
#[derive(Debug, Clone, Default)]
pub struct NamespaceCreation {
    /// Create missing namespaces at all (`--namespace-create-enable`).
    pub enabled: bool,
    /// Only create names this regex matches anywhere in (`--namespace-create-pattern`; unanchored,
    /// like upstream's Go `MatchString`); `None` = any name.
    pub pattern: Option<Regex>,
    /// Labels put on created namespaces (`--namespace-create-labels`).
    pub labels: BTreeMap<String, String>,
}

impl NamespaceCreation {
    /// Why namespace `name` may not be created, or `None` when it may.
    fn refusal(&self, name: &str) -> Option<String> {
        if !self.enabled {
            return Some(format!(
                "hub namespace {name:?} for autonomous agent {name:?} does not exist; create it or start the \
                 principal with --namespace-create-enable"
            ));
        }
        match &self.pattern {
            Some(pattern) if !pattern.is_match(name) => Some(format!(
                "hub namespace {name:?} for autonomous agent {name:?} does not exist and the name does not \
                 match --namespace-create-pattern {:?}; create the namespace, or widen the pattern",
                pattern.as_str()
            )),
            _ => None,
        }
    }

    /// The namespace `name` to create for an autonomous agent, labelled with
    /// `--namespace-create-labels`; or why it may not be created.
    pub fn namespace(&self, name: &str) -> Result<Namespace, String> {
        if let Some(refusal) = self.refusal(name) {
            return Err(refusal);
        }
        Ok(Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        })
    }
}

impl PartialEq for NamespaceCreation {
    fn eq(&self, other: &Self) -> bool {
        self.enabled == other.enabled
            && self.pattern.as_ref().map(Regex::as_str) == other.pattern.as_ref().map(Regex::as_str)
            && self.labels == other.labels
    }
}

/// Creates (or not) the hub namespaces of autonomous agents.
#[derive(Clone)]
pub struct Namespaces {
    client: kube::Client,
    creation: NamespaceCreation,
}

impl Namespaces {
    /// Namespaces made with `client` as `creation` allows.
    pub fn new(client: kube::Client, creation: NamespaceCreation) -> Namespaces {
        Namespaces { client, creation }
    }

    /// Makes sure hub namespace `agent` exists for an autonomous agent's mirrors: creates it when
    /// the namespace-create flags allow, else says what is missing.
    pub async fn ensure(&self, agent: &str) -> Result<(), String> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        match api.get_opt(agent).await {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => {}
            Err(e) => return Err(format!("cannot read hub namespace {agent:?}: {e}")),
        }
        let ns = self.creation.namespace(agent)?;
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {
                tracing::info!(agent, "created the hub namespace of an autonomous agent");
                Ok(())
            }
            Err(e) if argocd_agent_kube::errors::is_conflict(&e) => Ok(()),
            Err(e) => Err(format!("cannot create hub namespace {agent:?}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_is_refused_with_the_flag_to_change() {
        let off = NamespaceCreation::default();
        assert!(off
            .refusal("ship")
            .unwrap()
            .contains("--namespace-create-enable"));
        let on = NamespaceCreation {
            enabled: true,
            pattern: Some(Regex::new("^edge-").unwrap()),
            ..NamespaceCreation::default()
        };
        assert_eq!(on.refusal("edge-1"), None);
        let refused = on.refusal("core-1").unwrap();
        assert!(
            refused.contains("--namespace-create-pattern") && refused.contains("^edge-"),
            "{refused}"
        );
        let unanchored = NamespaceCreation {
            enabled: true,
            pattern: Some(Regex::new("edge").unwrap()),
            ..NamespaceCreation::default()
        };
        assert_eq!(unanchored.refusal("my-edge-1"), None);
    }

    #[test]
    fn a_created_namespace_is_named_after_the_agent_and_carries_the_configured_labels() {
        let plain = NamespaceCreation {
            enabled: true,
            ..NamespaceCreation::default()
        };
        let ns = plain.namespace("edge-1").unwrap();
        assert_eq!(ns.metadata.name.as_deref(), Some("edge-1"));
        assert_eq!(ns.metadata.labels, None, "no empty label map");
        let labelled = NamespaceCreation {
            labels: [("team".to_string(), "edge".to_string())].into(),
            ..plain
        };
        assert_eq!(
            labelled.namespace("edge-1").unwrap().metadata.labels,
            Some([("team".to_string(), "edge".to_string())].into())
        );
        let refused = NamespaceCreation::default()
            .namespace("edge-1")
            .unwrap_err();
        assert!(refused.contains("--namespace-create-enable"), "{refused}");
    }
}
