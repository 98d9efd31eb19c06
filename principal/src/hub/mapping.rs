//! Which agent a hub Application belongs to, and which hub Application an agent's event names.
//!
//! Owns the two mappings upstream offers (`--destination-based-mapping`):
//! - [`AppMapping::Namespace`] (default): the hub namespace is the agent's name; an agent's events
//!   name Applications by name only, in its own namespace;
//! - [`AppMapping::Destination`]: `spec.destination.name` is the agent's name and the Application
//!   may live in any hub namespace `--allowed-namespaces` admits; an agent's events carry the hub
//!   namespace (an upstream agent moves Applications of the principal's own namespace into its own
//!   and marks them with [`NAMESPACE_REMAPPED_ANNOTATION`], which maps back to the principal's
//!   namespace here).
//!
//! An Application labelled skip-sync maps to no agent.
//! Either way an agent only ever reaches the hub Applications mapped to it: [`AppMapping::owns`]
//! is checked on every lookup an agent's event causes, whatever namespace the event claims.
//! Also owns how AppProjects apply to agents under each mapping (destination mapping matches on
//! destinations only and keeps `sourceNamespaces` in the agent's copy, as upstream does, so the
//! spoke's Argo CD admits Applications outside its own namespace).

use argocd_agent_kube::argocd::{AppProject, Application, ObjectMetaExt};
use argocd_agent_kube::skip_sync::is_skip_sync;

use crate::routing::{destinations_match_agent, project_for_agent, project_matches_agent};

/// Annotation an upstream agent puts on a spoke Application it moved from the principal's
/// namespace into its own (destination mapping); its events then name the principal's namespace.
pub const NAMESPACE_REMAPPED_ANNOTATION: &str = "argocd.argoproj.io/namespace-remapped";

/// How hub Applications map to agents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AppMapping {
    /// Hub namespace == agent name.
    #[default]
    Namespace,
    /// `spec.destination.name` == agent name; any allowed hub namespace.
    Destination,
}

impl AppMapping {
    /// The mapping `--destination-based-mapping` chooses.
    pub fn from_flag(destination_based: bool) -> AppMapping {
        if destination_based {
            AppMapping::Destination
        } else {
            AppMapping::Namespace
        }
    }

    /// The agent hub Application `app` belongs to (`None`: to no agent). An Application labelled
    /// skip-sync ([`argocd_agent_kube::skip_sync`]) belongs to none, as upstream's filter keeps it
    /// from every agent: one that gains the label is deleted from its agent, one that loses it is
    /// created there.
    pub fn agent_of(self, app: &Application) -> Option<&str> {
        if is_skip_sync(&app.metadata) {
            return None;
        }
        let agent = match self {
            AppMapping::Namespace => app.metadata.namespace.as_deref(),
            AppMapping::Destination => app
                .spec
                .destination
                .as_ref()
                .and_then(|d| d.name.as_deref()),
        };
        agent.filter(|a| !a.is_empty())
    }

    /// Whether hub Application `app` belongs to `agent`.
    pub fn owns(self, agent: &str, app: &Application) -> bool {
        self.agent_of(app) == Some(agent)
    }

