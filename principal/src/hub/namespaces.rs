//! The hub namespaces of autonomous agents: an agent's Application mirrors live in namespace
//! `<agent>`.
//!
//! Owns making sure that namespace exists before mirrors are written into it: created with
//! `--namespace-create-enable`, else a message saying what is missing.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};

/// Creates (or not) the hub namespaces of autonomous agents.
#[derive(Clone)]
pub struct Namespaces {
    client: kube::Client,
    create: bool,
}

impl Namespaces {
    /// Namespaces made with `client` when `create` (`--namespace-create-enable`).
    pub fn new(client: kube::Client, create: bool) -> Namespaces {
        Namespaces { client, create }
    }

    /// Makes sure hub namespace `agent` exists for an autonomous agent's mirrors: creates it
    /// with `--namespace-create-enable`, else says what is missing.
    pub async fn ensure(&self, agent: &str) -> Result<(), String> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        match api.get_opt(agent).await {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => {}
            Err(e) => return Err(format!("cannot read hub namespace {agent:?}: {e}")),
        }
        if !self.create {
            return Err(format!(
                "hub namespace {agent:?} for autonomous agent {agent:?} does not exist; create it or start the \
                 principal with --namespace-create-enable"
            ));
        }
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(agent.to_string()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
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
