//! The cleanup controller: a pull-model ManifestWork exists only while its hub Application wants
//! it. Deleting the Application, removing its pull label, pointing it at another cluster or
//! re-creating it (new UID, new work name) deletes the old ManifestWork; ManifestWorks whose
//! Application vanished while nothing watched are found at start-up and after every re-list.
//!
//! Owns ManifestWork deletion and Argo CD's resources finalizer on pulled hub Applications: the
//! finalizer is removed once the Application's ManifestWorks are gone (the spoke's Argo CD does
//! the cascading delete). Never relies on ownerReferences (a ManifestWork lives in another
//! namespace than its Application, and a hub may run without a garbage collector). A deletion
//! decided from the caches is confirmed against a fresh read of the Application first.

use argocd_agent_kube::CancellationToken;
use std::sync::Arc;

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::application::{pull_intent, Application, RESOURCES_FINALIZERS};
use super::manifestwork::{hub_application_of, manifest_work_name_of, ManifestWork};
use super::watches::{controller_config, run_controller, touched, triggers, Subscription};
use super::{PullModelError, PullModelOptions, PROPAGATION_MANAGER};

/// Coalesces a burst of triggers for one ManifestWork or Application.
const DEBOUNCE: std::time::Duration = std::time::Duration::from_millis(20);

/// Why a ManifestWork must go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unwanted {
    /// The hub Application does not exist.
    AppGone,
    /// The hub Application is being deleted.
    AppDeleting,
    /// The hub Application is no longer (validly) labelled for the pull model.
    NotPulled,
    /// The hub Application now targets another cluster.
    Retargeted,
    /// The work was made for an earlier Application of the same name (another UID).
    Superseded,
}

impl std::fmt::Display for Unwanted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unwanted::AppGone => "its hub Application no longer exists",
            Unwanted::AppDeleting => "its hub Application is being deleted",
            Unwanted::NotPulled => "its hub Application is no longer labelled for the pull model",
            Unwanted::Retargeted => "its hub Application now targets another cluster",
            Unwanted::Superseded => "its hub Application was re-created",
        })
    }
}

/// Whether `app` (the work's hub Application, if it exists) still wants `work`.
pub fn work_wanted(work: &ManifestWork, app: Option<&Application>) -> Result<(), Unwanted> {
    let app = app.ok_or(Unwanted::AppGone)?;
    if app.metadata.deletion_timestamp.is_some() {
        return Err(Unwanted::AppDeleting);
    }
    let intent = pull_intent(&app.metadata);
    let target = intent.target().ok_or(Unwanted::NotPulled)?;
    if work.namespace().as_deref() != Some(target.cluster.as_str()) {
        return Err(Unwanted::Retargeted);
    }
    if manifest_work_name_of(app).as_deref() != Some(work.name_any().as_str()) {
        return Err(Unwanted::Superseded);
    }
    Ok(())
}

/// The finalizers left once Argo CD's resources finalizers are removed, or `None` if there are none.
pub fn without_resources_finalizers(finalizers: &[String]) -> Option<Vec<String>> {
    let kept: Vec<String> = finalizers
        .iter()
        .filter(|f| !RESOURCES_FINALIZERS.contains(&f.as_str()))
        .cloned()
        .collect();
    (kept.len() != finalizers.len()).then_some(kept)
}

struct Context {
    client: kube::Client,
    opts: PullModelOptions,
    apps: Store<Application>,
    works: Store<ManifestWork>,
}

impl Context {
    fn app_api(&self, namespace: &str) -> Api<Application> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn cached_app(&self, namespace: &str, name: &str) -> Option<Arc<Application>> {
        self.apps.get(&ObjectRef::new(name).within(namespace))
    }

    fn works_of(&self, namespace: &str, name: &str) -> Vec<Arc<ManifestWork>> {
        self.works.state_filter(|w| {
            hub_application_of(w).is_some_and(|(ns, n)| ns == namespace && n == name)
        })
    }
}