    /// The hub namespace an Application named by `agent`'s event lives in: the agent's own under
    /// namespace mapping (what the event says is ignored), else the namespace the event carries
    /// (`event_namespace`), or `principal_namespace` when the agent marked it remapped.
    pub fn hub_namespace<'a>(
        self,
        agent: &'a str,
        event_namespace: &'a str,
        remapped: bool,
        principal_namespace: &'a str,
    ) -> &'a str {
        match self {
            AppMapping::Namespace => agent,
            AppMapping::Destination if remapped => principal_namespace,
            AppMapping::Destination => event_namespace,
        }
    }

    /// [`AppMapping::hub_namespace`] of the spoke Application an event carries.
    pub fn hub_namespace_of<'a>(
        self,
        agent: &'a str,
        spoke: &'a Application,
        principal_namespace: &'a str,
    ) -> &'a str {
        self.hub_namespace(
            agent,
            spoke.namespace_str(),
            spoke.annotation(NAMESPACE_REMAPPED_ANNOTATION).is_some(),
            principal_namespace,
        )
    }

    /// Whether hub AppProject `project` applies to `agent` (upstream's DoesAgentMatchWithProject).
    /// Namespace mapping: its destinations select the agent and its source namespaces admit the
    /// agent's namespace; destination mapping: its destinations only (source namespaces say where
    /// Applications may live, not which agent runs them).
    pub fn project_applies(self, project: &AppProject, agent: &str) -> bool {
        match self {
            AppMapping::Namespace => project_matches_agent(project, agent),
            AppMapping::Destination => destinations_match_agent(project, agent),
        }
    }

    /// The copy of hub AppProject `project` that `agent` receives; destination mapping keeps
    /// `sourceNamespaces`, as upstream does, so the spoke admits Applications in those namespaces.
    pub fn project_copy(self, project: &AppProject, agent: &str) -> AppProject {
        let mut copy = project_for_agent(project, agent);
        if self == AppMapping::Destination {
            copy.spec.source_namespaces = project.spec.source_namespaces.clone();
        }
        copy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app(namespace: &str, destination: serde_json::Value) -> Application {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "guestbook", "namespace": namespace},
            "spec": {"project": "default", "destination": destination}
        }))
        .unwrap()
    }

    #[test]
    fn namespace_mapping_routes_by_namespace_destination_mapping_by_destination_name() {
        let a = app(
            "team-x",
            json!({"name": "agent-a", "namespace": "guestbook"}),
        );
        assert_eq!(AppMapping::Namespace.agent_of(&a), Some("team-x"));
        assert_eq!(AppMapping::Destination.agent_of(&a), Some("agent-a"));
        assert!(AppMapping::Destination.owns("agent-a", &a));
        assert!(!AppMapping::Destination.owns("team-x", &a));
        assert!(!AppMapping::Destination.owns("agent-b", &a));
    }

    #[test]
    fn an_application_labelled_skip_sync_belongs_to_no_agent_under_either_mapping() {
        let mut a = app(
            "team-x",
            json!({"name": "agent-a", "namespace": "guestbook"}),
        );
        a.metadata.labels = Some(
            [(
                argocd_agent_kube::skip_sync::SKIP_SYNC_LABEL.to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        assert_eq!(AppMapping::Namespace.agent_of(&a), None);
        assert_eq!(AppMapping::Destination.agent_of(&a), None);
        assert!(!AppMapping::Namespace.owns("team-x", &a));
    }

    #[test]
    fn an_application_without_a_destination_name_belongs_to_no_agent_under_destination_mapping() {
        let by_server = app(
            "team-x",
            json!({"server": "https://kubernetes.default.svc"}),
        );
        assert_eq!(AppMapping::Destination.agent_of(&by_server), None);
        let empty = app("team-x", json!({"name": ""}));
        assert_eq!(AppMapping::Destination.agent_of(&empty), None);
        assert!(!AppMapping::Destination.owns("", &empty));
    }

    #[test]
    fn the_hub_namespace_of_an_agents_event_follows_the_mapping_and_the_remap_mark() {
        let m = AppMapping::Namespace;
        assert_eq!(
            m.hub_namespace("agent-a", "elsewhere", true, "argocd"),
            "agent-a"
        );
        let m = AppMapping::Destination;
        assert_eq!(
            m.hub_namespace("agent-a", "team-x", false, "argocd"),
            "team-x"
        );
        assert_eq!(
            m.hub_namespace("agent-a", "agent-ns", true, "argocd"),
            "argocd"
        );
        let mut spoke = app("agent-ns", json!({"name": "in-cluster"}));
        spoke
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(NAMESPACE_REMAPPED_ANNOTATION.into(), "true".into());
        assert_eq!(m.hub_namespace_of("agent-a", &spoke, "argocd"), "argocd");
    }

    #[test]
    fn under_destination_mapping_projects_apply_by_destination_and_keep_source_namespaces() {
        let project: AppProject = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": {"name": "p", "namespace": "argocd"},
            "spec": {"sourceNamespaces": ["team-*"],
                     "destinations": [{"name": "agent-a", "namespace": "*"}]}
        }))
        .unwrap();
        let d = AppMapping::Destination;
        assert!(d.project_applies(&project, "agent-a"));
        assert!(
            !d.project_applies(&project, "team-x"),
            "a source namespace names no agent under destination mapping"
        );
        assert!(
            !AppMapping::Namespace.project_applies(&project, "team-x"),
            "namespace mapping needs a destination too"
        );
        assert!(
            !AppMapping::Namespace.project_applies(&project, "agent-a"),
            "namespace mapping needs the agent's namespace among the source namespaces"
        );
        assert_eq!(
            d.project_copy(&project, "agent-a").spec.source_namespaces,
            vec!["team-*".to_string()]
        );
        assert!(AppMapping::Namespace
            .project_copy(&project, "agent-a")
            .spec
            .source_namespaces
            .is_empty());
    }
}
