//! Managed agents: hub changes routed into the right agent's outbox, and their checksum resync.
//!
//! Owns, for agents in managed mode (the hub owns spec): which events a change of a hub
//! Application (to the agent it maps to, [`super::mapping`]; a new agent = delete on the old one,
//! create on the new), AppProject, repository Secret or GPG keys ConfigMap produces for which
//! agent (a repository Secret goes to every managed agent the AppProject in its `data.project`
//! applies to, and is re-routed whenever that AppProject changes; the GPG keys ConfigMap goes to
//! every managed agent); the resync after this principal (re)started
//! ([`ManagedRouter::principal_restart_resync`]: AppProjects, repository Secrets and the GPG
//! keys ConfigMap in full, the
//! operations the spoke has not started, then `request-resource-resync`, which the agent answers
//! with checksums); and the answer to an agent's key-set checksum
//! ([`ManagedRouter::answer_managed_key_list`]). Changes seen before a kind's first list are not
//! routed: the resync on connect covers them. It reads the hub through [`HubView`] and writes
//! nothing to the apiserver.

use std::sync::Arc;

use argocd_agent_kube::argocd::{AppProject, Application, ObjectMetaExt};
use argocd_agent_proto::event::{
    Event, EventType, ResourceKey, Target, GPG_KEY_RESYNC_KIND, REPOSITORY_RESYNC_KIND,
};
use argocd_agent_proto::mode::AgentMode;
use argocd_agent_proto::payload::SyncedResource;
use argocd_agent_proto::sync::keyed_request;
use argocd_agent_proto::sync::resync::{keys_to_announce, synced_resource_key, RESYNC_REQUEST_KEY};
use serde_json::Value;

use k8s_openapi::api::core::v1::ConfigMap;

