//! The propagation controller: every valid pull-model Application on the hub has its
//! ManifestWork in the target cluster's namespace, with the current payload.
//!
//! Owns creating and updating ManifestWorks (server-side apply, field manager
//! [`PROPAGATION_MANAGER`]), clearing the hub Application's `.operation` once it has run on the
//! spoke (as upstream clears it, but only when [`super::operation`] says it ran, so it is neither
//! lost while the cluster is offline nor withdrawn while running, and for an Application in an
//! ApplicationSet's progressive sync only when delivering and clearing it fit that rollout),
//! likewise its refresh request once the spoke's Argo CD has consumed it ([`super::refresh`]), and
//! the `PullModelSpecError` condition that tells the user why nothing was propagated (label
//! without cluster annotation, unknown ManagedCluster, cluster without namespace). Deleting
//! ManifestWorks is [`cleanup`](super::cleanup)'s.
//!
//! Triggers: Application changes; ManifestWork changes or deletions (drift is repaired);
//! ManagedCluster and Namespace changes (an Application waiting for its cluster proceeds as soon
//! as it appears); ApplicationSet changes, for its Applications that request an operation (the
//! rollout moved on). Reconciling an Application whose ManifestWork is already current makes no API
//! call (but one read of the work before clearing a consumed refresh), so the status controller's
//! writes to the Application cost nothing here.

use argocd_agent_kube::CancellationToken;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, PartialObjectMeta};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::ResourceExt;

use super::application::{
    conditions, hosting_appset, managed_cluster_resource, pull_intent, set_condition, Application,
    ApplicationSet, PullIntent, CLUSTER_ANNOTATION, SPEC_ERROR_CONDITION,
};
use super::manifestwork::{
    build_manifest_work, hub_application_of, work_is_current, BuildError, ManifestWork,
};
use super::operation::{
    baseline_for, carried, clear_awaits_rollout, delivery_hold, operation_ran, requested,
    rollout_of, Hold, OPERATION_BASELINE_ANNOTATION,
};
use super::refresh::{self, REQUEST_ANNOTATIONS};
use super::watches::{controller_config, run_controller, touched, Subscription};
use super::{PullModelError, PullModelOptions, PROPAGATION_MANAGER};

/// Coalesces a burst of triggers for one Application.
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

