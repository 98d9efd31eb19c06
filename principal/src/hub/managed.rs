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
use argocd_agent_kube::repository::RepositoryExt;
use argocd_agent_proto::event::{
    Event, EventType, ResourceKey, Target, GPG_KEY_RESYNC_KIND, REPOSITORY_RESYNC_KIND,
};
use argocd_agent_proto::mode::AgentMode;
use argocd_agent_proto::payload::SyncedResource;
use argocd_agent_proto::sync::keyed_request;
use argocd_agent_proto::sync::resync::{keys_to_announce, synced_resource_key, RESYNC_REQUEST_KEY};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use super::gpg_keys;
use super::mapping::AppMapping;
use super::view::{HubView, Kind};
use super::{push, queue, SOURCE};
use crate::routing::{
    application_change_events, application_payload, operation_already_started, repository_payload,
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
    pub fn repository_changed(&self, old: Option<&Secret>, new: Option<&Secret>) {
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
        let secrets: Vec<Arc<Secret>> = self
            .view
            .repositories()
            .into_iter()
            .filter(|s| s.repository().project == Some(project))
            .collect();
        for secret in secrets.iter().map(|s| &**s) {
            self.route_repository(Some(secret), old, Some(secret), new);
        }
    }

    fn route_repository(
        &self,
        old: Option<&Secret>,
        old_project: Option<&AppProject>,
        new: Option<&Secret>,
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
                repository = secret.name_str(),
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
        let repositories: Vec<Secret> = self
            .view
            .repositories_for(agent)
            .iter()
            .map(|s| repository_payload(s))
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
                .map(|s| ResourceKey::new(REPOSITORY_RESYNC_KIND, s.name_str(), "", s.uid_str())),
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

#[cfg(test)]
mod tests {
    use argocd_agent_proto::event::set_checksum;
    use argocd_agent_proto::payload::SyncedResource;
    use serde_json::{json, Value};

    use super::super::testing::*;
    use super::*;

    fn typed<K: serde::de::DeserializeOwned>(v: Value) -> K {
        serde_json::from_value(v).unwrap()
    }

    /// A router over a view listed with `apps`, `projects`, `repositories` and `gpg`, with managed
    /// agents `team-a` and `team-b` and autonomous agent `auto`.
    async fn router(
        mapping: AppMapping,
        apps: Vec<Value>,
        projects: Vec<Value>,
        repositories: Vec<Value>,
        gpg: Option<Value>,
    ) -> (ManagedRouter, Arc<AgentRegistry>, Feeds) {
        let registry = registry(&[
            ("team-a", AgentMode::Managed),
            ("team-b", AgentMode::Managed),
            ("auto", AgentMode::Autonomous),
        ]);
        let (view, feeds) = listed(mapping, apps, projects, repositories, gpg).await;
        (ManagedRouter::new(view, registry.clone()), registry, feeds)
    }

    fn sent(registry: &AgentRegistry, agent: &str) -> Vec<String> {
        drained(&registry.get(agent).unwrap())
    }

    #[tokio::test]
    async fn a_repository_secret_follows_the_project_its_data_names_to_managed_agents_only() {
        let (router, registry, _feeds) = router(
            AppMapping::Namespace,
            vec![],
            vec![project("p", &["team-a"]), project("q", &["team-*", "auto"])],
            vec![],
            None,
        )
        .await;
        let r1: Secret = typed(repository("r1", "p", "https://git/one"));
        router.repository_changed(None, Some(&r1));
        assert_eq!(sent(&registry, "team-a"), vec!["create Repository r1"]);
        assert!(sent(&registry, "team-b").is_empty());
        assert!(
            sent(&registry, "auto").is_empty(),
            "autonomous agents get none"
        );

        // New data: a spec-update where it applies.
        let r1_new: Secret = typed(repository("r1", "p", "https://git/two"));
        router.repository_changed(Some(&r1), Some(&r1_new));
        assert_eq!(sent(&registry, "team-a"), vec!["spec-update Repository r1"]);
        assert!(sent(&registry, "team-b").is_empty());

        // Another project: kept (updated) where both apply, created where only the new one does.
        let r1_q: Secret = typed(repository("r1", "q", "https://git/two"));
        router.repository_changed(Some(&r1_new), Some(&r1_q));
        assert_eq!(sent(&registry, "team-a"), vec!["spec-update Repository r1"]);
        assert_eq!(sent(&registry, "team-b"), vec!["create Repository r1"]);

        // A project that does not exist: deleted everywhere.
        let r1_gone: Secret = typed(repository("r1", "missing", "https://git/two"));
        router.repository_changed(Some(&r1_q), Some(&r1_gone));
        assert_eq!(sent(&registry, "team-a"), vec!["delete Repository r1"]);
        assert_eq!(sent(&registry, "team-b"), vec!["delete Repository r1"]);

        // Deleted on the hub.
        router.repository_changed(None, Some(&r1_q));
        drained(&registry.get("team-a").unwrap());
        drained(&registry.get("team-b").unwrap());
        router.repository_changed(Some(&r1_q), None);
        assert_eq!(sent(&registry, "team-a"), vec!["delete Repository r1"]);
        assert_eq!(sent(&registry, "team-b"), vec!["delete Repository r1"]);
    }

    #[tokio::test]
    async fn the_repository_payload_is_the_hub_secret_without_bookkeeping() {
        let (router, registry, _feeds) = router(
            AppMapping::Namespace,
            vec![],
            vec![project("p", &["team-a"])],
            vec![],
            None,
        )
        .await;
        let mut v = repository("r1", "p", "https://git/one");
        v["type"] = json!("Opaque");
        v["metadata"]["managedFields"] = json!([{"manager": "kubectl"}]);
        v["metadata"]["annotations"] =
            json!({crate::routing::LAST_APPLIED_ANNOTATION: "{}", "team": "a"});
        router.repository_changed(None, Some(&typed(v.clone())));
        let events = drained_events(&registry.get("team-a").unwrap());
        assert_eq!(events.len(), 1);
        let payload: Value = events[0].data_as().unwrap();
        assert_eq!(payload["data"], v["data"], "data stays base64, as read");
        assert_eq!(payload["type"], "Opaque");
        assert_eq!(payload["metadata"]["annotations"], json!({"team": "a"}));
        assert!(payload["metadata"].get("managedFields").is_none());
        assert_eq!(payload["metadata"]["uid"], "uid-r1");
    }

    #[tokio::test]
    async fn an_appproject_change_moves_itself_and_the_repository_secrets_that_name_it() {
        let (router, registry, _feeds) = router(
            AppMapping::Namespace,
            vec![],
            vec![project("p", &["team-a"])],
            vec![
                repository("r1", "p", "https://git/one"),
                repository("other", "q", "https://git/q"),
            ],
            None,
        )
        .await;
        let old: AppProject = typed(project("p", &["team-a"]));
        let new: AppProject = typed(project("p", &["team-b"]));
        router.project_applied(Some(&old), &new);
        assert_eq!(
            sent(&registry, "team-a"),
            vec!["delete AppProject p", "delete Repository r1"]
        );
        assert_eq!(
            sent(&registry, "team-b"),
            vec!["create AppProject p", "create Repository r1"]
        );
        // Unchanged for the agent: nothing.
        router.project_applied(Some(&new), &new);
        assert!(sent(&registry, "team-b").is_empty());
        router.project_deleted(&new);
        assert_eq!(
            sent(&registry, "team-b"),
            vec!["delete AppProject p", "delete Repository r1"]
        );
        assert!(sent(&registry, "team-a").is_empty());
        assert!(sent(&registry, "auto").is_empty());
    }

    #[tokio::test]
    async fn the_gpg_keys_configmap_goes_to_every_managed_agent_and_follows_skip_sync() {
        let (router, registry, _feeds) =
            router(AppMapping::Namespace, vec![], vec![], vec![], None).await;
        let both = |want: &[&str]| {
            for agent in ["team-a", "team-b"] {
                assert_eq!(sent(&registry, agent), want, "{agent}");
            }
            assert!(sent(&registry, "auto").is_empty());
        };
        let v1: ConfigMap = typed(gpg_keys(&[("k1", "key one")]));
        router.gpg_keys_changed(None, Some(&v1));
        both(&["create GpgKey argocd-gpg-keys-cm"]);
        let v2: ConfigMap = typed(gpg_keys(&[("k1", "key one"), ("k2", "key two")]));
        router.gpg_keys_changed(Some(&v1), Some(&v2));
        both(&["spec-update GpgKey argocd-gpg-keys-cm"]);
        // Only bookkeeping changed: nothing to send.
        let mut v2_touched = v2.clone();
        v2_touched.metadata.managed_fields = Some(vec![Default::default()]);
        router.gpg_keys_changed(Some(&v2), Some(&v2_touched));
        both(&[]);
        let skipped: ConfigMap =
            typed(skip_sync(gpg_keys(&[("k1", "key one"), ("k2", "key two")])));
        router.gpg_keys_changed(Some(&v2), Some(&skipped));
        both(&["delete GpgKey argocd-gpg-keys-cm"]);
        router.gpg_keys_changed(Some(&skipped), Some(&v2));
        both(&["create GpgKey argocd-gpg-keys-cm"]);
        router.gpg_keys_changed(Some(&v2), None);
        both(&["delete GpgKey argocd-gpg-keys-cm"]);
    }

    #[tokio::test]
    async fn changes_seen_before_the_first_list_are_left_to_the_resync_on_connect() {
        let registry = registry(&[("team-a", AgentMode::Managed)]);
        let (_informers, view) = hub_informers(AppMapping::Namespace);
        let router = ManagedRouter::new(view, registry.clone());
        router.application_applied(None, &typed(app("team-a", "guestbook", "v1")));
        router.project_applied(None, &typed(project("p", &["team-a"])));
        router.repository_changed(None, Some(&typed(repository("r", "p", "https://git"))));
        router.gpg_keys_changed(None, Some(&typed(gpg_keys(&[("k", "v")]))));
        assert!(sent(&registry, "team-a").is_empty());
    }

    #[tokio::test]
    async fn a_destination_change_deletes_the_copy_on_the_old_agent_and_creates_it_on_the_new() {
        let (router, registry, _feeds) =
            router(AppMapping::Destination, vec![], vec![], vec![], None).await;
        let on_a: Application = typed(app_to("apps", "guestbook", "team-a"));
        router.application_applied(None, &on_a);
        assert_eq!(
            sent(&registry, "team-a"),
            vec!["create Application guestbook"]
        );
        let on_b: Application = typed(app_to("apps", "guestbook", "team-b"));
        router.application_applied(Some(&on_a), &on_b);
        assert_eq!(
            sent(&registry, "team-a"),
            vec!["delete Application guestbook"]
        );
        assert_eq!(
            sent(&registry, "team-b"),
            vec!["create Application guestbook"]
        );
        // To an autonomous agent, or one never seen: the old agent deletes it, nobody creates it.
        for to in ["auto", "nobody"] {
            let moved: Application = typed(app_to("apps", "guestbook", to));
            router.application_applied(Some(&on_b), &moved);
            assert_eq!(
                sent(&registry, "team-b"),
                vec!["delete Application guestbook"]
            );
            assert!(sent(&registry, "auto").is_empty(), "{to}");
        }
        // Labelled skip-sync: it belongs to no agent any more.
        let skipped: Application = typed(skip_sync(app_to("apps", "guestbook", "team-a")));
        router.application_applied(Some(&on_a), &skipped);
        assert_eq!(
            sent(&registry, "team-a"),
            vec!["delete Application guestbook"]
        );
        // An edit that keeps the destination: a spec-update on the same agent only.
        let mut edited: Application = typed(app_to("apps", "guestbook", "team-b"));
        edited
            .spec
            .other
            .insert("revisionHistoryLimit".into(), json!(3));
        router.application_applied(Some(&on_b), &edited);
        assert_eq!(
            sent(&registry, "team-b"),
            vec!["spec-update Application guestbook"]
        );
        assert!(sent(&registry, "team-a").is_empty());
    }

    /// An Application of `team-a` with an operation the spoke has (`started`) or has not started.
    fn app_with_operation(name: &str, started: bool) -> Value {
        let mut v = app("team-a", name, "v1");
        let op = json!({"sync": {"revision": "HEAD"}});
        v["operation"] = op.clone();
        if started {
            v["status"] = json!({"operationState": {"operation": op, "phase": "Running"}});
        }
        v
    }

    #[tokio::test]
    async fn the_restart_resync_sends_projects_repositories_gpg_keys_and_unstarted_operations_then_asks_for_checksums(
    ) {
        let (router, registry, _feeds) = router(
            AppMapping::Namespace,
            vec![
                app_with_operation("pending", false),
                app_with_operation("running", true),
                app("team-a", "idle", "v1"),
                app("team-b", "elsewhere", "v1"),
            ],
            vec![project("p", &["team-a"]), project("other", &["team-b"])],
            vec![
                repository("r", "p", "https://git/r"),
                repository("s", "other", "https://git/s"),
            ],
            Some(gpg_keys(&[("k", "v")])),
        )
        .await;
        router.principal_restart_resync(&registry.get("team-a").unwrap());
        assert_eq!(
            sent(&registry, "team-a"),
            vec![
                "spec-update AppProject p",
                "spec-update Repository r",
                "spec-update GpgKey argocd-gpg-keys-cm",
                "set-operation Application pending",
                "request-resource-resync ResourceResync ",
            ]
        );
        assert!(sent(&registry, "team-b").is_empty());
    }

    #[tokio::test]
    async fn a_key_list_answer_costs_nothing_when_the_agent_holds_the_hubs_keys() {
        const N: usize = 50;
        let apps = (0..N)
            .map(|i| app("team-a", &format!("app-{i}"), "v1"))
            .collect();
        let (router, registry, _feeds) = router(
            AppMapping::Namespace,
            apps,
            vec![project("p", &["team-a"])],
            vec![repository("r", "p", "https://git/r")],
            Some(gpg_keys(&[("k", "v")])),
        )
        .await;
        let session = registry.get("team-a").unwrap();
        let keys = router.managed_keys("team-a");
        assert_eq!(
            keys.len(),
            N + 3,
            "apps, the project, the repository, the GPG keys"
        );

        // N unchanged objects: the checksums match, nothing is sent.
        router.answer_managed_key_list(&session, &set_checksum(&keys));
        assert!(drained_events(&session).is_empty());

        // The agent lacks one (deleted there) or holds one more: every hub key is listed once,
        // namespace-free under namespace mapping, so it asks for what it lacks.
        for agents_keys in [&keys[1..], &[keys.as_slice(), &keys[..1]].concat()[..]] {
            router.answer_managed_key_list(&session, &set_checksum(agents_keys));
            let listed: Vec<SyncedResource> = drained_events(&session)
                .iter()
                .map(|ev| {
                    assert_eq!(ev.event_type, EventType::ResponseSyncedResource);
                    ev.data_as().unwrap()
                })
                .collect();
            assert_eq!(listed.len(), N + 3);
            assert!(listed.iter().all(|r| r.namespace.is_empty()));
            let kinds: Vec<&str> = listed[N..].iter().map(|r| r.kind.as_str()).collect();
            assert_eq!(
                kinds,
                vec!["AppProject", REPOSITORY_RESYNC_KIND, GPG_KEY_RESYNC_KIND]
            );
        }

        // An object whose event is still on its way is not announced again.
        let app_0: Application = typed(app("team-a", "app-0", "v2"));
        router.application_applied(None, &app_0);
        router.answer_managed_key_list(&session, &set_checksum(&keys[1..]));
        let events = drained_events(&session);
        assert_eq!(events.len(), 1 + N + 2, "the create, then every other key");
        assert_eq!(describe(&events[0]), "create Application app-0");
    }

    #[tokio::test]
    async fn under_destination_mapping_the_key_list_names_each_applications_hub_namespace() {
        let (router, registry, _feeds) = router(
            AppMapping::Destination,
            vec![
                app_to("apps", "one", "team-a"),
                app_to("team-b", "two", "team-a"),
            ],
            vec![],
            vec![],
            None,
        )
        .await;
        let session = registry.get("team-a").unwrap();
        router.answer_managed_key_list(&session, &[]);
        let mut listed: Vec<String> = drained_events(&session)
            .iter()
            .map(|ev| {
                let r: SyncedResource = ev.data_as().unwrap();
                format!("{} {}/{}", r.kind, r.namespace, r.name)
            })
            .collect();
        listed.sort();
        assert_eq!(
            listed,
            vec!["Application apps/one", "Application team-b/two"]
        );
    }
}
