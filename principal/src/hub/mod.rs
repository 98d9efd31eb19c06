//! Hub-side sync: the principal's view of the hub and what it does when hub objects change.
//!
//! `Hub` wires its parts together and is what the rest of the principal calls:
//! - [`view`]: the informers of hub Applications (every namespace `--allowed-namespaces` admits),
//!   AppProjects, repository / repo-creds Secrets and the GPG keys ConfigMap (principal namespace),
//!   all narrowed by `--label-selector` — the one store per kind in the principal (the embedded
//!   operator's pull model reads the Application store too, when it holds every Application);
//! - [`managed`]: routing of hub changes into managed agents' outboxes and their checksum resync
//!   (reference §2.5, so a resync of N unchanged objects costs O(N) messages of O(1) size);
//! - [`mirrors`]: autonomous agents' hub mirrors, their protection and their checksum resync;
//! - [`namespaces`]: the hub namespaces of autonomous agents;
//! - [`gpg_keys`]: which ConfigMap is the hub's GPG keys and what is sent for it;
//! - [`mapping`]: which agent a hub Application belongs to (namespace, or `spec.destination.name`
//!   with `--destination-based-mapping`) and which hub Application an agent's event names.
//!
//! Each informer event goes to the part that owns it: a change of an Application in an autonomous
//! agent's namespace, or of a remembered AppProject mirror, to [`mirrors`]; everything else to
//! [`managed`]. On connect ([`Hub::on_connect`]) a managed agent gets the principal-restart resync
//! on its first connection since this principal started (a plain reconnect needs nothing beyond
//! the outbox, which kept every undelivered event), an autonomous agent the checksum resync; every
//! `--resync-interval` (jittered) each connected agent gets one again.

mod changes;
pub mod gpg_keys;
mod managed;
pub mod mapping;
mod mirrors;
mod namespaces;
#[cfg(test)]
pub(crate) mod testing;
pub(crate) mod view;

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use argocd_agent_kube::argocd::{AppProject, Application, ObjectMetaExt};
use argocd_agent_kube::fanout::EventFanout;
use argocd_agent_kube::informer::Handler;
use argocd_agent_proto::event::{Event, EventType, Target};
use argocd_agent_proto::mode::AgentMode;
use argocd_agent_proto::payload::RequestUpdate;
use argocd_agent_proto::sync::keyed_request;
use argocd_agent_proto::sync::resync::{jittered, request_update_key, RESYNC_REQUEST_KEY};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

pub use argocd_agent_kube::resources::{
    application as application_resource, appproject as appproject_resource,
};
pub use changes::{Change, HubChanges};
pub use managed::ManagedRouter;
pub use mapping::AppMapping;
pub use mirrors::{
    check_mirror_owner, MirrorCollision, MirrorCollisions, MirrorKind, Mirrored, Mirrors,
};
pub use view::{HubSelection, HubView, Kind};

use crate::sessions::{AgentRegistry, AgentSession};
use mirrors::MirrorOptions;
pub use namespaces::NamespaceCreation;
use namespaces::Namespaces;
pub(crate) use view::to_value;
use view::HubInformers;

/// Event source name the principal puts on its events.
pub const SOURCE: &str = "argocd-principal";

/// Hub-side behaviour the flags choose.
#[derive(Debug, Clone, Default)]
pub struct HubOptions {
    /// Whether and how the hub namespace of an autonomous agent is created when missing
    /// (`--namespace-create-enable`, `--namespace-create-pattern`, `--namespace-create-labels`).
    pub namespace_create: NamespaceCreation,
    /// Periodic resync of connected agents (`--resync-interval`); `None` = only on connect.
    pub resync_interval: Option<Duration>,
    /// Which hub Applications are served (`--allowed-namespaces`, `--label-selector`, which
    /// also narrows AppProjects and repository Secrets) and whether their watch is shared.
    pub selection: HubSelection,
    /// How hub Applications map to agents (`--destination-based-mapping`).
    pub mapping: AppMapping,
    /// Where refused mirror writes are counted.
    pub mirror_collisions: MirrorCollisions,
    /// Where handled hub changes are counted.
    pub changes: HubChanges,
}

