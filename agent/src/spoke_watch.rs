//! The agent's watch of its namespace: one [`Informer`] per spoke kind a mode syncs
//! (Applications and AppProjects, and in managed mode repository Secrets and the GPG keys
//! ConfigMap, by field selector), whose stores are the
//! agent's one copy of what the spoke holds. Under destination-based mapping the Application
//! informer watches every spoke namespace and keeps those [`AppPlacement`] admits.
//!
//! Owns [`SpokeInformers`] (built with a mode's sync, so the sync reads the stores from the start;
//! run once, by the mode's `run_watchers`) and [`SpokeObserver`], what a mode implements to hear
//! of spoke objects (as [`SpokeObject`]s): `applied` for an object added or changed (and for every object of a
//! relist), `gone` for one deleted or vanished while the watch was down, `listed` after every
//! complete (re)list. Following the watch, backing off, logging its failures and the relist diff
//! are [`argocd_agent_kube::informer`]'s.

use std::future::Future;
use std::sync::{Arc, Mutex};

use argocd_agent_kube::informer::{Handler, Informer, InformerReader};
use futures::future::BoxFuture;
use kube::api::Api;
use kube::runtime::watcher;

use crate::placement::AppPlacement;
use crate::spoke_copy::{SpokeObject, SyncedKind};

/// What a mode does when spoke objects change. Calls for one kind come one at a time, in watch
/// order; the store already holds (or no longer holds) the object when they come.
pub trait SpokeObserver: Send + Sync + 'static {
    /// `live` (without managedFields) was added or changed, or seen again by a relist.
    fn applied(
        self: &Arc<Self>,
        kind: SyncedKind,
        live: SpokeObject,
    ) -> impl Future<Output = ()> + Send;

    /// `last` (the last copy seen) was deleted, or vanished while the watch was down.
    fn gone(
        self: &Arc<Self>,
        kind: SyncedKind,
        last: SpokeObject,
    ) -> impl Future<Output = ()> + Send;

    /// A complete (re)list of `kind` is in the store.
    fn listed(self: &Arc<Self>, kind: SyncedKind) -> impl Future<Output = ()> + Send;
}

/// Turns an informer's calls for one kind into [`SpokeObserver`] calls.
struct KindHandler<O> {
    kind: SyncedKind,
    observer: Arc<O>,
}

impl<O: SpokeObserver> Handler<SpokeObject> for KindHandler<O> {
    fn applied(&self, _old: Option<Arc<SpokeObject>>, new: Arc<SpokeObject>) -> BoxFuture<'_, ()> {
        let live = SpokeObject::clone(&new).without_managed_fields();
        Box::pin(self.observer.applied(self.kind, live))
    }

    fn deleted(&self, last: Arc<SpokeObject>) -> BoxFuture<'_, ()> {
        let last = SpokeObject::clone(&last).without_managed_fields();
        Box::pin(self.observer.gone(self.kind, last))
    }

    fn listed(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.observer.listed(self.kind))
    }
}

/// The informers of the spoke kinds one mode watches in the agent namespace (see the module docs).
pub struct SpokeInformers {
    namespace: String,
    readers: Vec<(SyncedKind, InformerReader<SpokeObject>)>,
    /// Taken, with their handlers added, when the watch starts.
    pending: Mutex<Vec<(SyncedKind, Informer<SpokeObject>)>>,
}

impl SpokeInformers {
    /// Informers of `kinds` in `namespace`, each narrowed by its label selector; not yet running.
    pub fn new(
        client: &kube::Client,
        namespace: &str,
        kinds: impl IntoIterator<Item = (SyncedKind, Option<String>)>,
    ) -> Self {
        SpokeInformers::placed(client, namespace, kinds, None)
    }

    /// [`SpokeInformers::new`] whose Application informer, under destination-based mapping,
    /// watches every namespace `placement` admits.
    pub fn placed(
        client: &kube::Client,
        namespace: &str,
        kinds: impl IntoIterator<Item = (SyncedKind, Option<String>)>,
        placement: Option<Arc<AppPlacement>>,
    ) -> Self {
        let mut readers = Vec::new();
        let mut pending = Vec::new();
        let across = placement.filter(|p| p.destination_mapping());
        for (kind, selector) in kinds {
            let mut config = watcher::Config::default();
            if let Some(sel) = &selector {
                config = config.labels(sel);
            }
            if let Some(fields) = kind.field_selector() {
                config = config.fields(&fields);
            }
            let informer = match (&across, kind) {
                (Some(placement), SyncedKind::Application) => {
                    let placement = placement.clone();
                    Informer::new_with(
                        format!("spoke {kind}s in the allowed namespaces"),
                        Api::all_with(client.clone(), &kind.api_resource()),
                        config,
                        kind.api_resource(),
                    )
                    .scope(move |o: &SpokeObject| {
                        placement.admits(o.metadata.namespace.as_deref().unwrap_or_default())
                    })
                }
                _ => Informer::new_with(
                    format!("spoke {kind}s in {namespace}"),
                    Api::namespaced_with(client.clone(), namespace, &kind.api_resource()),
                    config,
                    kind.api_resource(),
                ),
            };
            readers.push((kind, informer.reader()));
            pending.push((kind, informer));
        }
        SpokeInformers {
            namespace: namespace.to_string(),
            readers,
            pending: Mutex::new(pending),
        }
    }

