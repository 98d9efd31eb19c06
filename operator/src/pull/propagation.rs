//! The propagation controller: every valid pull-model Application on the hub has its
//! ManifestWork in the target cluster's namespace, with the current payload.
//!
//! Owns creating and updating ManifestWorks (server-side apply, field manager
//! [`PROPAGATION_MANAGER`]) and the `PullModelSpecError` condition
//! that tells the user why nothing was propagated (label without cluster annotation, unknown
//! ManagedCluster, cluster without namespace). Deleting ManifestWorks is [`cleanup`](super::cleanup)'s.
//!
//! Triggers: Application changes; ManifestWork changes or deletions (drift is repaired);
//! ManagedCluster and Namespace changes (an Application waiting for its cluster proceeds as soon
//! as it appears). Reconciling an Application whose ManifestWork is already current makes no API
//! call, so the status controller's writes to the Application cost nothing here.

use argocd_agent_kube::CancellationToken;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::ResourceExt;

use super::application::{
    application_resource, conditions, managed_cluster_resource, pull_intent, set_condition,
    PullIntent, CLUSTER_ANNOTATION, PULL_LABEL, SPEC_ERROR_CONDITION,
};
use super::manifestwork::{
    build_manifest_work, hub_application_of, work_is_current, BuildError, ManifestWork,
};
use super::queue::DirtyQueue;
use super::{PullModelError, PullModelOptions, PROPAGATION_MANAGER};

/// Coalesces a burst of events for one Application.
const DEBOUNCE: std::time::Duration = std::time::Duration::from_millis(10);

/// Errors of one reconciliation (retried after [`PullModelOptions::retry_after`]).
#[derive(Debug, thiserror::Error)]
pub enum PropagationError {
    /// An API call failed.
    #[error("{action} for Application {app}: {source}")]
    Kube {
        /// What was being done.
        action: &'static str,
        /// `namespace/name` of the Application.
        app: String,
        /// The API error.
        source: kube::Error,
    },
    /// The Application cannot be wrapped.
    #[error(transparent)]
    Build(#[from] BuildError),
}

/// An Application by namespace and name.
type AppKey = (String, String);

fn app_key(app: &DynamicObject) -> String {
    format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any())
}

/// Why the ManagedCluster cannot receive work, as the condition message.
fn unknown_cluster_message(cluster: &str) -> String {
    format!("ManagedCluster {cluster:?} (annotation {CLUSTER_ANNOTATION}) does not exist on the hub; nothing is propagated")
}

fn missing_namespace_message(cluster: &str) -> String {
    format!("ManagedCluster {cluster:?} has no namespace {cluster:?} on the hub to hold its ManifestWorks; nothing is propagated")
}

/// A 404 from applying into a namespace that does not exist (as opposed to a missing CRD).
fn is_missing_namespace(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(s) if s.is_not_found() => {
            s.details.as_ref().is_some_and(|d| d.kind == "namespaces")
                || s.message.starts_with("namespaces ")
        }
        _ => false,
    }
}

struct Propagation {
    client: kube::Client,
    app_resource: ApiResource,
    cluster_resource: ApiResource,
    apps: Store<DynamicObject>,
    works: Store<ManifestWork>,
    clusters: Store<DynamicObject>,
}