/// The hub's view of synced objects and the routing of their changes to agents.
pub struct Hub {
    /// Hub Kubernetes client.
    pub client: kube::Client,
    /// Namespace of the principal (AppProjects live here).
    pub principal_namespace: String,
    /// Sessions.
    pub registry: Arc<AgentRegistry>,
    view: HubView,
    managed: ManagedRouter,
    mirrors: Arc<Mirrors>,
    namespaces: Namespaces,
    resync_interval: Option<Duration>,
    changes: HubChanges,
    /// The Application informer's changes for the pull model, when it selects every Application.
    app_events: Option<Arc<EventFanout<Application>>>,
    /// Taken by [`Hub::run`].
    informers: Mutex<Option<HubInformers>>,
}

pub(crate) fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
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
        let informers = HubInformers::new(
            &client,
            &principal_namespace,
            options.selection.clone(),
            options.mapping,
        );
        Hub::from_informers(client, principal_namespace, registry, options, informers)
    }

    fn from_informers(
        client: kube::Client,
        principal_namespace: String,
        registry: Arc<AgentRegistry>,
        options: HubOptions,
        informers: HubInformers,
    ) -> Arc<Hub> {
        let view = informers.view();
        let namespaces = Namespaces::new(client.clone(), options.namespace_create.clone());
        let mirrors = Mirrors::new(
            client.clone(),
            principal_namespace.clone(),
            view.clone(),
            namespaces.clone(),
            MirrorOptions {
                allowed_namespaces: options.selection.allowed_namespaces,
                collisions: options.mirror_collisions,
            },
        );
        Arc::new(Hub {
            managed: ManagedRouter::new(view.clone(), registry.clone()),
            client,
            principal_namespace,
            registry,
            view,
            mirrors,
            namespaces,
            resync_interval: options.resync_interval,
            changes: options.changes,
            app_events: informers.app_events.clone(),
            informers: Mutex::new(Some(informers)),
        })
    }

    /// Waits until every watch has listed everything once.
    pub async fn wait_synced(&self) {
        self.view.wait_listed().await;
    }

    /// The hub Application `namespace`/`name`, if it belongs to `agent`.
    pub fn application(
        &self,
        agent: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<Application>> {
        self.view.application(agent, namespace, name)
    }

    /// How hub Applications map to agents.
    pub fn mapping(&self) -> AppMapping {
        self.view.mapping()
    }

    /// The agent that answers live-view requests about hub Application `namespace`/`name`: an
    /// autonomous agent for its namespace's mirrors, else the agent the Application maps to.
    pub fn agent_answering_for(&self, namespace: &str, name: &str) -> Option<String> {
        if self.autonomous_session(namespace).is_some() {
            return Some(namespace.to_string());
        }
        let app = self.view.application_in(namespace, name)?;
        self.mapping().agent_of(&app).map(str::to_string)
    }

    /// The hub AppProject `name`, if it applies to `agent`.
    pub fn project_for(&self, agent: &str, name: &str) -> Option<Arc<AppProject>> {
        self.view
            .project(name)
            .filter(|p| self.view.project_applies(p, agent))
    }

    /// The hub's GPG keys ConfigMap, if it exists and is synced (every managed agent gets it).
    pub fn gpg_keys(&self) -> Option<Arc<ConfigMap>> {
        self.view.gpg_keys()
    }

    /// The hub repository Secret `name`, if the AppProject it names applies to `agent`.
    pub fn repository_for(&self, agent: &str, name: &str) -> Option<Arc<Secret>> {
        self.view.repository_for(agent, name)
    }

    /// The hub Applications' changes, for the embedded operator's pull model, when the hub's
    /// Application watch is shared ([`HubSelection::share_applications`]); `None` otherwise.
    pub fn application_events(&self) -> Option<Arc<EventFanout<Application>>> {
        self.app_events.clone()
    }

    /// The informers, with this hub's handlers attached; `None` once taken.
    fn take_informers(self: &Arc<Self>) -> Option<HubInformers> {
        let informers = self
            .informers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        let hub = || HubEvents { hub: self.clone() };
        Some(informers.with_handlers(
            Arc::new(hub()),
            Arc::new(hub()),
            Arc::new(hub()),
            Arc::new(hub()),
        ))
    }

    /// Runs the watches (and the periodic resync) until the process ends. Call once.
    pub async fn run(self: Arc<Self>) {
        let Some(informers) = self.take_informers() else {
            tracing::error!("Hub::run called twice; the hub watches are already running");
            return;
        };
        let periodic = self.clone().periodic_resync();
        tokio::join!(
            informers.apps.run(None),
            informers.projects.run(None),
            informers.repositories.run(None),
            informers.gpg_keys.run(None),
            periodic
        );
    }

    /// Every `--resync-interval` (jittered): a resync of every connected agent.
    async fn periodic_resync(self: Arc<Self>) {
        let Some(interval) = self.resync_interval else {
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
                    AgentMode::Autonomous => self.mirrors.autonomous_resync(&session),
                    AgentMode::Managed => match Event::request_resource_resync(SOURCE) {
                        Ok(ev) => push(&session, keyed_request(ev, RESYNC_REQUEST_KEY)),
                        Err(e) => tracing::error!(error = %e, "cannot build a resync request"),
                    },
                }
            }
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
                self.managed.principal_restart_resync(session)
            }
            AgentMode::Managed => tracing::debug!(
                agent = session.name.as_str(),
                "managed agent reconnected; its outbox carries what it missed"
            ),
            AgentMode::Autonomous => self.mirrors.autonomous_resync(session),
        }
    }

    /// Makes sure hub namespace `agent` exists for an autonomous agent's mirrors: creates it when
    /// the namespace-create flags allow, else says what is missing.
    pub async fn ensure_agent_namespace(&self, agent: &str) -> Result<(), String> {
        self.namespaces.ensure(agent).await
    }

    /// The routing to managed agents.
    pub fn managed(&self) -> &ManagedRouter {
        &self.managed
    }

    /// The autonomous agents' mirrors.
    pub fn mirrors(&self) -> &Mirrors {
        &self.mirrors
    }

    fn autonomous_session(&self, namespace: &str) -> Option<Arc<AgentSession>> {
        self.registry
            .get(namespace)
            .filter(|s| s.mode() == AgentMode::Autonomous)
    }

    /// A hub Application appeared or changed: to the mirrors if it is in an autonomous agent's
    /// namespace, else to the managed router.
    fn application_applied(&self, old: Option<&Application>, new: &Application) {
        match self.autonomous_session(new.namespace_str()) {
            Some(session) => self.mirrors.application_changed(&session, old, new),
            None => {
                self.count(Kind::Application, Change::of(old));
                self.managed.application_applied(old, new)
            }
        }
    }

    /// Counts a change of a managed-side hub object, once the kind's first list is done.
    fn count(&self, kind: Kind, change: Change) {
        if self.view.is_listed(kind) {
            self.changes.record(kind, change);
        }
    }

    /// A hub Application was deleted.
    fn application_deleted(&self, last: &Application) {
        let namespace = last.namespace_str();
        if self.autonomous_session(namespace).is_some() {
            self.mirrors.application_deleted(namespace, last);
        } else {
            self.count(Kind::Application, Change::Deleted);
            self.managed.application_deleted(last);
        }
    }

    /// A hub AppProject appeared or changed: a remembered mirror's edit is the mirrors'
    /// business, anything else the managed router's.
    fn project_applied(&self, old: Option<&AppProject>, new: &AppProject) {
        if !self.mirrors.project_changed(new) {
            self.count(Kind::AppProject, Change::of(old));
            self.managed.project_applied(old, new);
        }
    }

    /// A hub AppProject was deleted.
    fn project_deleted(&self, last: &AppProject) {
        if !self.mirrors.project_deleted(last) {
            self.count(Kind::AppProject, Change::Deleted);
            self.managed.project_deleted(last);
        }
    }
}

