//! Hub-side sync of managed agents: watches Applications (all namespaces; namespace == agent) and
//! AppProjects (principal namespace) on the hub, keeps the latest copy of each, and turns changes
//! into events in the right agent's outbox; on each (re)connect it queues the agent's full state
//! followed by a resync request so deletions made while apart are found.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use argocd_agent_proto::event::{Event, EventType, Target};
use argocd_agent_proto::telemetry::flags::AgentMode;
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use serde_json::Value;
use tokio::sync::watch;

use crate::routing::{
    application_change_events, application_payload, operation_already_started, project_for_agent,
    project_matches_agent,
};
use crate::sessions::{AgentRegistry, AgentSession};

/// `argoproj.io/v1alpha1` Application.
pub fn application_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    )
}

/// `argoproj.io/v1alpha1` AppProject.
pub fn appproject_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AppProject"),
        "appprojects",
    )
}

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
    synced: watch::Sender<(bool, bool)>,
}

impl Hub {
    /// A hub view that is empty until [`Hub::run`] fills it.
    pub fn new(
        client: kube::Client,
        principal_namespace: String,
        registry: Arc<AgentRegistry>,
    ) -> Arc<Hub> {
        Arc::new(Hub {
            client,
            principal_namespace,
            registry,
            apps: RwLock::new(HashMap::new()),
            projects: RwLock::new(HashMap::new()),
            synced: watch::channel((false, false)).0,
        })
    }

    /// Waits until both watches have listed everything once.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|(a, p)| *a && *p).await;
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

    /// Runs both watches until the process ends.
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
        tokio::join!(apps, projects);
    }

    async fn watch_objects(self: Arc<Self>, api: Api<DynamicObject>, kind: Kind) {
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
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
        }
    }

    fn applied(&self, kind: Kind, v: Value) {
        match kind {
            Kind::Application => {
                let key = key_of(&v);
                let old = self
                    .apps
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key.clone(), v.clone());
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
                    .insert(name, v.clone());
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
            }
        }
    }

    fn deleted(&self, kind: Kind, v: Value) {
        match kind {
            Kind::Application => {
                let (ns, _) = key_of(&v);
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
            }
        }
    }

    fn managed_session(&self, namespace: &str) -> Option<Arc<AgentSession>> {
        self.registry
            .get(namespace)
            .filter(|s| s.mode() == AgentMode::Managed)
    }

    /// Queues everything `session`'s agent should have (projects first, then applications, then
    /// their pending operations), followed by a resync request.
    pub fn queue_full_state(&self, session: &AgentSession) {
        let agent = session.name.as_str();
        let projects: Vec<Value> = {
            let p = self.projects.read().unwrap_or_else(|e| e.into_inner());
            p.values()
                .filter(|p| project_matches_agent(p, agent))
                .map(|p| project_for_agent(p, agent))
                .collect()
        };
        for p in &projects {
            queue(session, EventType::SpecUpdate, Target::AppProject, p);
        }
        let apps: Vec<Value> = {
            let a = self.apps.read().unwrap_or_else(|e| e.into_inner());
            a.iter()
                .filter(|((ns, _), _)| ns == agent)
                .map(|(_, v)| v.clone())
                .collect()
        };
        for app in &apps {
            queue(
                session,
                EventType::SpecUpdate,
                Target::Application,
                &application_payload(app, false),
            );
            if !operation_already_started(app) {
                queue(
                    session,
                    EventType::SetOperation,
                    Target::Application,
                    &application_payload(app, true),
                );
            }
        }
        match Event::request_resource_resync(SOURCE) {
            Ok(ev) => push(session, ev),
            Err(e) => tracing::error!(error = %e, "cannot build a resync request"),
        }
        tracing::info!(
            agent,
            applications = apps.len(),
            projects = projects.len(),
            "queued the agent's full state"
        );
    }
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
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Application => "Application",
            Kind::AppProject => "AppProject",
        }
    }

    fn key_string(self, v: &Value) -> String {
        let (ns, name) = key_of(v);
        match self {
            Kind::Application => format!("{ns}/{name}"),
            Kind::AppProject => name,
        }
    }
}
