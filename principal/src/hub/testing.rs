//! The hub's parts without an apiserver, for their unit tests: informers fed watch events by hand
//! ([`drive`]), agent sessions whose outboxes the tests read ([`drained`], [`received`]), and the
//! hub objects the tests feed ([`app`], [`project`], [`repository`], [`gpg_keys`]).
//!
//! The parts under test run as in the principal (the same informers, stores and handlers); only
//! the watch streams are replaced, and the client is one that is never reached.

use std::sync::Arc;
use std::time::{Duration, Instant};

use argocd_agent_proto::event::{Event, GPG_KEYS_CONFIGMAP};
use argocd_agent_proto::identity::AgentName;
use argocd_agent_proto::mode::AgentMode;
use argocd_agent_proto::sync::OutboxConfig;
use futures::channel::mpsc;
use futures::StreamExt;
use kube::runtime::watcher;
use serde_json::{json, Value};

use super::mapping::AppMapping;
use super::view::{HubInformers, HubView};
use crate::sessions::{AgentRegistry, AgentSession};

/// A client that is never reached.
pub fn offline_client() -> kube::Client {
    let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

/// Sends watch events (as JSON objects) into one informer.
pub struct Feed(mpsc::UnboundedSender<watcher::Event<Value>>);

impl Feed {
    /// `v` appeared or changed.
    pub fn apply(&self, v: Value) {
        self.0.unbounded_send(watcher::Event::Apply(v)).unwrap();
    }

    /// `v` was deleted.
    pub fn delete(&self, v: Value) {
        self.0.unbounded_send(watcher::Event::Delete(v)).unwrap();
    }

    /// `objects` as a complete first list.
    pub fn list(&self, objects: Vec<Value>) {
        self.0.unbounded_send(watcher::Event::Init).unwrap();
        for obj in objects {
            self.0
                .unbounded_send(watcher::Event::InitApply(obj))
                .unwrap();
        }
        self.0.unbounded_send(watcher::Event::InitDone).unwrap();
    }
}

fn feed<K>(informer: argocd_agent_kube::informer::Informer<K>) -> Feed
where
    K: argocd_agent_kube::informer::Watched,
{
    let (tx, rx) = mpsc::unbounded::<watcher::Event<Value>>();
    let typed = rx.map(|event| {
        let typed = |v: Value| serde_json::from_value::<K>(v).unwrap();
        Ok(match event {
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitApply(v) => watcher::Event::InitApply(typed(v)),
            watcher::Event::InitDone => watcher::Event::InitDone,
            watcher::Event::Apply(v) => watcher::Event::Apply(typed(v)),
            watcher::Event::Delete(v) => watcher::Event::Delete(typed(v)),
        })
    });
    tokio::spawn(informer.consume(typed));
    Feed(tx)
}

/// The hand-fed watch of each hub kind.
pub struct Feeds {
    /// Applications.
    pub apps: Feed,
    /// AppProjects.
    pub projects: Feed,
    /// Repository Secrets.
    pub repositories: Feed,
    /// The GPG keys ConfigMap.
    pub gpg_keys: Feed,
}

impl Feeds {
    /// Lists every kind (the GPG keys ConfigMap as `gpg`, if given) and waits until `view` saw
    /// all four lists.
    pub async fn list_all(
        &self,
        view: &HubView,
        apps: Vec<Value>,
        projects: Vec<Value>,
        repositories: Vec<Value>,
        gpg: Option<Value>,
    ) {
        self.apps.list(apps);
        self.projects.list(projects);
        self.repositories.list(repositories);
        self.gpg_keys.list(gpg.into_iter().collect());
        tokio::time::timeout(Duration::from_secs(5), view.wait_listed())
            .await
            .expect("every hub kind is listed");
    }
}

/// Starts `informers` on hand-fed event streams.
pub fn drive(informers: HubInformers) -> Feeds {
    Feeds {
        apps: feed(informers.apps),
        projects: feed(informers.projects),
        repositories: feed(informers.repositories),
        gpg_keys: feed(informers.gpg_keys),
    }
}

/// The informers of a hub whose principal namespace is `argocd`, with `mapping`, and their view.
pub fn hub_informers(mapping: AppMapping) -> (HubInformers, HubView) {
    let informers = HubInformers::new(
        &offline_client(),
        "argocd",
        super::view::HubSelection::default(),
        mapping,
    );
    let view = informers.view();
    (informers, view)
}

/// A view with `mapping` whose informers listed `apps`, `projects`, `repositories` and the GPG
/// keys ConfigMap `gpg`; the feeds keep it changing.
pub async fn listed(
    mapping: AppMapping,
    apps: Vec<Value>,
    projects: Vec<Value>,
    repositories: Vec<Value>,
    gpg: Option<Value>,
) -> (HubView, Feeds) {
    let (informers, view) = hub_informers(mapping);
    let feeds = drive(informers);
    feeds
        .list_all(&view, apps, projects, repositories, gpg)
        .await;
    (view, feeds)
}

/// `v` labelled skip-sync.
pub fn skip_sync(mut v: Value) -> Value {
    v["metadata"]["labels"] = json!({argocd_agent_kube::skip_sync::SKIP_SYNC_LABEL: "true"});
    v
}

/// A registry with one session per (agent, mode).
pub fn registry(agents: &[(&str, AgentMode)]) -> Arc<AgentRegistry> {
    let registry = Arc::new(AgentRegistry::new(
        OutboxConfig::default(),
        Default::default(),
    ));
    for (name, mode) in agents {
        registry.get_or_create(&AgentName::new(*name).unwrap(), *mode);
    }
    registry
}

/// Every event queued for `session` so far, in delivery order (each ACKed, so the next call sees
/// only what was queued since).
pub fn drained_events(session: &AgentSession) -> Vec<Event> {
    session.outbox.set_connected(true);
    let mut out = Vec::new();
    while let Some(ev) = session.outbox.take_next(Instant::now()) {
        session.outbox.ack(&ev.ack());
        out.push(ev);
    }
    out
}

/// An event as "type Target name" (the name of the object it carries, if any).
pub fn describe(ev: &Event) -> String {
    let name = ev
        .data_as::<Value>()
        .ok()
        .and_then(|v| {
            v.pointer("/metadata/name")
                .or_else(|| v.get("name"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default();
    format!("{} {:?} {name}", ev.event_type.name(), ev.target)
}

/// [`drained_events`], each [`describe`]d.
pub fn drained(session: &AgentSession) -> Vec<String> {
    drained_events(session).iter().map(describe).collect()
}

/// The next `n` events for `session`, [`describe`]d (informers run on their own tasks).
pub async fn received(session: &AgentSession, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.len() < n {
        assert!(
            Instant::now() < deadline,
            "got {got:?}, expected {n} events"
        );
        got.extend(drained(session));
        tokio::task::yield_now().await;
    }
    got
}

/// Hub Application `ns`/`name` (uid `uid-<name>`) at `revision`.
pub fn app(ns: &str, name: &str, revision: &str) -> Value {
    json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
           "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")},
           "spec": {"project": "default", "source": {"repoURL": "https://git", "targetRevision": revision},
                    "destination": {"server": "https://kubernetes.default.svc", "namespace": "default"}}})
}

/// An Application in hub namespace `ns` whose destination names `agent`.
pub fn app_to(ns: &str, name: &str, agent: &str) -> Value {
    let mut v = app(ns, name, "v1");
    v["spec"]["destination"] = json!({"name": agent, "namespace": "guestbook"});
    v
}

/// Hub AppProject `name` (in `argocd`) with one destination per agent pattern, and the same
/// patterns as its source namespaces: under namespace mapping a project applies to an agent only
/// when both admit it (upstream's `DoesAgentMatchWithProject`).
pub fn project(name: &str, agents: &[&str]) -> Value {
    let destinations: Vec<Value> = agents
        .iter()
        .map(|a| json!({"name": a, "namespace": "*"}))
        .collect();
    json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
           "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}")},
           "spec": {"destinations": destinations, "sourceNamespaces": agents}})
}

/// Hub repository Secret `name` (in `argocd`, uid `uid-<name>`) of AppProject `project`, for
/// repository `url`.
pub fn repository(name: &str, project: &str, url: &str) -> Value {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}"),
                        "labels": {"argocd.argoproj.io/secret-type": "repository"}},
           "data": {"project": b64(project), "url": b64(url)}})
}

/// The hub's GPG keys ConfigMap holding `keys` (key id → key).
pub fn gpg_keys(keys: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = keys
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": GPG_KEYS_CONFIGMAP, "namespace": "argocd", "uid": "uid-gpg"},
           "data": data})
}
