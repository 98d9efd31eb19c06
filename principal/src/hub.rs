//! Hub-side sync: watches Applications (every namespace `--allowed-namespaces` admits; namespace ==
//! agent), AppProjects and repository / repo-creds Secrets (principal namespace), all narrowed by
//! `--label-selector`, on the hub, keeps the latest copy of each,
//! and turns changes into events in the right agent's outbox. A repository Secret goes to every
//! managed agent the AppProject in its `data.project` applies to, and is re-routed whenever that
//! AppProject changes.
//!
//! Managed agents: checksum resync (reference §2.5), so a resync of N unchanged objects costs
//! O(N) messages of O(1) size. On the first connection of an agent since this principal started
//! (the principal restarted: undelivered events were lost) it queues the agent's AppProjects and
//! repository Secrets in full (few and small, as upstream does), the set-operations the spoke has
//! not started, and `request-resource-resync`; the agent answers with a `request-update{checksum}`
//! per object and a `request-synced-resource-list{checksum of its keys}`
//! ([`Hub::answer_managed_key_list`]). An agent that restarted sends the same on its own; a plain
//! reconnect needs nothing beyond the outbox, which kept every undelivered event. Events of the
//! hub's initial list are not routed to agents: the resync on connect covers them.
//!
//! Autonomous agents: it writes the mirrors of what the spoke owns ([`Hub::upsert_mirror`],
//! [`Hub::delete_mirror`]), remembers each mirror as written and reverts hub edits and deletions of
//! it, forwards operations, terminations and refresh requests made on a mirror to the spoke, and
//! runs the checksum resync ([`Hub::autonomous_resync`]) on connect, periodically and on request:
//! one `request-update` (carrying the mirror's checksum) per mirror plus one
//! `request-synced-resource-list`, so a resync where nothing changed costs O(1)-sized messages.
//! Conflicts resolve to the owner: for an autonomous agent's objects, the spoke.
//!
//! Ownership, not names: every mirror carries the agent it belongs to
//! ([`MIRROR_AGENT_ANNOTATION`], set by the principal, never taken from the spoke), and an agent
//! only creates, replaces or deletes hub objects that carry its own name there. A name taken by
//! another agent's mirror (agent `team` writing project `b-x` = `team-b-x`, the mirror of agent
//! `team-b`'s project `x`) or by an object made on the hub (no mark) is refused
//! ([`MirrorCollision`]) and counted in `argocd_principal_mirror_collisions_total{agent_name}`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use argocd_agent_kube::errors::handle_error;
use argocd_agent_proto::event::{
    set_checksum, Event, EventType, ResourceKey, Target, SOURCE_UID_ANNOTATION,
};
use argocd_agent_proto::mode::AgentMode;
use argocd_agent_proto::payload::{RequestUpdate, SyncedResource};
use argocd_agent_proto::sync::resync::{
    jittered, keys_to_announce, request_update_key, synced_resource_key, MIRROR_AGENT_ANNOTATION,
    MIRROR_CHECKSUM_ANNOTATION, RESYNC_REQUEST_KEY,
};
use argocd_agent_proto::sync::{keyed_request, HandleError};
use argocd_agent_runtime::telemetry::MetricsRegistry;
use futures::StreamExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::core::ApiResource;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::Value;
use tokio::sync::watch;

use crate::routing::{
    application_change_events, application_payload, combined_selector, mirror_application,
    mirror_project, mirror_view, mirrored_project_name, namespace_allowed,
    operation_already_started, project_for_agent, project_matches_agent, repository_payload,
    repository_project, repository_routes_to, REFRESH_ANNOTATION,
};
use crate::sessions::{AgentRegistry, AgentSession};
pub use argocd_agent_kube::resources::{
    application as application_resource, appproject as appproject_resource,
};

/// The hub Secrets synced to managed agents: Argo CD repositories and repository credentials.
pub const REPOSITORY_SELECTOR: &str = "argocd.argoproj.io/secret-type in (repository,repo-creds)";

type AppKey = (String, String);

/// Event source name the principal puts on its events.
pub const SOURCE: &str = "argocd-principal";

fn key_of(v: &Value) -> AppKey {
    let m = &v["metadata"];
    (
        m["namespace"].as_str().unwrap_or_default().to_string(),
        m["name"].as_str().unwrap_or_default().to_string(),
    )
}

/// Hub-side behaviour the flags choose.
#[derive(Debug, Clone, Default)]
pub struct HubOptions {
    /// Create the hub namespace of an autonomous agent when missing (`--namespace-create-enable`).
    pub namespace_create: bool,
    /// Periodic resync of connected agents (`--resync-interval`); `None` = only on connect.
    pub resync_interval: Option<Duration>,
    /// Hub namespaces whose Applications are watched and served (`--allowed-namespaces`, globs);
    /// empty = every namespace.
    pub allowed_namespaces: Vec<String>,
    /// Only Applications, AppProjects and repository Secrets matching it (`--label-selector`).
    pub label_selector: Option<String>,
    /// Where refused mirror writes are counted.
    pub mirror_collisions: MirrorCollisions,
}

/// `argocd_principal_mirror_collisions_total{agent_name}`: mirror writes and deletions refused
/// because the hub object of that name is not the agent's mirror. `agent_name` is an
/// authenticated agent, so the series are as many as the agents.
#[derive(Debug, Clone, Default)]
pub struct MirrorCollisions(Family<Vec<(String, String)>, Counter>);

impl MirrorCollisions {
    /// Registers the counter in `registry`.
    pub fn register(&self, registry: &MetricsRegistry) {
        registry.register(
            "argocd_principal_mirror_collisions",
            "Mirror writes refused because the hub object of that name belongs to another agent or was made on the hub",
            self.0.clone(),
        );
    }

    fn record(&self, agent: &str) {
        self.0
            .get_or_create(&vec![("agent_name".into(), agent.into())])
            .inc();
    }
}

