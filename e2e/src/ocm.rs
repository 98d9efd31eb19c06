//! Real Open Cluster Management as local processes, built from OCM's Go module by `hack/peers.sh`:
//! the hub side ([`OcmHub`]: `registration controller`, `placement controller`, and
//! kube-controller-manager's `csrsigning` controller issuing the client certificates OCM approves)
//! and one klusterlet per managed cluster ([`Klusterlet`]: the singleton `registration-operator
//! agent`, i.e. the registration and work agents in one process, as upstream deploys it).
//!
//! Owns the OCM CRDs the peers need (`crds/hub`, `crds/spoke` of the OCM peer directory, copied
//! from the `open-cluster-management.io/api` module OCM is built against), the descriptions of the
//! OCM kinds tests read, and waits on ManagedCluster conditions and taints. It writes nothing OCM
//! would write: a cluster joins through the real CSR flow (created by the agent, approved by the
//! hub's auto-approval for the bootstrap user `admin`, signed with the hub's client CA), and every
//! status, decision and taint comes from the OCM processes.
//!
//! No hub `work manager` runs: plain ManifestWorks need only the spoke's work agent (upstream runs
//! the manager only for ManifestWorkReplicaSets and completed-work cleanup). The work agents run
//! with OCM's `RawFeedbackJsonString` feature gate, as an admin enables it in the Klusterlet's
//! `spec.workConfiguration.featureGates`: the pull model's `status.resources` feedback needs it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

use crate::binaries::Peer;
use crate::control_plane::ControlPlane;
use crate::gateway::ensure_namespace;
use crate::ports::free_port;
use crate::process::{print_log_tail, ManagedProcess, ProcessSpec};
use crate::wait::wait_until;

/// Hub namespace of the OCM hub controllers (events; leader election is off).
pub const HUB_NAMESPACE: &str = "open-cluster-management-hub";
/// Spoke namespace of the klusterlet: OCM's fixed component namespace outside a pod, where the agent
/// keeps its hub kubeconfig Secret.
pub const AGENT_NAMESPACE: &str = "open-cluster-management-agent";
/// Taint the hub puts on a cluster whose lease stopped (Available=Unknown).
pub const UNREACHABLE_TAINT: &str = "cluster.open-cluster-management.io/unreachable";
/// Taint the hub puts on a cluster that reports Available=False.
pub const UNAVAILABLE_TAINT: &str = "cluster.open-cluster-management.io/unavailable";
/// ManagedCluster condition: the hub accepted the cluster.
pub const CONDITION_HUB_ACCEPTED: &str = "HubAcceptedManagedCluster";
/// ManagedCluster condition: the agent joined with an approved certificate.
pub const CONDITION_JOINED: &str = "ManagedClusterJoined";
/// ManagedCluster condition: the agent reports the cluster's apiserver healthy and renews its lease.
pub const CONDITION_AVAILABLE: &str = "ManagedClusterConditionAvailable";
/// The ManagedClusterSet containing every cluster, created by the hub registration controller.
pub const GLOBAL_CLUSTER_SET: &str = "global";
/// Label on a PlacementDecision naming its Placement.
pub const PLACEMENT_LABEL: &str = "cluster.open-cluster-management.io/placement";
/// The bootstrap user whose CSRs the hub approves by itself: the planes' admin token user.
const BOOTSTRAP_USER: &str = "admin";

fn ocm_resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// `cluster.open-cluster-management.io/v1` ManagedCluster (cluster-scoped).
pub fn managed_cluster_resource() -> ApiResource {
    ocm_resource(
        "cluster.open-cluster-management.io",
        "v1",
        "ManagedCluster",
        "managedclusters",
    )
}

/// `cluster.open-cluster-management.io/v1beta2` ManagedClusterSet (cluster-scoped).
pub fn managed_cluster_set_resource() -> ApiResource {
    ocm_resource(
        "cluster.open-cluster-management.io",
        "v1beta2",
        "ManagedClusterSet",
        "managedclustersets",
    )
}

/// `cluster.open-cluster-management.io/v1beta2` ManagedClusterSetBinding.
pub fn managed_cluster_set_binding_resource() -> ApiResource {
    ocm_resource(
        "cluster.open-cluster-management.io",
        "v1beta2",
        "ManagedClusterSetBinding",
        "managedclustersetbindings",
    )
}