    fn reader(&self, kind: SyncedKind) -> Option<&InformerReader<SpokeObject>> {
        self.readers
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, r)| r)
    }

    /// Waits until every informer has applied its first complete list.
    pub async fn wait_listed(&self) {
        futures::future::join_all(self.readers.iter().map(|(_, r)| r.wait_listed())).await;
    }

    /// Every stored object of `kind`.
    pub fn state(&self, kind: SyncedKind) -> Vec<Arc<SpokeObject>> {
        self.reader(kind)
            .map(InformerReader::state)
            .unwrap_or_default()
    }

    /// The hub object uid (source-uid annotation) of the stored `kind`/`name` in the agent
    /// namespace, if it has one.
    pub fn source_uid(&self, kind: SyncedKind, name: &str) -> Option<String> {
        self.source_uid_in(kind, &self.namespace, name)
    }

    /// [`SpokeInformers::source_uid`] of the object in spoke namespace `namespace`.
    pub fn source_uid_in(&self, kind: SyncedKind, namespace: &str, name: &str) -> Option<String> {
        self.stored(kind, namespace, name)?
            .source_uid()
            .map(str::to_string)
    }

    /// The stored `kind` object `namespace`/`name`, if any.
    pub fn stored(
        &self,
        kind: SyncedKind,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<SpokeObject>> {
        self.reader(kind)?.get(Some(namespace), name)
    }

    /// The informers with `observer`'s handlers, ready to run; empty after the first call (each
    /// informer runs once).
    pub fn start<O: SpokeObserver>(
        &self,
        observer: &Arc<O>,
    ) -> Vec<(SyncedKind, Informer<SpokeObject>)> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        pending
            .into_iter()
            .map(|(kind, informer)| {
                let handler = KindHandler {
                    kind,
                    observer: observer.clone(),
                };
                (kind, informer.handler(Arc::new(handler)))
            })
            .collect()
    }

    /// Runs every informer, for `observer`, until the future is dropped.
    pub async fn run<O: SpokeObserver>(&self, observer: &Arc<O>) {
        let informers = self.start(observer);
        futures::future::join_all(informers.into_iter().map(|(_, i)| i.run(None))).await;
    }
}

/// The seam the modes' unit tests watch through: no apiserver, events fed by hand.
#[cfg(test)]
pub(crate) mod seam {
    use std::time::Instant;

    use argocd_agent_proto::sync::Outbox;

    use argocd_agent_kube::argocd::ObjectMetaExt;
    use serde_json::Value;

    use super::*;

    /// A client nothing answers: the syncs under test must not need the apiserver.
    pub(crate) fn unreachable_client() -> kube::Client {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("static uri"));
        kube::Client::try_from(config).expect("client")
    }

    /// `obj` (JSON) as the watch would deliver it.
    pub(crate) fn object(obj: Value) -> SpokeObject {
        serde_json::from_value(obj).expect("a Kubernetes object")
    }

    impl SpokeInformers {
        /// Feeds `events` to the informer of `kind`, with `observer`'s handlers, as its watch
        /// would; the other informers are dropped.
        pub(crate) async fn feed<O: SpokeObserver>(
            &self,
            observer: &Arc<O>,
            kind: SyncedKind,
            events: Vec<watcher::Event<SpokeObject>>,
        ) {
            let (_, informer) = self
                .start(observer)
                .into_iter()
                .find(|(k, _)| *k == kind)
                .expect("an informer of the kind");
            informer
                .consume(futures::stream::iter(events.into_iter().map(Ok)))
                .await
        }
    }

    /// One watch history through every path: a first list (a, b, d at version 1), then a changed
    /// (version 2), c added, b deleted, and, after the watch broke, a relist (a and c unchanged)
    /// from which d is missing. `object(name, version)` builds the objects.
    pub(crate) fn watch_history(
        object: impl Fn(&str, usize) -> SpokeObject,
    ) -> Vec<watcher::Event<SpokeObject>> {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        vec![
            Init,
            InitApply(object("a", 1)),
            InitApply(object("b", 1)),
            InitApply(object("d", 1)),
            InitDone,
            Apply(object("a", 2)),
            Apply(object("c", 1)),
            Delete(object("b", 1)),
            Init,
            InitApply(object("a", 2)),
            InitApply(object("c", 1)),
            InitDone,
        ]
    }

    /// "type name" of every event queued, in delivery order (each ACKed as taken).
    pub(crate) fn drain(outbox: &Outbox) -> Vec<String> {
        outbox.set_connected(true);
        let mut out = Vec::new();
        while let Some(ev) = outbox.take_next(Instant::now()) {
            outbox.ack(&ev.ack());
            let obj: SpokeObject = ev.data_as().expect("an object");
            out.push(format!("{} {}", ev.event_type.name(), obj.name_str()));
        }
        out
    }
}
