//! The operator's OCM pull-model controllers (`argocd_agent_operator::pull`) run in-process against
//! the shared hub, once per test binary, with the `MulticlusterApplicationSetReport` CRD installed
//! from the principal chart. Tests that meet them with real OCM and Argo CD (`real_ocm`) and tests
//! that drive them directly (`pull_model`) start them the same way. They read Applications the way
//! they do in `argocd-principal` by default: through an informer of every Application and its
//! fanout (`ApplicationSource::Informer`), not through a watch of their own. They ask the work
//! agents for `status.resources` too (the principal's `--operator-pull-resource-feedback`; the
//! klusterlets of `e2e::ocm` run with the feature gate that needs). Argo CD's real ApplicationSet
//! controller for [`ARGOCD_NAMESPACE`] is shared the same way ([`shared_applicationset_controller`]):
//! two in one namespace would both reconcile every ApplicationSet there.

use std::time::Duration;

use argocd_agent_kube::argocd::Application;
use argocd_agent_kube::fanout::EventFanout;
use argocd_agent_kube::informer::Informer;
use argocd_agent_kube::CancellationToken;
use argocd_agent_operator::pull::manifestwork::Feedback;
use argocd_agent_operator::pull::{run_pull_model_from, ApplicationSource, PullModelOptions};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;

use crate::argocd::ArgoCd;
use crate::gateway::ensure_namespace;
use crate::shared::SharedPlanes;
use crate::wait::wait_until;

/// Argo CD namespace on the hub given to the controllers (cluster Secrets land here).
pub const ARGOCD_NAMESPACE: &str = "argocd-pull";

static STARTED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// Argo CD's ApplicationSet controller for the hub's [`ARGOCD_NAMESPACE`] (progressive syncs
/// enabled), started on first use and running as long as the test binary.
pub async fn shared_applicationset_controller(
    planes: &'static SharedPlanes,
) -> anyhow::Result<&'static ArgoCd> {
    static CONTROLLER: tokio::sync::OnceCell<ArgoCd> = tokio::sync::OnceCell::const_new();
    CONTROLLER
        .get_or_try_init(|| async {
            let hub = planes.hub.client().await?;
            ensure_namespace(&hub, ARGOCD_NAMESPACE).await?;
            let dir = planes.hub.dir().join("pull-model");
            ArgoCd::start_applicationset_controller("pull", &dir, &planes.hub, ARGOCD_NAMESPACE)
                .await
        })
        .await
}

/// Installs the report CRD on `planes`' hub and starts the pull-model controllers against it, on a
/// runtime of their own that lives as long as the test binary (a test's runtime ends with the
/// test); later calls return at once.
pub async fn start_controllers(planes: &'static SharedPlanes) -> anyhow::Result<()> {
    STARTED
        .get_or_try_init(|| async {
            let hub = planes.hub.client().await?;
            install_report_crd(&hub).await?;
            ensure_namespace(&hub, ARGOCD_NAMESPACE).await?;
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let client = planes.hub.client().await.expect("hub client");
                    let opts = PullModelOptions {
                        argocd_namespace: ARGOCD_NAMESPACE.into(),
                        retry_after: Duration::from_secs(1),
                        feedback: Feedback::StatusAndResources,
                        ..Default::default()
                    };
                    let informer = Informer::new(
                        "hub Applications",
                        Api::<Application>::all(client.clone()),
                        kube::runtime::watcher::Config::default(),
                    );
                    let applications = EventFanout::new(informer.reader());
                    tokio::spawn(informer.handler(applications.clone()).run(None));
                    let source = ApplicationSource::Informer(applications);
                    let stop = CancellationToken::new();
                    if let Err(e) = run_pull_model_from(client, opts, source, stop).await {
                        eprintln!("[e2e] pull-model controllers stopped: {e}");
                    }
                });
            });
            Ok::<_, anyhow::Error>(())
        })
        .await?;
    Ok(())
}

/// Creates the chart's `MulticlusterApplicationSetReport` CRD on `hub` and waits until it is served.
async fn install_report_crd(hub: &kube::Client) -> anyhow::Result<()> {
    let path = crate::binaries::workspace_root()
        .join("charts/argocd-agent-principal/crds/multiclusterapplicationsetreports.yaml");
    let crd = crate::crds::load_crd(&path)?;
    let name = crd.metadata.name.clone().unwrap_or_default();
    let raw: Api<DynamicObject> = Api::all_with(
        hub.clone(),
        &ApiResource::erase::<CustomResourceDefinition>(&()),
    );
    match raw.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => anyhow::bail!("creating {name} from {}: {e}", path.display()),
    }
    let api: Api<CustomResourceDefinition> = Api::all(hub.clone());
    wait_until(
        &format!("CRD {name} Established"),
        Duration::from_secs(30),
        || async {
            let crd = api.get(&name).await?;
            let ok = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok::<_, kube::Error>(ok.then_some(()))
        },
    )
    .await
}