/// `cluster.open-cluster-management.io/v1beta1` Placement.
pub fn placement_resource() -> ApiResource {
    ocm_resource(
        "cluster.open-cluster-management.io",
        "v1beta1",
        "Placement",
        "placements",
    )
}

/// `cluster.open-cluster-management.io/v1beta1` PlacementDecision.
pub fn placement_decision_resource() -> ApiResource {
    ocm_resource(
        "cluster.open-cluster-management.io",
        "v1beta1",
        "PlacementDecision",
        "placementdecisions",
    )
}

/// `work.open-cluster-management.io/v1` ManifestWork.
pub fn manifest_work_resource() -> ApiResource {
    ocm_resource(
        "work.open-cluster-management.io",
        "v1",
        "ManifestWork",
        "manifestworks",
    )
}

/// `work.open-cluster-management.io/v1` AppliedManifestWork (spoke, cluster-scoped).
pub fn applied_manifest_work_resource() -> ApiResource {
    ocm_resource(
        "work.open-cluster-management.io",
        "v1",
        "AppliedManifestWork",
        "appliedmanifestworks",
    )
}

/// Which side's CRDs to install.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrdSide {
    /// What the hub controllers and the agents' hub clients watch.
    Hub,
    /// What the klusterlet watches on its own cluster (ClusterClaims, AppliedManifestWorks).
    Spoke,
}

/// Installs OCM's CRDs for `side` (tolerating ones that exist, e.g. the repo's copies in `e2e/crds`)
/// and waits until each is Established.
pub async fn install_crds(client: &kube::Client, side: CrdSide) -> anyhow::Result<()> {
    let dir = Peer::Ocm.dir()?.join("crds").join(match side {
        CrdSide::Hub => "hub",
        CrdSide::Spoke => "spoke",
    });
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| {
            anyhow::anyhow!(
                "{}: {e} (rebuild the OCM peer: `bash hack/peers.sh ocm`)",
                dir.display()
            )
        })?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    crate::crds::install_files(client, &files).await?;
    Ok(())
}

/// Creates Placement `name` in `namespace` (created if needed) over the `global` cluster set, bound
/// into that namespace (no registration webhook runs here to bind it; an existing binding is
/// kept), selecting the clusters labelled `label`=`value`.
pub async fn create_label_placement(
    hub: &kube::Client,
    namespace: &str,
    name: &str,
    (label, value): (&str, &str),
) -> anyhow::Result<()> {
    ensure_namespace(hub, namespace).await?;
    let bindings: Api<DynamicObject> = Api::namespaced_with(
        hub.clone(),
        namespace,
        &managed_cluster_set_binding_resource(),
    );
    let created = bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "cluster.open-cluster-management.io/v1beta2",
                "kind": "ManagedClusterSetBinding",
                "metadata": {"name": GLOBAL_CLUSTER_SET, "namespace": namespace},
                "spec": {"clusterSet": GLOBAL_CLUSTER_SET},
            }))?,
        )
        .await;
    match created {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let placements: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), namespace, &placement_resource());
    placements
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "cluster.open-cluster-management.io/v1beta1",
                "kind": "Placement",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "clusterSets": [GLOBAL_CLUSTER_SET],
                    "predicates": [{"requiredClusterSelector": {"labelSelector": {
                        "matchLabels": {label: value},
                    }}}],
                },
            }))?,
        )
        .await?;
    Ok(())
}

/// The OCM hub controllers running against one control plane.
pub struct OcmHub {
    registration: ManagedProcess,
    placement: ManagedProcess,
    signer: ManagedProcess,
}

