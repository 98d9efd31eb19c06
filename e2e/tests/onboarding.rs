//! Onboarding through real Open Cluster Management: nothing here plays OCM. A spoke joins through
//! the registration flow (its klusterlet, `e2e::ocm`), the real placement controller decides a
//! Placement bound to the `global` ManagedClusterSet, our principal's embedded operator
//! (`--enable-operator=true`) answers a GitOpsCluster referencing that Placement with a cluster
//! secret and the agent ManifestWork, the real work agent applies the ManifestWork on the spoke and
//! reports it Applied and Available, and the applied agent Deployment runs as a kubelet would run
//! it (`e2e::pod_runner`: the image's entrypoint, the Deployment's args, its volumes under a
//! read-only root, and its ServiceAccount's TokenRequest token — no admin kubeconfig) and syncs a
//! hub Application, AppProject and repository Secret to the spoke.
//!
//! Intermittent sites stay onboarded: a cluster whose klusterlet stops is tainted unreachable by
//! the hub, yet the Placement (given tolerations by the operator, like upstream) keeps deciding
//! it and the operator keeps its ManifestWork and cluster secret; the restarted klusterlet
//! re-applies the work. A cluster taken out of the placement on purpose is offboarded.
//!
//! Upstream's GitOpsCluster contract: its condition types and reasons, the JWT signing key Secret
//! created, `argoCDCRManifestWork` delivered in its own ManifestWork with the principal endpoint
//! injected (applied by the real work agent), `RemovedClustersCleanedUp` after a removal, and a
//! GitOpsCluster without an endpoint getting the principal's NodePort written back, its agent
//! connecting through that node port.
//!
//! The tests write only what users write: Placements, bindings, GitOpsClusters, Argo CD objects on
//! the hub, ManagedCluster labels, a Service, and the CRD of the Argo CD operator's `ArgoCD` kind
//! (as its installer would). The one exception says so in its name: a Node object and
//! kube-proxy's forwarding of its node port, since the planes run no kubelet and no kube-proxy.
//! One principal serves every test of this binary (its Argo CD namespace, which every test's
//! GitOpsCluster names).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use argocd_agent_operator::gitops::agent_work::{
    agent_live_view_role, agent_live_view_rules, agent_live_view_write_rules, agent_role_rules,
    agent_terminal_role, agent_terminal_rules, AGENT_DEPLOYMENT, AGENT_PARAMS_CONFIGMAP,
    AGENT_WORK_NAME, PARAM_SERVER_ADDRESS, PARAM_SERVER_PORT,
};
use argocd_agent_operator::gitops::crd::GitOpsCluster;
use argocd_agent_operator::pki::jwt::inspect_jwt_key;
use argocd_agent_operator::pki::secrets::{
    AGENT_CA_SECRET, AGENT_CLIENT_TLS_SECRET, JWT_KEY_KEY, JWT_SECRET, PRINCIPAL_TLS_SECRET,
    TLS_CERT_KEY, TLS_KEY_KEY,
};
use argocd_agent_runtime::dial::{connect_tls, TlsTarget};
use e2e::discovery::{
    create_endpointless_gitopscluster, hold_node_port, register_loopback_node,
    wait_node_port_written, DISCOVERED,
};
use e2e::gateway::{
    application, application_resource, appproject_resource, client_tls, Pki, Principal, SOURCE_UID,
};
use e2e::ocm::{
    condition, condition_is, create_label_placement, managed_cluster_resource,
    manifest_work_resource, placement_decision_resource, placement_resource, shared_ocm_hub,
    wait_cluster_available, wait_cluster_taint, Klusterlet, KlusterletOptions, OcmHub,
    CONDITION_AVAILABLE, PLACEMENT_LABEL, UNAVAILABLE_TAINT, UNREACHABLE_TAINT,
};
use e2e::pod_runner::{Image, Pod, PodRunner};
use e2e::process::{print_log_tail, temp_dir};
use e2e::tcp_proxy::TcpProxy;
use e2e::{shared_planes, wait_until, ControlPlane, SharedPlanes, TestContext};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

/// A join takes a few seconds (CSR round trip, first health check); generous for a loaded
/// 2-core machine running other test binaries at once.
const JOIN_WAIT: Duration = Duration::from_secs(120);
/// Everything after the join reacts within a pass, a status-sync or a lease period (1-2 s).
const REACT_WAIT: Duration = Duration::from_secs(120);
/// How long an unreachable cluster is kept offline after its taint, measured on the hub's own
/// clock (the Available condition's transition time): many lease periods (1 s) and placement
/// re-evaluations, each of which would have dropped the cluster without the tolerations.
const OFFLINE_HOLD: Duration = Duration::from_secs(8);
/// Label the test's Placements select on, so clusters of other tests stay out of the decision.
const TEST_LABEL: &str = "e2e.argocd-agent.io/onboarding";
/// The principal's (and hub Argo CD's) namespace: cluster secrets, the operator's PKI Secrets.
const PRINCIPAL_NS: &str = "argocd-onboarding";
/// The work agent's finalizer on a ManifestWork it applied.
const WORK_CLEANUP_FINALIZER: &str = "cluster.open-cluster-management.io/manifest-work-cleanup";

/// The principal with the embedded operator, shared by this binary's tests.
struct OperatorHub {
    principal: Principal,
    pki: Pki,
    /// The principal's TLS files were replaced by the operator's certificates.
    files: tokio::sync::OnceCell<Result<(), String>>,
}

