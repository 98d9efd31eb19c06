//! One informer per watched kind: a `kube::runtime` watcher feeding a reflector [`Store`], with
//! add/update/delete callbacks in the shape of upstream argocd-agent's `Informer[T]`.
//!
//! Owns the watch loop every component used to write by hand: following the watch with the
//! default backoff, logging a failing watch once per distinct error (and once when it recovers),
//! keeping the latest copy of every object in a store any part of the process can read, and
//! turning the watch's events into [`Handler`] calls — `applied(old, new)` for an object that
//! appeared or changed (`old` is the copy the store held before, `None` for a new one),
//! `deleted(last)` for one that went away, including objects that vanished while the watch was
//! down (a relist does not replay their deletion), and `listed()` after every complete (re)list.
//!
//! Objects are stored and handed on without `metadata.managedFields`: nothing in the project reads
//! them, and they are often the largest part of an object (one entry per field manager, each
//! listing every field it owns), so a store of thousands of Applications holds a fraction of
//! the memory.
//!
//! The store is never stale behind the callbacks: an object is in the store (or gone from it)
//! before its callback runs, also during a relist. Handlers run one at a time, in watch order, on
//! the informer's task; a slow handler slows only its own kind. [`InformerReader::wait_listed`]
//! waits for the first complete list; from then on the store is also ready in kube's sense
//! (`Store::wait_until_ready`), so a `kube::runtime::Controller` can run off it. [`Informer::consume`] takes the events from any stream, so
//! a component's handlers can be unit-tested without an apiserver.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A kind an informer can watch: every bound the watch, the store and the handlers need, named
/// once. Every Kubernetes object type (typed, or `DynamicObject`) is one.
pub trait Watched:
    Resource<DynamicType: Eq + Hash + Clone + Send + Sync>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType: Eq + Hash + Clone + Send + Sync>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// What a component does when the objects of one kind change. Every method has a default that