impl OcmHub {
    /// Installs the hub CRDs, creates [`HUB_NAMESPACE`], starts the registration controller (which
    /// accepts new clusters and approves CSRs of the bootstrap user `admin` by itself), the
    /// placement controller and kube-controller-manager's CSR signer (signing with the hub's client
    /// CA, which the hub apiserver trusts), and waits until the registration controller has created
    /// the `global` ManagedClusterSet.
    pub async fn start(hub: &ControlPlane, dir: &Path) -> anyhow::Result<OcmHub> {
        let client = hub.client().await?;
        install_crds(&client, CrdSide::Hub).await?;
        ensure_namespace(&client, HUB_NAMESPACE).await?;
        std::fs::create_dir_all(dir)?;
        let kubeconfig = format!("--kubeconfig={}", hub.kubeconfig.display());
        let common = [
            kubeconfig.clone(),
            format!("--namespace={HUB_NAMESPACE}"),
            "--disable-leader-election".to_string(),
        ];
        let registration = ManagedProcess::spawn(
            ProcessSpec::new(
                format!("ocm-registration-{}", hub.name),
                Peer::Ocm.binary("registration")?,
                dir.join("ocm-registration-controller.log"),
            )
            .arg("controller")
            .args(&common)
            .arg(format!("--listen=127.0.0.1:{}", free_port()))
            // library-go writes its self-signed serving certificate under TMPDIR.
            .env("TMPDIR", dir)
            .arg("--feature-gates=ManagedClusterAutoApproval=true")
            .arg(format!("--auto-approved-csr-users={BOOTSTRAP_USER}")),
        )?;
        let placement = ManagedProcess::spawn(
            ProcessSpec::new(
                format!("ocm-placement-{}", hub.name),
                Peer::Ocm.binary("placement")?,
                dir.join("ocm-placement-controller.log"),
            )
            .arg("controller")
            .args(&common)
            .arg(format!("--listen=127.0.0.1:{}", free_port()))
            .env("TMPDIR", dir),
        )?;
        let (ca_cert, ca_key) = hub.client_ca();
        let signer = ManagedProcess::spawn(
            ProcessSpec::new(
                format!("csr-signer-{}", hub.name),
                Peer::Kube.binary("kube-controller-manager")?,
                dir.join("kube-controller-manager-csrsigning.log"),
            )
            .arg(kubeconfig)
            .args([
                "--controllers=csrsigning",
                "--leader-elect=false",
                "--secure-port=0",
                "--cluster-signing-duration=24h",
            ])
            .arg(format!(
                "--cluster-signing-kube-apiserver-client-cert-file={}",
                ca_cert.display()
            ))
            .arg(format!(
                "--cluster-signing-kube-apiserver-client-key-file={}",
                ca_key.display()
            )),
        )?;
        let mut ocm = OcmHub {
            registration,
            placement,
            signer,
        };
        let sets: Api<DynamicObject> = Api::all_with(client, &managed_cluster_set_resource());
        let ready = wait_until(
            "the OCM registration controller to create the global ManagedClusterSet",
            Duration::from_secs(60),
            || {
                let sets = sets.clone();
                async move { sets.get_opt(GLOBAL_CLUSTER_SET).await }
            },
        )
        .await;
        if let Err(e) = ready {
            ocm.print_logs(40);
            return Err(e);
        }
        let exited = [&mut ocm.registration, &mut ocm.placement, &mut ocm.signer]
            .into_iter()
            .find_map(|p| (!p.is_running()).then(|| p.name().to_string()));
        if let Some(name) = exited {
            ocm.print_logs(40);
            anyhow::bail!("{name} exited at start-up");
        }
        eprintln!("[e2e] OCM hub controllers running on {}", hub.name);
        Ok(ocm)
    }

    /// Prints the tails of the hub controllers' logs.
    pub fn print_logs(&self, lines: usize) {
        for p in [&self.registration, &self.placement, &self.signer] {
            print_log_tail(p.name(), p.log_path(), lines);
        }
    }
}

/// The OCM hub controllers on this test binary's shared hub plane, started on first use.
pub async fn shared_ocm_hub() -> &'static OcmHub {
    static HUB: tokio::sync::OnceCell<Result<OcmHub, String>> = tokio::sync::OnceCell::const_new();
    let hub = HUB
        .get_or_init(|| async {
            let planes = crate::shared::shared_planes().await;
            let dir = planes.hub.dir().join("ocm");
            OcmHub::start(&planes.hub, &dir)
                .await
                .map_err(|e| format!("{e:#}"))
        })
        .await;
    match hub {
        Ok(h) => h,
        Err(e) => panic!("OCM hub controllers failed to start: {e}"),
    }
}

/// What a klusterlet's cluster looks like to the hub before it joins.
#[derive(Clone, Debug, Default)]
pub struct KlusterletOptions {
    /// Pre-create the ManagedCluster (as a hub admin importing a cluster does) with this
    /// `spec.leaseDurationSeconds` instead of letting the agent create it with the default 60 s.
    /// Acceptance still comes from the hub's auto-approval.
    pub lease_duration_seconds: Option<u32>,
    /// Labels of the pre-created ManagedCluster (implies pre-creating it).
    pub labels: Vec<(String, String)>,
}