/// A hub object that a mirror write or deletion of `agent` would have touched, but that is not
/// `agent`'s mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorCollision {
    /// What the agent tried to write.
    pub kind: MirrorKind,
    /// The hub object's name.
    pub name: String,
    /// The agent the hub object belongs to; `None` = made on the hub (no owner mark).
    pub owner: Option<String>,
}

impl std::fmt::Display for MirrorCollision {
    // Told to the agent: says the name is taken, not by whom.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hub {:?} {} exists and is not this agent's mirror; it is left unchanged (rename the object on the spoke)",
            self.kind, self.name
        )
    }
}

/// Whether `agent` may replace or delete the hub object `live` that its mirror of that name
/// would be: only when the principal marked `live` as `agent`'s mirror.
pub fn check_mirror_owner(
    kind: MirrorKind,
    live: &Value,
    agent: &str,
) -> Result<(), MirrorCollision> {
    match mirror_agent_of(live) {
        Some(owner) if owner == agent => Ok(()),
        owner => Err(MirrorCollision {
            kind,
            name: name_of(live).to_string(),
            owner: owner.map(str::to_string),
        }),
    }
}

/// Field manager of the principal's hub writes.
const FIELD_MANAGER: &str = "argocd-principal";

/// The hub's view of synced objects and the routing of their changes to agents.
pub struct Hub {
    /// Hub Kubernetes client.
    pub client: kube::Client,
    /// Namespace of the principal (AppProjects live here).
    pub principal_namespace: String,
    /// Sessions.
    pub registry: Arc<AgentRegistry>,
    apps: RwLock<HashMap<AppKey, Value>>,
    projects: RwLock<HashMap<String, Value>>,
    /// Repository and repo-creds Secrets in the principal namespace, by name.
    repositories: RwLock<HashMap<String, Value>>,
    synced: watch::Sender<(bool, bool, bool)>,
    options: HubOptions,
    /// Autonomous mirrors as the principal last wrote them: Applications by (agent, name),
    /// AppProjects by mirror name. Hub edits are reverted to these; deletions recreate them.
    app_mirrors: RwLock<HashMap<AppKey, Value>>,
    project_mirrors: RwLock<HashMap<String, Value>>,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

fn name_of(v: &Value) -> &str {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn source_uid_of(v: &Value) -> Option<&str> {
    v.pointer("/metadata/annotations")
        .and_then(|a| a.get(SOURCE_UID_ANNOTATION))
        .and_then(Value::as_str)
}

fn mirror_agent_of(v: &Value) -> Option<&str> {
    v.pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_AGENT_ANNOTATION))
        .and_then(Value::as_str)
}

fn is_terminating(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

fn phase(v: &Value) -> Option<&str> {
    v.pointer("/status/operationState/phase")
        .and_then(Value::as_str)
}

fn refresh(v: &Value) -> Option<&Value> {
    v.pointer("/metadata/annotations")
        .and_then(|a| a.get(REFRESH_ANNOTATION))
}

/// The kinds an autonomous agent owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorKind {
    /// Application, mirrored into namespace `<agent>`.
    Application,
    /// AppProject, mirrored as `<agent>-<name>` in the principal namespace.
    AppProject,
}

impl Hub {
    /// A hub view that is empty until [`Hub::run`] fills it.
    pub fn new(
        client: kube::Client,
        principal_namespace: String,
        registry: Arc<AgentRegistry>,
    ) -> Arc<Hub> {
        Hub::with_options(client, principal_namespace, registry, HubOptions::default())
    }

    /// A hub view with the behaviour `options` choose.
    pub fn with_options(
        client: kube::Client,
        principal_namespace: String,
        registry: Arc<AgentRegistry>,
        options: HubOptions,
    ) -> Arc<Hub> {
        Arc::new(Hub {
            client,
            principal_namespace,
            registry,
            apps: RwLock::new(HashMap::new()),
            projects: RwLock::new(HashMap::new()),
            repositories: RwLock::new(HashMap::new()),
            synced: watch::channel((false, false, false)).0,
            options,
            app_mirrors: RwLock::new(HashMap::new()),
            project_mirrors: RwLock::new(HashMap::new()),
        })
    }

