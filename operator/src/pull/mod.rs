//! The OCM pull model on the hub: Argo CD Applications carried to managed clusters inside
//! ManifestWorks, their spoke status carried back, and the per-ApplicationSet report.
//!
//! Field-compatible with open-cluster-management-io/argocd-pull-integration (labels,
//! annotations, ManifestWork names and layout, cluster Secrets) and with the
//! `MulticlusterApplicationSetReport` of open-cluster-management-io/multicloud-integrations.
//!
//! Each controller owns one decision and writes with its own field manager; each is a
//! `kube::runtime::Controller` (reconcile, error policy, triggers from the other kinds it reads)
//! over the watches all of them share ([`watches`]: one watch and store per kind):
//! - [`propagation`]: which ManifestWork should exist for an Application, and its content (with
//!   [`operation`]: when a hub-requested operation reaches the spoke, when it has run there and
//!   is cleared, in step with an ApplicationSet's progressive sync; and [`refresh`]: a
//!   hub-requested refresh carried to the spoke and cleared once its Argo CD consumed it);
//! - [`status`]: the spoke status (ManifestWork status feedback) written into the hub Application;
//! - [`cleanup`]: which ManifestWorks must go (Application deleted, unlabelled, retargeted, orphaned);
//! - [`cluster_secret`]: one Argo CD cluster Secret per ManagedCluster (ApplicationSet cluster generator);
//! - [`report`]: one `MulticlusterApplicationSetReport` per ApplicationSet with pulled Applications.
//!
//! The pure parts (what an Application asks for, ManifestWork building, feedback parsing, report
//! aggregation) live in [`application`], [`manifestwork`], [`status`] and [`report`] and are tested
//! without an apiserver. Nothing here relies on ownerReference garbage collection: deletions are
//! explicit, so the controllers also work where no controller-manager runs.

pub mod application;
pub mod cleanup;
pub mod cluster_secret;
pub mod manifestwork;
pub mod operation;
pub mod propagation;
pub mod refresh;
pub mod report;
pub mod status;
pub mod watches;

use argocd_agent_kube::fanout::EventFanout;
use argocd_agent_kube::CancellationToken;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::task::JoinSet;

use application::{managed_cluster_resource, Application, ApplicationSet, PULL_LABEL};
use manifestwork::ManifestWork;
use watches::{SharedWatch, Subscription};

/// Field manager of the Application → ManifestWork controller (and of the Application
/// conditions it owns).
pub const PROPAGATION_MANAGER: &str = "argocd-agent-pull-model";
/// Field manager of the status controller.
pub const STATUS_MANAGER: &str = "argocd-agent-pull-status";
/// Field manager of the cluster Secret controller.
pub const CLUSTER_SECRET_MANAGER: &str = "argocd-agent-pull-cluster-secret";
/// Field manager of the ApplicationSet report controller.
pub const REPORT_MANAGER: &str = "argocd-agent-appset-report";

/// What the pull-model controllers need to know about the installation.
#[derive(Clone, Debug)]
pub struct PullModelOptions {
    /// Namespace of the hub's Argo CD, where cluster Secrets are written.
    pub argocd_namespace: String,
    /// The hub namespaces whose Applications (and ApplicationSets) these controllers handle, and
    /// so the ManifestWorks they handle: those whose hub Application (upstream's
    /// `apps.open-cluster-management.io/hub-application-namespace` annotation) lives in one of
    /// them. `None`: every namespace (one pull model per hub, as upstream's). Several principals
    /// on one hub each give their Argo CD namespaces, so that no two act on one Application or
    /// ManifestWork.
    pub application_namespaces: Option<BTreeSet<String>>,
    /// Run the cluster Secret controller (turn off when another component registers clusters).
    pub cluster_secrets: bool,
    /// Run the `MulticlusterApplicationSetReport` controller.
    pub appset_report: bool,
    /// What the work agents bring back of each pulled Application.
    pub feedback: manifestwork::Feedback,
    /// How many Applications / ManifestWorks are reconciled at once.
    pub concurrency: u16,
    /// Wait before retrying a failed write.
    pub retry_after: Duration,
}