/// One managed cluster's klusterlet: the singleton OCM agent (registration + work) for cluster
/// `cluster_name`, living in `spoke` and registered with `hub`.
pub struct Klusterlet {
    /// The ManagedCluster's name (also its hub namespace).
    pub cluster_name: String,
    /// Where the agent writes the hub kubeconfig and client certificate it obtained.
    pub hub_kubeconfig_dir: PathBuf,
    process: ManagedProcess,
}

impl Klusterlet {
    /// Starts the klusterlet for `cluster_name` with default options (the agent creates the
    /// ManagedCluster itself). Does not wait for the join: see [`wait_cluster_available`].
    pub async fn start(
        cluster_name: &str,
        spoke: &ControlPlane,
        hub: &ControlPlane,
        dir: &Path,
    ) -> anyhow::Result<Klusterlet> {
        Self::start_with(cluster_name, spoke, hub, dir, &KlusterletOptions::default()).await
    }

    /// Installs the spoke CRDs, creates [`AGENT_NAMESPACE`] on the spoke, optionally pre-creates
    /// the ManagedCluster (see [`KlusterletOptions`]) and starts the agent with the hub's admin
    /// kubeconfig as bootstrap kubeconfig. The agent keeps the hub kubeconfig it obtains under
    /// `dir/hub-kubeconfig` and in a Secret named after the cluster (several klusterlets may share
    /// one spoke plane), so a restart reuses the certificate instead of registering anew.
    pub async fn start_with(
        cluster_name: &str,
        spoke: &ControlPlane,
        hub: &ControlPlane,
        dir: &Path,
        options: &KlusterletOptions,
    ) -> anyhow::Result<Klusterlet> {
        let spoke_client = spoke.client().await?;
        install_crds(&spoke_client, CrdSide::Spoke).await?;
        ensure_namespace(&spoke_client, AGENT_NAMESPACE).await?;
        if options.lease_duration_seconds.is_some() || !options.labels.is_empty() {
            let labels: serde_json::Map<String, Value> = options
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            let mut spec = json!({"hubAcceptsClient": false});
            if let Some(lease) = options.lease_duration_seconds {
                spec["leaseDurationSeconds"] = json!(lease);
            }
            let cluster: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "cluster.open-cluster-management.io/v1",
                "kind": "ManagedCluster",
                "metadata": {"name": cluster_name, "labels": labels},
                "spec": spec,
            }))?;
            let api: Api<DynamicObject> =
                Api::all_with(hub.client().await?, &managed_cluster_resource());
            api.create(&PostParams::default(), &cluster).await?;
        }
        let dir = dir.join(format!("klusterlet-{cluster_name}"));
        let hub_kubeconfig_dir = dir.join("hub-kubeconfig");
        std::fs::create_dir_all(&hub_kubeconfig_dir)?;
        let spec = ProcessSpec::new(
            format!("klusterlet-{cluster_name}"),
            Peer::Ocm.binary("registration-operator")?,
            dir.join("klusterlet.log"),
        )
        .arg("agent")
        .env("TMPDIR", &dir)
        .arg(format!("--spoke-cluster-name={cluster_name}"))
        .arg(format!("--agent-id={cluster_name}-agent"))
        .arg(format!("--kubeconfig={}", spoke.kubeconfig.display()))
        .arg(format!(
            "--bootstrap-kubeconfig={}",
            hub.kubeconfig.display()
        ))
        .arg(format!(
            "--hub-kubeconfig-dir={}",
            hub_kubeconfig_dir.display()
        ))
        .arg(format!(
            "--hub-kubeconfig-secret=hub-kubeconfig-{cluster_name}"
        ))
        .arg(format!("--spoke-external-server-urls={}", spoke.url))
        .arg("--workload-source-driver=kube")
        .arg(format!(
            "--workload-source-config={}",
            hub_kubeconfig_dir.join("kubeconfig").display()
        ))
        .arg(format!("--namespace={AGENT_NAMESPACE}"))
        .arg("--disable-leader-election")
        .arg(format!("--listen=127.0.0.1:{}", free_port()))
        .args([
            "--status-sync-interval=1s",
            "--cluster-healthcheck-period=2s",
            "--feature-gates=RawFeedbackJsonString=true",
        ]);
        let process = ManagedProcess::spawn(spec)?;
        Ok(Klusterlet {
            cluster_name: cluster_name.to_string(),
            hub_kubeconfig_dir,
            process,
        })
    }

    /// Stops the agent (SIGTERM): the cluster stops renewing its lease, as if it went offline.
    pub fn stop(&mut self) {
        self.process.stop();
    }

    /// Starts the agent again after [`stop`](Self::stop), with the hub certificate it already has.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        self.process.start_again()
    }

    /// Whether the agent process is running.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// The last `n` lines of the agent's log.
    pub fn log_tail(&self, n: usize) -> String {
        self.process.log_tail(n)
    }

    /// A client for `hub` authenticating as this agent does, with the client certificate OCM had
    /// issued to it (`tls.crt`/`tls.key` in [`hub_kubeconfig_dir`](Self::hub_kubeconfig_dir)).
    pub async fn hub_client(&self, hub: &ControlPlane) -> anyhow::Result<kube::Client> {
        use base64::Engine as _;
        let b64 = |file: &str| -> anyhow::Result<String> {
            let bytes = std::fs::read(self.hub_kubeconfig_dir.join(file))?;
            Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
        };
        let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "hub", "cluster": {
                "server": hub.url, "certificate-authority": hub.ca_file}}],
            "users": [{"name": "agent", "user": {
                "client-certificate-data": b64("tls.crt")?, "client-key-data": b64("tls.key")?}}],
            "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "agent"}}],
            "current-context": "hub",
        }))?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// The agent's log file.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }
}

