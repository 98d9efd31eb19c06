//! The hub watches the pull-model controllers share, and the one way they run a
//! `kube::runtime::Controller`.
//!
//! Owns one watch and one reflector store per watched kind ([`SharedWatch`]) for all pull
//! controllers together, so the principal keeps one pull-model cache of every Application,
//! ManifestWork and ManagedCluster however many controllers read them. Every controller
//! [`subscribe`](SharedWatch::subscribe)s before the watch starts and receives every event
//! (applies, deletes, relists) after the store has taken it; kube's own shared stores
//! (`store_shared`) do not hand on deletions, which drift repair and finalization need. A failing
//! watch is logged here, once per kind. [`run_controller`] is the shape every pull controller runs
//! in: concurrency, debounce, error policy and graceful shutdown on the `CancellationToken`.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_kube::CancellationToken;
use futures::channel::mpsc;
use futures::{FutureExt, Stream, StreamExt, TryFuture};
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Resource;
use serde::de::DeserializeOwned;

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
        }
    }

    /// The store every subscriber reads.
    pub fn store(&self) -> Store<K> {
        self.writer.as_reader()
    }

    /// The store, and every event of the watch from its start, each after the store applied it.
    pub fn subscribe(&mut self) -> Subscription<K> {
        let (tx, events) = mpsc::unbounded();
        self.subscribers.push(tx);
        Subscription {
            store: self.store(),
            events,
        }
    }

    /// Follows the watch until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let name = self.name;
        let subscribers = self.subscribers;
        let events = reflector::reflector(self.writer, watcher::watcher(self.api, self.config))
            .default_backoff()
            .for_each(|event| {
                match event {
                    Ok(event) => {
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
    /// The watch's events.
    pub events: mpsc::UnboundedReceiver<Event<K>>,
}

/// The objects a watch applied or deleted (relists included), as a controller's own trigger.
pub fn touched<K>(
    events: impl Stream<Item = Event<K>> + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Send + 'static,
{
    events.flat_map(|event| {
        futures::stream::iter(match event {
            Event::Apply(o) | Event::InitApply(o) | Event::Delete(o) => Some(Ok(o)),
            Event::Init | Event::InitDone => None,
        })
    })
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

/// Runs `controller` until `shutdown`: at most `concurrency` reconciliations at once, triggers
/// for one object within `debounce` of each other coalesced, reconciler errors handled by
/// `error_policy` (which logs and requeues), watch errors logged as `name`'s.
pub async fn run_controller<K, Ctx, F>(
    name: &'static str,
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
    let store = controller.store();
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
    // kube's graceful shutdown waits for the store to fill, which never happens once the watch
    // is cut; before the first list nothing is in flight, so stop at once. Otherwise in-flight
    // reconciliations get a grace period.
    let deadline = async {
        shutdown.cancelled().await;
        if store.wait_until_ready().now_or_never().is_some() {
            tokio::time::sleep(SHUTDOWN_GRACE).await;
            tracing::warn!(
                "{name} controller did not stop within {SHUTDOWN_GRACE:?}; abandoning it"
            );
        }
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