/// The informer handler of every hub kind: hands their changes to the [`Hub`].
struct HubEvents {
    hub: Arc<Hub>,
}

impl Handler<Application> for HubEvents {
    fn applied(&self, old: Option<Arc<Application>>, new: Arc<Application>) -> BoxFuture<'_, ()> {
        self.hub.application_applied(old.as_deref(), &new);
        Box::pin(async {})
    }

    fn deleted(&self, last: Arc<Application>) -> BoxFuture<'_, ()> {
        self.hub.application_deleted(&last);
        Box::pin(async {})
    }
}

impl Handler<AppProject> for HubEvents {
    fn applied(&self, old: Option<Arc<AppProject>>, new: Arc<AppProject>) -> BoxFuture<'_, ()> {
        self.hub.project_applied(old.as_deref(), &new);
        Box::pin(async {})
    }

    fn deleted(&self, last: Arc<AppProject>) -> BoxFuture<'_, ()> {
        self.hub.project_deleted(&last);
        Box::pin(async {})
    }
}

/// Repository Secrets.
impl Handler<Secret> for HubEvents {
    fn applied(&self, old: Option<Arc<Secret>>, new: Arc<Secret>) -> BoxFuture<'_, ()> {
        self.hub.count(Kind::Repository, Change::of(old.as_ref()));
        self.hub
            .managed
            .repository_changed(old.as_deref(), Some(&new));
        Box::pin(async {})
    }

    fn deleted(&self, last: Arc<Secret>) -> BoxFuture<'_, ()> {
        self.hub.count(Kind::Repository, Change::Deleted);
        self.hub.managed.repository_changed(Some(&last), None);
        Box::pin(async {})
    }
}