/// The `status.conditions[]` entry of `type_` on an OCM object.
pub fn condition<'a>(obj: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    obj.data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Whether condition `type_` has status `status` (`"True"`, `"False"`, `"Unknown"`).
pub fn condition_is(obj: &DynamicObject, type_: &str, status: &str) -> bool {
    condition(obj, type_).is_some_and(|c| c["status"] == status)
}

/// The keys of a ManagedCluster's `spec.taints`.
pub fn taint_keys(cluster: &DynamicObject) -> Vec<String> {
    cluster
        .data
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .map(|taints| {
            taints
                .iter()
                .filter_map(|t| t["key"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A one-line summary of a ManagedCluster's conditions and taints, for failure messages.
pub fn cluster_summary(cluster: &DynamicObject) -> String {
    let conditions: Vec<String> = cluster
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    format!(
                        "{}={}({})",
                        c["type"].as_str().unwrap_or("?"),
                        c["status"].as_str().unwrap_or("?"),
                        c["reason"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    format!(
        "conditions [{}], taints {:?}",
        conditions.join(", "),
        taint_keys(cluster)
    )
}

/// Waits until ManagedCluster `name` is accepted, joined and Available=True with no unreachable or
/// unavailable taint; returns it.
pub async fn wait_cluster_available(
    hub: &kube::Client,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<DynamicObject> {
    wait_cluster(
        hub,
        name,
        &format!("ManagedCluster {name} joined and Available"),
        timeout,
        |c| {
            condition_is(c, CONDITION_HUB_ACCEPTED, "True")
                && condition_is(c, CONDITION_JOINED, "True")
                && condition_is(c, CONDITION_AVAILABLE, "True")
                && !taint_keys(c)
                    .iter()
                    .any(|k| k == UNREACHABLE_TAINT || k == UNAVAILABLE_TAINT)
        },
    )
    .await
}

/// Waits until ManagedCluster `name` carries (`present`) or no longer carries taint `key`.
pub async fn wait_cluster_taint(
    hub: &kube::Client,
    name: &str,
    key: &str,
    present: bool,
    timeout: Duration,
) -> anyhow::Result<DynamicObject> {
    let what = if present {
        format!("ManagedCluster {name} tainted {key}")
    } else {
        format!("taint {key} removed from ManagedCluster {name}")
    };
    wait_cluster(hub, name, &what, timeout, |c| {
        taint_keys(c).iter().any(|k| k == key) == present
    })
    .await
}

/// Waits until ManagedCluster `name` exists and satisfies `done`; a timeout reports its conditions
/// and taints as last seen.
pub async fn wait_cluster(
    hub: &kube::Client,
    name: &str,
    what: &str,
    timeout: Duration,
    done: impl Fn(&DynamicObject) -> bool,
) -> anyhow::Result<DynamicObject> {
    let api: Api<DynamicObject> = Api::all_with(hub.clone(), &managed_cluster_resource());
    let done = &done;
    wait_until(what, timeout, || {
        let api = api.clone();
        async move {
            match api.get_opt(name).await {
                Ok(Some(c)) if done(&c) => Ok(Some(c)),
                Ok(Some(c)) => Err(cluster_summary(&c)),
                Ok(None) => Err("no such ManagedCluster yet".to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await
}