async fn operator_hub() -> &'static OperatorHub {
    static HUB: tokio::sync::OnceCell<Result<OperatorHub, String>> =
        tokio::sync::OnceCell::const_new();
    let hub = HUB
        .get_or_init(|| async {
            let start = async {
                let planes = shared_planes().await;
                let dir = temp_dir("onboarding-principal")?;
                let pki = Pki::create(&dir.join("pki"))?;
                let principal = Principal::start(
                    "operator",
                    &dir,
                    &planes.hub,
                    &pki,
                    PRINCIPAL_NS,
                    // The grants off by default too (the agent chart's liveView.write and
                    // terminal.enabled), so the work agent is seen applying all of them.
                    &[
                        "--enable-operator=true",
                        "--operator-agent-live-view-write",
                        "--operator-agent-terminal",
                    ],
                )
                .await?;
                anyhow::Ok(OperatorHub {
                    principal,
                    pki,
                    files: tokio::sync::OnceCell::new(),
                })
            };
            start.await.map_err(|e| format!("{e:#}"))
        })
        .await;
    match hub {
        Ok(h) => h,
        Err(e) => panic!("principal with the operator failed to start: {e}"),
    }
}

impl OperatorHub {
    /// The principal serves the operator's certificate and trusts the operator's CA (as the chart
    /// mounts the operator's Secrets): writes its files from those Secrets once; the principal
    /// reloads changed files by itself.
    async fn use_operator_pki(&self, hub: &kube::Client) -> anyhow::Result<()> {
        let done = self
            .files
            .get_or_init(|| async {
                let write = async {
                    let secrets: Api<Secret> = Api::namespaced(hub.clone(), PRINCIPAL_NS);
                    let text = |s: &Secret, key: &str| -> anyhow::Result<String> {
                        let bytes = s
                            .data
                            .as_ref()
                            .and_then(|d| d.get(key))
                            .ok_or_else(|| anyhow::anyhow!("secret lacks {key}"))?;
                        Ok(String::from_utf8(bytes.0.clone())?)
                    };
                    let tls = wait_secret(&secrets, PRINCIPAL_TLS_SECRET).await?;
                    let ca = wait_secret(&secrets, "argocd-agent-ca").await?;
                    let dir = &self.pki.dir;
                    std::fs::write(dir.join("principal.key"), text(&tls, TLS_KEY_KEY)?)?;
                    std::fs::write(dir.join("principal.crt"), text(&tls, TLS_CERT_KEY)?)?;
                    std::fs::write(self.pki.ca(), text(&ca, TLS_CERT_KEY)?)?;
                    // Agents retry a refused handshake only after a back-off; start them once the
                    // principal serves the operator's certificate.
                    let tls = std::sync::Arc::new(client_tls(&self.pki, None, &[b"h2"])?);
                    let addr = self.principal.address();
                    wait_until(
                        "the principal serving the operator's certificate",
                        REACT_WAIT,
                        || async {
                            let name = rustls::pki_types::ServerName::IpAddress(
                                std::net::Ipv4Addr::LOCALHOST.into(),
                            );
                            let target = TlsTarget::new(addr.as_str(), name);
                            connect_tls(&target, &tls).await.map(|_| Some(()))
                        },
                    )
                    .await?;
                    anyhow::Ok(())
                };
                write.await.map_err(|e| format!("{e:#}"))
            })
            .await;
        done.clone().map_err(anyhow::Error::msg)
    }
}

async fn wait_secret(api: &Api<Secret>, name: &str) -> anyhow::Result<Secret> {
    wait_until(&format!("secret {name}"), REACT_WAIT, || async {
        api.get_opt(name).await
    })
    .await
}

/// Prints the OCM hub controllers', the principal's, the klusterlets' and the pods' logs when
/// dropped before [`passed`](FailureLogs::passed), i.e. when the test fails.
struct FailureLogs {
    ocm: &'static OcmHub,
    operator: &'static OperatorHub,
    logs: Vec<(String, PathBuf)>,
    passed: bool,
}

impl FailureLogs {
    fn new(ocm: &'static OcmHub, operator: &'static OperatorHub) -> Self {
        Self {
            ocm,
            operator,
            logs: Vec::new(),
            passed: false,
        }
    }

    fn watch(&mut self, name: String, log: PathBuf) {
        self.logs.push((name, log));
    }

    fn passed(mut self) {
        self.passed = true;
    }
}

impl Drop for FailureLogs {
    fn drop(&mut self) {
        if !self.passed {
            self.ocm.print_logs(30);
            let p = &self.operator.principal.process;
            print_log_tail(p.name(), p.log_path(), 60);
            for (name, log) in &self.logs {
                print_log_tail(name, log, 40);
            }
        }
    }
}

/// One test's fleet: a labelled cluster, the namespace of its Placement and GitOpsCluster, and
/// the agent namespace on its spoke.
struct Site {
    cluster: String,
    label: String,
    gitops_ns: String,
    agent_ns: String,
}

impl Site {
    fn new(ctx: &TestContext, prefix: &str) -> Site {
        Site {
            cluster: ctx.unique(prefix),
            label: ctx.suffix.clone(),
            gitops_ns: ctx.unique("gitops"),
            agent_ns: ctx.unique("agent"),
        }
    }