use super::gpg_keys;
use super::mapping::AppMapping;
use super::view::{HubView, Kind};
use super::{name_of, push, queue, uid_of, SOURCE};
use crate::routing::{
    application_change_events, application_payload, operation_already_started, repository_payload,
    repository_project,
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

    fn managed_session(&self, agent: &str) -> Option<Arc<AgentSession>> {
        self.registry
            .get(agent)
            .filter(|s| s.mode() == AgentMode::Managed)
    }

    /// The managed agent's session hub Application `app` belongs to.
    fn session_of(&self, app: &Application) -> Option<Arc<AgentSession>> {
        self.view
            .mapping()
            .agent_of(app)
            .and_then(|agent| self.managed_session(agent))
    }

    /// Hub Application `new` appeared or changed from `old`. When it moved to another agent
    /// (destination mapping: a new `spec.destination.name`), the old agent deletes its copy and
    /// the new one creates it.
    pub fn application_applied(&self, old: Option<&Application>, new: &Application) {
        if !self.view.is_listed(Kind::Application) {
            return;
        }
        let mapping = self.view.mapping();
        let old = match old {
            Some(o) if mapping.agent_of(o) != mapping.agent_of(new) => {
                tracing::info!(
                    app = %format!("{}/{}", new.namespace_str(), new.name_str()),
                    from = mapping.agent_of(o),
                    to = mapping.agent_of(new),
                    "the Application moved to another agent"
                );
                self.application_deleted(o);
                None
            }
            other => other,
        };
        let Some(session) = self.session_of(new) else {
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
        if let Some(session) = self.session_of(last) {
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
        let mapping = self.view.mapping();
        for session in self.managed_sessions() {
            let agent = session.name.as_str();
            let was = old.is_some_and(|o| mapping.project_applies(o, agent));
            let copy = mapping.project_copy(new, agent);
            if mapping.project_applies(new, agent) {
                let changed = old.map(|o| mapping.project_copy(o, agent)).as_ref() != Some(&copy);
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
        let mapping = self.view.mapping();
        for session in self.managed_sessions() {
            if mapping.project_applies(last, session.name.as_str()) {
                queue(
                    &session,
                    EventType::Delete,
                    Target::AppProject,
                    &mapping.project_copy(last, session.name.as_str()),
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
            let was = old.filter(|o| self.view.repository_routes_to(o, old_project, agent));
            let is = new.filter(|n| self.view.repository_routes_to(n, new_project, agent));
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

    /// Routes a change of the hub's GPG keys ConfigMap (`old` → `new`, `None` = absent or not
    /// synced) to every managed agent: create, spec-update when the payload changed, or delete.
    pub fn gpg_keys_changed(&self, old: Option<&ConfigMap>, new: Option<&ConfigMap>) {
        if new.is_some() && !self.view.is_listed(Kind::GpgKey) {
            return;
        }
        let (old, new) = (gpg_keys::if_synced(old), gpg_keys::if_synced(new));
        let (event, cm) = match (old, new) {
            (None, Some(n)) => (EventType::Create, n),
            (Some(o), Some(n)) if gpg_keys::payload(o) != gpg_keys::payload(n) => {
                (EventType::SpecUpdate, n)
            }
            (Some(o), None) => (EventType::Delete, o),
            _ => return,
        };
        let payload = gpg_keys::payload(cm);
        for session in self.managed_sessions() {
            tracing::info!(
                agent = session.name.as_str(),
                event_type = event.name(),
                "routing the GPG keys ConfigMap to the agent"
            );
            queue(&session, event.clone(), Target::GpgKey, &payload);
        }
    }

    /// The resync after this principal (re)started, for a managed agent: its AppProjects,
    /// repository Secrets and the GPG keys ConfigMap in full (few and small), the operations its spoke has not started yet
    /// (the events that carried them may have been lost with the old process), then
    /// `request-resource-resync`, which the agent answers with checksums.
    pub fn principal_restart_resync(&self, session: &AgentSession) {
        let agent = session.name.as_str();
        let mapping = self.view.mapping();
        let projects: Vec<AppProject> = self
            .view
            .projects()
            .iter()
            .filter(|p| mapping.project_applies(p, agent))
            .map(|p| mapping.project_copy(p, agent))
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
        let gpg_keys = self.view.gpg_keys();
        if let Some(cm) = &gpg_keys {
            queue(
                session,
                EventType::SpecUpdate,
                Target::GpgKey,
                &gpg_keys::payload(cm),
            );
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
            gpg_keys = gpg_keys.is_some(),
            pending_operations = pending.len(),
            "first connection since the principal started: checksum resync requested"
        );
    }

    /// The keys of everything managed agent `agent` should have: its Applications (in their hub
    /// namespace), the AppProjects and repository Secrets that apply to it and the GPG keys
    /// ConfigMap (uid = the hub object's).
    pub fn managed_keys(&self, agent: &str) -> Vec<ResourceKey> {
        let mut keys: Vec<ResourceKey> = self
            .view
            .applications_of(agent)
            .iter()
            .map(|app| {
                ResourceKey::new(
                    "Application",
                    app.name_str(),
                    app.namespace_str(),
                    app.uid_str(),
                )
            })
            .collect();
        keys.extend(
            self.view
                .projects()
                .iter()
                .filter(|p| self.view.project_applies(p, agent))
                .map(|p| ResourceKey::new("AppProject", p.name_str(), "", p.uid_str())),
        );
        keys.extend(
            self.view
                .repositories_for(agent)
                .iter()
                .map(|s| ResourceKey::new(REPOSITORY_RESYNC_KIND, name_of(s), "", uid_of(s))),
        );
        keys.extend(
            self.view
                .gpg_keys()
                .map(|cm| ResourceKey::new(GPG_KEY_RESYNC_KIND, cm.name_str(), "", cm.uid_str())),
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
        let mapping = self.view.mapping();
        for key in announce {
            let mut synced = SyncedResource::from(key);
            // Under destination mapping the agent keeps each Application in its hub namespace
            // and needs it to look its copy up; otherwise everything lives in its own namespace.
            if mapping == AppMapping::Namespace || key.kind != "Application" {
                synced.namespace.clear();
            }
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