/// The GPG keys ConfigMap.
impl Handler<ConfigMap> for HubEvents {
    fn applied(&self, old: Option<Arc<ConfigMap>>, new: Arc<ConfigMap>) -> BoxFuture<'_, ()> {
        self.hub.count(Kind::GpgKey, Change::of(old.as_ref()));
        self.hub
            .managed
            .gpg_keys_changed(old.as_deref(), Some(&new));
        Box::pin(async {})
    }

    fn deleted(&self, last: Arc<ConfigMap>) -> BoxFuture<'_, ()> {
        self.hub.count(Kind::GpgKey, Change::Deleted);
        self.hub.managed.gpg_keys_changed(Some(&last), None);
        Box::pin(async {})
    }
}

/// Asks the agent of `session` for one object (empty checksum: "send it").
pub fn request_object(
    session: &AgentSession,
    kind: &str,
    name: &str,
    uid: &str,
    checksum: Vec<u8>,
) {
    request_object_in(session, kind, "", name, uid, checksum)
}

/// [`request_object`] naming the object's hub namespace too (destination-based mapping, where an
/// agent's Applications live in several namespaces).
pub fn request_object_in(
    session: &AgentSession,
    kind: &str,
    namespace: &str,
    name: &str,
    uid: &str,
    checksum: Vec<u8>,
) {
    let req = RequestUpdate {
        name: name.to_string(),
        namespace: namespace.to_string(),
        uid: uid.to_string(),
        kind: kind.to_string(),
        checksum,
    };
    let key = match namespace {
        "" => request_update_key(kind, name),
        ns => request_update_key(kind, &format!("{ns}/{name}")),
    };
    match Event::request_update(SOURCE, &req) {
        Ok(ev) => push(session, keyed_request(ev, key)),
        Err(e) => tracing::error!(error = %e, "cannot build a request-update"),
    }
}