impl Propagation {
    async fn set_spec_error(
        &self,
        app: &DynamicObject,
        message: Option<String>,
    ) -> Result<bool, PropagationError> {
        let apps: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &app.namespace().unwrap_or_default(),
            &self.app_resource,
        );
        set_condition(
            &apps,
            app,
            SPEC_ERROR_CONDITION,
            message.as_deref(),
            PROPAGATION_MANAGER,
        )
        .await
        .map_err(|source| PropagationError::Kube {
            action: "updating conditions",
            app: app_key(app),
            source,
        })
    }

    async fn reconcile(&self, (namespace, name): &AppKey) -> Result<(), PropagationError> {
        let Some(app) = self
            .apps
            .get(&ObjectRef::new_with(name, self.app_resource.clone()).within(namespace))
        else {
            return Ok(()); // deleted: cleanup's business
        };
        let has_spec_error = conditions(&app)
            .iter()
            .any(|c| c["type"] == SPEC_ERROR_CONDITION);
        let target = match pull_intent(&app.metadata) {
            PullIntent::NotPulled => {
                // The label may just have been removed: a spec error no longer applies.
                if has_spec_error {
                    self.set_spec_error(&app, None).await?;
                }
                return Ok(());
            }
            PullIntent::Invalid(reason) => {
                if self.set_spec_error(&app, Some(reason.to_string())).await? {
                    tracing::warn!(app = %app_key(&app), %reason, "pull-model Application rejected");
                }
                return Ok(());
            }
            PullIntent::Pulled(target) => target,
        };
        if app.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        if self
            .clusters
            .get(&ObjectRef::new_with(
                &target.cluster,
                self.cluster_resource.clone(),
            ))
            .is_none()
        {
            if self
                .set_spec_error(&app, Some(unknown_cluster_message(&target.cluster)))
                .await?
            {
                tracing::warn!(app = %app_key(&app), cluster = %target.cluster, "pull-model Application names an unknown ManagedCluster");
            }
            return Ok(());
        }
        let work = build_manifest_work(&app, &target)?;
        let work_name = work.name_any();
        let existing = self
            .works
            .get(&ObjectRef::new(&work_name).within(&target.cluster));
        if !existing.is_some_and(|w| work_is_current(&w, &work)) {
            let works: Api<ManifestWork> = Api::namespaced(self.client.clone(), &target.cluster);
            let params = PatchParams::apply(PROPAGATION_MANAGER).force();
            match works.patch(&work_name, &params, &Patch::Apply(&work)).await {
                Ok(_) => {
                    tracing::info!(app = %app_key(&app), work = %format!("{}/{work_name}", target.cluster), "ManifestWork applied")
                }
                Err(e) if is_missing_namespace(&e) => {
                    self.set_spec_error(&app, Some(missing_namespace_message(&target.cluster)))
                        .await?;
                    return Ok(());
                }
                Err(source) => {
                    return Err(PropagationError::Kube {
                        action: "applying the ManifestWork",
                        app: app_key(&app),
                        source,
                    })
                }
            }
        }
        if has_spec_error {
            self.set_spec_error(&app, None).await?;
        }
        Ok(())
    }

    /// Applications whose pull target is `cluster`.
    fn apps_targeting(&self, cluster: &str) -> Vec<AppKey> {
        self.apps
            .state()
            .iter()
            .filter(|a| {
                pull_intent(&a.metadata)
                    .target()
                    .is_some_and(|t| t.cluster == cluster)
            })
            .map(|a| (a.namespace().unwrap_or_default(), a.name_any()))
            .collect()
    }
}

