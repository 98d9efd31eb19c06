//! Managed agents: hub changes routed into the right agent's outbox, and their checksum resync.
//!
//! Owns, for agents in managed mode (the hub owns spec): which events a change of a hub
//! Application (namespace == agent), AppProject or repository Secret produces for which agent (a
//! repository Secret goes to every managed agent the AppProject in its `data.project` applies to,
//! and is re-routed whenever that AppProject changes); the resync after this principal (re)started
//! ([`ManagedRouter::principal_restart_resync`]: AppProjects and repository Secrets in full, the
//! operations the spoke has not started, then `request-resource-resync`, which the agent answers
//! with checksums); and the answer to an agent's key-set checksum
//! ([`ManagedRouter::answer_managed_key_list`]). Changes seen before a kind's first list are not
//! routed: the resync on connect covers them. It reads the hub through [`HubView`] and writes
//! nothing to the apiserver.

use std::sync::Arc;

use argocd_agent_kube::argocd::{AppProject, Application, ObjectMetaExt};
use argocd_agent_proto::event::{Event, EventType, ResourceKey, Target};
use argocd_agent_proto::mode::AgentMode;
use argocd_agent_proto::payload::SyncedResource;
use argocd_agent_proto::sync::keyed_request;
use argocd_agent_proto::sync::resync::{keys_to_announce, synced_resource_key, RESYNC_REQUEST_KEY};
use serde_json::Value;

use super::view::{HubView, Kind};
use super::{name_of, push, queue, uid_of, SOURCE};
use crate::routing::{
    application_change_events, application_payload, operation_already_started, project_for_agent,
    project_matches_agent, repository_payload, repository_project, repository_routes_to,
};
use crate::sessions::{AgentRegistry, AgentSession};

/// Routes hub changes to managed agents.
pub struct ManagedRouter {
    view: HubView,
    registry: Arc<AgentRegistry>,
}

impl ManagedRouter {
    /// A router reading `view` and queueing into the sessions of `registry`.
    pub fn new(view: HubView, registry: Arc<AgentRegistry>) -> ManagedRouter {
        ManagedRouter { view, registry }
    }

    fn managed_sessions(&self) -> impl Iterator<Item = Arc<AgentSession>> {
        self.registry
            .all()
            .into_iter()
            .filter(|s| s.mode() == AgentMode::Managed)
    }

    fn managed_session(&self, namespace: &str) -> Option<Arc<AgentSession>> {
        self.registry
            .get(namespace)
            .filter(|s| s.mode() == AgentMode::Managed)
    }

    /// Hub Application `new` (namespace == agent) appeared or changed from `old`.
    pub fn application_applied(&self, old: Option<&Application>, new: &Application) {
        if !self.view.is_listed(Kind::Application) {
            return;
        }
        let Some(session) = self.managed_session(new.namespace_str()) else {
            return;
        };
        for t in application_change_events(old, new) {
            let with_op = t == EventType::SetOperation;
            queue(
                &session,
                t,
                Target::Application,
                &application_payload(new, with_op),
            );
        }
    }

    /// Hub Application `last` was deleted.
    pub fn application_deleted(&self, last: &Application) {
        if let Some(session) = self.managed_session(last.namespace_str()) {
            queue(
                &session,
                EventType::Delete,
                Target::Application,
                &application_payload(last, false),
            );
        }
    }

    /// Hub AppProject `new` appeared or changed from `old`: create, update or delete the copy
    /// of each managed agent it starts, keeps or stops applying to, and re-route the repository
    /// Secrets that name it.
    pub fn project_applied(&self, old: Option<&AppProject>, new: &AppProject) {
        if !self.view.is_listed(Kind::AppProject) {
            return;
        }
        for session in self.managed_sessions() {
            let agent = session.name.as_str();
            let was = old.is_some_and(|o| project_matches_agent(o, agent));
            let copy = project_for_agent(new, agent);
            if project_matches_agent(new, agent) {
                let changed = old.map(|o| project_for_agent(o, agent)).as_ref() != Some(&copy);
                if !was {
                    queue(&session, EventType::Create, Target::AppProject, &copy);
                } else if changed {
                    queue(&session, EventType::SpecUpdate, Target::AppProject, &copy);
                }
            } else if was {
                queue(&session, EventType::Delete, Target::AppProject, &copy);
            }
        }
        self.reroute_repositories(new.name_str(), old, Some(new));
    }

    /// Hub AppProject `last` was deleted.
    pub fn project_deleted(&self, last: &AppProject) {
        for session in self.managed_sessions() {
            if project_matches_agent(last, session.name.as_str()) {
                queue(
                    &session,
                    EventType::Delete,
                    Target::AppProject,
                    &project_for_agent(last, session.name.as_str()),
                );
            }
        }
        self.reroute_repositories(last.name_str(), Some(last), None);
    }

    /// Routes one repository Secret change (`old` → `new`, `None` = absent) to managed agents:
    /// create where it starts applying, spec-update where its payload changed, delete where it
    /// stops applying.
    pub fn repository_changed(&self, old: Option<&Value>, new: Option<&Value>) {
        if new.is_some() && !self.view.is_listed(Kind::Repository) {
            return;
        }
        let old_project = old.and_then(|o| self.view.project_of(o));
        let new_project = new.and_then(|n| self.view.project_of(n));
        self.route_repository(old, old_project.as_deref(), new, new_project.as_deref());
    }