    /// What a user writes on the hub: the `global` ManagedClusterSetBinding, a Placement
    /// selecting clusters labelled for this test, and a GitOpsCluster referencing it (managed
    /// mode, dialing the principal on loopback; the client key ships in the ManifestWork, see
    /// the final report: no OCM add-on registration agent runs here to sign an add-on CSR).
    async fn create_hub_objects(&self, hub: &kube::Client, grpc_port: u16) -> anyhow::Result<()> {
        let ns = &self.gitops_ns;
        create_label_placement(hub, ns, "sites", (TEST_LABEL, &self.label)).await?;
        let gocs: Api<GitOpsCluster> = Api::namespaced(hub.clone(), ns);
        gocs.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "apps.open-cluster-management.io/v1alpha1",
                "kind": "GitOpsCluster",
                "metadata": {"name": "sites", "namespace": ns},
                "spec": {
                    "placementRef": {"kind": "Placement", "name": "sites"},
                    // Each test's own namespace is served by no principal: name the principal's
                    // (upstream's default is the GitOpsCluster's namespace).
                    "argoServer": {"argoNamespace": PRINCIPAL_NS},
                    "argoCDAgentAddon": {
                        "mode": "managed",
                        "principalServerAddress": "127.0.0.1",
                        "principalServerPort": grpc_port.to_string(),
                        "agentNamespace": self.agent_ns,
                        "agentKeyInManifestWork": true,
                        // Upstream's field: delivered in its own ManifestWork, the principal
                        // endpoint set in the ArgoCD CR.
                        "argoCDCRManifestWork": {"manifests": [
                            {"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": self.cr_configmap(), "namespace": "default"},
                             "data": {"from": "argoCDCRManifestWork"}},
                            {"apiVersion": "argoproj.io/v1beta1", "kind": "ArgoCD",
                             "metadata": {"name": self.cr_configmap(), "namespace": "default"},
                             "spec": {"argoCDAgent": {"agent": {"enabled": true}}}}
                        ]},
                    },
                },
            }))?,
        )
        .await?;
        Ok(())
    }

    /// The ConfigMap the GitOpsCluster's `argoCDCRManifestWork` carries.
    fn cr_configmap(&self) -> String {
        format!("{}-cr", self.cluster)
    }

    fn klusterlet_options(&self, lease_duration_seconds: Option<u32>) -> KlusterletOptions {
        KlusterletOptions {
            lease_duration_seconds,
            labels: vec![(TEST_LABEL.to_string(), self.label.clone())],
        }
    }

    /// Starts the site's klusterlet on `spoke` (its log watched by `logs`) and waits until the
    /// cluster joined `hub` and is available.
    async fn join(
        &self,
        spoke: &ControlPlane,
        hub: &ControlPlane,
        dir: &std::path::Path,
        lease_duration_seconds: Option<u32>,
        logs: &mut FailureLogs,
    ) -> anyhow::Result<Klusterlet> {
        let options = self.klusterlet_options(lease_duration_seconds);
        let klusterlet = Klusterlet::start_with(&self.cluster, spoke, hub, dir, &options).await?;
        logs.watch(
            format!("klusterlet-{}", self.cluster),
            klusterlet.log_path().to_path_buf(),
        );
        wait_cluster_available(&hub.client().await?, &self.cluster, JOIN_WAIT).await?;
        Ok(klusterlet)
    }

    fn works(&self, hub: &kube::Client) -> Api<DynamicObject> {
        Api::namespaced_with(hub.clone(), &self.cluster, &manifest_work_resource())
    }

    fn cluster_secret_name(&self) -> String {
        format!("cluster-{}", self.cluster)
    }

    /// The clusters the placement controller decided for the Placement.
    async fn decided(&self, hub: &kube::Client) -> Result<Vec<String>, kube::Error> {
        let decisions: Api<DynamicObject> =
            Api::namespaced_with(hub.clone(), &self.gitops_ns, &placement_decision_resource());
        let list = decisions
            .list(&ListParams::default().labels(&format!("{PLACEMENT_LABEL}=sites")))
            .await?;
        Ok(list
            .items
            .iter()
            .flat_map(|d| {
                d.data
                    .pointer("/status/decisions")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|d| d["clusterName"].as_str().map(str::to_string))
            .collect())
    }

    /// Waits until the placement controller decides exactly this site's cluster.
    async fn wait_decided(&self, hub: &kube::Client) -> anyhow::Result<()> {
        wait_until(
            &format!(
                "Placement {}/sites deciding {}",
                self.gitops_ns, self.cluster
            ),
            REACT_WAIT,
            || async {
                let decided = self.decided(hub).await?;
                Ok::<_, kube::Error>((decided == [self.cluster.clone()]).then_some(()))
            },
        )
        .await
    }

    /// Waits until the work agent reports the agent ManifestWork Applied and Available, the work
    /// and every manifest; returns it.
    async fn wait_work_available(&self, hub: &kube::Client) -> anyhow::Result<DynamicObject> {
        let works = self.works(hub);
        wait_until(
            &format!(
                "ManifestWork {}/{AGENT_WORK_NAME} Applied and Available (work and manifests)",
                self.cluster
            ),
            REACT_WAIT,
            || async {
                let Some(w) = works.get_opt(AGENT_WORK_NAME).await? else {
                    return Ok::<_, kube::Error>(None);
                };
                Ok(work_fully_available(&w).then_some(w))
            },
        )
        .await
    }
}

/// The work's Applied and Available conditions are True for the work and for every manifest.
fn work_fully_available(work: &DynamicObject) -> bool {
    let manifests_ok = work
        .data
        .pointer("/status/resourceStatus/manifests")
        .and_then(Value::as_array)
        .is_some_and(|ms| {
            !ms.is_empty()
                && ms.iter().all(|m| {
                    let cs = m["conditions"].as_array().cloned().unwrap_or_default();
                    ["Applied", "Available"]
                        .iter()
                        .all(|t| cs.iter().any(|c| c["type"] == *t && c["status"] == "True"))
                })
        });
    condition_is(work, "Applied", "True") && condition_is(work, "Available", "True") && manifests_ok
}

/// Seconds since the epoch on this machine's clock, which the hub's apiserver (a local process)
/// stamps conditions with.
fn unix_seconds_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

/// Whether the agent's `/metrics` on host port `port` reports a live connection.
async fn connected(port: u16) -> bool {
    matches!(e2e::metrics::agent_connected(port).await, Ok(true))
}

async fn planes_and_hubs() -> (&'static SharedPlanes, &'static OcmHub, &'static OperatorHub) {
    let planes = shared_planes().await;
    let ocm = shared_ocm_hub().await;
    (planes, ocm, operator_hub().await)
}

