//! An informer's changes handed on as `kube::runtime` watcher events, so `Controller`s elsewhere
//! in the process can run off the informer's one store instead of a watch and a store of their
//! own.
//!
//! Owns [`EventFanout`]: a [`Handler`] that forwards every change it hears (`applied` as
//! `Apply`, `deleted` as `Delete`, `listed` as `InitDone`) to any number of subscribers, and
//! starts each new subscriber with what the store holds (`Init`, one `InitApply` per object,
//! and `InitDone` once the informer has listed), so one that subscribes late (e.g. controllers
//! that start only once a replica leads) still sees every object. An object is always in the
//! store before its event is sent: subscribers may look it up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::future::BoxFuture;
use kube::runtime::watcher::Event;

use crate::informer::{Handler, InformerReader, Watched};

/// Forwards one informer's changes to subscribers (see the module docs). Add it to the informer
/// with [`crate::informer::Informer::handler`] before the informer runs.
pub struct EventFanout<K: Watched> {
    reader: InformerReader<K>,
    listed: AtomicBool,
    subscribers: Mutex<Vec<mpsc::UnboundedSender<Event<K>>>>,
}

impl<K: Watched> EventFanout<K> {
    /// A fanout of the informer `reader` reads.
    pub fn new(reader: InformerReader<K>) -> Arc<Self> {
        Arc::new(EventFanout {
            reader,
            listed: AtomicBool::new(false),
            subscribers: Mutex::new(Vec::new()),
        })
    }

    /// The informer's read side.
    pub fn reader(&self) -> &InformerReader<K> {
        &self.reader
    }

    /// Every change from now on, after what the store holds now.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<Event<K>> {
        let (tx, rx) = mpsc::unbounded();
        let mut subscribers = self.lock();
        // Under the lock, so no change is sent between the replay and the registration.
        let _ = tx.unbounded_send(Event::Init);
        for obj in self.reader.state() {
            let _ = tx.unbounded_send(Event::InitApply(obj.as_ref().clone()));
        }
        if self.listed.load(Ordering::SeqCst) {
            let _ = tx.unbounded_send(Event::InitDone);
        }
        subscribers.push(tx);
        rx
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<mpsc::UnboundedSender<Event<K>>>> {
        self.subscribers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, event: Event<K>) {
        // A subscriber that stopped no longer needs events.
        self.lock()
            .retain(|s| s.unbounded_send(event.clone()).is_ok());
    }
}

impl<K: Watched> Handler<K> for EventFanout<K> {
    fn applied(&self, _old: Option<Arc<K>>, new: Arc<K>) -> BoxFuture<'_, ()> {
        self.send(Event::Apply(new.as_ref().clone()));
        Box::pin(async {})
    }

    fn deleted(&self, last: Arc<K>) -> BoxFuture<'_, ()> {
        self.send(Event::Delete(last.as_ref().clone()));
        Box::pin(async {})
    }

    fn listed(&self) -> BoxFuture<'_, ()> {
        // Under the lock, so a concurrent subscriber's replay ends with InitDone or gets it here.
        let mut subscribers = self.lock();
        self.listed.store(true, Ordering::SeqCst);
        subscribers.retain(|s| s.unbounded_send(Event::InitDone).is_ok());
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::Api;
    use kube::runtime::watcher;

    use super::*;
    use crate::informer::tests::{cm as configmap, offline_client};
    use crate::informer::Informer;

    fn cm(name: &str) -> ConfigMap {
        configmap(name, "1")
    }

    /// `event` as "Event name".
    fn name(event: Event<ConfigMap>) -> String {
        match event {
            Event::Init => "Init".to_string(),
            Event::InitApply(o) => format!("InitApply {}", o.metadata.name.unwrap()),
            Event::InitDone => "InitDone".to_string(),
            Event::Apply(o) => format!("Apply {}", o.metadata.name.unwrap()),
            Event::Delete(o) => format!("Delete {}", o.metadata.name.unwrap()),
        }
    }

    /// What a subscriber received so far.
    fn received(rx: &mut mpsc::UnboundedReceiver<Event<ConfigMap>>) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(name)
            .collect()
    }

    #[tokio::test]
    async fn early_and_late_subscribers_see_every_object_and_every_change_after() {
        let informer = Informer::new(
            "configmaps",
            Api::<ConfigMap>::all(offline_client()),
            watcher::Config::default(),
        );
        let fanout = EventFanout::new(informer.reader());
        let mut early = fanout.subscribe();
        let informer = informer.handler(fanout.clone());
        let (tx, events) = mpsc::unbounded();
        let run = tokio::spawn(informer.consume(events));
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(cm("a")),
            watcher::Event::InitApply(cm("b")),
            watcher::Event::InitDone,
            watcher::Event::Delete(cm("a")),
        ] {
            tx.unbounded_send(Ok(event)).unwrap();
        }
        // The early subscriber's stream is the informer's progress: wait for all of it.
        let mut seen = Vec::new();
        while seen.len() < 5 {
            let event = tokio::time::timeout(std::time::Duration::from_secs(5), early.next())
                .await
                .expect("the informer handed the events on")
                .expect("the fanout is alive");
            seen.push(name(event));
        }
        assert_eq!(seen, ["Init", "Apply a", "Apply b", "InitDone", "Delete a"]);

        let mut late = fanout.subscribe();
        assert_eq!(received(&mut late), ["Init", "InitApply b", "InitDone"]);
        tx.unbounded_send(Ok(watcher::Event::Apply(cm("c"))))
            .unwrap();
        drop(tx);
        run.await.unwrap();
        assert_eq!(received(&mut late), ["Apply c"]);
        assert_eq!(received(&mut early), ["Apply c"]);
        drop(late);
        fanout.send(Event::Apply(cm("d")));
        assert_eq!(fanout.lock().len(), 1, "a stopped subscriber is dropped");
    }
}