/// Runs the propagation controller until `shutdown`.
pub async fn run(
    client: kube::Client,
    opts: PullModelOptions,
    shutdown: CancellationToken,
) -> Result<(), PullModelError> {
    let app_resource = application_resource();
    let cluster_resource = managed_cluster_resource();
    let dynamic = |ar: &ApiResource| {
        let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
        let reader = writer.as_reader();
        let events = reflector::reflector(
            writer,
            watcher::watcher(
                Api::<DynamicObject>::all_with(client.clone(), ar),
                watcher::Config::default(),
            ),
        )
        .default_backoff()
        .boxed();
        (reader, events)
    };
    let (apps, mut app_events) = dynamic(&app_resource);
    let (clusters, mut cluster_events) = dynamic(&cluster_resource);
    let work_writer = reflector::store::Writer::<ManifestWork>::default();
    let works = work_writer.as_reader();
    let mut work_events = reflector::reflector(
        work_writer,
        watcher::watcher(
            Api::<ManifestWork>::all(client.clone()),
            watcher::Config::default().labels(&format!("{PULL_LABEL}=true")),
        ),
    )
    .default_backoff()
    .boxed();
    let mut namespace_events = watcher::watcher(
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .boxed();

    let controller = Propagation {
        client,
        app_resource,
        cluster_resource,
        apps,
        works,
        clusters,
    };
    let mut queue = DirtyQueue::<AppKey>::default();
    let mut ready = [false; 3];
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            event = app_events.next() => match event {
                Some(Ok(Event::Apply(a) | Event::InitApply(a))) => {
                    queue.mark((a.namespace().unwrap_or_default(), a.name_any()), DEBOUNCE);
                }
                Some(Ok(Event::InitDone)) => ready[0] = true,
                Some(Ok(Event::Init | Event::Delete(_))) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "propagation: Application watch failed; retrying"),
                None => break,
            },
            event = work_events.next() => match event {
                // A changed or deleted work is re-checked against its Application (drift repair).
                Some(Ok(Event::Apply(w) | Event::InitApply(w) | Event::Delete(w))) => {
                    if let Some(key) = hub_application_of(&w) {
                        queue.mark(key, DEBOUNCE);
                    }
                }
                Some(Ok(Event::InitDone)) => ready[1] = true,
                Some(Ok(Event::Init)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "propagation: ManifestWork watch failed; retrying"),
                None => break,
            },
            event = cluster_events.next() => match event {
                Some(Ok(Event::Apply(c) | Event::InitApply(c) | Event::Delete(c))) => {
                    for key in controller.apps_targeting(&c.name_any()) {
                        queue.mark(key, DEBOUNCE);
                    }
                }
                Some(Ok(Event::InitDone)) => ready[2] = true,
                Some(Ok(Event::Init)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "propagation: ManagedCluster watch failed; retrying"),
                None => break,
            },
            event = namespace_events.next() => match event {
                Some(Ok(Event::Apply(ns))) => {
                    for key in controller.apps_targeting(&ns.name_any()) {
                        queue.mark(key, DEBOUNCE);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "propagation: Namespace watch failed; retrying"),
                None => break,
            },
            _ = queue.wait_due(), if ready.iter().all(|r| *r) => {
                let due = queue.take_due(std::time::Instant::now());
                let failed: Vec<AppKey> = futures::stream::iter(due)
                    .map(|key| {
                        let controller = &controller;
                        async move {
                            match controller.reconcile(&key).await {
                                Ok(()) => None,
                                // Rebuilding will not help until the Application changes.
                                Err(e @ PropagationError::Build(_)) => {
                                    tracing::error!(error = %e, "cannot wrap Application");
                                    None
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "propagation failed; retrying");
                                    Some(key)
                                }
                            }
                        }
                    })
                    .buffer_unordered(usize::from(opts.concurrency.max(1)))
                    .filter_map(|k| async move { k })
                    .collect()
                    .await;
                for key in failed {
                    queue.mark(key, opts.retry_after);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    #[test]
    fn only_a_missing_namespace_404_counts_as_missing_namespace() {
        let ns = Status::failure("namespaces \"cluster9\" not found", "NotFound").with_code(404);
        assert!(is_missing_namespace(&kube::Error::Api(ns.boxed())));
        let crd = Status::failure(
            "the server could not find the requested resource",
            "NotFound",
        )
        .with_code(404);
        assert!(!is_missing_namespace(&kube::Error::Api(crd.boxed())));
    }

    #[test]
    fn condition_messages_name_the_cluster_and_say_nothing_happened() {
        let m = unknown_cluster_message("cluster9");
        assert!(
            m.contains("\"cluster9\"") && m.contains("nothing is propagated"),
            "{m}"
        );
        let m = missing_namespace_message("cluster9");
        assert!(
            m.contains("namespace \"cluster9\"") && m.contains("nothing is propagated"),
            "{m}"
        );
    }
}