    /// Waits until every watch has listed everything once.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|(a, p, r)| *a && *p && *r).await;
    }

    /// The hub Application `name` in agent namespace `agent`.
    pub fn application(&self, agent: &str, name: &str) -> Option<Value> {
        self.apps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(agent.to_string(), name.to_string()))
            .cloned()
    }

    /// The hub AppProject `name`, if it applies to `agent`.
    pub fn project_for(&self, agent: &str, name: &str) -> Option<Value> {
        let projects = self.projects.read().unwrap_or_else(|e| e.into_inner());
        projects
            .get(name)
            .filter(|p| project_matches_agent(p, agent))
            .cloned()
    }

    /// The hub repository Secret `name`, if the AppProject it names applies to `agent`.
    pub fn repository_for(&self, agent: &str, name: &str) -> Option<Value> {
        let secret = read(&self.repositories).get(name).cloned()?;
        let project = self.project_of(&secret);
        repository_routes_to(&secret, project.as_ref(), agent).then_some(secret)
    }

    /// Runs the watches until the process ends.
    pub async fn run(self: Arc<Self>) {
        let apps = self.clone().watch_objects(
            Api::all_with(self.client.clone(), &application_resource()),
            Kind::Application,
        );
        let projects = self.clone().watch_objects(
            Api::namespaced_with(
                self.client.clone(),
                &self.principal_namespace,
                &appproject_resource(),
            ),
            Kind::AppProject,
        );
        let repositories = self.clone().watch_objects(
            Api::namespaced_with(
                self.client.clone(),
                &self.principal_namespace,
                &ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&()),
            ),
            Kind::Repository,
        );
        let periodic = self.clone().periodic_resync();
        tokio::join!(apps, projects, repositories, periodic);
    }

    /// Every `--resync-interval` (jittered): a resync of every connected agent.
    async fn periodic_resync(self: Arc<Self>) {
        let Some(interval) = self.options.resync_interval else {
            return;
        };
        loop {
            tokio::time::sleep(jittered(interval)).await;
            for session in self.registry.all() {
                if !session.outbox.is_connected() {
                    continue;
                }
                tracing::debug!(agent = session.name.as_str(), "periodic resync");
                match session.mode() {
                    AgentMode::Autonomous => self.autonomous_resync(&session),
                    AgentMode::Managed => match Event::request_resource_resync(SOURCE) {
                        Ok(ev) => push(&session, keyed_request(ev, RESYNC_REQUEST_KEY)),
                        Err(e) => tracing::error!(error = %e, "cannot build a resync request"),
                    },
                }
            }
        }
    }

    /// Whether the first list of `kind` completed (before that, changes are not routed: the
    /// resync on connect covers them).
    fn listed(&self, kind: Kind) -> bool {
        let (apps, projects, repositories) = *self.synced.borrow();
        match kind {
            Kind::Application => apps,
            Kind::AppProject => projects,
            Kind::Repository => repositories,
        }
    }

    /// What a newly connected agent needs once the hub view is complete. Managed: the
    /// principal-restart resync on its first connection since this principal started, nothing on
    /// a later one (the outbox kept what it missed; a restarted agent asks on its own).
    /// Autonomous: the checksum resync.
    pub async fn on_connect(&self, session: &AgentSession) {
        self.wait_synced().await;
        match session.mode() {
            AgentMode::Managed if session.begin_first_resync() => {
                self.principal_restart_resync(session)
            }
            AgentMode::Managed => tracing::debug!(
                agent = session.name.as_str(),
                "managed agent reconnected; its outbox carries what it missed"
            ),
            AgentMode::Autonomous => self.autonomous_resync(session),
        }
    }

    /// Makes sure hub namespace `agent` exists for an autonomous agent's mirrors: creates it
    /// with `--namespace-create-enable`, else says what is missing.
    pub async fn ensure_agent_namespace(&self, agent: &str) -> Result<(), String> {
        use k8s_openapi::api::core::v1::Namespace;
        let api: Api<Namespace> = Api::all(self.client.clone());
        match api.get_opt(agent).await {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => {}
            Err(e) => return Err(format!("cannot read hub namespace {agent:?}: {e}")),
        }
        if !self.options.namespace_create {
            return Err(format!(
                "hub namespace {agent:?} for autonomous agent {agent:?} does not exist; create it or start the \
                 principal with --namespace-create-enable"
            ));
        }
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": agent}}))
                .map_err(|e| e.to_string())?;
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {
                tracing::info!(agent, "created the hub namespace of an autonomous agent");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(format!("cannot create hub namespace {agent:?}: {e}")),
        }
    }

    async fn watch_objects(self: Arc<Self>, api: Api<DynamicObject>, kind: Kind) {
        let selector = match kind {
            Kind::Repository => Some(REPOSITORY_SELECTOR),
            _ => None,
        };
        let config = match combined_selector(selector, self.options.label_selector.as_deref()) {
            Some(selector) => watcher::Config::default().labels(&selector),
            None => watcher::Config::default(),
        };
        let out_of_scope = |obj: &DynamicObject| {
            matches!(kind, Kind::Application)
                && !namespace_allowed(
                    &self.options.allowed_namespaces,
                    obj.metadata.namespace.as_deref().unwrap_or_default(),
                )
        };
        let mut stream = watcher(api, config).default_backoff().boxed();
        let mut relisted: Option<HashSet<String>> = None;
        let mut last_error: Option<String> = None;
        while let Some(ev) = stream.next().await {
            let ev = match ev {
                Ok(ev) => {
                    last_error = None;
                    ev
                }
                Err(e) => {
                    let msg = e.to_string();
                    if last_error.as_deref() != Some(msg.as_str()) {
                        tracing::warn!(kind = kind.name(), error = %msg, "watching the hub failed; retrying with backoff");
                        last_error = Some(msg);
                    }
                    continue;
                }
            };
            match ev {
                watcher::Event::InitApply(ref obj)
                | watcher::Event::Apply(ref obj)
                | watcher::Event::Delete(ref obj)
                    if out_of_scope(obj) => {}
                watcher::Event::Init => relisted = Some(HashSet::new()),
                watcher::Event::InitApply(obj) => {
                    let v = to_value(obj);
                    if let Some(seen) = relisted.as_mut() {
                        seen.insert(kind.key_string(&v));
                    }
                    self.applied(kind, v);
                }
                watcher::Event::InitDone => {
                    if let Some(seen) = relisted.take() {
                        for gone in self.keys(kind).into_iter().filter(|k| !seen.contains(k)) {
                            if let Some(v) = self.remove(kind, &gone) {
                                self.deleted(kind, v);
                            }
                        }
                    }
                    self.synced.send_modify(|s| match kind {
                        Kind::Application => s.0 = true,
                        Kind::AppProject => s.1 = true,
                        Kind::Repository => s.2 = true,
                    });
                }
                watcher::Event::Apply(obj) => self.applied(kind, to_value(obj)),
                watcher::Event::Delete(obj) => {
                    let v = to_value(obj);
                    self.remove(kind, &kind.key_string(&v));
                    self.deleted(kind, v);
                }
            }
        }
    }

    fn keys(&self, kind: Kind) -> Vec<String> {
        match kind {
            Kind::Application => self
                .apps
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .keys()
                .map(|(ns, n)| format!("{ns}/{n}"))
                .collect(),
            Kind::AppProject => self
                .projects
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .keys()
                .cloned()
                .collect(),
            Kind::Repository => read(&self.repositories).keys().cloned().collect(),
        }
    }

    fn remove(&self, kind: Kind, key: &str) -> Option<Value> {
        match kind {
            Kind::Application => {
                let (ns, name) = key.split_once('/')?;
                self.apps
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&(ns.to_string(), name.to_string()))
            }
            Kind::AppProject => self
                .projects
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(key),
            Kind::Repository => write(&self.repositories).remove(key),
        }
    }

    fn applied(self: &Arc<Self>, kind: Kind, v: Value) {
        match kind {
            Kind::Application => {
                let key = key_of(&v);
                let old = self
                    .apps
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key.clone(), v.clone());
                if let Some(session) = self.autonomous_session(&key.0) {
                    self.mirror_app_changed(&session, old.as_ref(), &v);
                    return;
                }
                if !self.listed(kind) {
                    return;
                }
                let Some(session) = self.managed_session(&key.0) else {
                    return;
                };
                for t in application_change_events(old.as_ref(), &v) {
                    let with_op = t == EventType::SetOperation;
                    queue(
                        &session,
                        t,
                        Target::Application,
                        &application_payload(&v, with_op),
                    );
                }
            }
            Kind::AppProject => {
                let name = v["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let old = self
                    .projects
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.clone(), v.clone());
                if let Some(desired) = read(&self.project_mirrors).get(&name).cloned() {
                    self.mirror_project_changed(&desired, &v);
                    return;
                }
                if !self.listed(kind) {
                    return;
                }
                for session in self
                    .registry
                    .all()
                    .into_iter()
                    .filter(|s| s.mode() == AgentMode::Managed)
                {
                    let agent = session.name.as_str();
                    let was = old
                        .as_ref()
                        .is_some_and(|o| project_matches_agent(o, agent));
                    let copy = project_for_agent(&v, agent);
                    if project_matches_agent(&v, agent) {
                        let changed =
                            old.as_ref().map(|o| project_for_agent(o, agent)) != Some(copy.clone());
                        if !was {
                            queue(&session, EventType::Create, Target::AppProject, &copy);
                        } else if changed {
                            queue(&session, EventType::SpecUpdate, Target::AppProject, &copy);
                        }
                    } else if was {
                        queue(&session, EventType::Delete, Target::AppProject, &copy);
                    }
                }
                self.reroute_repositories(&name, old.as_ref(), Some(&v));
            }
            Kind::Repository => {
                let name = name_of(&v).to_string();
                let old = write(&self.repositories).insert(name, v.clone());
                if self.listed(kind) {
                    self.repository_changed(old.as_ref(), Some(&v));
                }
            }
        }
    }

    /// The hub AppProject a repository Secret names, if it exists.
    fn project_of(&self, secret: &Value) -> Option<Value> {
        repository_project(secret).and_then(|p| read(&self.projects).get(&p).cloned())
    }

    /// Routes one repository Secret change (`old` → `new`, `None` = absent) to managed agents:
    /// create where it starts applying, spec-update where its payload changed, delete where it
    /// stops applying.
    fn repository_changed(&self, old: Option<&Value>, new: Option<&Value>) {
        let old_project = old.and_then(|o| self.project_of(o));
        let new_project = new.and_then(|n| self.project_of(n));
        self.route_repository(old, old_project.as_ref(), new, new_project.as_ref());
    }

    /// AppProject `project` changed from `old` to `new` (`None` = absent): re-routes every
    /// repository Secret that names it.
    fn reroute_repositories(&self, project: &str, old: Option<&Value>, new: Option<&Value>) {
        let secrets: Vec<Value> = read(&self.repositories)
            .values()
            .filter(|s| repository_project(s).as_deref() == Some(project))
            .cloned()
            .collect();
        for secret in &secrets {
            self.route_repository(Some(secret), old, Some(secret), new);
        }
    }

    fn route_repository(
        &self,
        old: Option<&Value>,
        old_project: Option<&Value>,
        new: Option<&Value>,
        new_project: Option<&Value>,
    ) {
        for session in self
            .registry
            .all()
            .into_iter()
            .filter(|s| s.mode() == AgentMode::Managed)
        {
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

    fn deleted(self: &Arc<Self>, kind: Kind, v: Value) {
        match kind {
            Kind::Application => {
                let (ns, name) = key_of(&v);
                if self.autonomous_session(&ns).is_some() {
                    if let Some(desired) = read(&self.app_mirrors).get(&(ns.clone(), name)).cloned()
                    {
                        self.spawn_restore(MirrorKind::Application, desired, "deleted on the hub");
                    }
                    return;
                }
                if let Some(session) = self.managed_session(&ns) {
                    queue(
                        &session,
                        EventType::Delete,
                        Target::Application,
                        &application_payload(&v, false),
                    );
                }
            }
            Kind::AppProject => {
                if let Some(desired) = read(&self.project_mirrors).get(name_of(&v)).cloned() {
                    self.spawn_restore(MirrorKind::AppProject, desired, "deleted on the hub");
                    return;
                }
                for session in self
                    .registry
                    .all()
                    .into_iter()
                    .filter(|s| s.mode() == AgentMode::Managed)
                {
                    if project_matches_agent(&v, session.name.as_str()) {
                        queue(
                            &session,
                            EventType::Delete,
                            Target::AppProject,
                            &project_for_agent(&v, session.name.as_str()),
                        );
                    }
                }
                self.reroute_repositories(name_of(&v), Some(&v), None);
            }
            Kind::Repository => self.repository_changed(Some(&v), None),
        }
    }

    fn autonomous_session(&self, namespace: &str) -> Option<Arc<AgentSession>> {
        self.registry
            .get(namespace)
            .filter(|s| s.mode() == AgentMode::Autonomous)
    }

    fn managed_session(&self, namespace: &str) -> Option<Arc<AgentSession>> {
        self.registry
            .get(namespace)
            .filter(|s| s.mode() == AgentMode::Managed)
    }

    /// The resync after this principal (re)started, for a managed agent: its AppProjects and
    /// repository Secrets in full (few and small), the operations its spoke has not started yet
    /// (the events that carried them may have been lost with the old process), then
    /// `request-resource-resync`, which the agent answers with checksums.
    pub fn principal_restart_resync(&self, session: &AgentSession) {
        let agent = session.name.as_str();
        let projects: Vec<Value> = read(&self.projects)
            .values()
            .filter(|p| project_matches_agent(p, agent))
            .map(|p| project_for_agent(p, agent))
            .collect();
        for p in &projects {
            queue(session, EventType::SpecUpdate, Target::AppProject, p);
        }
        let names: Vec<String> = read(&self.repositories).keys().cloned().collect();
        let repositories: Vec<Value> = names
            .iter()
            .filter_map(|name| self.repository_for(agent, name))
            .map(|s| repository_payload(&s))
            .collect();
        for r in &repositories {
            queue(session, EventType::SpecUpdate, Target::Repository, r);
        }
        let pending: Vec<Value> = read(&self.apps)
            .iter()
            .filter(|((ns, _), app)| ns == agent && !operation_already_started(app))
            .map(|(_, app)| app.clone())
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
        let uid = |v: &Value| {
            v.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let mut keys: Vec<ResourceKey> = read(&self.apps)
            .iter()
            .filter(|((ns, _), _)| ns == agent)
            .map(|((_, name), app)| ResourceKey::new("Application", name, agent, uid(app)))
            .collect();
        keys.extend(
            read(&self.projects)
                .values()
                .filter(|p| project_matches_agent(p, agent))
                .map(|p| ResourceKey::new("AppProject", name_of(p), "", uid(p))),
        );
        let names: Vec<String> = read(&self.repositories).keys().cloned().collect();
        keys.extend(
            names
                .iter()
                .filter_map(|name| self.repository_for(agent, name))
                .map(|s| ResourceKey::new("Secret", name_of(&s), "", uid(&s))),
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

/// Autonomous agents: mirrors, their protection, and the checksum resync.
impl Hub {
    fn mirror_api(&self, kind: MirrorKind, agent: &str) -> Api<DynamicObject> {
        match kind {
            MirrorKind::Application => {
                Api::namespaced_with(self.client.clone(), agent, &application_resource())
            }
            MirrorKind::AppProject => Api::namespaced_with(
                self.client.clone(),
                &self.principal_namespace,
                &appproject_resource(),
            ),
        }
    }

    /// Writes the hub mirror of spoke object `spoke` of autonomous agent `agent` (the spoke's
    /// version wins over whatever the hub holds).
    pub async fn upsert_mirror(
        &self,
        kind: MirrorKind,
        agent: &str,
        spoke: &Value,
    ) -> Result<(), HandleError> {
        if name_of(spoke).is_empty() {
            return Err(HandleError::Rejected(
                "the object has no metadata.name".into(),
            ));
        }
        if kind == MirrorKind::Application
            && !namespace_allowed(&self.options.allowed_namespaces, agent)
        {
            return Err(HandleError::Rejected(format!(
                "hub namespace {agent:?} is not in the principal's --allowed-namespaces"
            )));
        }
        let desired = match kind {
            MirrorKind::Application => mirror_application(spoke, agent),
            MirrorKind::AppProject => mirror_project(spoke, agent, &self.principal_namespace),
        };
        let name = name_of(&desired).to_string();
        // The remembered mirrors decide what hub edits are reverted to: another owner's name
        // never enters them (the write below checks the apiserver's object; this the hub view and
        // the writes in flight).
        let cached = match kind {
            MirrorKind::Application => self.application(agent, &name),
            MirrorKind::AppProject => read(&self.projects).get(&name).cloned(),
        };
        if let Some(cached) = &cached {
            self.refuse_foreign(kind, agent, cached)?;
        }
        let remembered = match kind {
            MirrorKind::Application => remember_mirror(
                &mut write(&self.app_mirrors),
                (agent.to_string(), name.clone()),
                kind,
                &desired,
                agent,
            ),
            MirrorKind::AppProject => remember_mirror(
                &mut write(&self.project_mirrors),
                name.clone(),
                kind,
                &desired,
                agent,
            ),
        };
        remembered.map_err(|c| self.refused(agent, c))?;
        let written = self.write_mirror(kind, agent, &desired).await;
        if let Err(HandleError::Rejected(_)) = &written {
            // Not written (e.g. the name is another owner's): nothing to protect or restore.
            self.forget_mirror(kind, agent, &name, Some(&desired));
        }
        written
    }

    /// Refuses (and counts) a write or deletion by `agent` of hub object `live` that is not its
    /// mirror.
    fn refuse_foreign(
        &self,
        kind: MirrorKind,
        agent: &str,
        live: &Value,
    ) -> Result<(), HandleError> {
        check_mirror_owner(kind, live, agent).map_err(|c| self.refused(agent, c))
    }

    fn refused(&self, agent: &str, c: MirrorCollision) -> HandleError {
        self.options.mirror_collisions.record(agent);
        tracing::debug!(agent, kind = ?c.kind, name = %c.name, owner = ?c.owner, "refused a mirror write: the hub object of that name is not this agent's mirror");
        HandleError::Rejected(c.to_string())
    }

    /// Drops the remembered mirror `name` of `agent` (when it is `only_if`, if given): it is no
    /// longer restored after hub edits or deletions.
    fn forget_mirror(&self, kind: MirrorKind, agent: &str, name: &str, only_if: Option<&Value>) {
        let ours = |v: &Value| mirror_agent_of(v) == Some(agent) && only_if.is_none_or(|o| o == v);
        match kind {
            MirrorKind::Application => {
                let mut apps = write(&self.app_mirrors);
                let key = (agent.to_string(), name.to_string());
                if apps.get(&key).is_some_and(ours) {
                    apps.remove(&key);
                }
            }
            MirrorKind::AppProject => {
                let mut projects = write(&self.project_mirrors);
                if projects.get(name).is_some_and(ours) {
                    projects.remove(name);
                }
            }
        }
    }

    /// Creates or replaces a mirror with `desired`, keeping a hub-requested operation.
    async fn write_mirror(
        &self,
        kind: MirrorKind,
        agent: &str,
        desired: &Value,
    ) -> Result<(), HandleError> {
        let name = name_of(desired);
        let api = self.mirror_api(kind, agent);
        let what = format!("mirror {kind:?} {name} of agent {agent}");
        // A bulk of new mirrors (e.g. after a long disconnect) costs one write each, not a read
        // and a write: when the hub view holds no object of that name, try to create first (an
        // existing one, or any failure, falls through to the read below).
        if !self.mirror_known(kind, agent, name) {
            if let Ok(body) = serde_json::from_value(desired.clone()) {
                if let Ok(true) = Self::create_mirror(&api, kind, agent, &body).await {
                    return Ok(());
                }
            }
        }
        let live = api
            .get_opt(name)
            .await
            .map_err(|e| handle_error(&what, e))?;
        let body: DynamicObject = match live {
            None => serde_json::from_value(desired.clone())
                .map_err(|e| HandleError::Rejected(format!("{what}: {e}")))?,
            Some(live) => {
                let live = to_value(live);
                self.refuse_foreign(kind, agent, &live)?;
                if is_terminating(&live) {
                    return Err(HandleError::Retryable(format!(
                        "{what} is being deleted; retrying once gone"
                    )));
                }
                if mirror_view(&live) == mirror_view(desired)
                    && live.get("operation") == desired.get("operation")
                {
                    return Ok(());
                }
                let mut body = desired.clone();
                body["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"].clone();
                if let Some(r) = refresh(&live) {
                    body["metadata"]["annotations"][REFRESH_ANNOTATION] = r.clone();
                }
                if let Some(f) = live.pointer("/metadata/finalizers") {
                    body["metadata"]["finalizers"] = f.clone();
                }
                let replaced: DynamicObject = serde_json::from_value(body)
                    .map_err(|e| HandleError::Rejected(format!("{what}: {e}")))?;
                api.replace(
                    name,
                    &PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &replaced,
                )
                .await
                .map_err(|e| handle_error(&what, e))?;
                tracing::debug!(agent, kind = ?kind, name, "updated hub mirror from the spoke");
                return Ok(());
            }
        };
        match Self::create_mirror(&api, kind, agent, &body).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(HandleError::Retryable(format!(
                "{what} appeared while creating it"
            ))),
            Err(kube::Error::Api(s)) if s.code == 404 && kind == MirrorKind::Application => {
                Err(match self.ensure_agent_namespace(agent).await {
                    Ok(()) => HandleError::Retryable(format!(
                        "{what}: hub namespace was missing; created it"
                    )),
                    Err(msg) => HandleError::Rejected(msg),
                })
            }
            Err(e) => Err(handle_error(&what, e)),
        }
    }

    /// Whether the hub view holds an object named like mirror `name` (or is not listed yet).
    fn mirror_known(&self, kind: MirrorKind, agent: &str, name: &str) -> bool {
        match kind {
            MirrorKind::Application => {
                !self.listed(Kind::Application) || self.application(agent, name).is_some()
            }
            MirrorKind::AppProject => {
                !self.listed(Kind::AppProject) || read(&self.projects).contains_key(name)
            }
        }
    }

    /// Creates mirror `body`; `Ok(false)` when an object of that name already exists.
    async fn create_mirror(
        api: &Api<DynamicObject>,
        kind: MirrorKind,
        agent: &str,
        body: &DynamicObject,
    ) -> Result<bool, kube::Error> {
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match api.create(&params, body).await {
            Ok(created) => {
                let name = created.metadata.name.as_deref().unwrap_or_default();
                tracing::info!(agent, kind = ?kind, name, "created hub mirror of a spoke object");
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes the hub mirror of spoke object `name` (uid `uid`, empty = any) of agent `agent`:
    /// the spoke deleted it. Not recreated afterwards. Only `agent`'s mirror is deleted: the
    /// object is read from the apiserver, checked, and deleted with its uid as precondition.
    pub async fn delete_mirror(
        &self,
        kind: MirrorKind,
        agent: &str,
        name: &str,
        uid: &str,
    ) -> Result<(), HandleError> {
        let mirror_name = match kind {
            MirrorKind::Application => name.to_string(),
            MirrorKind::AppProject => mirrored_project_name(agent, name),
        };
        let api = self.mirror_api(kind, agent);
        let what = format!("deleting mirror {kind:?} {mirror_name} of agent {agent}");
        let Some(live) = api
            .get_opt(&mirror_name)
            .await
            .map_err(|e| handle_error(&what, e))?
            .map(to_value)
        else {
            self.forget_mirror(kind, agent, &mirror_name, None);
            return Ok(());
        };
        self.refuse_foreign(kind, agent, &live)?;
        let theirs = source_uid_of(&live);
        if !uid.is_empty() && theirs.is_some_and(|t| t != uid) {
            tracing::debug!(
                agent,
                name,
                "delete for an older spoke object; the mirror is a newer one"
            );
            return Ok(());
        }
        self.forget_mirror(kind, agent, &mirror_name, None);
        if live.pointer("/metadata/finalizers").is_some() {
            let patch = serde_json::json!({"metadata": {"finalizers": null}});
            match api
                .patch(&mirror_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
                Err(e) => return Err(handle_error(&what, e)),
            }
        }
        // The object checked above, not one made under the same name since.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: live
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match api.delete(&mirror_name, &params).await {
            Ok(_) => {
                tracing::info!(agent, kind = ?kind, name = %mirror_name, "deleted hub mirror: the spoke deleted the object");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(handle_error(&what, e)),
        }
    }

    /// Recreates or reverts a mirror from what the principal last wrote, in the background.
    fn spawn_restore(self: &Arc<Self>, kind: MirrorKind, desired: Value, why: &'static str) {
        let hub = self.clone();
        tokio::spawn(async move {
            let agent = mirror_agent_of(&desired).unwrap_or_default().to_string();
            let name = name_of(&desired).to_string();
            tracing::info!(agent, kind = ?kind, name, "hub mirror was {why}; restoring the spoke's version");
            for attempt in 0..5u32 {
                let still_wanted = match kind {
                    MirrorKind::Application => {
                        read(&hub.app_mirrors).get(&(agent.clone(), name.clone())) == Some(&desired)
                    }
                    MirrorKind::AppProject => {
                        read(&hub.project_mirrors).get(&name) == Some(&desired)
                    }
                };
                if !still_wanted {
                    return;
                }
                match hub.write_mirror(kind, &agent, &desired).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::debug!(agent, name, error = %e, "restoring the mirror failed; retrying");
                        tokio::time::sleep(Duration::from_millis(200 * 2u64.pow(attempt))).await;
                    }
                }
            }
        });
    }

    /// A hub Application in an autonomous agent's namespace changed: forward requests, revert edits.
    fn mirror_app_changed(
        self: &Arc<Self>,
        session: &AgentSession,
        old: Option<&Value>,
        new: &Value,
    ) {
        let agent = session.name.as_str();
        let Some(desired) = read(&self.app_mirrors)
            .get(&(agent.to_string(), name_of(new).to_string()))
            .cloned()
        else {
            return;
        };
        if is_terminating(new) {
            if new.pointer("/metadata/finalizers").is_some() {
                let hub = self.clone();
                let name = name_of(new).to_string();
                let agent = agent.to_string();
                tokio::spawn(async move {
                    let patch = serde_json::json!({"metadata": {"finalizers": null}});
                    let _ = hub
                        .mirror_api(MirrorKind::Application, &agent)
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                });
            }
            return;
        }
        let new_op = new.get("operation").filter(|o| !o.is_null());
        let old_op = old
            .and_then(|o| o.get("operation"))
            .filter(|o| !o.is_null());
        let written_op = desired.get("operation").filter(|o| !o.is_null());
        if new_op.is_some() && new_op != old_op && new_op != written_op {
            tracing::info!(
                agent,
                app = name_of(new),
                "sync requested on the hub mirror; forwarding it to the spoke"
            );
            queue(
                session,
                EventType::SetOperation,
                Target::Application,
                &application_payload(new, true),
            );
        }
        if phase(new) == Some("Terminating")
            && old.and_then(phase) != Some("Terminating")
            && phase(&desired) != Some("Terminating")
        {
            tracing::info!(
                agent,
                app = name_of(new),
                "termination requested on the hub mirror; forwarding it to the spoke"
            );
            queue(
                session,
                EventType::TerminateOperation,
                Target::Application,
                &application_payload(new, false),
            );
        }
        if refresh(new).is_some()
            && refresh(new) != old.and_then(refresh)
            && refresh(new) != refresh(&desired)
        {
            tracing::info!(
                agent,
                app = name_of(new),
                "refresh requested on the hub mirror; forwarding it to the spoke"
            );
            queue(
                session,
                EventType::SpecUpdate,
                Target::Application,
                &application_payload(new, false),
            );
        }
        if mirror_view(new) != mirror_view(&desired) {
            self.spawn_restore(MirrorKind::Application, desired, "edited on the hub");
        }
    }

    fn mirror_project_changed(self: &Arc<Self>, desired: &Value, new: &Value) {
        if is_terminating(new) {
            return;
        }
        if mirror_view(new) != mirror_view(desired) {
            self.spawn_restore(MirrorKind::AppProject, desired.clone(), "edited on the hub");
        }
    }

    /// Whether `agent`'s mirror of (kind, spoke name, spoke uid) exists on the hub.
    pub fn has_mirror(&self, kind: MirrorKind, agent: &str, name: &str, uid: &str) -> bool {
        let live = match kind {
            MirrorKind::Application => self.application(agent, name),
            MirrorKind::AppProject => read(&self.projects)
                .get(&mirrored_project_name(agent, name))
                .cloned(),
        };
        live.is_some_and(|l| mirror_agent_of(&l) == Some(agent) && source_uid_of(&l) == Some(uid))
    }

    /// Asks the agent for one object (empty checksum: "send it").
    pub fn request_object(
        &self,
        session: &AgentSession,
        kind: &str,
        name: &str,
        uid: &str,
        checksum: Vec<u8>,
    ) {
        let req = RequestUpdate {
            name: name.to_string(),
            namespace: String::new(),
            uid: uid.to_string(),
            kind: kind.to_string(),
            checksum,
        };
        match Event::request_update(SOURCE, &req) {
            Ok(ev) => push(session, keyed_request(ev, request_update_key(kind, name))),
            Err(e) => tracing::error!(error = %e, "cannot build a request-update"),
        }
    }

    /// The checksum resync with an autonomous agent: one `request-update` per mirror (with the
    /// checksum of the spoke object it mirrors) and the checksum of the mirrored key set.
    pub fn autonomous_resync(&self, session: &AgentSession) {
        let agent = session.name.as_str();
        let checksum_of = |v: &Value| {
            v.pointer("/metadata/annotations")
                .and_then(|a| a.get(MIRROR_CHECKSUM_ANNOTATION))
                .and_then(Value::as_str)
                .and_then(|h| hex::decode(h).ok())
                .unwrap_or_default()
        };
        let apps: Vec<Value> = read(&self.apps)
            .iter()
            .filter(|((ns, _), v)| {
                ns == agent && mirror_agent_of(v) == Some(agent) && source_uid_of(v).is_some()
            })
            .map(|(_, v)| v.clone())
            .collect();
        let prefix = format!("{agent}-");
        let projects: Vec<Value> = read(&self.projects)
            .values()
            .filter(|v| mirror_agent_of(v) == Some(agent) && name_of(v).starts_with(&prefix))
            .cloned()
            .collect();
        let mut keys = Vec::new();
        for app in &apps {
            let name = name_of(app);
            let uid = source_uid_of(app).unwrap_or_default();
            write(&self.app_mirrors)
                .entry((agent.to_string(), name.to_string()))
                .or_insert_with(|| app.clone());
            keys.push(ResourceKey::new("Application", name, "", uid));
            self.request_object(session, "Application", name, uid, checksum_of(app));
        }
        for project in &projects {
            let mirror_name = name_of(project);
            let name = &mirror_name[prefix.len()..];
            let uid = source_uid_of(project).unwrap_or_default();
            write(&self.project_mirrors)
                .entry(mirror_name.to_string())
                .or_insert_with(|| project.clone());
            keys.push(ResourceKey::new("AppProject", name, "", uid));
            self.request_object(session, "AppProject", name, uid, checksum_of(project));
        }
        match Event::request_synced_resource_list(SOURCE, set_checksum(&keys)) {
            Ok(ev) => push(session, keyed_request(ev, RESYNC_REQUEST_KEY)),
            Err(e) => tracing::error!(error = %e, "cannot build a resync request"),
        }
        tracing::info!(
            agent,
            applications = apps.len(),
            projects = projects.len(),
            "checksum resync with the autonomous agent started"
        );
    }
}

/// Remembers `desired` as `agent`'s mirror under `key`, unless another owner's mirror is
/// remembered there (two agents whose `<agent>-<project>` names meet).
fn remember_mirror<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, Value>,
    key: K,
    kind: MirrorKind,
    desired: &Value,
    agent: &str,
) -> Result<(), MirrorCollision> {
    if let Some(remembered) = map.get(&key) {
        check_mirror_owner(kind, remembered, agent)?;
    }
    map.insert(key, desired.clone());
    Ok(())
}

/// Builds an object event and queues it for `session`.
pub fn queue(session: &AgentSession, t: EventType, target: Target, obj: &Value) {
    match Event::for_object(t.clone(), target.clone(), SOURCE, obj) {
        Ok(ev) => push(session, ev),
        Err(e) => {
            tracing::error!(agent = session.name.as_str(), event_type = t.name(), error = %e, "cannot build event")
        }
    }
}

fn push(session: &AgentSession, ev: Event) {
    if let Err(e) = session.outbox.push(ev) {
        tracing::error!(agent = session.name.as_str(), error = %e, "event not queued");
    }
}

fn to_value(obj: DynamicObject) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Application,
    AppProject,
    Repository,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Application => "Application",
            Kind::AppProject => "AppProject",
            Kind::Repository => "Secret",
        }
    }

    fn key_string(self, v: &Value) -> String {
        let (ns, name) = key_of(v);
        match self {
            Kind::Application => format!("{ns}/{name}"),
            Kind::AppProject | Kind::Repository => name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hub_object(name: &str, owner: Option<&str>) -> Value {
        let mut v = json!({"metadata": {"name": name, "annotations": {"note": "x"}}});
        if let Some(owner) = owner {
            v["metadata"]["annotations"][MIRROR_AGENT_ANNOTATION] = json!(owner);
        }
        v
    }

    #[test]
    fn only_the_agent_marked_on_a_hub_object_may_replace_or_delete_it() {
        let own = hub_object("team-x", Some("team"));
        assert_eq!(
            check_mirror_owner(MirrorKind::AppProject, &own, "team"),
            Ok(())
        );
        // Agent `team`'s project `b-x` and agent `team-b`'s project `x` share one hub name.
        let other = hub_object("team-b-x", Some("team-b"));
        let refused = check_mirror_owner(MirrorKind::AppProject, &other, "team").unwrap_err();
        assert_eq!(refused.owner.as_deref(), Some("team-b"));
        assert_eq!(refused.name, "team-b-x");
        // The agent is told the name is taken, not by whom.
        assert!(!refused.to_string().contains("team-b\""), "{refused}");
        assert!(refused.to_string().contains("not this agent's mirror"));
        // Made on the hub (no owner mark): nobody's mirror.
        let admin = hub_object("team-admin", None);
        let refused = check_mirror_owner(MirrorKind::AppProject, &admin, "team").unwrap_err();
        assert_eq!(refused.owner, None);
        let app = hub_object("hub-owned", None);
        assert!(check_mirror_owner(MirrorKind::Application, &app, "team").is_err());
    }

    #[test]
    fn a_remembered_mirror_is_never_replaced_by_another_agents_version() {
        let mut remembered: HashMap<String, Value> = HashMap::new();
        let theirs = hub_object("team-b-x", Some("team-b"));
        remember_mirror(
            &mut remembered,
            "team-b-x".into(),
            MirrorKind::AppProject,
            &theirs,
            "team-b",
        )
        .unwrap();
        let mine = hub_object("team-b-x", Some("team"));
        assert!(remember_mirror(
            &mut remembered,
            "team-b-x".into(),
            MirrorKind::AppProject,
            &mine,
            "team"
        )
        .is_err());
        assert_eq!(remembered["team-b-x"], theirs);
        // The owner's next version replaces its own.
        let mut newer = theirs.clone();
        newer["spec"] = json!({"description": "v2"});
        remember_mirror(
            &mut remembered,
            "team-b-x".into(),
            MirrorKind::AppProject,
            &newer,
            "team-b",
        )
        .unwrap();
        assert_eq!(remembered["team-b-x"], newer);
    }

    #[test]
    fn collisions_are_counted_by_agent() {
        let registry = MetricsRegistry::empty();
        let collisions = MirrorCollisions::default();
        collisions.register(&registry);
        collisions.record("team");
        collisions.record("team");
        let text = registry.encode().unwrap();
        assert!(
            text.lines()
                .any(|l| l == "argocd_principal_mirror_collisions_total{agent_name=\"team\"} 2"),
            "{text}"
        );
    }
}