impl Default for PullModelOptions {
    fn default() -> Self {
        PullModelOptions {
            argocd_namespace: "argocd".to_string(),
            application_namespaces: None,
            cluster_secrets: true,
            appset_report: true,
            feedback: manifestwork::Feedback::Status,
            concurrency: 8,
            retry_after: Duration::from_secs(5),
        }
    }
}

impl PullModelOptions {
    /// Whether the Applications of hub namespace `namespace` are these controllers' to handle.
    pub fn handles(&self, namespace: &str) -> bool {
        self.application_namespaces
            .as_ref()
            .is_none_or(|n| n.contains(namespace))
    }

    /// Whether `work` is these controllers' to handle: its hub Application's namespace is
    /// handled (a work naming no hub Application is not the pull model's).
    pub fn handles_work(&self, work: &ManifestWork) -> bool {
        manifestwork::hub_application_of(work).is_some_and(|(ns, _)| self.handles(&ns))
    }
}

/// Why the pull-model controllers stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub enum PullModelError {
    /// A controller task panicked or was aborted.
    #[error("pull-model controller task failed: {0}")]
    TaskFailed(#[from] tokio::task::JoinError),
    /// A controller gave up.
    #[error("pull-model {controller} controller stopped: {reason}")]
    ControllerStopped {
        /// Which controller.
        controller: &'static str,
        /// Why.
        reason: String,
    },
}

/// Where the pull-model controllers read Applications from.
pub enum ApplicationSource {
    /// A watch and a store of their own.
    OwnWatch,
    /// An informer of every Application the process already runs (the principal's hub
    /// Applications), through its fanout.
    Informer(Arc<EventFanout<Application>>),
}

/// The pull model's Application watch, or the process's informer it subscribes to.
enum ApplicationWatch {
    Own(Box<SharedWatch<Application>>),
    Informer(Arc<EventFanout<Application>>),
}

impl ApplicationWatch {
    fn subscribe(&mut self) -> Subscription<Application> {
        match self {
            ApplicationWatch::Own(watch) => watch.subscribe(),
            ApplicationWatch::Informer(fanout) => Subscription::of_informer(fanout),
        }
    }
}

/// Runs every enabled pull-model controller against the hub until `shutdown` completes, with an
/// Application watch of their own.
pub async fn run_pull_model(
    client: kube::Client,
    opts: PullModelOptions,
    shutdown: CancellationToken,
) -> Result<(), PullModelError> {
    run_pull_model_from(client, opts, ApplicationSource::OwnWatch, shutdown).await
}

