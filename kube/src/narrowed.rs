//! A handler's view of part of a shared informer: one watch and store of a kind serve several
//! parts of a process, each narrowed to the objects it cares about.
//!
//! Owns [`Narrowed`]: a [`Handler`] wrapper that hands the inner handler only the objects a
//! predicate admits, with the transitions a server-side selected watch would have shown it — an
//! object that comes into scope (e.g. gains the selected label) is `applied` as new, one that
//! leaves it is `deleted` with its last copy in scope, one that never was in scope is never
//! seen. The store keeps every object; readers narrow their lookups with the same predicate.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::informer::{Handler, Scope, Watched};

/// `inner`, seeing only what `admits` admits (see the module docs).
pub struct Narrowed<K> {
    admits: Scope<K>,
    inner: Arc<dyn Handler<K>>,
}

impl<K: Watched> Narrowed<K> {
    /// `inner` narrowed to the objects `admits` admits.
    pub fn new(admits: Scope<K>, inner: Arc<dyn Handler<K>>) -> Arc<Self> {
        Arc::new(Narrowed { admits, inner })
    }
}

impl<K: Watched> Handler<K> for Narrowed<K> {
    fn applied(&self, old: Option<Arc<K>>, new: Arc<K>) -> BoxFuture<'_, ()> {
        let old = old.filter(|o| (self.admits)(o));
        if (self.admits)(&new) {
            self.inner.applied(old, new)
        } else if let Some(old) = old {
            self.inner.deleted(old)
        } else {
            Box::pin(async {})
        }
    }

    fn deleted(&self, last: Arc<K>) -> BoxFuture<'_, ()> {
        if (self.admits)(&last) {
            self.inner.deleted(last)
        } else {
            Box::pin(async {})
        }
    }

    fn listed(&self) -> BoxFuture<'_, ()> {
        self.inner.listed()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    #[derive(Default)]
    struct Seen(Mutex<Vec<String>>);

    impl Handler<ConfigMap> for Seen {
        fn applied(&self, old: Option<Arc<ConfigMap>>, new: Arc<ConfigMap>) -> BoxFuture<'_, ()> {
            let what = format!("applied {} (new: {})", label(&new), old.is_none());
            self.0.lock().unwrap().push(what);
            Box::pin(async {})
        }
        fn deleted(&self, last: Arc<ConfigMap>) -> BoxFuture<'_, ()> {
            self.0
                .lock()
                .unwrap()
                .push(format!("deleted {}", label(&last)));
            Box::pin(async {})
        }
        fn listed(&self) -> BoxFuture<'_, ()> {
            self.0.lock().unwrap().push("listed".into());
            Box::pin(async {})
        }
    }

    fn label(cm: &ConfigMap) -> String {
        cm.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("team"))
            .cloned()
            .unwrap_or_default()
    }

    fn cm(team: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some("x".into()),
                labels: Some([("team".to_string(), team.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn objects_entering_and_leaving_the_scope_are_seen_as_created_and_deleted() {
        let seen = Arc::new(Seen::default());
        let narrowed = Narrowed::new(Arc::new(|cm: &ConfigMap| label(cm) == "a"), seen.clone());
        narrowed.applied(None, cm("b")).await;
        narrowed.applied(Some(cm("b")), cm("a")).await;
        narrowed.applied(Some(cm("a")), cm("a")).await;
        narrowed.applied(Some(cm("a")), cm("b")).await;
        narrowed.deleted(cm("b")).await;
        narrowed.applied(None, cm("a")).await;
        narrowed.deleted(cm("a")).await;
        narrowed.listed().await;
        assert_eq!(
            *seen.0.lock().unwrap(),
            vec![
                "applied a (new: true)",
                "applied a (new: false)",
                "deleted a",
                "applied a (new: true)",
                "deleted a",
                "listed",
            ]
        );
    }
}
