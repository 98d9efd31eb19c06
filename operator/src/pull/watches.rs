//! The hub watches the pull-model controllers share, and the one way they run a
//! `kube::runtime::Controller`.
//!
//! Owns one watch and one reflector store per watched kind ([`SharedWatch`]) for all pull
//! controllers together, so the principal keeps one pull-model cache of every Application,
//! ManifestWork and ManagedCluster however many controllers read them; where the process already
//! runs an informer of every object of a kind (the principal's hub Applications), the controllers
//! subscribe to it instead ([`Subscription::of_informer`]) and no second watch or store exists. Every controller
//! [`subscribe`](SharedWatch::subscribe)s before the watch starts and receives every event
//! (applies, deletes, relists) after the store has taken it; kube's own shared stores
//! (`store_shared`) do not hand on deletions, which drift repair and finalization need. A failing
//! watch is logged here, once per kind. Objects are kept without `managedFields`, as in
//! `argocd_agent_kube::informer`. [`run_controller`] is the shape every pull controller runs
//! in: concurrency, debounce, error policy and graceful shutdown on the `CancellationToken`.
//!
//! Readiness: a controller starts only once every store it reads is filled ([`Ready`], set by the
//! watch at its first complete list), so no reconciliation waits for a cache. kube's
//! `Store::wait_until_ready` is not used: with more than one task waiting on a store it wakes
//! only the last one polled (its readiness is a oneshot receiver holding a single waker), and a
//! reconciliation left waiting there never ran again.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_kube::fanout::EventFanout;
use argocd_agent_kube::informer::Watched;
use argocd_agent_kube::CancellationToken;
use futures::channel::mpsc;
use futures::{Stream, StreamExt, TryFuture};
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

/// How long in-flight reconciliations may take after shutdown was requested.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// One watch of a kind feeding one store and every subscribed controller.
pub struct SharedWatch<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    name: &'static str,
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    subscribers: Vec<mpsc::UnboundedSender<Event<K>>>,
    filled: watch::Sender<bool>,
}

impl<K> SharedWatch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    /// A watch of the objects `api` and `config` select, named `name` in logs.
    pub fn new(
        name: &'static str,
        api: Api<K>,
        config: watcher::Config,
        dyntype: K::DynamicType,
    ) -> Self {
        SharedWatch {
            name,
            api,
            config,
            writer: reflector::store::Writer::new(dyntype),
            subscribers: Vec::new(),
            filled: watch::Sender::new(false),
        }
    }

    /// The store every subscriber reads.
    pub fn store(&self) -> Store<K> {
        self.writer.as_reader()
    }

    /// Whether the store is filled, for a reader that needs no events.
    pub fn ready(&self) -> Ready {
        Ready(self.filled.subscribe())
    }

    /// The store, and every event of the watch from its start, each after the store applied it.
    pub fn subscribe(&mut self) -> Subscription<K> {
        let (tx, events) = mpsc::unbounded();
        self.subscribers.push(tx);
        Subscription {
            store: self.store(),
            ready: Ready(self.filled.subscribe()),
            events,
        }
    }

    /// Follows the watch until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let name = self.name;
        let subscribers = self.subscribers;
        let filled = self.filled;
        // As the informers do: nothing reads managedFields, often an object's largest part.
        let objects =
            watcher::watcher(self.api, self.config).modify(|o| o.meta_mut().managed_fields = None);
        let events = reflector::reflector(self.writer, objects)
            .default_backoff()
            .for_each(|event| {
                match event {
                    Ok(event) => {
                        if matches!(event, Event::InitDone) {
                            // The reflector has swapped the listed objects into the store.
                            filled.send_if_modified(|f| !std::mem::replace(f, true));
                        }
                        for s in &subscribers {
                            // A controller that stopped no longer needs events.
                            let _ = s.unbounded_send(event.clone());
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "pull model: {name} watch failed; retrying")
                    }
                }
                std::future::ready(())
            });
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = events => {}
        }
    }
}

/// What a controller gets from a [`SharedWatch`].
pub struct Subscription<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    /// The shared store of the kind.
    pub store: Store<K>,
    /// Completes once the store holds a complete list.
    pub ready: Ready,
    /// The watch's events.
    pub events: mpsc::UnboundedReceiver<Event<K>>,
}

impl<K> Subscription<K>
where
    K: Watched,
{
    /// A subscription to an informer the process already runs, through its `fanout`: its store
    /// and its changes, with no watch of its own.
    pub fn of_informer(fanout: &EventFanout<K>) -> Self {
        Subscription {
            store: fanout.reader().store(),
            ready: Ready(fanout.reader().listed_signal()),
            events: fanout.subscribe(),
        }
    }
}

/// Whether a [`SharedWatch`]'s store is filled: set at the watch's first complete list, and
/// awaited by any number of tasks.
#[derive(Clone, Debug)]
pub struct Ready(watch::Receiver<bool>);

impl Ready {
    /// Completes when the store is filled: true, or false if the watch stopped before that.
    pub async fn filled(mut self) -> bool {
        self.0.wait_for(|filled| *filled).await.is_ok()
    }
}