    /// AppProject `project` changed from `old` to `new` (`None` = absent): re-routes every
    /// repository Secret that names it.
    fn reroute_repositories(
        &self,
        project: &str,
        old: Option<&AppProject>,
        new: Option<&AppProject>,
    ) {
        let secrets: Vec<Value> = self
            .view
            .repositories()
            .into_iter()
            .filter(|s| repository_project(s).as_deref() == Some(project))
            .collect();
        for secret in &secrets {
            self.route_repository(Some(secret), old, Some(secret), new);
        }
    }

    fn route_repository(
        &self,
        old: Option<&Value>,
        old_project: Option<&AppProject>,
        new: Option<&Value>,
        new_project: Option<&AppProject>,
    ) {
        for session in self.managed_sessions() {
            let agent = session.name.as_str();
            let was = old.filter(|o| repository_routes_to(o, old_project, agent));
            let is = new.filter(|n| repository_routes_to(n, new_project, agent));
            let (event, secret) = match (was, is) {
                (None, Some(n)) => (EventType::Create, n),
                (Some(o), Some(n)) if repository_payload(o) != repository_payload(n) => {
                    (EventType::SpecUpdate, n)
                }
                (Some(o), None) => (EventType::Delete, o),
                _ => continue,
            };
            tracing::info!(
                agent,
                repository = name_of(secret),
                event_type = event.name(),
                "routing a repository Secret to the agent"
            );
            queue(
                &session,
                event,
                Target::Repository,
                &repository_payload(secret),
            );
        }
    }

    /// The resync after this principal (re)started, for a managed agent: its AppProjects and
    /// repository Secrets in full (few and small), the operations its spoke has not started yet
    /// (the events that carried them may have been lost with the old process), then
    /// `request-resource-resync`, which the agent answers with checksums.
    pub fn principal_restart_resync(&self, session: &AgentSession) {
        let agent = session.name.as_str();
        let projects: Vec<AppProject> = self
            .view
            .projects()
            .iter()
            .filter(|p| project_matches_agent(p, agent))
            .map(|p| project_for_agent(p, agent))
            .collect();
        for p in &projects {
            queue(session, EventType::SpecUpdate, Target::AppProject, p);
        }
        let repositories: Vec<Value> = self
            .view
            .repositories_for(agent)
            .iter()
            .map(repository_payload)
            .collect();
        for r in &repositories {
            queue(session, EventType::SpecUpdate, Target::Repository, r);
        }
        let pending: Vec<Arc<Application>> = self
            .view
            .applications_of(agent)
            .into_iter()
            .filter(|app| !operation_already_started(app))
            .collect();
        for app in &pending {
            queue(
                session,
                EventType::SetOperation,
                Target::Application,
                &application_payload(app, true),
            );
        }
        match Event::request_resource_resync(SOURCE) {
            Ok(ev) => push(session, keyed_request(ev, RESYNC_REQUEST_KEY)),
            Err(e) => tracing::error!(error = %e, "cannot build a resync request"),
        }
        tracing::info!(
            agent,
            projects = projects.len(),
            repositories = repositories.len(),
            pending_operations = pending.len(),
            "first connection since the principal started: checksum resync requested"
        );
    }

    /// The keys of everything managed agent `agent` should have: its Applications, the
    /// AppProjects and repository Secrets that apply to it (uid = the hub object's).
    pub fn managed_keys(&self, agent: &str) -> Vec<ResourceKey> {
        let mut keys: Vec<ResourceKey> = self
            .view
            .applications_of(agent)
            .iter()
            .map(|app| ResourceKey::new("Application", app.name_str(), agent, app.uid_str()))
            .collect();
        keys.extend(
            self.view
                .projects()
                .iter()
                .filter(|p| project_matches_agent(p, agent))
                .map(|p| ResourceKey::new("AppProject", p.name_str(), "", p.uid_str())),
        );
        keys.extend(
            self.view
                .repositories_for(agent)
                .iter()
                .map(|s| ResourceKey::new("Secret", name_of(s), "", uid_of(s))),
        );
        keys
    }

    /// A managed agent's `request-synced-resource-list`: when its key set differs from the hub's,
    /// one `response-synced-resource` per hub key, so it asks for what it lacks.
    pub fn answer_managed_key_list(&self, session: &AgentSession, checksum: &[u8]) {
        let agent = session.name.as_str();
        let keys = self.managed_keys(agent);
        // An object whose event is still on its way (not ACKed) reaches the agent anyway:
        // announcing it too would make the agent ask for it a second time.
        let announce: Vec<&ResourceKey> = keys_to_announce(&keys, checksum)
            .iter()
            .filter(|k| !session.outbox.holds(&format!("{}_{}", k.name, k.uid)))
            .collect();
        if announce.is_empty() {
            tracing::debug!(
                agent,
                objects = keys.len(),
                "the agent holds the hub's keys, or is about to receive the missing ones"
            );
            return;
        }
        tracing::info!(
            agent,
            objects = announce.len(),
            "the agent's keys differ from the hub's; listing the hub's keys for it"
        );
        for key in announce {
            let mut synced = SyncedResource::from(key);
            synced.namespace.clear();
            match Event::synced_resource(SOURCE, &synced) {
                Ok(ev) => push(
                    session,
                    keyed_request(ev, synced_resource_key(&key.kind, &key.name)),
                ),
                Err(e) => tracing::error!(error = %e, "cannot build a response-synced-resource"),
            }
        }
    }
}