#[tokio::test]
async fn spoke_joined_through_ocm_gets_its_agent_from_the_real_work_agent_and_syncs(
) -> anyhow::Result<()> {
    let (planes, ocm, operator) = planes_and_hubs().await;
    let mut logs = FailureLogs::new(ocm, operator);
    let ctx = TestContext::new("onboarding")?;
    let site = Site::new(&ctx, "site");
    let spoke = &planes.spokes[0];
    let hub = planes.hub.client().await?;
    let spoke_client = spoke.client().await?;
    let started = Instant::now();

    register_argocd_operator_kind(&spoke_client).await?;

    // The spoke joins through the registration flow.
    let _klusterlet = site
        .join(spoke, &planes.hub, &ctx.dir, None, &mut logs)
        .await?;
    let joined = started.elapsed();

    site.create_hub_objects(&hub, operator.principal.grpc_port)
        .await?;
    // The operator makes the Placement tolerate the offline taints (upstream's
    // ensurePlacementTolerations); the real placement controller decides the cluster.
    let placements: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &site.gitops_ns, &placement_resource());
    wait_until(
        "the operator's tolerations on the Placement",
        REACT_WAIT,
        || async {
            let p = placements.get("sites").await?;
            let keys: Vec<String> = p
                .data
                .pointer("/spec/tolerations")
                .and_then(Value::as_array)
                .map(|ts| {
                    ts.iter()
                        .filter(|t| t["operator"] == "Exists")
                        .filter_map(|t| t["key"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            Ok::<_, kube::Error>(
                [UNREACHABLE_TAINT, UNAVAILABLE_TAINT]
                    .iter()
                    .all(|k| keys.iter().any(|have| have == k))
                    .then_some(()),
            )
        },
    )
    .await?;
    site.wait_decided(&hub).await?;

    // The operator registers the cluster with the hub Argo CD and writes the agent ManifestWork.
    let hub_secrets: Api<Secret> = Api::namespaced(hub.clone(), PRINCIPAL_NS);
    let cluster_secret = wait_secret(&hub_secrets, &site.cluster_secret_name()).await?;
    assert_eq!(
        cluster_secret.metadata.labels.clone().unwrap_or_default()
            ["argocd.argoproj.io/secret-type"],
        "cluster"
    );
    operator.use_operator_pki(&hub).await?;

    // The real work agent applies it and reports it Applied and Available.
    let work = site.wait_work_available(&hub).await?;
    let applied_in = started.elapsed();
    let finalizers = work.metadata.finalizers.clone().unwrap_or_default();
    assert!(
        finalizers.iter().any(|f| f == WORK_CLEANUP_FINALIZER),
        "the work agent holds the ManifestWork until it cleaned up: {finalizers:?}"
    );
    let ns = site.agent_ns.as_str();
    assert!(
        Api::<Namespace>::all(spoke_client.clone())
            .get_opt(ns)
            .await?
            .is_some(),
        "agent namespace on the spoke"
    );
    assert!(Api::<ServiceAccount>::namespaced(spoke_client.clone(), ns)
        .get_opt(AGENT_DEPLOYMENT)
        .await?
        .is_some());
    let role = Api::<Role>::namespaced(spoke_client.clone(), ns)
        .get(AGENT_DEPLOYMENT)
        .await?;
    assert_eq!(
        serde_json::to_value(role.rules.unwrap_or_default())?,
        Value::Array(agent_role_rules()),
        "the applied Role grants what agent/rbac.yaml lists"
    );
    let binding = Api::<RoleBinding>::namespaced(spoke_client.clone(), ns)
        .get(AGENT_DEPLOYMENT)
        .await?;
    assert_eq!(binding.role_ref.name, AGENT_DEPLOYMENT);
    // The live view's cluster-wide reads and writes and the web terminal's exec (the principal's
    // --operator-agent-live-view-write and --operator-agent-terminal), applied by the work agent
    // as agent/rbac.yaml lists them.
    let cluster_roles = Api::<ClusterRole>::all(spoke_client.clone());
    let live = cluster_roles.get(&agent_live_view_role(ns)).await?;
    let mut live_rules = agent_live_view_rules();
    live_rules.extend(agent_live_view_write_rules());
    assert_eq!(
        serde_json::to_value(live.rules.unwrap_or_default())?,
        Value::Array(live_rules),
        "the applied ClusterRole grants what agent/rbac.yaml `liveView` and `liveViewWrite` list"
    );
    let terminal = cluster_roles.get(&agent_terminal_role(ns)).await?;
    assert_eq!(
        serde_json::to_value(terminal.rules.unwrap_or_default())?,
        Value::Array(agent_terminal_rules()),
        "the applied ClusterRole grants what agent/rbac.yaml `terminal` lists"
    );
    let spoke_secrets: Api<Secret> = Api::namespaced(spoke_client.clone(), ns);
    for name in [AGENT_CA_SECRET, AGENT_CLIENT_TLS_SECRET] {
        assert!(
            spoke_secrets.get_opt(name).await?.is_some(),
            "secret {name} on the spoke"
        );
    }
    assert!(Api::<ConfigMap>::namespaced(spoke_client.clone(), ns)
        .get_opt(AGENT_PARAMS_CONFIGMAP)
        .await?
        .is_some());
    let deployment = Api::<Deployment>::namespaced(spoke_client.clone(), ns)
        .get(AGENT_DEPLOYMENT)
        .await?;
    let labels = deployment.metadata.labels.clone().unwrap_or_default();
    assert!(
        !labels.is_empty(),
        "the Deployment as the ManifestWork carries it"
    );

    // The operator reads the work agent's report back into the GitOpsCluster's status (the
    // Deployment never becomes ready: no kube-controller-manager writes Deployment status here).
    let gocs: Api<GitOpsCluster> = Api::namespaced(hub.clone(), &site.gitops_ns);
    wait_until(
        "GitOpsCluster status: ManifestWork applied",
        REACT_WAIT,
        || async {
            let goc = gocs.get("sites").await?;
            let applied = goc.status.as_ref().is_some_and(|s| {
                s.clusters
                    .iter()
                    .any(|c| c.name == site.cluster && c.message.contains("ManifestWork applied"))
            });
            Ok::<_, kube::Error>(applied.then_some(()))
        },
    )
    .await?;

    // Upstream's GitOpsCluster contract: its condition types, all True once onboarded; the JWT
    // signing key Secret created; `argoCDCRManifestWork` in its own ManifestWork with the
    // principal endpoint injected, applied by the real work agent.
    let cr_work_name = format!("argocd-agent-cr-{}-sites", site.gitops_ns);
    let cr_work = wait_until("the ArgoCD CR ManifestWork", REACT_WAIT, || async {
        site.works(&hub).get_opt(&cr_work_name).await
    })
    .await?;
    assert_eq!(
        cr_work.data["spec"]["workload"]["manifests"][1]["spec"]["argoCDAgent"]["agent"]["client"],
        json!({"principalServerAddress": "127.0.0.1",
               "principalServerPort": operator.principal.grpc_port.to_string()}),
        "the principal endpoint is injected into the ArgoCD CR"
    );
    let default_cms: Api<ConfigMap> = Api::namespaced(spoke_client.clone(), "default");
    let argocd_crs: Api<DynamicObject> = Api::namespaced_with(
        spoke_client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1beta1", "ArgoCD"),
            "argocds",
        ),
    );
    let spoke_cr = wait_until(
        "the work agent to apply the argoCDCRManifestWork ConfigMap and ArgoCD CR",
        REACT_WAIT,
        || async {
            let cm = default_cms.get_opt(&site.cr_configmap()).await?;
            let cr = argocd_crs.get_opt(&site.cr_configmap()).await?;
            Ok::<_, kube::Error>(cm.and(cr))
        },
    )
    .await?;
    assert_eq!(
        spoke_cr.data["spec"]["argoCDAgent"]["agent"]["client"]["principalServerAddress"],
        "127.0.0.1"
    );
    let upstream_types = [
        "RBACReady",
        "ServerDiscovered",
        "JWTSecretReady",
        "CACertificateReady",
        "PrincipalCertificateReady",
        "ResourceProxyCertificateReady",
        "PlacementTolerationConfigured",
        "AddOnTemplateReady",
        "PlacementEvaluated",
        "ClustersImported",
        "ManifestWorkCreated",
        "AddonConfigured",
        "ArgoCDCRDelivered",
    ];
    let goc = gocs.get("sites").await?;
    let conditions = goc.status.clone().unwrap_or_default().conditions;
    for type_ in upstream_types {
        let c = conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("no upstream condition {type_}: {conditions:?}"));
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "Success"),
            "{c:?}"
        );
    }
    let server = conditions.iter().find(|c| c.type_ == "ServerDiscovered");
    assert_eq!(
        server.map(|c| c.message.clone()),
        Some(format!(
            "Server at 127.0.0.1:{}",
            operator.principal.grpc_port
        ))
    );
    let jwt = hub_secrets.get(JWT_SECRET).await?;
    let key = jwt
        .data
        .as_ref()
        .and_then(|d| d.get(JWT_KEY_KEY))
        .map(|k| String::from_utf8_lossy(&k.0).to_string())
        .unwrap_or_default();
    inspect_jwt_key(&key)?;

    // The applied Deployment runs as a kubelet would run it, with its ServiceAccount's token.
    let kubelet = PodRunner::new(spoke, &ctx.dir, Image::ours()?).await?;
    let pods = kubelet
        .run_deployment(ns, AGENT_DEPLOYMENT, &[operator.principal.grpc_port])
        .await?;
    let pod: &Pod = &pods[0];
    logs.watch(
        format!("pod {}", pod.name),
        pod.process.log_path().to_path_buf(),
    );
    assert!(
        !pod.env.iter().any(|(k, _)| k.contains("KUBECONFIG")),
        "in-cluster config only: {:?}",
        pod.env
    );
    let metrics = pod.port("metrics").expect("the agent exposes metrics");
    wait_until("the agent pod connected", REACT_WAIT, || async {
        Ok::<_, anyhow::Error>(connected(metrics).await.then_some(()))
    })
    .await?;
    pod.wait_ready(REACT_WAIT).await?;
    let connected_in = started.elapsed();

    // Managed mode: an Application in the cluster's hub namespace, an AppProject and a
    // repository Secret for it in the principal's namespace reach the spoke.
    let project = ctx.unique("team");
    let hub_projects: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), PRINCIPAL_NS, &appproject_resource());
    hub_projects
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": project},
                "spec": {"destinations": [{"name": site.cluster, "namespace": "*"}],
                         "sourceNamespaces": [site.cluster], "sourceRepos": ["*"]},
            }))?,
        )
        .await?;
    let repo = ctx.unique("repo");
    let created_repo = hub_secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": repo,
                             "labels": {"argocd.argoproj.io/secret-type": "repository"}},
                "type": "Opaque",
                "stringData": {"project": project, "type": "git",
                               "url": "https://example.com/onboarding.git"},
            }))?,
        )
        .await?;
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &site.cluster, &application_resource());
    hub_apps
        .create(
            &PostParams::default(),
            &application("guestbook", &site.cluster, "v1"),
        )
        .await?;
    let spoke_apps: Api<DynamicObject> =
        Api::namespaced_with(spoke_client.clone(), ns, &application_resource());
    let spoke_projects: Api<DynamicObject> =
        Api::namespaced_with(spoke_client.clone(), ns, &appproject_resource());
    wait_until(
        "the hub Application, AppProject and repository Secret on the spoke",
        REACT_WAIT,
        || async {
            let app = spoke_apps.get_opt("guestbook").await?;
            let proj = spoke_projects.get_opt(&project).await?;
            let secret = spoke_secrets.get_opt(&repo).await?;
            Ok::<_, kube::Error>(match (app, proj, secret) {
                (Some(_), Some(_), Some(s)) => Some(s),
                _ => None,
            })
        },
    )
    .await
    .map(|copy| {
        assert_eq!(
            copy.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SOURCE_UID)),
            created_repo.metadata.uid.as_ref(),
            "the spoke's repository Secret is the hub's"
        );
    })?;
    eprintln!(
        "[onboarding] {} joined in {joined:.1?}, agent ManifestWork applied by the work agent at \
         {applied_in:.1?}, agent pod connected at {connected_in:.1?}, synced at {:.1?} \
         (isolation {:?})",
        site.cluster,
        started.elapsed(),
        pod.isolation
    );

    // Deleting the GitOpsCluster offboards through the real work agent: it removes the agent
    // from the spoke, then releases the ManifestWork; the operator then releases its finalizer.
    drop(pods);
    gocs.delete("sites", &DeleteParams::default()).await?;
    let works = site.works(&hub);
    let deployments: Api<Deployment> = Api::namespaced(spoke_client.clone(), ns);
    wait_until(
        "GitOpsCluster deleted: ManifestWork, cluster secret and the spoke's agent gone",
        REACT_WAIT,
        || async {
            let left = [
                ("GitOpsCluster", gocs.get_opt("sites").await?.is_some()),
                (
                    "ManifestWork",
                    works.get_opt(AGENT_WORK_NAME).await?.is_some(),
                ),
                (
                    "cluster secret",
                    hub_secrets
                        .get_opt(&site.cluster_secret_name())
                        .await?
                        .is_some(),
                ),
                (
                    "spoke Deployment",
                    deployments.get_opt(AGENT_DEPLOYMENT).await?.is_some(),
                ),
                (
                    "ArgoCD CR ManifestWork",
                    works.get_opt(&cr_work_name).await?.is_some(),
                ),
                (
                    "its ConfigMap on the spoke",
                    default_cms.get_opt(&site.cr_configmap()).await?.is_some(),
                ),
                (
                    "its ArgoCD CR on the spoke",
                    argocd_crs.get_opt(&site.cr_configmap()).await?.is_some(),
                ),
            ];
            remaining(&left)
        },
    )
    .await?;
    logs.passed();
    Ok(())
}