/// does nothing, so a handler implements only what it needs.
pub trait Handler<K>: Send + Sync + 'static {
    /// `new` appeared (`old` = `None`) or changed from `old`. Also called for every object of
    /// a relist, with the copy the store held before.
    fn applied(&self, old: Option<Arc<K>>, new: Arc<K>) -> BoxFuture<'_, ()> {
        let _ = (old, new);
        Box::pin(async {})
    }

    /// `last` (the last copy seen) was deleted, or vanished while the watch was down.
    fn deleted(&self, last: Arc<K>) -> BoxFuture<'_, ()> {
        let _ = last;
        Box::pin(async {})
    }

    /// A complete (re)list has been applied to the store.
    fn listed(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Which objects of a kind an informer keeps, beyond what the server-side selectors narrow.
pub type Scope<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;

/// The informer of one kind: its store, its watch configuration and its handlers.
pub struct Informer<K>
where
    K: Watched,
{
    name: String,
    api: Api<K>,
    config: watcher::Config,
    scope: Option<Scope<K>>,
    dyntype: K::DynamicType,
    writer: Writer<K>,
    handlers: Vec<Arc<dyn Handler<K>>>,
    listed: watch::Sender<bool>,
}

/// A cloneable read side of an [`Informer`]: the store and the first-list signal.
pub struct InformerReader<K>
where
    K: Watched,
{
    store: Store<K>,
    dyntype: K::DynamicType,
    listed: watch::Receiver<bool>,
}

impl<K> Clone for InformerReader<K>
where
    K: Watched,
{
    fn clone(&self) -> Self {
        InformerReader {
            store: self.store.clone(),
            dyntype: self.dyntype.clone(),
            listed: self.listed.clone(),
        }
    }
}

impl<K> Informer<K>
where
    K: Watched,
    K::DynamicType: Default,
{
    /// An informer for the objects `api` and `config` select, named `name` in logs.
    pub fn new(name: impl Into<String>, api: Api<K>, config: watcher::Config) -> Self {
        Self::new_with(name, api, config, K::DynamicType::default())
    }
}

impl<K> Informer<K>
where
    K: Watched,
{
    /// An informer for a kind known at run time (e.g. `DynamicObject` with its `ApiResource`).
    pub fn new_with(
        name: impl Into<String>,
        api: Api<K>,
        config: watcher::Config,
        dyntype: K::DynamicType,
    ) -> Self {
        Informer {
            name: name.into(),
            api,
            config,
            scope: None,
            writer: Writer::new(dyntype.clone()),
            dyntype,
            handlers: Vec::new(),
            listed: watch::channel(false).0,
        }
    }

    /// Keeps only objects `scope` admits: the others are neither stored nor handed to handlers.
    pub fn scope(mut self, scope: impl Fn(&K) -> bool + Send + Sync + 'static) -> Self {
        self.scope = Some(Arc::new(scope));
        self
    }

    /// Adds a handler; handlers are called in the order they were added.
    pub fn handler(mut self, handler: Arc<dyn Handler<K>>) -> Self {
        self.handlers.push(handler);
        self
    }

    /// The read side, for whoever needs the objects of this kind.
    pub fn reader(&self) -> InformerReader<K> {
        InformerReader {
            store: self.writer.as_reader(),
            dyntype: self.dyntype.clone(),
            listed: self.listed.subscribe(),
        }
    }

    /// Follows the watch until `stop` is cancelled (or forever without one).
    pub async fn run(self, stop: Option<CancellationToken>) {
        let stop = stop.unwrap_or_default();
        tokio::select! {
            () = stop.cancelled() => {}
            () = self.follow() => {}
        }
    }

    async fn follow(self) {
        let events = watcher(self.api.clone(), self.config.clone()).default_backoff();
        self.consume(events).await
    }

    /// Applies a watch's events to the store and calls the handlers: what [`Informer::run`] does
    /// with the apiserver's watch, and the seam through which tests drive an informer (and the
    /// components it feeds) without an apiserver.
    pub async fn consume(
        mut self,
        events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    ) {
        let mut events = std::pin::pin!(events);
        let mut relisted: Option<HashSet<ObjectRef<K>>> = None;
        let mut last_error: Option<String> = None;
        while let Some(item) = events.next().await {
            let event = match item {
                Ok(event) => event,
                Err(e) => {
                    let msg = e.to_string();
                    if last_error.as_deref() != Some(msg.as_str()) {
                        tracing::warn!(informer = %self.name, error = %msg, "watch failed; retrying with backoff");
                        last_error = Some(msg);
                    } else {
                        tracing::debug!(informer = %self.name, error = %msg, "watch still failing");
                    }
                    continue;
                }
            };
            // `Init` comes before the list is attempted; only a listed object proves recovery.
            if !matches!(event, watcher::Event::Init) && last_error.take().is_some() {
                tracing::info!(informer = %self.name, "watching again");
            }
            match event {
                watcher::Event::Init => relisted = Some(HashSet::new()),
                watcher::Event::InitApply(mut obj) | watcher::Event::Apply(mut obj) => {
                    if !self.in_scope(&obj) {
                        continue;
                    }
                    obj.meta_mut().managed_fields = None;
                    let key = ObjectRef::from_obj_with(&obj, self.dyntype.clone());
                    if let Some(seen) = relisted.as_mut() {
                        seen.insert(key.clone());
                    }
                    let old = self.writer.as_reader().get(&key);
                    self.writer.apply_watcher_event(&watcher::Event::Apply(obj));
                    let Some(new) = self.writer.as_reader().get(&key) else {
                        continue;
                    };
                    for handler in &self.handlers {
                        handler.applied(old.clone(), new.clone()).await;
                    }
                }
                watcher::Event::InitDone => {
                    let seen = relisted.take().unwrap_or_default();
                    let vanished: Vec<Arc<K>> = self
                        .writer
                        .as_reader()
                        .state()
                        .into_iter()
                        .filter(|obj| {
                            !seen.contains(&ObjectRef::from_obj_with(
                                obj.as_ref(),
                                self.dyntype.clone(),
                            ))
                        })
                        .collect();
                    for last in vanished {
                        self.writer
                            .apply_watcher_event(&watcher::Event::Delete(last.as_ref().clone()));
                        for handler in &self.handlers {
                            handler.deleted(last.clone()).await;
                        }
                    }
                    if !*self.listed.borrow() {
                        self.mark_store_ready();
                    }
                    for handler in &self.handlers {
                        handler.listed().await;
                    }
                    self.listed.send_replace(true);
                }
                watcher::Event::Delete(obj) => {
                    if !self.in_scope(&obj) {
                        continue;
                    }
                    let key = ObjectRef::from_obj_with(&obj, self.dyntype.clone());
                    let last = self
                        .writer
                        .as_reader()
                        .get(&key)
                        .unwrap_or_else(|| Arc::new(obj.clone()));
                    self.writer
                        .apply_watcher_event(&watcher::Event::Delete(obj));
                    for handler in &self.handlers {
                        handler.deleted(last.clone()).await;
                    }
                }
            }
        }
    }

    /// Marks the store ready the way kube's reflector does (a `Controller` reading it waits for
    /// that): kube's writer becomes ready only at an `InitDone` of a list it buffered itself,
    /// which this informer, applying listed objects as they come, never sends. So at the first
    /// complete list the store's content is handed to the writer once more as a list.
    fn mark_store_ready(&mut self) {
        let listed = self.writer.as_reader().state();
        self.writer.apply_watcher_event(&watcher::Event::Init);
        for obj in listed {
            self.writer
                .apply_watcher_event(&watcher::Event::InitApply(obj.as_ref().clone()));
        }
        self.writer.apply_watcher_event(&watcher::Event::InitDone);
    }

    fn in_scope(&self, obj: &K) -> bool {
        self.scope.as_ref().is_none_or(|scope| scope(obj))
    }
}

impl<K> InformerReader<K>
where
    K: Watched,
{
    /// The object `name` in `namespace` (`None` for cluster-scoped kinds), if stored.
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let mut key = ObjectRef::new_with(name, self.dyntype.clone());
        if let Some(ns) = namespace {
            key = key.within(ns);
        }
        self.store.get(&key)
    }

    /// Every stored object.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    /// The store itself, for readers that take a `kube::runtime` store (e.g. a `Controller`).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Becomes true once the first complete list has been applied.
    pub fn listed_signal(&self) -> watch::Receiver<bool> {
        self.listed.clone()
    }

    /// Whether the first complete list has been applied.
    pub fn is_listed(&self) -> bool {
        *self.listed.borrow()
    }

    /// Waits for the first complete list.
    pub async fn wait_listed(&self) {
        let mut listed = self.listed.clone();
        let _ = listed.wait_for(|l| *l).await;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    /// A ConfigMap `name` in namespace `ns` holding `v: value`.
    pub(crate) fn cm(name: &str, value: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            data: Some([("v".to_string(), value.to_string())].into()),
            ..ConfigMap::default()
        }
    }

    fn value(c: &ConfigMap) -> String {
        format!(
            "{}={}",
            c.metadata.name.as_deref().unwrap(),
            c.data.as_ref().unwrap()["v"]
        )
    }

    /// Records every call, and what the store held when it was made.
    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Vec<String>>,
        reader: Mutex<Option<InformerReader<ConfigMap>>>,
    }

    impl Recorder {
        fn stored(&self, name: &str) -> String {
            let reader = self.reader.lock().unwrap();
            reader
                .as_ref()
                .unwrap()
                .get(Some("ns"), name)
                .map(|c| value(&c))
                .unwrap_or_else(|| "-".into())
        }
    }

    impl Handler<ConfigMap> for Recorder {
        fn applied(&self, old: Option<Arc<ConfigMap>>, new: Arc<ConfigMap>) -> BoxFuture<'_, ()> {
            let name = new.metadata.name.clone().unwrap();
            let call = format!(
                "applied {} -> {} (stored {})",
                old.map(|o| value(&o)).unwrap_or_else(|| "none".into()),
                value(&new),
                self.stored(&name)
            );
            self.calls.lock().unwrap().push(call);
            Box::pin(async {})
        }

        fn deleted(&self, last: Arc<ConfigMap>) -> BoxFuture<'_, ()> {
            let name = last.metadata.name.clone().unwrap();
            let call = format!("deleted {} (stored {})", value(&last), self.stored(&name));
            self.calls.lock().unwrap().push(call);
            Box::pin(async {})
        }

        fn listed(&self) -> BoxFuture<'_, ()> {
            self.calls.lock().unwrap().push("listed".into());
            Box::pin(async {})
        }
    }

    /// A client that is never used: `consume` gets the events directly.
    pub(crate) fn offline_client() -> kube::Client {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    fn informer(recorder: &Arc<Recorder>) -> Informer<ConfigMap> {
        let informer = Informer::new(
            "test",
            Api::namespaced(offline_client(), "ns"),
            watcher::Config::default(),
        )
        .scope(|c: &ConfigMap| c.metadata.name.as_deref() != Some("ignored"))
        .handler(recorder.clone());
        *recorder.reader.lock().unwrap() = Some(informer.reader());
        informer
    }

    #[tokio::test]
    async fn adds_updates_deletes_and_relist_vanishings_reach_the_handler_with_the_store_current() {
        let recorder = Arc::new(Recorder::default());
        let informer = informer(&recorder);
        let reader = informer.reader();
        use watcher::Event::*;
        let events = vec![
            Ok(Init),
            Ok(InitApply(cm("a", "1"))),
            Ok(InitApply(cm("b", "1"))),
            Ok(InitApply(cm("ignored", "1"))),
            Ok(InitDone),
            Ok(Apply(cm("a", "2"))),
            Ok(Delete(cm("b", "1"))),
            Ok(Apply(cm("c", "1"))),
            // The watch broke and relisted: c vanished meanwhile, a changed.
            Err(watcher::Error::NoResourceVersion),
            Ok(Init),
            Ok(InitApply(cm("a", "3"))),
            Ok(InitDone),
        ];
        informer.consume(futures::stream::iter(events)).await;
        let calls = recorder.calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            vec![
                "applied none -> a=1 (stored a=1)",
                "applied none -> b=1 (stored b=1)",
                "listed",
                "applied a=1 -> a=2 (stored a=2)",
                "deleted b=1 (stored -)",
                "applied none -> c=1 (stored c=1)",
                "applied a=2 -> a=3 (stored a=3)",
                "deleted c=1 (stored -)",
                "listed",
            ]
        );
        assert!(reader.is_listed());
        let mut names: Vec<String> = reader.state().iter().map(|c| value(c)).collect();
        names.sort();
        assert_eq!(names, vec!["a=3"]);
    }

    #[tokio::test]
    async fn objects_are_stored_and_handed_on_without_managed_fields() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let recorder = Arc::new(Recorder::default());
        let informer = informer(&recorder);
        let reader = informer.reader();
        let with_fields = |name: &str| {
            let mut c = cm(name, "1");
            c.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
                manager: Some("argocd-controller".into()),
                ..ManagedFieldsEntry::default()
            }]);
            c
        };
        use watcher::Event::*;
        let events = vec![
            Ok(Init),
            Ok(InitApply(with_fields("a"))),
            Ok(InitDone),
            Ok(Apply(with_fields("b"))),
        ];
        informer.consume(futures::stream::iter(events)).await;
        for name in ["a", "b"] {
            let stored = reader.get(Some("ns"), name).expect("stored");
            assert_eq!(stored.metadata.managed_fields, None, "{name}");
            assert_eq!(value(&stored), format!("{name}=1"));
        }
    }

    #[tokio::test]
    async fn the_store_is_ready_for_kube_controllers_once_listed_and_keeps_its_objects() {
        let recorder = Arc::new(Recorder::default());
        let informer = informer(&recorder);
        let store = informer.reader().store();
        use watcher::Event::*;
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let task = tokio::spawn(informer.consume(rx));
        tx.unbounded_send(Ok(Init)).unwrap();
        tx.unbounded_send(Ok(InitApply(cm("a", "1")))).unwrap();
        tx.unbounded_send(Ok(InitApply(cm("b", "1")))).unwrap();
        tx.unbounded_send(Ok(InitDone)).unwrap();
        // What `Controller` waits for before it reconciles anything.
        tokio::time::timeout(std::time::Duration::from_secs(5), store.wait_until_ready())
            .await
            .expect("ready after the first list")
            .unwrap();
        let mut names: Vec<String> = store.state().iter().map(|c| value(c)).collect();
        names.sort();
        assert_eq!(names, vec!["a=1", "b=1"]);
        drop(tx);
        task.await.unwrap();
    }

    #[tokio::test]
    async fn wait_listed_returns_only_after_the_first_complete_list() {
        let recorder = Arc::new(Recorder::default());
        let informer = informer(&recorder);
        let reader = informer.reader();
        use watcher::Event::*;
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let task = tokio::spawn(informer.consume(rx));
        tx.unbounded_send(Ok(Init)).unwrap();
        tx.unbounded_send(Ok(InitApply(cm("a", "1")))).unwrap();
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(200), reader.wait_listed()).await;
        assert!(waited.is_err(), "listed before InitDone");
        tx.unbounded_send(Ok(InitDone)).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), reader.wait_listed())
            .await
            .expect("listed after InitDone");
        drop(tx);
        task.await.unwrap();
    }
}