/// Deletes `work` if its hub Application no longer wants it.
async fn check_work(work: Arc<ManifestWork>, ctx: Arc<Context>) -> Result<Action, kube::Error> {
    let Some((app_ns, app_name)) = hub_application_of(&work) else {
        return Ok(Action::await_change()); // not made by the pull model
    };
    if !ctx.opts.handles(&app_ns) {
        // Another pull model's: its Application is not in this one's caches.
        return Ok(Action::await_change());
    }
    if work.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if work_wanted(&work, ctx.cached_app(&app_ns, &app_name).as_deref()).is_ok() {
        return Ok(Action::await_change());
    }
    // The caches may lag behind a just-created or just-relabelled Application.
    let live = ctx.app_api(&app_ns).get_opt(&app_name).await?;
    let Err(reason) = work_wanted(&work, live.as_ref()) else {
        return Ok(Action::await_change());
    };
    let (cluster, name) = (work.namespace().unwrap_or_default(), work.name_any());
    let works: Api<ManifestWork> = Api::namespaced(ctx.client.clone(), &cluster);
    match works.delete(&name, &DeleteParams::default()).await {
        Ok(_) => {
            tracing::info!(work = %format!("{cluster}/{name}"), app = %format!("{app_ns}/{app_name}"), "deleted ManifestWork: {reason}")
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(e) => return Err(e),
    }
    Ok(Action::await_change())
}

/// Deletes a deleted Application's works; once none is left, drops Argo CD's resources finalizer.
async fn finalize(app: Arc<Application>, ctx: Arc<Context>) -> Result<Action, kube::Error> {
    if app.metadata.deletion_timestamp.is_none()
        || without_resources_finalizers(app.metadata.finalizers.as_deref().unwrap_or_default())
            .is_none()
    {
        return Ok(Action::await_change());
    }
    let (namespace, name) = (app.namespace().unwrap_or_default(), app.name_any());
    if !ctx.opts.handles(&namespace) {
        return Ok(Action::await_change());
    }
    let api = ctx.app_api(&namespace);
    let Some(app) = api.get_opt(&name).await? else {
        return Ok(Action::await_change());
    };
    if app.metadata.deletion_timestamp.is_none()
        || !crate::pull::application::has_pull_label(&app.metadata)
    {
        return Ok(Action::await_change());
    }
    let Some(kept) =
        without_resources_finalizers(app.metadata.finalizers.as_deref().unwrap_or_default())
    else {
        return Ok(Action::await_change());
    };
    let remaining = ctx.works_of(&namespace, &name);
    for work in &remaining {
        if work.metadata.deletion_timestamp.is_none() {
            let works: Api<ManifestWork> =
                Api::namespaced(ctx.client.clone(), &work.namespace().unwrap_or_default());
            match works
                .delete(&work.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {
                    tracing::info!(work = %format!("{}/{}", work.namespace().unwrap_or_default(), work.name_any()), app = %format!("{namespace}/{name}"), "deleted ManifestWork: {}", Unwanted::AppDeleting)
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
    }
    // Confirm against the API: the cache may still list works that are gone.
    let mut still_there = false;
    for work in &remaining {
        let works: Api<ManifestWork> =
            Api::namespaced(ctx.client.clone(), &work.namespace().unwrap_or_default());
        still_there |= works.get_opt(&work.name_any()).await?.is_some();
    }
    if still_there {
        return Ok(Action::await_change()); // the works' Delete events bring us back
    }
    let patch =
        json!({"metadata": {"resourceVersion": app.metadata.resource_version, "finalizers": kept}});
    let params = PatchParams {
        field_manager: Some(PROPAGATION_MANAGER.to_string()),
        ..Default::default()
    };
    api.patch(&name, &params, &Patch::Merge(&patch)).await?;
    tracing::info!(app = %format!("{namespace}/{name}"), "ManifestWorks gone; removed the resources finalizer");
    Ok(Action::await_change())
}

fn retry<K: Resource>(object: Arc<K>, error: &kube::Error, ctx: Arc<Context>) -> Action {
    let key = format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    );
    tracing::warn!(%key, %error, "cleanup failed; retrying");
    Action::requeue(ctx.opts.retry_after)
}

/// Runs the cleanup controllers until `shutdown`: one checks ManifestWorks, one finishes the
/// deletion of Applications.
pub async fn run(
    client: kube::Client,
    opts: PullModelOptions,
    apps: [Subscription<Application>; 2],
    works: [Subscription<ManifestWork>; 2],
    shutdown: CancellationToken,
) -> Result<(), PullModelError> {
    let [apps, apps_too] = apps;
    let [works, works_too] = works;
    let ctx = Arc::new(Context {
        client,
        opts,
        apps: apps.store.clone(),
        works: works.store.clone(),
    });
    let config = controller_config(1, DEBOUNCE);
    let reads = [apps.ready.clone(), works.ready.clone()];

    // An Application's change concerns its works; after a relist of Applications every work is
    // checked (Applications that vanished meanwhile left no Delete event).
    let app_works = {
        let ctx = ctx.clone();
        move |event: Event<Application>| {
            match event {
                Event::Apply(app) | Event::InitApply(app) | Event::Delete(app) => {
                    ctx.works_of(&app.namespace().unwrap_or_default(), &app.name_any())
                }
                Event::InitDone => ctx.works.state(),
                Event::Init => Vec::new(),
            }
            .into_iter()
            .map(|w| ObjectRef::from_obj(w.as_ref()))
            .collect::<Vec<_>>()
        }
    };
    let works_controller = Controller::for_stream(touched(works.events), works.store)
        .reconcile_on(triggers(apps_too.events, app_works));
    // A deleted work may be the last one a deleted Application waits for.
    let deleted_work_app = move |event: Event<ManifestWork>| match event {
        Event::Delete(work) => {
            hub_application_of(&work).map(|(ns, name)| ObjectRef::new(&name).within(&ns))
        }
        _ => None,
    };
    let apps_controller = Controller::for_stream(touched(apps.events), apps.store)
        .reconcile_on(triggers(works_too.events, deleted_work_app));
    tokio::join!(
        run_controller(
            "cleanup",
            reads.clone(),
            works_controller,
            config.clone(),
            check_work,
            retry,
            ctx.clone(),
            shutdown.clone()
        ),
        run_controller(
            "cleanup finalizer",
            reads,
            apps_controller,
            config,
            finalize,
            retry,
            ctx,
            shutdown
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pull::application::{CLUSTER_ANNOTATION, PULL_LABEL};

    fn app(labels: serde_json::Value, cluster: &str, uid: &str) -> Application {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "guestbook", "namespace": "apps", "uid": uid, "labels": labels,
                         "annotations": {CLUSTER_ANNOTATION: cluster}},
            "spec": {}
        }))
        .unwrap()
    }

    fn work(cluster: &str, name: &str) -> ManifestWork {
        serde_json::from_value(json!({
            "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": {"name": name, "namespace": cluster},
            "spec": {"workload": {"manifests": []}}
        }))
        .unwrap()
    }

    #[test]
    fn a_work_is_wanted_only_by_its_current_application() {
        let pulled = app(json!({PULL_LABEL: "true"}), "cluster1", "abcdef12");
        assert_eq!(
            work_wanted(&work("cluster1", "guestbook-abcde"), Some(&pulled)),
            Ok(())
        );
        assert_eq!(
            work_wanted(&work("cluster1", "guestbook-abcde"), None),
            Err(Unwanted::AppGone)
        );
        assert_eq!(
            work_wanted(&work("cluster2", "guestbook-abcde"), Some(&pulled)),
            Err(Unwanted::Retargeted)
        );
        assert_eq!(
            work_wanted(&work("cluster1", "guestbook-99999"), Some(&pulled)),
            Err(Unwanted::Superseded)
        );
        let unlabelled = app(json!({}), "cluster1", "abcdef12");
        assert_eq!(
            work_wanted(&work("cluster1", "guestbook-abcde"), Some(&unlabelled)),
            Err(Unwanted::NotPulled)
        );
        let mut deleting = pulled.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        assert_eq!(
            work_wanted(&work("cluster1", "guestbook-abcde"), Some(&deleting)),
            Err(Unwanted::AppDeleting)
        );
    }

    #[test]
    fn only_argo_cd_resources_finalizers_are_removed() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            without_resources_finalizers(&f(&[
                "resources-finalizer.argocd.argoproj.io",
                "example.com/keep"
            ])),
            Some(f(&["example.com/keep"]))
        );
        assert_eq!(
            without_resources_finalizers(&f(&["example.com/keep"])),
            None
        );
    }
}