/// The Argo CD operator's `ArgoCD` kind (argoproj.io/v1beta1), as its installer would register
/// it, with an open schema: no Argo CD operator runs here, but the CRs an `argoCDCRManifestWork`
/// carries must be storable on the spoke for the work agent to apply (and later delete) them.
async fn register_argocd_operator_kind(spoke: &kube::Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(spoke.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "argocds.argoproj.io"},
        "spec": {"group": "argoproj.io", "scope": "Namespaced",
                 "names": {"kind": "ArgoCD", "listKind": "ArgoCDList", "plural": "argocds", "singular": "argocd"},
                 "versions": [{"name": "v1beta1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))?;
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    wait_until(
        "CRD argocds.argoproj.io Established",
        REACT_WAIT,
        || async {
            let crd = crds.get("argocds.argoproj.io").await?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok::<_, kube::Error>(established.then_some(()))
        },
    )
    .await
}

/// `Ok(Some(()))` when nothing of `left` (name, still there) is left, else an error naming what
/// is, for the time-out message.
fn remaining(left: &[(&str, bool)]) -> anyhow::Result<Option<()>> {
    let names: Vec<&str> = left.iter().filter(|(_, l)| *l).map(|(n, _)| *n).collect();
    anyhow::ensure!(names.is_empty(), "still there: {}", names.join(", "));
    Ok(Some(()))
}

/// Why the onboarding of an offline site broke, if it did: the Placement must still decide it and
/// its ManifestWork and cluster secret must be the very objects they were (same uid, not
/// deleting).
async fn offline_violation(
    site: &Site,
    hub: &kube::Client,
    work_uid: &str,
    secret_uid: &str,
) -> Result<Option<String>, kube::Error> {
    let decided = site.decided(hub).await?;
    if decided != [site.cluster.clone()] {
        return Ok(Some(format!(
            "the Placement stopped deciding the offline cluster: {decided:?}"
        )));
    }
    let work = site.works(hub).get_opt(AGENT_WORK_NAME).await?;
    match work {
        Some(w) if w.metadata.uid.as_deref() == Some(work_uid) => {
            if w.metadata.deletion_timestamp.is_some() {
                return Ok(Some("the agent ManifestWork is being deleted".into()));
            }
        }
        other => {
            return Ok(Some(format!(
                "the agent ManifestWork was removed or replaced: {:?}",
                other.map(|w| w.metadata.uid)
            )))
        }
    }
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), PRINCIPAL_NS);
    match secrets.get_opt(&site.cluster_secret_name()).await? {
        Some(s) if s.metadata.uid.as_deref() == Some(secret_uid) => Ok(None),
        other => Ok(Some(format!(
            "the cluster secret was removed or replaced: {:?}",
            other.map(|s| s.metadata.uid)
        ))),
    }
}

#[tokio::test]
async fn unreachable_site_stays_onboarded_and_deselected_site_is_offboarded() -> anyhow::Result<()>
{
    let (planes, ocm, operator) = planes_and_hubs().await;
    let mut logs = FailureLogs::new(ocm, operator);
    let ctx = TestContext::new("onboarding-offline")?;
    let site = Site::new(&ctx, "intermittent");
    let spoke = &planes.spokes[1];
    let hub = planes.hub.client().await?;
    let spoke_client = spoke.client().await?;
    register_argocd_operator_kind(&spoke_client).await?;

    // A 1 s lease: the hub declares the cluster unreachable 5 lease periods after its last renewal.
    let mut klusterlet = site
        .join(spoke, &planes.hub, &ctx.dir, Some(1), &mut logs)
        .await?;
    site.create_hub_objects(&hub, operator.principal.grpc_port)
        .await?;
    site.wait_decided(&hub).await?;
    let work = site.wait_work_available(&hub).await?;
    let hub_secrets: Api<Secret> = Api::namespaced(hub.clone(), PRINCIPAL_NS);
    let secret = wait_secret(&hub_secrets, &site.cluster_secret_name()).await?;
    let work_uid = work.metadata.uid.clone().unwrap_or_default();
    let secret_uid = secret.metadata.uid.clone().unwrap_or_default();

    // The site goes offline until the hub taints it unreachable.
    klusterlet.stop();
    let stopped = Instant::now();
    let tainted =
        wait_cluster_taint(&hub, &site.cluster, UNREACHABLE_TAINT, true, REACT_WAIT).await?;
    eprintln!(
        "[onboarding] {} tainted unreachable {:.1?} after its klusterlet stopped",
        site.cluster,
        stopped.elapsed()
    );
    let went_unknown = condition(&tainted, CONDITION_AVAILABLE)
        .and_then(|c| serde_json::from_value::<Condition>(c.clone()).ok())
        .map(|c| c.last_transition_time.0.as_second())
        .ok_or_else(|| anyhow::anyhow!("no Available transition time on the tainted cluster"))?;

    // While it stays offline (OFFLINE_HOLD past the hub's own transition to Unknown, checked on
    // every poll), nothing is offboarded. Meanwhile drift on the spoke: the agent's parameters
    // ConfigMap is deleted, for the returning work agent to restore.
    let params: Api<ConfigMap> = Api::namespaced(spoke_client.clone(), &site.agent_ns);
    params
        .delete(AGENT_PARAMS_CONFIGMAP, &DeleteParams::default())
        .await?;
    let clusters: Api<DynamicObject> = Api::all_with(hub.clone(), &managed_cluster_resource());
    let held = wait_until(
        &format!("{OFFLINE_HOLD:?} offline with the site still onboarded"),
        REACT_WAIT,
        || async {
            if let Some(why) = offline_violation(&site, &hub, &work_uid, &secret_uid).await? {
                return Ok::<_, kube::Error>(Some(Err(why)));
            }
            let cluster = clusters.get(&site.cluster).await?;
            if !condition_is(&cluster, CONDITION_AVAILABLE, "Unknown") {
                return Ok(Some(Err(
                    "the cluster came back while its klusterlet is stopped".into(),
                )));
            }
            let offline_for = unix_seconds_now() - went_unknown;
            Ok((offline_for >= OFFLINE_HOLD.as_secs() as i64).then_some(Ok(())))
        },
    )
    .await?;
    if let Err(why) = held {
        anyhow::bail!("an unreachable site was offboarded: {why}");
    }

    // Back online: the taint goes, the work agent re-applies what drifted and reports the work.
    klusterlet.start_again()?;
    wait_cluster_available(&hub, &site.cluster, REACT_WAIT).await?;
    wait_until(
        "the returning work agent to restore the agent's ConfigMap",
        REACT_WAIT,
        || async { params.get_opt(AGENT_PARAMS_CONFIGMAP).await },
    )
    .await?;
    let back = site.wait_work_available(&hub).await?;
    assert_eq!(back.metadata.uid.as_deref(), Some(work_uid.as_str()));

    // Taken out of the placement on purpose (its label changed), the site is offboarded: the
    // ManifestWork and the cluster secret go, and the work agent removes the agent from the spoke.
    clusters
        .patch(
            &site.cluster,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {TEST_LABEL: "retired"}}})),
        )
        .await?;
    let works = site.works(&hub);
    let deployments: Api<Deployment> = Api::namespaced(spoke_client.clone(), &site.agent_ns);
    wait_until(
        "the deselected site offboarded (ManifestWork, cluster secret, spoke Deployment gone)",
        REACT_WAIT,
        || async {
            let left = [
                ("decision", !site.decided(&hub).await?.is_empty()),
                (
                    "ManifestWork",
                    works.get_opt(AGENT_WORK_NAME).await?.is_some(),
                ),
                (
                    "cluster secret",
                    hub_secrets
                        .get_opt(&site.cluster_secret_name())
                        .await?
                        .is_some(),
                ),
                (
                    "spoke Deployment",
                    deployments.get_opt(AGENT_DEPLOYMENT).await?.is_some(),
                ),
                (
                    "ArgoCD CR ManifestWork",
                    works
                        .get_opt(&format!("argocd-agent-cr-{}-sites", site.gitops_ns))
                        .await?
                        .is_some(),
                ),
            ];
            remaining(&left)
        },
    )
    .await?;
    // Upstream's record of the removal on the GitOpsCluster.
    let gocs: Api<GitOpsCluster> = Api::namespaced(hub.clone(), &site.gitops_ns);
    wait_until(
        "condition RemovedClustersCleanedUp on the GitOpsCluster",
        REACT_WAIT,
        || async {
            let goc = gocs.get("sites").await?;
            let cleaned = goc
                .status
                .unwrap_or_default()
                .conditions
                .into_iter()
                .find(|c| {
                    c.type_ == "RemovedClustersCleanedUp"
                        && c.status == "True"
                        && c.message == "Cleaned up 1 removed cluster(s)"
                });
            Ok::<_, kube::Error>(cleaned)
        },
    )
    .await?;
    // The agent namespace is orphaned, not deleted: it may hold more than the agent.
    let kept = Api::<Namespace>::all(spoke_client.clone())
        .get_opt(&site.agent_ns)
        .await?;
    assert!(
        kept.is_some_and(|n| n.metadata.deletion_timestamp.is_none()),
        "offboarding must leave the agent namespace {} in place",
        site.agent_ns
    );
    logs.passed();
    Ok(())
}