/// Runs every enabled pull-model controller against the hub until `shutdown` completes, reading
/// Applications from `applications`.
///
/// The principal embeds this; it returns `Ok(())` after a clean shutdown and an error if a
/// controller task fails (the other controllers are then stopped too).
pub async fn run_pull_model_from(
    client: kube::Client,
    opts: PullModelOptions,
    applications: ApplicationSource,
    shutdown: CancellationToken,
) -> Result<(), PullModelError> {
    // Stopping one controller (after another failed) does not stop the caller's process.
    let signal = shutdown.child_token();
    let mut tasks = JoinSet::new();
    let cluster_resource = managed_cluster_resource();
    let all = watcher::Config::default;
    let mut apps = match applications {
        ApplicationSource::OwnWatch => ApplicationWatch::Own(Box::new(SharedWatch::new(
            "Application",
            Api::<Application>::all(client.clone()),
            all(),
            (),
        ))),
        ApplicationSource::Informer(fanout) => ApplicationWatch::Informer(fanout),
    };
    let mut works = SharedWatch::new(
        "ManifestWork",
        Api::<ManifestWork>::all(client.clone()),
        all().labels(&format!("{PULL_LABEL}=true")),
        (),
    );
    let mut clusters = SharedWatch::new(
        "ManagedCluster",
        Api::all_with(client.clone(), &cluster_resource),
        all(),
        cluster_resource,
    );
    // Read by propagation (where an Application's rollout is) and the report.
    let mut appsets = SharedWatch::new(
        "ApplicationSet",
        Api::<ApplicationSet>::all(client.clone()),
        all(),
        (),
    );
    tasks.spawn(propagation::run(
        client.clone(),
        opts.clone(),
        apps.subscribe(),
        works.subscribe(),
        clusters.subscribe(),
        appsets.subscribe(),
        signal.clone(),
    ));
    tasks.spawn(status::run(
        client.clone(),
        opts.clone(),
        works.subscribe(),
        signal.clone(),
    ));
    tasks.spawn(cleanup::run(
        client.clone(),
        opts.clone(),
        [apps.subscribe(), apps.subscribe()],
        [works.subscribe(), works.subscribe()],
        signal.clone(),
    ));
    if opts.cluster_secrets {
        let mut secrets = SharedWatch::new(
            "cluster Secret",
            Api::<Secret>::namespaced(client.clone(), &opts.argocd_namespace),
            all().labels(&format!("{}=cluster", cluster_secret::SECRET_TYPE_LABEL)),
            (),
        );
        tasks.spawn(cluster_secret::run(
            client.clone(),
            opts.clone(),
            [clusters.subscribe(), clusters.subscribe()],
            [secrets.subscribe(), secrets.subscribe()],
            signal.clone(),
        ));
        tasks.spawn(follow(secrets, signal.clone()));
    }
    if opts.appset_report {
        let mut reports = SharedWatch::new(
            "ApplicationSet report",
            Api::<report::MulticlusterApplicationSetReport>::all(client.clone()),
            all().labels(report::REPORT_APPSET_LABEL),
            (),
        );
        tasks.spawn(report::run(
            client.clone(),
            opts.clone(),
            apps.subscribe(),
            [appsets.subscribe(), appsets.subscribe()],
            clusters.subscribe(),
            [reports.subscribe(), reports.subscribe()],
            signal.clone(),
        ));
        tasks.spawn(follow(reports, signal.clone()));
    }
    tasks.spawn(follow(appsets, signal.clone()));
    if let ApplicationWatch::Own(apps) = apps {
        tasks.spawn(follow(*apps, signal.clone()));
    }
    tasks.spawn(follow(works, signal.clone()));
    tasks.spawn(follow(clusters, signal.clone()));
    tracing::info!(argocd_namespace = %opts.argocd_namespace, "pull-model controllers started");
    let mut outcome = Ok(());
    while let Some(joined) = tasks.join_next().await {
        let result = joined.map_err(PullModelError::from).and_then(|r| r);
        if let Err(e) = result {
            tracing::error!(error = %e, "pull-model controller failed; stopping the others");
            signal.cancel();
            if outcome.is_ok() {
                outcome = Err(e);
            }
        }
    }
    outcome
}

/// Follows a shared watch until `shutdown`, as a pull-model task.
async fn follow<K>(watch: SharedWatch<K>, shutdown: CancellationToken) -> Result<(), PullModelError>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    watch.run(shutdown).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn work(annotations: serde_json::Value) -> ManifestWork {
        serde_json::from_value(json!({
            "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": {"name": "w", "namespace": "c1", "annotations": annotations},
            "spec": {},
        }))
        .expect("a ManifestWork")
    }

    #[test]
    fn a_scoped_pull_model_handles_only_its_namespaces_applications_and_works() {
        let hub_app = |ns: &str| {
            work(json!({
                manifestwork::HUB_APP_NAMESPACE_ANNOTATION: ns,
                manifestwork::HUB_APP_NAME_ANNOTATION: "guestbook",
            }))
        };
        let everyone = PullModelOptions::default();
        assert!(everyone.handles("anywhere"));
        assert!(everyone.handles_work(&hub_app("anywhere")));
        let scoped = PullModelOptions {
            application_namespaces: Some(["argocd-a".to_string()].into()),
            ..Default::default()
        };
        assert!(scoped.handles("argocd-a"));
        assert!(!scoped.handles("argocd-b"));
        assert!(scoped.handles_work(&hub_app("argocd-a")));
        assert!(!scoped.handles_work(&hub_app("argocd-b")));
        // Not the pull model's at all.
        assert!(!everyone.handles_work(&work(json!({}))));
    }
}