/// The objects a watch applied or deleted, as a controller's own trigger. The objects of a
/// (re)list are handed on at its end, when the store holds them: the controller looks each
/// triggered object up in the store and drops those it does not find.
pub fn touched<K>(
    events: impl Stream<Item = Event<K>> + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Send + 'static,
{
    events
        .scan(Vec::new(), |listed, event| {
            std::future::ready(Some(match event {
                Event::Apply(o) | Event::Delete(o) => vec![o],
                Event::Init => {
                    listed.clear();
                    Vec::new()
                }
                Event::InitApply(o) => {
                    listed.push(o);
                    Vec::new()
                }
                Event::InitDone => std::mem::take(listed),
            }))
        })
        .flat_map(|objects| futures::stream::iter(objects.into_iter().map(Ok)))
}

/// The objects of another kind a watch's events concern, as reconcile triggers (`reconcile_on`):
/// unlike `watches`' mappers, `concerns` sees the kind of event (a deletion, the end of a relist).
pub fn triggers<K, R, I>(
    events: impl Stream<Item = Event<K>> + Send + 'static,
    mut concerns: impl FnMut(Event<K>) -> I + Send + 'static,
) -> impl Stream<Item = R> + Send + 'static
where
    K: Send + 'static,
    I: IntoIterator<Item = R>,
    I::IntoIter: Send + 'static,
    R: Send + 'static,
{
    events.flat_map(move |event| futures::stream::iter(concerns(event)))
}

/// Runs `controller` until `shutdown`, starting once every store in `reads` is filled: at most
/// `concurrency` reconciliations at once, triggers for one object within `debounce` of each
/// other coalesced, reconciler errors handled by `error_policy` (which logs and requeues), watch
/// errors logged as `name`'s. After `shutdown`, in-flight reconciliations get a grace period.
#[allow(clippy::too_many_arguments)]
pub async fn run_controller<K, Ctx, F>(
    name: &'static str,
    reads: impl IntoIterator<Item = Ready>,
    controller: Controller<K>,
    config: ControllerConfig,
    reconcile: impl FnMut(Arc<K>, Arc<Ctx>) -> F,
    error_policy: impl Fn(Arc<K>, &F::Error, Arc<Ctx>) -> Action,
    ctx: Arc<Ctx>,
    shutdown: CancellationToken,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Unpin,
    F: TryFuture<Ok = Action> + Send + 'static,
    F::Error: std::error::Error + Send + 'static,
    Ctx: Send + Sync + 'static,
{
    let filled = futures::future::join_all(reads.into_iter().map(Ready::filled));
    tokio::select! {
        () = shutdown.cancelled() => return,
        filled = filled => if !filled.into_iter().all(|f| f) {
            return; // a watch stopped: shutting down
        },
    }
    tracing::debug!("{name} controller started: its stores are filled");
    let running = controller
        .with_config(config)
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Err(kube::runtime::controller::Error::QueueError(e)) => {
                    tracing::warn!(error = %e, "{name}: watch failed; retrying")
                }
                Err(e) => tracing::debug!(error = %e, "{name} controller event"),
                Ok(_) => {}
            }
        });
    let deadline = async {
        shutdown.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
        tracing::warn!("{name} controller did not stop within {SHUTDOWN_GRACE:?}; abandoning it");
    };
    tokio::select! {
        _ = running => {}
        _ = deadline => {}
    }
}

/// The controller configuration: `concurrency` reconciliations at once (0: unbounded), triggers
/// for one object coalesced over `debounce`.
pub fn controller_config(concurrency: u16, debounce: Duration) -> ControllerConfig {
    ControllerConfig::default()
        .concurrency(concurrency)
        .debounce(debounce)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    async fn finishes<T>(task: tokio::task::JoinHandle<T>) -> bool {
        tokio::time::timeout(Duration::from_millis(500), task)
            .await
            .is_ok()
    }

    /// Why [`Ready`] exists: kube-runtime 5's store readiness wakes only the last of several
    /// waiters. If this starts failing, kube fixed it and `Ready` could go.
    #[tokio::test]
    async fn kube_store_readiness_wakes_only_its_last_waiter() {
        let mut writer = reflector::store::Writer::<ConfigMap>::default();
        let (first, last) = (writer.as_reader(), writer.as_reader());
        let first = tokio::spawn(async move { first.wait_until_ready().await.is_ok() });
        let last = tokio::spawn(async move { last.wait_until_ready().await.is_ok() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        assert!(finishes(last).await);
        assert!(!finishes(first).await, "kube now wakes every waiter");
    }

    #[tokio::test]
    async fn ready_wakes_every_waiter_and_says_when_the_watch_stopped_first() {
        let filled = watch::Sender::new(false);
        let waiters: Vec<_> = (0..3)
            .map(|_| tokio::spawn(Ready(filled.subscribe()).filled()))
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        filled.send_replace(true);
        for waiter in waiters {
            assert!(tokio::time::timeout(Duration::from_millis(500), waiter)
                .await
                .expect("woken")
                .unwrap());
        }
        let stopped = watch::Sender::new(false);
        let waiter = Ready(stopped.subscribe());
        drop(stopped);
        assert!(!waiter.filled().await);
    }

    #[tokio::test]
    async fn listed_objects_trigger_once_the_list_is_complete() {
        let events = futures::stream::iter([
            Event::Init,
            Event::InitApply(cm("a")),
            Event::InitApply(cm("b")),
            Event::InitDone,
            Event::Apply(cm("c")),
            Event::Delete(cm("a")),
            // A relist cut short by a new one hands on only the new one's objects.
            Event::Init,
            Event::InitApply(cm("stale")),
            Event::Init,
            Event::InitApply(cm("d")),
            Event::InitDone,
        ]);
        let names: Vec<String> = touched(events)
            .map(|o| o.unwrap().metadata.name.unwrap())
            .collect()
            .await;
        assert_eq!(names, ["a", "b", "c", "a", "d"]);
    }
}