fn app_key(app: &Application) -> String {
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

struct Context {
    client: kube::Client,
    opts: PullModelOptions,
    cluster_resource: ApiResource,
    works: Store<ManifestWork>,
    clusters: Store<DynamicObject>,
    appsets: Store<ApplicationSet>,
}

impl Context {
    /// The ApplicationSet that generated `app`, if it is in the store.
    fn appset_of(&self, app: &Application) -> Option<Arc<ApplicationSet>> {
        let key = hosting_appset(&app.metadata)?;
        self.appsets
            .get(&ObjectRef::new(&key.name).within(&key.namespace))
    }

    async fn set_spec_error(
        &self,
        app: &Application,
        message: Option<String>,
    ) -> Result<bool, PropagationError> {
        let apps: Api<Application> =
            Api::namespaced(self.client.clone(), &app.namespace().unwrap_or_default());
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

    /// Merge-patches the hub Application with `patch`, which removes a request the spoke has
    /// acted on and carries the `resourceVersion` read: returns the Application as written, or
    /// `None` if it changed since it was read or is gone (a newer version triggers another
    /// reconciliation, which decides again).
    async fn clear(
        &self,
        app: &Application,
        patch: serde_json::Value,
        what: &'static str,
    ) -> Result<Option<Application>, PropagationError> {
        let apps: Api<Application> =
            Api::namespaced(self.client.clone(), &app.namespace().unwrap_or_default());
        let params = PatchParams {
            field_manager: Some(PROPAGATION_MANAGER.to_string()),
            ..Default::default()
        };
        match apps
            .patch(&app.name_any(), &params, &Patch::Merge(&patch))
            .await
        {
            Ok(written) => {
                tracing::info!(app = %app_key(app), "{what} delivered to the spoke; cleared on the hub");
                Ok(Some(written))
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.is_not_found() => Ok(None),
            Err(source) => Err(PropagationError::Kube {
                action: "clearing a delivered request",
                app: app_key(app),
                source,
            }),
        }
    }

    /// Removes the hub Application's `.operation` (see [`Context::clear`]).
    async fn clear_operation(&self, app: &Application) -> Result<(), PropagationError> {
        let rv = &app.metadata.resource_version;
        let patch = serde_json::json!({"metadata": {"resourceVersion": rv}, "operation": null});
        self.clear(app, patch, "operation").await.map(drop)
    }

    /// Clears the hub Application's refresh request once the spoke has consumed it
    /// ([`refresh::delivered`] on the `cached` work, then on the work read again from the API
    /// server). Returns the Application to go on with (as written when cleared) and the work, or
    /// `None` when the Application changed meanwhile.
    async fn settle_refresh(
        &self,
        app: Arc<Application>,
        cached: Option<Arc<ManifestWork>>,
        cluster: &str,
        work_name: &str,
    ) -> Result<Option<(Arc<Application>, Option<Arc<ManifestWork>>)>, PropagationError> {
        if !refresh::delivered(&app, cached.as_deref()) {
            return Ok(Some((app, cached)));
        }
        let works: Api<ManifestWork> = Api::namespaced(self.client.clone(), cluster);
        let work = works
            .get_opt(work_name)
            .await
            .map_err(|source| PropagationError::Kube {
                action: "reading the ManifestWork",
                app: app_key(&app),
                source,
            })?
            .map(Arc::new);
        if !refresh::delivered(&app, work.as_deref()) {
            return Ok(Some((app, work)));
        }
        Ok(self
            .clear_refresh(&app)
            .await?
            .map(|cleared| (Arc::new(cleared), work)))
    }

    /// Removes the hub Application's refresh request annotations (see [`Context::clear`]).
    async fn clear_refresh(
        &self,
        app: &Application,
    ) -> Result<Option<Application>, PropagationError> {
        let gone: serde_json::Map<_, _> = REQUEST_ANNOTATIONS
            .iter()
            .map(|k| (k.to_string(), serde_json::Value::Null))
            .collect();
        let rv = &app.metadata.resource_version;
        let patch = serde_json::json!({"metadata": {"resourceVersion": rv, "annotations": gone}});
        self.clear(app, patch, "refresh request").await
    }
}

async fn reconcile(app: Arc<Application>, ctx: Arc<Context>) -> Result<Action, PropagationError> {
    if !ctx.opts.handles(&app.namespace().unwrap_or_default()) {
        // Another pull model's (another principal's Argo CD namespace).
        return Ok(Action::await_change());
    }
    let has_spec_error = conditions(&app)
        .iter()
        .any(|c| c.type_.as_deref() == Some(SPEC_ERROR_CONDITION));
    let target = match pull_intent(&app.metadata) {
        PullIntent::NotPulled => {
            // The label may just have been removed: a spec error no longer applies.
            if has_spec_error {
                ctx.set_spec_error(&app, None).await?;
            }
            return Ok(Action::await_change());
        }
        PullIntent::Invalid(reason) => {
            if ctx.set_spec_error(&app, Some(reason.to_string())).await? {
                tracing::warn!(app = %app_key(&app), %reason, "pull-model Application rejected");
            }
            return Ok(Action::await_change());
        }
        PullIntent::Pulled(target) => target,
    };
    if app.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if ctx
        .clusters
        .get(&ObjectRef::new_with(
            &target.cluster,
            ctx.cluster_resource.clone(),
        ))
        .is_none()
    {
        if ctx
            .set_spec_error(&app, Some(unknown_cluster_message(&target.cluster)))
            .await?
        {
            tracing::warn!(app = %app_key(&app), cluster = %target.cluster, "pull-model Application names an unknown ManagedCluster");
        }
        return Ok(Action::await_change());
    }
    let work_name = build_manifest_work(&app, &target, ctx.opts.feedback)?.name_any();
    let existing = ctx
        .works
        .get(&ObjectRef::new(&work_name).within(&target.cluster));
    let Some((app, existing)) = ctx
        .settle_refresh(app, existing, &target.cluster, &work_name)
        .await?
    else {
        return Ok(Action::await_change());
    };
    let rollout = rollout_of(&app, ctx.appset_of(&app).as_deref());
    if operation_ran(&app, existing.as_deref()) {
        let mark = rollout.as_ref().and_then(|r| r.pending());
        if existing
            .as_deref()
            .is_some_and(|w| clear_awaits_rollout(w, mark))
        {
            // The ApplicationSet's next change (the Pending mark gone) brings it back here.
            tracing::debug!(app = %app_key(&app), "operation ran on the spoke; cleared once its ApplicationSet has taken the run");
            return Ok(Action::await_change());
        }
        // The next reconciliation (this patch's watch event) builds the payload without it.
        ctx.clear_operation(&app).await?;
        return Ok(Action::await_change());
    }
    let hold = delivery_hold(
        &app,
        existing.as_deref(),
        rollout.as_ref(),
        chrono::Utc::now(),
    );
    let mut sent = app.clone();
    if let Some(hold) = &hold {
        // The work keeps what it carried; the rest of the Application goes out as usual.
        tracing::debug!(app = %app_key(&app), ?hold, "operation requested by an ApplicationSet rollout held back");
        Arc::make_mut(&mut sent).operation = existing.as_deref().and_then(carried).cloned();
    }
    if let Some(request) = refresh::requested(&app) {
        let token = refresh::token_for(&app, &request, existing.as_deref());
        refresh::stamp(&mut Arc::make_mut(&mut sent).metadata, token);
    }
    let mut work = build_manifest_work(&sent, &target, ctx.opts.feedback)?;
    if let Some(operation) = requested(&sent) {
        work.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                OPERATION_BASELINE_ANNOTATION.to_owned(),
                baseline_for(operation, existing.as_deref()),
            );
    }
    if !existing.is_some_and(|w| work_is_current(&w, &work)) {
        let works: Api<ManifestWork> = Api::namespaced(ctx.client.clone(), &target.cluster);
        let params = PatchParams::apply(PROPAGATION_MANAGER).force();
        match works.patch(&work_name, &params, &Patch::Apply(&work)).await {
            Ok(_) => {
                tracing::info!(app = %app_key(&app), work = %format!("{}/{work_name}", target.cluster), "ManifestWork applied")
            }
            Err(e) if is_missing_namespace(&e) => {
                ctx.set_spec_error(&app, Some(missing_namespace_message(&target.cluster)))
                    .await?;
                return Ok(Action::await_change());
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
        ctx.set_spec_error(&app, None).await?;
    }
    Ok(match hold {
        Some(Hold::For(delay)) => Action::requeue(delay),
        // The feedback, the hub Application or the ApplicationSet changes first.
        Some(Hold::Revision | Hold::Waiting) | None => Action::await_change(),
    })
}

fn error_policy(_app: Arc<Application>, error: &PropagationError, ctx: Arc<Context>) -> Action {
    match error {
        // Rebuilding will not help until the Application changes.
        PropagationError::Build(_) => {
            tracing::error!(%error, "cannot wrap Application");
            Action::await_change()
        }
        PropagationError::Kube { .. } => {
            tracing::warn!(%error, "propagation failed; retrying");
            Action::requeue(ctx.opts.retry_after)
        }
    }
}

/// Applications (in `apps`) whose pull target is `cluster`.
fn apps_targeting(apps: &Store<Application>, cluster: &str) -> Vec<ObjectRef<Application>> {
    apps.state()
        .iter()
        .filter(|a| {
            pull_intent(&a.metadata)
                .target()
                .is_some_and(|t| t.cluster == cluster)
        })
        .map(|a| ObjectRef::from_obj(a.as_ref()))
        .collect()
}

/// Applications (in `apps`) generated by `appset` that request an operation.
fn rollout_requests(
    apps: &Store<Application>,
    appset: &ApplicationSet,
) -> Vec<ObjectRef<Application>> {
    let key = (appset.namespace(), appset.name_any());
    apps.state()
        .iter()
        .filter(|a| requested(a).is_some())
        .filter(|a| hosting_appset(&a.metadata).is_some_and(|k| (Some(k.namespace), k.name) == key))
        .map(|a| ObjectRef::from_obj(a.as_ref()))
        .collect()
}

/// Runs the propagation controller until `shutdown`.
pub async fn run(
    client: kube::Client,
    opts: PullModelOptions,
    apps: Subscription<Application>,
    works: Subscription<ManifestWork>,
    clusters: Subscription<DynamicObject>,
    appsets: Subscription<ApplicationSet>,
    shutdown: CancellationToken,
) -> Result<(), PullModelError> {
    let cluster_resource = managed_cluster_resource();
    // Only a namespace that appeared or changed can unblock an Application.
    let namespaces = watcher::watcher(
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .filter_map(|event| {
        std::future::ready(match event {
            Ok(Event::Apply(ns)) => Some(Ok(ns)),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "propagation: Namespace watch failed; retrying");
                None
            }
        })
    });
    let targeting = {
        let apps = apps.store.clone();
        move |cluster: String| apps_targeting(&apps, &cluster)
    };
    let targeting_too = targeting.clone();
    let requesting = {
        let apps = apps.store.clone();
        move |appset: ApplicationSet| rollout_requests(&apps, &appset)
    };
    // A changed or deleted work is re-checked against its Application (drift repair).
    let work_app = |w: ManifestWork| {
        hub_application_of(&w).map(|(ns, name)| ObjectRef::new(&name).within(&ns))
    };
    // Nothing is decided before every cache is filled (an unlisted cluster is not unknown).
    let reads = [
        apps.ready.clone(),
        works.ready.clone(),
        clusters.ready.clone(),
        appsets.ready.clone(),
    ];
    let controller = Controller::for_stream(touched(apps.events), apps.store)
        .watches_stream(touched(works.events), work_app)
        .watches_stream_with(
            touched(clusters.events),
            move |c| targeting(c.name_any()),
            cluster_resource.clone(),
        )
        .watches_stream(namespaces, move |ns| targeting_too(ns.name_any()))
        .watches_stream(touched(appsets.events), requesting);
    let config = controller_config(opts.concurrency.max(1), DEBOUNCE);
    let ctx = Arc::new(Context {
        client,
        opts,
        cluster_resource,
        works: works.store,
        clusters: clusters.store,
        appsets: appsets.store,
    });
    run_controller(
        "propagation",
        reads,
        controller,
        config,
        reconcile,
        error_policy,
        ctx,
        shutdown,
    )
    .await;
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