/// Server discovery as upstream, dialled: a GitOpsCluster without `principalServerAddress`/`Port`,
/// the principal exposed by a `NodePort` Service. The operator discovers a node's InternalIP and
/// the node port, writes them back into the GitOpsCluster and gives them to the agent it deploys;
/// the agent's pod (run from the Deployment the real work agent applied, allowed to reach only the
/// apiserver and that node port) connects through it. The real kube-apiserver validates and
/// reserves the node port; two stand-ins, as the planes run neither a kubelet nor kube-proxy: the
/// Node (InternalIP 127.0.0.1) is registered by the test, and the test plays kube-proxy, forwarding
/// 127.0.0.1:<node port> to the Service's target port, where the principal listens.
#[tokio::test]
async fn gitopscluster_without_endpoint_gets_the_node_port_written_back_and_its_agent_connects_through_it_with_node_and_kube_proxy_played_by_the_test_since_none_runs(
) -> anyhow::Result<()> {
    let (planes, ocm, operator) = planes_and_hubs().await;
    let mut logs = FailureLogs::new(ocm, operator);
    let ctx = TestContext::new("discovery")?;
    let site = Site::new(&ctx, "nodeport");
    let spoke = &planes.spokes[1];
    let hub = planes.hub.client().await?;
    let node_name = ctx.unique("node");
    let nodes: Api<Node> = Api::all(hub.clone());
    register_loopback_node(&hub, &node_name).await?;
    // The node port: held on the Node's InternalIP, then asked for by the Service; the test's
    // kube-proxy forwards it to the target port.
    let held = hold_node_port()?;
    let node_port = held.local_addr()?.port();
    let grpc_port = operator.principal.grpc_port;
    let services: Api<Service> = Api::namespaced(hub.clone(), PRINCIPAL_NS);
    let service = services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "argocd-agent-principal"},
                "spec": {"type": "NodePort", "selector": {"app": "argocd-agent-principal"},
                         "ports": [{"name": "metrics", "port": 8000},
                                   {"name": "https", "port": 443, "targetPort": grpc_port,
                                    "nodePort": node_port}]},
            }))?,
        )
        .await?;
    let allocated = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|ports| ports.iter().find(|p| p.name.as_deref() == Some("https")))
        .and_then(|p| p.node_port);
    let kube_proxy = TcpProxy::start_on(held, ([127, 0, 0, 1], grpc_port).into())?;

    let run = async {
        assert_eq!(
            allocated,
            Some(i32::from(node_port)),
            "the apiserver reserved it"
        );
        let _klusterlet = site
            .join(spoke, &planes.hub, &ctx.dir, None, &mut logs)
            .await?;
        create_label_placement(&hub, &site.gitops_ns, "sites", (TEST_LABEL, &site.label)).await?;
        let gocs: Api<GitOpsCluster> = Api::namespaced(hub.clone(), &site.gitops_ns);
        create_endpointless_gitopscluster(
            &gocs,
            &site.gitops_ns,
            PRINCIPAL_NS,
            "sites",
            json!({"agentNamespace": site.agent_ns, "agentKeyInManifestWork": true}),
        )
        .await?;
        wait_node_port_written(&gocs, i32::from(node_port), REACT_WAIT).await?;
        wait_until(
            "ServerDiscovered True naming the node port",
            REACT_WAIT,
            || async {
                let goc = gocs.get(DISCOVERED).await?;
                let conditions = goc.status.unwrap_or_default().conditions;
                let discovered = conditions.iter().any(|c| {
                    c.type_ == "ServerDiscovered"
                        && c.status == "True"
                        && c.message == format!("Server at 127.0.0.1:{node_port}")
                });
                Ok::<_, kube::Error>(discovered.then_some(()))
            },
        )
        .await?;

        // The agent the operator deploys is given the discovered endpoint...
        operator.use_operator_pki(&hub).await?;
        site.wait_work_available(&hub).await?;
        let spoke_client = spoke.client().await?;
        let params = Api::<ConfigMap>::namespaced(spoke_client, &site.agent_ns)
            .get(AGENT_PARAMS_CONFIGMAP)
            .await?
            .data
            .unwrap_or_default();
        assert_eq!(
            (
                params.get(PARAM_SERVER_ADDRESS).map(String::as_str),
                params.get(PARAM_SERVER_PORT).cloned()
            ),
            (Some("127.0.0.1"), Some(node_port.to_string())),
            "{params:?}"
        );
        // ...and, run as a kubelet would run it, reaching nothing but the apiserver and the node
        // port, connects through the node port.
        let kubelet = PodRunner::new(spoke, &ctx.dir, Image::ours()?).await?;
        let pods = kubelet
            .run_deployment(&site.agent_ns, AGENT_DEPLOYMENT, &[node_port])
            .await?;
        let pod: &Pod = &pods[0];
        logs.watch(
            format!("pod {}", pod.name),
            pod.process.log_path().to_path_buf(),
        );
        let metrics = pod.port("metrics").expect("the agent exposes metrics");
        wait_until(
            "the agent connected through the node port",
            REACT_WAIT,
            || async { Ok::<_, anyhow::Error>(connected(metrics).await.then_some(())) },
        )
        .await?;
        assert!(
            kube_proxy.connections() > 0,
            "the agent's connection came through the node port"
        );

        // Offboarded when the GitOpsCluster goes.
        gocs.delete(DISCOVERED, &DeleteParams::default()).await?;
        let works = site.works(&hub);
        wait_until(
            "GitOpsCluster and agent ManifestWork gone",
            REACT_WAIT,
            || async {
                let left = [
                    ("GitOpsCluster", gocs.get_opt(DISCOVERED).await?.is_some()),
                    (
                        "ManifestWork",
                        works.get_opt(AGENT_WORK_NAME).await?.is_some(),
                    ),
                ];
                remaining(&left)
            },
        )
        .await?;
        anyhow::Ok(())
    };
    let outcome = run.await;
    // Always: the Service and Node would change discovery for GitOpsClusters of other tests that
    // name no endpoint.
    services
        .delete("argocd-agent-principal", &DeleteParams::default())
        .await?;
    nodes.delete(&node_name, &DeleteParams::default()).await?;
    outcome?;
    logs.passed();
    Ok(())
}