/// Builds an object event and queues it for `session`.
pub fn queue<T: serde::Serialize + ?Sized>(
    session: &AgentSession,
    t: EventType,
    target: Target,
    obj: &T,
) {
    match Event::for_object(t.clone(), target.clone(), SOURCE, obj) {
        Ok(ev) => push(session, ev),
        Err(e) => {
            tracing::error!(agent = session.name.as_str(), event_type = t.name(), error = %e, "cannot build event")
        }
    }
}

pub(crate) fn push(session: &AgentSession, ev: Event) {
    if let Err(e) = session.outbox.push(ev) {
        tracing::error!(agent = session.name.as_str(), error = %e, "event not queued");
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::testing::{app, app_to, drained, drive, offline_client, project, received, Feeds};
    use super::*;

    fn apply(feed: &testing::Feed, v: Value) {
        feed.apply(v);
    }

    fn delete(feed: &testing::Feed, v: Value) {
        feed.delete(v);
    }

    /// The feeds as the tests below name them: (apps, projects, repositories).
    struct Fixture {
        hub: Arc<Hub>,
        feeds: Feeds,
        managed: Arc<AgentSession>,
        autonomous: Arc<AgentSession>,
    }

    async fn fixture(apps: Vec<Value>, projects: Vec<Value>) -> Fixture {
        fixture_mapped(AppMapping::Namespace, apps, projects)
            .await
            .0
    }

    /// [`fixture`] with `mapping`, and a second managed agent `team-b`.
    async fn fixture_mapped(
        mapping: AppMapping,
        apps: Vec<Value>,
        projects: Vec<Value>,
    ) -> (Fixture, Arc<AgentSession>) {
        let options = HubOptions {
            mapping,
            ..HubOptions::default()
        };
        fixture_with(options, apps, projects).await
    }

    /// [`fixture_mapped`] with any `options`.
    async fn fixture_with(
        options: HubOptions,
        apps: Vec<Value>,
        projects: Vec<Value>,
    ) -> (Fixture, Arc<AgentSession>) {
        let registry = testing::registry(&[
            ("team-a", AgentMode::Managed),
            ("team-b", AgentMode::Managed),
            ("auto", AgentMode::Autonomous),
        ]);
        let managed = registry.get("team-a").unwrap();
        let team_b = registry.get("team-b").unwrap();
        let autonomous = registry.get("auto").unwrap();
        let hub = Hub::with_options(offline_client(), "argocd".into(), registry, options);
        let feeds = drive(hub.take_informers().unwrap());
        feeds
            .list_all(&hub.view, apps, projects, vec![], None)
            .await;
        (
            Fixture {
                hub,
                feeds,
                managed,
                autonomous,
            },
            team_b,
        )
    }

    #[tokio::test]
    async fn hub_changes_are_counted_once_each_after_the_first_list_and_mirrors_not_at_all() {
        let f = fixture(vec![app("team-a", "listed", "v1")], vec![]).await;
        let counted = |kind, change| f.hub.changes.value(kind, change);
        assert_eq!(
            counted(Kind::Application, Change::Created),
            0,
            "the first list"
        );
        apply(&f.feeds.apps, app("team-a", "guestbook", "v1"));
        apply(&f.feeds.apps, app("team-a", "guestbook", "v2"));
        // An autonomous agent's namespace holds mirrors: its writes, not counted.
        apply(&f.feeds.apps, app("auto", "mirror", "v1"));
        delete(&f.feeds.apps, app("team-a", "guestbook", "v2"));
        // One informer task handles them in order: once the marker's event is queued, all were
        // handled (the outbox keeps guestbook's last event only).
        apply(&f.feeds.apps, app("team-a", "marker", "v1"));
        let mut got = received(&f.managed, 2).await;
        got.sort();
        assert_eq!(
            got,
            vec!["create Application marker", "delete Application guestbook"]
        );
        for (change, n) in [
            (Change::Created, 2),
            (Change::Updated, 1),
            (Change::Deleted, 1),
        ] {
            assert_eq!(counted(Kind::Application, change), n, "{change:?}");
        }
        // A project counts once, however many agents it is routed to.
        apply(&f.feeds.projects, project("shared", &["team-*"]));
        assert_eq!(
            received(&f.managed, 1).await,
            vec!["create AppProject shared"]
        );
        assert_eq!(counted(Kind::AppProject, Change::Created), 1);
    }

    /// With the Application watch shared (the embedded operator reads every Application), the
    /// hub narrows its own view to `--allowed-namespaces` and `--label-selector` in process,
    /// exactly as the apiserver's selected watch did: a label added or removed is a create or a
    /// delete for the agent, other namespaces and unlabelled Applications are neither served
    /// nor routed, and the shared events still carry every Application.
    #[tokio::test]
    async fn a_shared_application_watch_is_narrowed_to_the_selection_in_process() {
        let labelled = |ns: &str, name: &str, team: Option<&str>| {
            let mut v = app(ns, name, "v1");
            if let Some(team) = team {
                v["metadata"]["labels"] = serde_json::json!({ "sync": team });
            }
            v
        };
        let options = HubOptions {
            selection: HubSelection {
                allowed_namespaces: vec!["team-*".into()],
                label_selector: Some("sync in (yes)".parse().unwrap()),
                share_applications: true,
            },
            ..HubOptions::default()
        };
        let (f, _) = fixture_with(
            options,
            vec![
                labelled("team-a", "in", Some("yes")),
                labelled("team-a", "unlabelled", None),
                labelled("other", "elsewhere", Some("yes")),
            ],
            vec![project("p", &["team-a"])],
        )
        .await;
        let shared = f.hub.application_events().expect("the watch is shared");
        let mut events = shared.subscribe();
        let mut replayed = Vec::new();
        while let Some(event) = futures::StreamExt::next(&mut events).await {
            match event {
                kube::runtime::watcher::Event::InitApply(app) => {
                    replayed.push(app.name_str().to_string())
                }
                kube::runtime::watcher::Event::InitDone => break,
                _ => {}
            }
        }
        replayed.sort();
        assert_eq!(
            replayed,
            vec!["elsewhere", "in", "unlabelled"],
            "every Application"
        );
        assert!(f.hub.application("team-a", "team-a", "in").is_some());
        assert!(f
            .hub
            .application("team-a", "team-a", "unlabelled")
            .is_none());
        assert!(f.hub.view.application_in("other", "elsewhere").is_none());
        assert_eq!(f.hub.view.applications_of("team-a").len(), 1);
        // (The first list is not routed: the resync on connect covers it.)
        // Gaining the label is a create; losing it a delete; out-of-scope changes are silent.
        apply(&f.feeds.apps, labelled("team-a", "unlabelled", Some("yes")));
        assert_eq!(
            received(&f.managed, 1).await,
            vec!["create Application unlabelled"]
        );
        apply(&f.feeds.apps, labelled("team-a", "in", Some("no")));
        apply(&f.feeds.apps, labelled("other", "elsewhere", Some("yes")));
        delete(&f.feeds.apps, labelled("team-a", "gone", None));
        apply(&f.feeds.apps, labelled("team-a", "marker", Some("yes")));
        let mut got = received(&f.managed, 2).await;
        got.sort();
        assert_eq!(
            got,
            vec!["create Application marker", "delete Application in"]
        );
        assert!(f.hub.application("team-a", "team-a", "in").is_none());
    }

    #[tokio::test]
    async fn under_destination_mapping_an_application_reaches_the_agent_its_destination_names() {
        let (f, team_b) = fixture_mapped(
            AppMapping::Destination,
            vec![app_to("apps", "guestbook", "team-a")],
            vec![project("p", &["team-a"])],
        )
        .await;
        assert!(f.hub.application("team-a", "apps", "guestbook").is_some());
        assert!(
            f.hub.application("team-b", "apps", "guestbook").is_none(),
            "another agent cannot reach it by naming its namespace"
        );
        // In namespace "team-a" but destined to team-b: only team-b gets it.
        apply(&f.feeds.apps, app_to("team-a", "other", "team-b"));
        assert_eq!(received(&team_b, 1).await, vec!["create Application other"]);
        assert!(drained(&f.managed).is_empty());
        // A new destination moves it: the old agent deletes its copy, the new one creates it.
        apply(&f.feeds.apps, app_to("apps", "guestbook", "team-b"));
        assert_eq!(
            received(&f.managed, 1).await,
            vec!["delete Application guestbook"]
        );
        assert_eq!(
            received(&team_b, 1).await,
            vec!["create Application guestbook"]
        );
        let keys: Vec<String> = f
            .hub
            .managed()
            .managed_keys("team-b")
            .iter()
            .map(|k| format!("{} {}/{}", k.kind, k.namespace, k.name))
            .collect();
        let mut keys = keys;
        keys.sort();
        assert_eq!(
            keys,
            vec!["Application apps/guestbook", "Application team-a/other"]
        );
        // Live-view keys follow the destination; an autonomous agent answers for its namespace.
        assert_eq!(
            f.hub.agent_answering_for("apps", "guestbook").as_deref(),
            Some("team-b")
        );
        assert_eq!(
            f.hub.agent_answering_for("auto", "anything").as_deref(),
            Some("auto")
        );
        assert_eq!(f.hub.agent_answering_for("apps", "missing"), None);
        // No destination name: no agent. (One informer task routes in order, so once the
        // marker after it arrived, nothing of it is still on its way.)
        apply(&f.feeds.apps, app("apps", "unrouted", "v1"));
        apply(&f.feeds.apps, app_to("apps", "marker", "team-b"));
        assert_eq!(
            received(&team_b, 1).await,
            vec!["create Application marker"]
        );
        assert!(drained(&f.managed).is_empty());
    }

    #[tokio::test]
    async fn the_first_list_routes_nothing_later_changes_reach_the_managed_agent_they_belong_to() {
        let f = fixture(
            vec![
                app("team-a", "guestbook", "v1"),
                app("auto", "mirror", "v1"),
            ],
            vec![project("p", &["team-a"])],
        )
        .await;
        assert!(
            drained(&f.managed).is_empty(),
            "the resync on connect covers the first list"
        );
        assert!(f.hub.application("team-a", "team-a", "guestbook").is_some());

        apply(&f.feeds.apps, app("team-a", "guestbook", "v2"));
        apply(&f.feeds.apps, app("team-b", "unrelated", "v1"));
        apply(&f.feeds.projects, project("q", &["team-*"]));
        apply(&f.feeds.projects, project("other", &["team-b"]));
        assert_eq!(
            received(&f.managed, 2).await,
            vec!["spec-update Application guestbook", "create AppProject q"]
        );
        delete(&f.feeds.apps, app("team-a", "guestbook", "v2"));
        assert_eq!(
            received(&f.managed, 1).await,
            vec!["delete Application guestbook"]
        );
        // An autonomous agent's namespace is the mirrors' business, never routed as managed.
        apply(&f.feeds.apps, app("auto", "mirror", "v2"));
        tokio::task::yield_now().await;
        assert!(drained(&f.autonomous).is_empty());
    }

    #[tokio::test]
    async fn a_project_that_stops_applying_is_deleted_on_the_agent_and_keys_follow_the_hub() {
        let f = fixture(
            vec![app("team-a", "guestbook", "v1")],
            vec![project("p", &["team-a"])],
        )
        .await;
        let keys: Vec<String> = f
            .hub
            .managed()
            .managed_keys("team-a")
            .iter()
            .map(|k| format!("{} {}", k.kind, k.name))
            .collect();
        assert_eq!(keys, vec!["Application guestbook", "AppProject p"]);
        apply(&f.feeds.projects, project("p", &["team-b"]));
        assert_eq!(received(&f.managed, 1).await, vec!["delete AppProject p"]);
        assert_eq!(f.hub.managed().managed_keys("team-a").len(), 1);
    }
}
