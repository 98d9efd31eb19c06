//! The GitOpsCluster operator end to end, embedded in a real `argocd-principal`
//! (`--enable-operator=true`) on a hub plane with the OCM and Argo CD CRDs and the GitOpsCluster CRD
//! generated from the operator's type: ManagedClusters selected by a Placement get certificates,
//! Argo CD cluster secrets and agent ManifestWorks; an agent started from a ManifestWork's payload
//! connects and receives hub Applications; `argocd-agentctl fleet status` shows it connected; an
//! agent whose key never leaves its cluster gets its certificate through an add-on
//! CertificateSigningRequest the operator signs (and refuses the CSRs it must not sign); clusters
//! leaving the decision are offboarded; a rotated CA gets every certificate reissued and the
//! principal and agent pick up their new files without a restart (same PIDs) and reconnect;
//! deleting the GitOpsCluster leaves nothing behind; bad input is reported in the status.
//!
//! OCM's controllers do not run here, and the scenarios' module name says why: the add-on CSR flow needs OCM's
//! addon-manager, which the harness does not build (`hack/peers.sh` builds placement, registration
//! and work), and the bad-input cases need a PlacementDecision naming a cluster that does not exist,
//! which the real placement controller never writes. Onboarding and offboarding through the real
//! placement controller and work agent are proven in `onboarding.rs`. So the tests play the
//! placement controller (writes the PlacementDecision) and the work agent (applies the ManifestWork
//! payload on the spoke, starts `argocd-agent` as a process with the certificate and config from
//! that payload, and reports the agent's readiness back as status feedback) and OCM's add-on
//! registration agent (makes the agent key on the spoke side and submits a CSR as the cluster's
//! add-on identity, by impersonation). The
//! principal reads its TLS from files, so the test copies the operator's Secrets into them (the
//! principal reloads changed files by itself).
//! Every GitOpsCluster here names its principal's namespace in `spec.argoServer.argoNamespace`,
//! so the operators of this binary's principals (all on the shared hub) each reconcile only their
//! own; that two principals on one hub do not fight over a GitOpsCluster is a test of its own.

use std::path::Path;
use std::time::Duration;

use argocd_agent_operator::gitops::agent_work::{
    payload_secret_text, AGENT_DEPLOYMENT, AGENT_PARAMS_CONFIGMAP, AGENT_WORK_NAME, PARAM_MODE,
    PARAM_NAMESPACE, PARAM_SERVER_ADDRESS, PARAM_SERVER_PORT,
};
use argocd_agent_operator::gitops::crd::GitOpsCluster;
use argocd_agent_operator::gitops::csr::{ADDON_SIGNER, CSR_CLUSTER_LABEL};
use argocd_agent_operator::pki::secrets::ca_secret;
use argocd_agent_operator::pki::secrets::{
    AGENT_CA_SECRET, AGENT_CLIENT_TLS_SECRET, CA_CERT_KEY, TLS_CERT_KEY, TLS_KEY_KEY,
};
use argocd_agent_operator::pki::{days, inspect, CertificateAuthority};
use argocd_agent_operator::pull::manifestwork::ManifestWork;
use e2e::binaries::project_binary;
use e2e::gateway::{application, application_resource, ensure_namespace, Pki, Principal};
use e2e::ports::free_port;
use e2e::{shared_planes, wait_until, ManagedProcess, ProcessSpec, TestContext};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn secret_text(s: &Secret, key: &str) -> String {
    String::from_utf8(s.data.as_ref().expect("data")[key].0.clone()).expect("utf-8")
}

async fn wait_secret(
    api: &Api<Secret>,
    name: &str,
    pred: impl Fn(&Secret) -> bool,
) -> anyhow::Result<Secret> {
    wait_until(&format!("secret {name}"), WAIT, || async {
        Ok::<_, kube::Error>(api.get_opt(name).await?.filter(|s| pred(s)))
    })
    .await
}

async fn wait_work(
    hub: &kube::Client,
    cluster: &str,
    pred: impl Fn(&ManifestWork) -> bool,
) -> anyhow::Result<ManifestWork> {
    let api: Api<ManifestWork> = Api::namespaced(hub.clone(), cluster);
    wait_until(
        &format!("ManifestWork {cluster}/{AGENT_WORK_NAME}"),
        WAIT,
        || async { Ok::<_, kube::Error>(api.get_opt(AGENT_WORK_NAME).await?.filter(|w| pred(w))) },
    )
    .await
}

async fn wait_goc(
    api: &Api<GitOpsCluster>,
    name: &str,
    what: &str,
    pred: impl Fn(&GitOpsCluster) -> bool,
) -> anyhow::Result<GitOpsCluster> {
    wait_until(what, WAIT, || async {
        Ok::<_, kube::Error>(api.get_opt(name).await?.filter(|g| pred(g)))
    })
    .await
}

fn condition(goc: &GitOpsCluster, type_: &str) -> Option<(String, String, String)> {
    goc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Writes the principal's TLS files from the operator's Secrets.
async fn write_principal_files(
    secrets: &Api<Secret>,
    pki: &Pki,
    ca_pem: &str,
) -> anyhow::Result<()> {
    let tls = wait_secret(secrets, "argocd-agent-principal-tls", |_| true).await?;
    std::fs::write(
        pki.dir.join("principal.key"),
        secret_text(&tls, TLS_KEY_KEY),
    )?;
    std::fs::write(
        pki.dir.join("principal.crt"),
        secret_text(&tls, TLS_CERT_KEY),
    )?;
    std::fs::write(pki.ca(), ca_pem)?;
    Ok(())
}

/// Stand-in for OCM's work agent of one cluster: applies the payload on the spoke.
async fn apply_payload(spoke: &kube::Client, work: &ManifestWork) -> anyhow::Result<()> {
    for m in &work.spec.workload.manifests {
        let api_version = m["apiVersion"].as_str().unwrap_or_default();
        let kind = m["kind"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let plural = format!("{}s", kind.to_lowercase());
        let ar = resource(group, version, kind, &plural);
        let obj: DynamicObject = serde_json::from_value(m.clone())?;
        let api: Api<DynamicObject> = match m.pointer("/metadata/namespace").and_then(Value::as_str)
        {
            Some(ns) => Api::namespaced_with(spoke.clone(), ns, &ar),
            None => Api::all_with(spoke.clone(), &ar),
        };
        let pp = PatchParams::apply("work-agent").force();
        api.patch(
            &obj.metadata.name.clone().unwrap_or_default(),
            &pp,
            &Patch::Apply(&obj),
        )
        .await?;
    }
    Ok(())
}

/// Writes the agent's certificate files from the payload; returns (cert, key, ca) paths.
fn write_agent_files(dir: &Path, work: &ManifestWork) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (key, file) in [
        (TLS_CERT_KEY, "tls.crt"),
        (TLS_KEY_KEY, "tls.key"),
        (CA_CERT_KEY, "ca.crt"),
    ] {
        let text = payload_secret_text(work, AGENT_CLIENT_TLS_SECRET, key)
            .ok_or_else(|| anyhow::anyhow!("payload lacks {AGENT_CLIENT_TLS_SECRET}/{key}"))?;
        std::fs::write(dir.join(file), text)?;
    }
    Ok(())
}

/// Starts `argocd-agent` with the config carried by the payload's ConfigMap and the certificate
/// files (tls.crt, tls.key, ca.crt) already in `dir`.
fn start_agent(
    ctx: &TestContext,
    name: &str,
    spoke_kubeconfig: &Path,
    work: &ManifestWork,
    dir: &Path,
) -> anyhow::Result<(ManagedProcess, u16)> {
    let params = work
        .spec
        .workload
        .manifests
        .iter()
        .find(|m| m["kind"] == "ConfigMap" && m["metadata"]["name"] == AGENT_PARAMS_CONFIGMAP)
        .ok_or_else(|| anyhow::anyhow!("payload lacks the params ConfigMap"))?;
    let p = |k: &str| params["data"][k].as_str().unwrap_or_default().to_string();
    let ops_port = free_port();
    let spec = ProcessSpec::new(
        format!("agent-{name}"),
        project_binary("argocd-agent")?,
        ctx.dir.join(format!("agent-{name}.log")),
    )
    .arg(format!(
        "--server-address={}:{}",
        p(PARAM_SERVER_ADDRESS),
        p(PARAM_SERVER_PORT)
    ))
    .arg(format!("--mode={}", p(PARAM_MODE)))
    .arg(format!("--namespace={}", p(PARAM_NAMESPACE)))
    .arg(format!(
        "--tls-client-cert={}",
        dir.join("tls.crt").display()
    ))
    .arg(format!(
        "--tls-client-key={}",
        dir.join("tls.key").display()
    ))
    .arg(format!("--tls-ca={}", dir.join("ca.crt").display()))
    .arg(format!("--queue-dir={}", dir.join("queue").display()))
    .arg(format!("--metrics-address=127.0.0.1:{ops_port}"))
    .arg(format!("--health-address=127.0.0.1:{ops_port}"))
    .arg(format!("--kubeconfig={}", spoke_kubeconfig.display()))
    .arg("--reconnect-backoff-max=2s")
    .arg("--log-level=debug,kube_client=warn,hyper=info,h2=info,tower=info,rustls=info");
    Ok((ManagedProcess::spawn(spec)?, ops_port))
}

async fn connected(port: u16) -> bool {
    matches!(e2e::metrics::agent_connected(port).await, Ok(true))
}

/// The agent's `argocd_agent_connections_total` (streams established since it started).
async fn connections(port: u16) -> Option<u64> {
    let connections = e2e::metrics::read(port, "argocd_agent_connections", &[]).await;
    connections.ok().flatten().map(|v| v as u64)
}

/// Plays OCM's add-on registration agent: a key made here (the spoke side) and a CSR for it.
/// `sans` are extra subject alternative names (the operator must refuse them).
fn agent_key_and_csr(cn: &str, sans: &[&str]) -> anyhow::Result<(String, String)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params =
        rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let csr = params.serialize_request(&key)?;
    Ok((key.serialize_pem(), csr.pem()?))
}

/// Submits an add-on CSR to the hub as `user` (impersonated from the admin kubeconfig, in the
/// add-on's group as OCM's registration agent would be).
#[allow(clippy::too_many_arguments)]
async fn submit_csr(
    hub_config: &kube::Config,
    name: &str,
    cluster_label: &str,
    user: &str,
    signer: &str,
    usages: &[&str],
    csr_pem: &str,
) -> anyhow::Result<()> {
    let mut config = hub_config.clone();
    config.auth_info.impersonate = Some(user.to_string());
    config.auth_info.impersonate_groups = Some(vec![
        ADDON_GROUP.to_string(),
        "system:authenticated".to_string(),
    ]);
    let api: Api<CertificateSigningRequest> = Api::all(kube::Client::try_from(config)?);
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "labels": {CSR_CLUSTER_LABEL: cluster_label,
                     "open-cluster-management.io/addon-name": "argocd-agent-addon"}},
        "spec": {"signerName": signer, "usages": usages,
                 "request": k8s_openapi::ByteString(csr_pem.as_bytes().to_vec())}
    }))?;
    api.create(&PostParams::default(), &csr).await?;
    Ok(())
}

/// The group OCM puts add-on registration agents in (bound to CSR creation for the test).
const ADDON_GROUP: &str = "system:open-cluster-management:addon:argocd-agent-addon";

/// The add-on user OCM's registration agent of `cluster` acts as.
fn addon_user(cluster: &str) -> String {
    format!("system:open-cluster-management:{cluster}:addon:argocd-agent-addon:agent:argocd-agent-addon-agent")
}

/// (type, reason, message) of a CSR's Approved/Denied/Failed condition, and its certificate.
fn csr_outcome(
    csr: &CertificateSigningRequest,
) -> (Option<(String, String, String)>, Option<String>) {
    let status = csr.status.as_ref();
    let cond = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.first())
        .map(|c| {
            (
                c.type_.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        });
    let cert = status
        .and_then(|s| s.certificate.as_ref())
        .map(|c| String::from_utf8_lossy(&c.0).into_owned());
    (cond, cert)
}

/// Stand-in for the work agent's status feedback: Applied, and the Deployment's ready replicas.
async fn report_feedback(
    hub: &kube::Client,
    cluster: &str,
    agent_ns: &str,
    ready: i64,
) -> anyhow::Result<()> {
    let api: Api<ManifestWork> = Api::namespaced(hub.clone(), cluster);
    let now = "2024-01-01T00:00:00Z";
    let status = json!({"status": {
        "conditions": [{"type": "Applied", "status": "True", "reason": "AppliedManifestWorkComplete", "message": "applied", "lastTransitionTime": now}],
        "resourceStatus": {"manifests": [{
            "resourceMeta": {"ordinal": 6, "group": "apps", "version": "v1", "kind": "Deployment", "resource": "deployments", "name": AGENT_DEPLOYMENT, "namespace": agent_ns},
            "statusFeedback": {"values": [{"name": "ReadyReplicas", "fieldValue": {"type": "Integer", "integer": ready}}]},
            "conditions": [{"type": "Applied", "status": "True", "reason": "Applied", "message": "applied", "lastTransitionTime": now}]
        }]}
    }});
    api.patch_status(
        AGENT_WORK_NAME,
        &PatchParams::default(),
        &Patch::Merge(&status),
    )
    .await?;
    Ok(())
}

/// Stand-in for OCM's placement controller: writes the decision of PlacementDecision `name`.
async fn set_decision(
    hub: &kube::Client,
    ns: &str,
    name: &str,
    clusters: &[&str],
) -> anyhow::Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        hub.clone(),
        ns,
        &resource(
            "cluster.open-cluster-management.io",
            "v1beta1",
            "PlacementDecision",
            "placementdecisions",
        ),
    );
    let decisions: Vec<Value> = clusters
        .iter()
        .map(|c| json!({"clusterName": c, "reason": "Selected"}))
        .collect();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"decisions": decisions}})),
    )
    .await?;
    Ok(())
}

/// The scenarios with OCM played by the test; each starts its own principal and fleet
/// ([`Fleet`]) so each fails on its own.
mod ocm_played_by_the_test_since_addon_manager_is_not_built_and_placement_never_decides_a_missing_cluster {
    use super::*;

    /// Kinds of OCM's API the tests write.
    fn managed_cluster_resource() -> ApiResource {
        resource(
            "cluster.open-cluster-management.io",
            "v1",
            "ManagedCluster",
            "managedclusters",
        )
    }

    /// One scenario's ground: a principal with its embedded operator in a namespace of its own,
    /// ManagedClusters c1 and c2 (with namespaces) decided by Placement `all`, and GitOpsCluster
    /// `fleet` (managed mode, agent key in the ManifestWork) whose certificates, cluster Secrets and
    /// ManifestWorks have appeared; the principal's TLS files written from the operator's Secrets.
    /// Each scenario starts its own (a principal starts in about a second), so each fails on its own.
    struct Fleet {
        planes: &'static e2e::SharedPlanes,
        ctx: TestContext,
        hub: kube::Client,
        pki: Pki,
        ns: String,
        principal: Principal,
        spoke_ns: String,
        clusters: [String; 2],
        mc_api: Api<DynamicObject>,
        placements: Api<DynamicObject>,
        decisions: Api<DynamicObject>,
        gocs: Api<GitOpsCluster>,
        secrets: Api<Secret>,
        /// The operator's CA Secret as first created.
        ca_secret: Secret,
    }

    /// Agent 1 (cluster c1 on spoke 1) started from its ManifestWork's payload and connected.
    struct Onboarded {
        agent: ManagedProcess,
        agent_port: u16,
        work: ManifestWork,
        dir: std::path::PathBuf,
        hub_apps: Api<DynamicObject>,
        spoke_apps: Api<DynamicObject>,
    }

    impl Fleet {
        async fn start(name: &str) -> anyhow::Result<Fleet> {
            let planes = shared_planes().await;
            let ctx = TestContext::new(name)?;
            let hub = planes.hub.client().await?;
            let pki = Pki::create(&ctx.dir.join("pki"))?;
            let ns = ctx.unique("gitops");
            let principal = Principal::start(
                "p",
                &ctx.dir,
                &planes.hub,
                &pki,
                &ns,
                &["--enable-operator=true"],
            )
            .await?;
            let spoke_ns = ctx.unique("spoke-argocd");
            let clusters = [ctx.unique("c1"), ctx.unique("c2")];

            // OCM registration: ManagedClusters and their namespaces.
            let mc_api: Api<DynamicObject> =
                Api::all_with(hub.clone(), &managed_cluster_resource());
            for c in &clusters {
                let mc: DynamicObject = serde_json::from_value(
                    json!({"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster", "metadata": {"name": c}, "spec": {"hubAcceptsClient": true}}),
                )?;
                mc_api.create(&PostParams::default(), &mc).await?;
                ensure_namespace(&hub, c).await?;
            }
            // Placement and its decision (the test plays OCM's placement controller).
            let placements: Api<DynamicObject> = Api::namespaced_with(
                hub.clone(),
                &ns,
                &resource(
                    "cluster.open-cluster-management.io",
                    "v1beta1",
                    "Placement",
                    "placements",
                ),
            );
            placements.create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement", "metadata": {"name": "all", "namespace": ns}, "spec": {}}))?).await?;
            let decisions: Api<DynamicObject> = Api::namespaced_with(
                hub.clone(),
                &ns,
                &resource(
                    "cluster.open-cluster-management.io",
                    "v1beta1",
                    "PlacementDecision",
                    "placementdecisions",
                ),
            );
            decisions.create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "PlacementDecision", "metadata": {"name": "all-decision-1", "namespace": ns, "labels": {"cluster.open-cluster-management.io/placement": "all"}}}))?).await?;
            set_decision(&hub, &ns, "all-decision-1", &[&clusters[0], &clusters[1]]).await?;

            let gocs: Api<GitOpsCluster> = Api::namespaced(hub.clone(), &ns);
            let goc: GitOpsCluster = serde_json::from_value(json!({
                "apiVersion": "apps.open-cluster-management.io/v1alpha1", "kind": "GitOpsCluster",
                "metadata": {"name": "fleet", "namespace": ns},
                "spec": {"placementRef": {"kind": "Placement", "name": "all"}, "argoServer": {"argoNamespace": ns},
                         "argoCDAgentAddon": {"mode": "managed", "principalServerAddress": "127.0.0.1",
                                              "principalServerPort": principal.grpc_port.to_string(),
                                              "agentNamespace": spoke_ns, "agentKeyInManifestWork": true}}
            }))?;
            gocs.create(&PostParams::default(), &goc).await?;

            // Certificates, cluster secrets and ManifestWorks appear.
            let secrets: Api<Secret> = Api::namespaced(hub.clone(), &ns);
            let ca_secret = wait_secret(&secrets, "argocd-agent-ca", |_| true).await?;
            for c in &clusters {
                wait_secret(&secrets, &format!("cluster-{c}"), |_| true).await?;
                wait_work(&hub, c, |_| true).await?;
            }
            write_principal_files(&secrets, &pki, &secret_text(&ca_secret, TLS_CERT_KEY)).await?;
            Ok(Fleet {
                planes,
                ctx,
                hub,
                pki,
                ns,
                principal,
                spoke_ns,
                clusters,
                mc_api,
                placements,
                decisions,
                gocs,
                secrets,
                ca_secret,
            })
        }

        /// Plays the work agent for cluster 1 on spoke 1, starts the agent from the payload, waits
        /// for it to connect and reports its readiness.
        async fn onboard_first(&self) -> anyhow::Result<Onboarded> {
            let (planes, hub, clusters) = (self.planes, &self.hub, &self.clusters);
            let work = wait_work(hub, &clusters[0], |_| true).await?;
            let spoke1 = planes.spokes[0].client().await?;
            apply_payload(&spoke1, &work).await?;
            ensure_namespace(&spoke1, &self.spoke_ns).await?;
            let dir = self.ctx.dir.join(format!("agent-{}", clusters[0]));
            write_agent_files(&dir, &work)?;
            let (agent, agent_port) = start_agent(
                &self.ctx,
                &clusters[0],
                &planes.spokes[0].kubeconfig,
                &work,
                &dir,
            )?;
            wait_until("agent from the ManifestWork connected", WAIT, || async {
                Ok::<_, anyhow::Error>(connected(agent_port).await.then_some(()))
            })
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "{e}\n{}\n{}",
                    agent.log_tail(30),
                    self.principal.process.log_tail(30)
                )
            })?;
            report_feedback(hub, &clusters[0], &self.spoke_ns, 1).await?;
            Ok(Onboarded {
                agent,
                agent_port,
                work,
                dir,
                hub_apps: Api::namespaced_with(hub.clone(), &clusters[0], &application_resource()),
                spoke_apps: Api::namespaced_with(spoke1, &self.spoke_ns, &application_resource()),
            })
        }
    }

    /// Onboarding: certificates, cluster Secrets (labels, resource-proxy server) and ManifestWorks
    /// for the selected clusters; an agent started from a ManifestWork's payload connects and gets
    /// hub Applications; the status says which cluster is onboarded and which waits for its agent;
    /// `argocd-agentctl fleet status` shows the agent connected.
    #[tokio::test]
    async fn onboarding_delivers_certificates_secrets_and_works_and_the_payloads_agent_gets_applications(
    ) -> anyhow::Result<()> {
        let f = Fleet::start("operator_onboarding").await?;
        let (planes, ns, clusters, gocs, secrets) =
            (f.planes, &f.ns, &f.clusters, &f.gocs, &f.secrets);
        wait_secret(secrets, "argocd-agent-ca-bundle", |_| true).await?;
        wait_secret(secrets, "argocd-agent-resource-proxy-tls", |_| true).await?;
        for c in clusters {
            let s = wait_secret(secrets, &format!("cluster-{c}"), |_| true).await?;
            let labels = s.metadata.labels.clone().unwrap_or_default();
            assert_eq!(labels["argocd.argoproj.io/secret-type"], "cluster");
            assert_eq!(labels["apps.open-cluster-management.io/cluster-name"], *c);
            assert_eq!(labels["argocd-agent.argoproj-labs.io/agent-name"], *c);
            assert_eq!(
                secret_text(&s, "server"),
                format!("https://argocd-agent-resource-proxy:9090?agentName={c}")
            );
        }
        let mut one = f.onboard_first().await?;

        // An Application created on the hub reaches the spoke.
        one.hub_apps
            .create(
                &PostParams::default(),
                &application("guestbook", &clusters[0], "v1"),
            )
            .await?;
        wait_until("hub app on spoke 1", WAIT, || async {
            one.spoke_apps.get_opt("guestbook").await
        })
        .await?;

        // Status: cluster 1 onboarded, cluster 2 waiting for its agent.
        let status = wait_goc(gocs, "fleet", "status lists cluster 1 onboarded", |g| {
            g.status.as_ref().is_some_and(|s| {
                s.clusters
                    .iter()
                    .any(|c| c.name == clusters[0] && c.phase == "Onboarded" && c.agent_ready)
            })
        })
        .await?;
        assert_eq!(condition(&status, "PlacementResolved").unwrap().0, "True");
        assert_eq!(condition(&status, "CertificatesReady").unwrap().0, "True");
        assert_eq!(condition(&status, "ClustersRegistered").unwrap().0, "True");
        let (s, reason, message) = condition(&status, "AgentsDeployed").unwrap();
        assert_eq!((s.as_str(), reason.as_str()), ("False", "WaitingForAgents"));
        assert!(message.contains(&clusters[1]), "{message}");
        assert_eq!(
            status.status.as_ref().unwrap().observed_generation,
            status.metadata.generation
        );

        // Fleet status from the CLI, joined with the principal's metrics.
        let metrics_url = format!("http://127.0.0.1:{}/metrics", f.principal.ops_port);
        let fleet = |output: &'static str| {
            let (kubeconfig, ns, metrics_url) = (
                planes.hub.kubeconfig.to_str().unwrap().to_string(),
                ns.clone(),
                metrics_url.clone(),
            );
            move || {
                e2e::gateway::agentctl(&[
                    "fleet",
                    "status",
                    "--kubeconfig",
                    &kubeconfig,
                    "-n",
                    &ns,
                    "--principal-metrics",
                    &metrics_url,
                    "-o",
                    output,
                ])
            }
        };
        let table = fleet("text")()?;
        assert!(
            table.contains(&clusters[0]) && table.contains(&clusters[1]),
            "{table}"
        );
        let json_fleet = fleet("json");
        let row = wait_until("fleet status shows cluster 1 connected", WAIT, || async {
            let rows: Value = serde_json::from_str(&json_fleet()?)?;
            Ok::<_, anyhow::Error>(
                rows.as_array()
                    .into_iter()
                    .flatten()
                    .find(|r| r["name"] == clusters[0].as_str() && r["connected"] == true)
                    .cloned(),
            )
        })
        .await?;
        assert_eq!(row["mode"], "managed", "{row}");
        assert_eq!(row["registered"], true, "{row}");
        let expiry = row["certExpiry"].as_str().unwrap_or_default();
        assert!(
            expiry
                .parse::<k8s_openapi::jiff::Timestamp>()
                .is_ok_and(|t| t > k8s_openapi::jiff::Timestamp::now()),
            "cert expiry in the future: {row}"
        );
        assert!(row["queueDepth"].is_u64(), "{row}");

        one.agent.stop();
        Ok(())
    }

    /// The add-on CSR path: a GitOpsCluster without the key fallback puts no agent key in its
    /// ManifestWork; the operator refuses add-on CSRs with another CN, from another cluster's identity,
    /// for server auth or with extra SANs (each with its reason, nothing signed), leaves CSRs of other
    /// signers alone, and signs the good one; the agent starts with its own key and that certificate,
    /// connects and gets hub Applications; deleting the GitOpsCluster offboards the cluster.
    #[tokio::test]
    async fn addon_csr_path_signs_only_the_good_csr_and_its_agent_connects_with_its_own_key(
    ) -> anyhow::Result<()> {
        let f = Fleet::start("operator_csr").await?;
        let (planes, hub, ctx, ns, clusters, gocs) =
            (f.planes, &f.hub, &f.ctx, &f.ns, &f.clusters, &f.gocs);
        let (mc_api, placements, decisions, spoke_ns) =
            (&f.mc_api, &f.placements, &f.decisions, &f.spoke_ns);
        let principal = &f.principal;
        // The CSR path: a GitOpsCluster without the key fallback; cluster 3's agent makes its key on
        // its side and gets its certificate signed through an add-on CSR.
        let c3 = ctx.unique("c3");
        mc_api.create(&PostParams::default(), &serde_json::from_value(
        json!({"apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster", "metadata": {"name": c3}, "spec": {"hubAcceptsClient": true}}),
    )?).await?;
        ensure_namespace(hub, &c3).await?;
        placements.create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement", "metadata": {"name": "addon", "namespace": ns}, "spec": {}}))?).await?;
        decisions.create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "PlacementDecision", "metadata": {"name": "addon-decision-1", "namespace": ns, "labels": {"cluster.open-cluster-management.io/placement": "addon"}}}))?).await?;
        set_decision(hub, ns, "addon-decision-1", &[&c3]).await?;
        gocs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "apps.open-cluster-management.io/v1alpha1", "kind": "GitOpsCluster",
            "metadata": {"name": "addon", "namespace": ns},
            "spec": {"placementRef": {"kind": "Placement", "name": "addon"}, "argoServer": {"argoNamespace": ns},
                     "argoCDAgentAddon": {"mode": "managed", "principalServerAddress": "127.0.0.1",
                                          "principalServerPort": principal.grpc_port.to_string(),
                                          "agentNamespace": spoke_ns}}
        }))?,
    )
    .await?;
        let work3 = wait_work(hub, &c3, |_| true).await?;
        assert!(
            payload_secret_text(&work3, AGENT_CLIENT_TLS_SECRET, TLS_KEY_KEY).is_none()
                && !serde_json::to_string(&work3.spec)?.contains("PRIVATE KEY"),
            "no agent key in a CSR-mode ManifestWork"
        );
        let ca3 = payload_secret_text(&work3, AGENT_CA_SECRET, CA_CERT_KEY)
            .ok_or_else(|| anyhow::anyhow!("payload lacks the CA"))?;

        // The add-on identity may create CSRs (OCM's registration grants this).
        let rbac_name = ctx.unique("addon-csr");
        let roles: Api<DynamicObject> = Api::all_with(
            hub.clone(),
            &resource(
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRole",
                "clusterroles",
            ),
        );
        roles.create(&PostParams::default(), &serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": rbac_name},
        "rules": [{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["create", "get", "list", "watch"]}]
    }))?).await?;
        let bindings: Api<DynamicObject> = Api::all_with(
            hub.clone(),
            &resource(
                "rbac.authorization.k8s.io",
                "v1",
                "ClusterRoleBinding",
                "clusterrolebindings",
            ),
        );
        bindings.create(&PostParams::default(), &serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": rbac_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": rbac_name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": ADDON_GROUP}]
    }))?).await?;

        // Refusals first (each with its reason, nothing signed), and a CSR of another signer.
        let hub_config = planes.hub.kube_config().await?;
        let client_usages = ["digital signature", "key encipherment", "client auth"];
        let (_, other_cn) = agent_key_and_csr(&clusters[0], &[])?;
        let (_, own) = agent_key_and_csr(&c3, &[])?;
        let (_, with_san) = agent_key_and_csr(&c3, &["evil.example.com"])?;
        let refusals = [
            (
                "cn",
                &c3,
                addon_user(&c3),
                ADDON_SIGNER,
                &client_usages[..],
                &other_cn,
                "subject CN",
            ),
            (
                "identity",
                &c3,
                addon_user(&clusters[0]),
                ADDON_SIGNER,
                &client_usages[..],
                &own,
                "requested by",
            ),
            (
                "server-auth",
                &c3,
                addon_user(&c3),
                ADDON_SIGNER,
                &["digital signature", "server auth"][..],
                &own,
                "server auth",
            ),
            (
                "san",
                &c3,
                addon_user(&c3),
                ADDON_SIGNER,
                &client_usages[..],
                &with_san,
                "subject alternative name",
            ),
        ];
        for (suffix, label, user, signer, usages, pem, _) in &refusals {
            submit_csr(
                &hub_config,
                &format!("{c3}-{suffix}"),
                label,
                user,
                signer,
                usages,
                pem,
            )
            .await?;
        }
        let other_signer = format!("{c3}-other-signer");
        submit_csr(
            &hub_config,
            &other_signer,
            &c3,
            &addon_user(&c3),
            "example.com/other-signer",
            &client_usages,
            &own,
        )
        .await?;
        let csrs: Api<CertificateSigningRequest> = Api::all(hub.clone());
        for (suffix, _, _, _, _, _, reason) in &refusals {
            let name = format!("{c3}-{suffix}");
            let csr = wait_until(&format!("CSR {name} denied"), WAIT, || async {
                Ok::<_, kube::Error>(
                    csrs.get_opt(&name)
                        .await?
                        .filter(|c| csr_outcome(c).0.is_some()),
                )
            })
            .await?;
            let (cond, cert) = csr_outcome(&csr);
            let (type_, _, message) = cond.unwrap();
            assert_eq!(type_, "Denied", "{name}: {message}");
            assert!(
                message.contains(reason),
                "{name}: {message:?} lacks {reason:?}"
            );
            assert!(cert.is_none(), "{name}: nothing signed");
        }

        // The good CSR: approved and signed; the agent starts with its own key and that certificate.
        let (key3, csr3) = agent_key_and_csr(&c3, &[])?;
        let good = format!("{c3}-agent");
        submit_csr(
            &hub_config,
            &good,
            &c3,
            &addon_user(&c3),
            ADDON_SIGNER,
            &client_usages,
            &csr3,
        )
        .await?;
        let signed = wait_until("add-on CSR signed", WAIT, || async {
            Ok::<_, kube::Error>(csrs.get_opt(&good).await?.and_then(|c| csr_outcome(&c).1))
        })
        .await?;
        let (cond, _) = csr_outcome(&csrs.get(&good).await?);
        assert_eq!(cond.unwrap().0, "Approved");
        let info = inspect(&signed)?;
        assert_eq!(info.subject_cn.as_deref(), Some(c3.as_str()));
        assert!(info.sans.is_empty() && !info.is_ca, "{info:?}");
        assert_eq!(
            csr_outcome(&csrs.get(&other_signer).await?),
            (None, None),
            "a CSR of another signer is left alone"
        );
        let spoke2 = planes.spokes[1].client().await?;
        apply_payload(&spoke2, &work3).await?;
        ensure_namespace(&spoke2, spoke_ns).await?;
        let agent3_dir = ctx.dir.join(format!("agent-{c3}"));
        std::fs::create_dir_all(&agent3_dir)?;
        std::fs::write(agent3_dir.join("tls.crt"), &signed)?;
        std::fs::write(agent3_dir.join("tls.key"), &key3)?;
        std::fs::write(agent3_dir.join("ca.crt"), &ca3)?;
        let (mut agent3, agent3_port) =
            start_agent(ctx, &c3, &planes.spokes[1].kubeconfig, &work3, &agent3_dir)?;
        wait_until(
            "agent with a CSR-signed certificate connected",
            WAIT,
            || async { Ok::<_, anyhow::Error>(connected(agent3_port).await.then_some(())) },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", agent3.log_tail(30)))?;
        let hub_apps3: Api<DynamicObject> =
            Api::namespaced_with(hub.clone(), &c3, &application_resource());
        hub_apps3
            .create(&PostParams::default(), &application("csr-app", &c3, "v1"))
            .await?;
        let spoke2_apps: Api<DynamicObject> =
            Api::namespaced_with(spoke2.clone(), spoke_ns, &application_resource());
        wait_until("hub app on spoke 2 (CSR path)", WAIT, || async {
            spoke2_apps.get_opt("csr-app").await
        })
        .await?;
        agent3.stop();
        gocs.delete("addon", &DeleteParams::default()).await?;
        let works3: Api<ManifestWork> = Api::namespaced(hub.clone(), &c3);
        wait_until("CSR-path cluster offboarded", WAIT, || async {
            Ok::<_, kube::Error>(
                works3
                    .get_opt(AGENT_WORK_NAME)
                    .await?
                    .is_none()
                    .then_some(()),
            )
        })
        .await?;
        for name in refusals
            .iter()
            .map(|r| format!("{c3}-{}", r.0))
            .chain([other_signer, good])
        {
            csrs.delete(&name, &DeleteParams::default()).await?;
        }
        roles.delete(&rbac_name, &DeleteParams::default()).await?;
        bindings
            .delete(&rbac_name, &DeleteParams::default())
            .await?;

        Ok(())
    }

    /// Removing a cluster from the PlacementDecision offboards it (ManifestWork and cluster Secret
    /// gone) and the GitOpsCluster is Ready with the one cluster left.
    #[tokio::test]
    async fn a_cluster_leaving_the_decision_is_offboarded() -> anyhow::Result<()> {
        let f = Fleet::start("operator_offboard").await?;
        let (hub, ns, clusters, gocs, secrets) = (&f.hub, &f.ns, &f.clusters, &f.gocs, &f.secrets);
        let mut one = f.onboard_first().await?;
        // Removing cluster 2 from the decision offboards it.
        set_decision(hub, ns, "all-decision-1", &[&clusters[0]]).await?;
        let works2: Api<ManifestWork> = Api::namespaced(hub.clone(), &clusters[1]);
        wait_until("cluster 2 offboarded", WAIT, || async {
            Ok::<_, kube::Error>(
                (works2.get_opt(AGENT_WORK_NAME).await?.is_none()
                    && secrets
                        .get_opt(&format!("cluster-{}", clusters[1]))
                        .await?
                        .is_none())
                .then_some(()),
            )
        })
        .await?;
        let ready = wait_goc(gocs, "fleet", "Ready after offboarding", |g| {
            condition(g, "Ready").is_some_and(|c| c.0 == "True")
        })
        .await?;
        assert_eq!(ready.status.unwrap().clusters.len(), 1);

        one.agent.stop();
        Ok(())
    }

    /// CA rotation (a new CA with another validity window): the agent's certificate in the
    /// ManifestWork, the principal's and the cluster Secret's CA are reissued; the principal and the
    /// agent pick up their new files without a restart (same PIDs) and the agent reconnects and gets
    /// hub Applications.
    #[tokio::test]
    async fn ca_rotation_reissues_everything_and_nobody_restarts() -> anyhow::Result<()> {
        let mut f = Fleet::start("operator_rotation").await?;
        let Onboarded {
            mut agent,
            agent_port,
            work: work1,
            dir: agent1_dir,
            hub_apps,
            spoke_apps,
        } = f.onboard_first().await?;
        let (hub, clusters, secrets, pki) = (&f.hub, &f.clusters, &f.secrets, &f.pki);
        let ca_secret = &f.ca_secret;
        let principal = &mut f.principal;
        // CA rotation (a new CA with another validity window): everything is reissued; the agent picks
        // up its new files and reconnects without a restart.
        let old_cert = payload_secret_text(&work1, AGENT_CLIENT_TLS_SECRET, TLS_CERT_KEY).unwrap();
        let new_ca = CertificateAuthority::generate("argocd-agent-ca", days(90))?;
        let mut rotated = ca_secret.clone();
        rotated.metadata.resource_version = None;
        rotated.data = Some(
            [
                (
                    "tls.crt".to_string(),
                    k8s_openapi::ByteString(new_ca.cert_pem().as_bytes().to_vec()),
                ),
                (
                    "tls.key".to_string(),
                    k8s_openapi::ByteString(new_ca.key_pem().into_bytes()),
                ),
            ]
            .into(),
        );
        secrets
            .replace("argocd-agent-ca", &PostParams::default(), &{
                let mut r = rotated;
                r.metadata.resource_version = secrets
                    .get("argocd-agent-ca")
                    .await?
                    .metadata
                    .resource_version;
                r
            })
            .await?;
        let work1 = wait_work(hub, &clusters[0], |w| {
            payload_secret_text(w, AGENT_CLIENT_TLS_SECRET, TLS_CERT_KEY)
                .is_some_and(|c| c != old_cert && new_ca.verify_issued(&c).is_ok())
        })
        .await?;
        wait_secret(secrets, "argocd-agent-principal-tls", |s| {
            new_ca.verify_issued(&secret_text(s, TLS_CERT_KEY)).is_ok()
        })
        .await?;
        wait_secret(secrets, &format!("cluster-{}", clusters[0]), |s| {
            secret_text(s, "config").contains(&{
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.encode(new_ca.cert_pem())
            })
        })
        .await?;
        let pids = (principal.process.pid(), agent.pid());
        let streams_before = connections(agent_port)
            .await
            .ok_or_else(|| anyhow::anyhow!("agent metrics lack argocd_agent_connections_total"))?;
        write_agent_files(&agent1_dir, &work1)?;
        write_principal_files(secrets, pki, new_ca.cert_pem()).await?;
        // No restart: the principal reloads its files, ends the streams authenticated under the old
        // CA, and the agent reconnects with its reloaded certificate.
        wait_until(
            "agent reconnected with its reissued certificate",
            WAIT,
            || async {
                Ok::<_, anyhow::Error>(
                    (connected(agent_port).await
                        && connections(agent_port).await.unwrap_or(0) > streams_before)
                        .then_some(()),
                )
            },
        )
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "{e}\n{}\n{}",
                agent.log_tail(30),
                principal.process.log_tail(30)
            )
        })?;
        assert_eq!(
            (principal.process.pid(), agent.pid()),
            pids,
            "neither the principal nor the agent was restarted"
        );
        assert!(principal.process.is_running());
        hub_apps
            .create(
                &PostParams::default(),
                &application("after-rotation", &clusters[0], "v1"),
            )
            .await?;
        wait_until("app after rotation on spoke 1", WAIT, || async {
            spoke_apps.get_opt("after-rotation").await
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", agent.log_tail(30)))?;
        assert!(agent.is_running(), "the agent was not restarted");
        assert_eq!(agent.pid(), pids.1);

        agent.stop();
        Ok(())
    }

    /// A CA Secret whose key was tampered with is reported (`CertificatesReady` False, `CAUnusable`,
    /// naming the Secret) and not silently replaced.
    #[tokio::test]
    async fn a_tampered_ca_is_reported_not_replaced() -> anyhow::Result<()> {
        let f = Fleet::start("operator_tampered_ca").await?;
        let (gocs, secrets) = (&f.gocs, &f.secrets);
        // Tampered CA: reported, not replaced.
        let mut tampered = secrets.get("argocd-agent-ca").await?;
        tampered.data.as_mut().unwrap().insert(
            "tls.key".into(),
            k8s_openapi::ByteString(b"not a key".to_vec()),
        );
        secrets
            .replace("argocd-agent-ca", &PostParams::default(), &tampered)
            .await?;
        let g = wait_goc(gocs, "fleet", "tampered CA reported", |g| {
            condition(g, "CertificatesReady").is_some_and(|c| c.0 == "False")
        })
        .await?;
        let (_, reason, message) = condition(&g, "CertificatesReady").unwrap();
        assert_eq!(reason, "CAUnusable");
        assert!(message.contains("argocd-agent-ca"), "{message}");
        assert_eq!(
            secret_text(&secrets.get("argocd-agent-ca").await?, "tls.key"),
            "not a key",
            "not silently replaced"
        );
        Ok(())
    }

    /// Bad input is reported in the status: a missing Placement, an invalid mode, a GitOpsCluster
    /// claiming a cluster another one holds (the older keeps it), a decision naming a cluster without
    /// a namespace; a GitOpsCluster naming an Argo CD namespace no principal serves is reported
    /// (ArgoServerNotFound) by the principal serving its own namespace, and not claimed.
    #[tokio::test]
    async fn bad_input_is_reported_in_the_status_and_unserved_gitopsclusters_are_not_claimed(
    ) -> anyhow::Result<()> {
        let f = Fleet::start("operator_bad_input").await?;
        let (hub, ctx, ns, clusters, gocs, secrets) =
            (&f.hub, &f.ctx, &f.ns, &f.clusters, &f.gocs, &f.secrets);
        // Bad input: a missing Placement, an invalid mode, a conflicting GitOpsCluster, a decision
        // naming a cluster without a namespace.
        let bad = |name: &str, placement: &str, mode: &str| -> anyhow::Result<GitOpsCluster> {
            Ok(serde_json::from_value(json!({
                "apiVersion": "apps.open-cluster-management.io/v1alpha1", "kind": "GitOpsCluster",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"placementRef": {"kind": "Placement", "name": placement}, "argoServer": {"argoNamespace": ns},
                         "argoCDAgentAddon": {"mode": mode, "principalServerAddress": "127.0.0.1", "principalServerPort": "1"}}
            }))?)
        };
        gocs.create(&PostParams::default(), &bad("missing", "nope", "managed")?)
            .await?;
        gocs.create(&PostParams::default(), &bad("badmode", "all", "sideways")?)
            .await?;
        gocs.create(&PostParams::default(), &bad("second", "all", "managed")?)
            .await?;
        // An Argo CD namespace no principal serves: nothing made for it; this principal, serving
        // the GitOpsCluster's own namespace, says so in its status (home_of_unserved).
        let mut foreign = bad("foreign", "all", "managed")?;
        foreign.spec.argo_server = Some(serde_json::from_value(
            json!({"argoNamespace": "kube-system"}),
        )?);
        gocs.create(&PostParams::default(), &foreign).await?;
        let g = wait_goc(gocs, "missing", "missing placement reported", |g| {
            condition(g, "PlacementResolved").is_some_and(|c| c.0 == "False")
        })
        .await?;
        let (_, reason, message) = condition(&g, "PlacementResolved").unwrap();
        assert_eq!(reason, "PlacementNotFound");
        assert!(message.contains("nope"), "{message}");
        let g = wait_goc(gocs, "badmode", "invalid mode reported", |g| {
            condition(g, "Ready").is_some_and(|c| c.1 == "InvalidMode")
        })
        .await?;
        assert!(condition(&g, "Ready").unwrap().2.contains("sideways"));
        // Nothing written for it: no cluster Secret of the operator in kube-system, while the
        // accepted GitOpsCluster's cluster Secret is in the principal's namespace (and, below, no
        // finalizer or status once passes that saw it have run).
        let managed_secrets = ListParams::default().labels(&format!(
            "{}={}",
            argocd_agent_operator::gitops::agent_work::MANAGED_BY_LABEL,
            argocd_agent_operator::gitops::agent_work::MANAGED_BY_OPERATOR
        ));
        assert!(Api::<Secret>::namespaced(hub.clone(), "kube-system")
            .list(&managed_secrets)
            .await?
            .items
            .is_empty());
        assert!(!secrets.list(&managed_secrets).await?.items.is_empty());
        let g = wait_goc(gocs, "second", "conflict reported", |g| {
            condition(g, "ClustersRegistered").is_some_and(|c| c.1 == "ClusterConflict")
        })
        .await?;
        assert!(g
            .status
            .unwrap()
            .clusters
            .iter()
            .any(|c| c.name == clusters[0] && c.phase == "Conflict"));
        let w = wait_work(hub, &clusters[0], |_| true).await?;
        assert_eq!(
            w.metadata.annotations.unwrap()["apps.open-cluster-management.io/gitopscluster"],
            format!("{ns}/fleet"),
            "the older GitOpsCluster keeps the cluster"
        );
        let ghost = ctx.unique("ghost");
        set_decision(hub, ns, "all-decision-1", &[&clusters[0], &ghost]).await?;
        let g = wait_goc(gocs, "fleet", "cluster without namespace reported", |g| {
            g.status.as_ref().is_some_and(|s| {
                s.clusters.iter().any(|c| {
                    c.name == ghost && c.phase == "Failed" && c.message.contains("does not exist")
                })
            })
        })
        .await?;
        assert_eq!(
            condition(&g, "ClustersRegistered").unwrap().1,
            "RegistrationFailed"
        );
        // That pass ran after "foreign" existed: reported, not claimed.
        let foreign = wait_goc(gocs, "foreign", "unserved namespace reported", |g| {
            condition(g, "ArgoServerVerified").is_some_and(|c| c.1 == "ArgoServerNotFound")
        })
        .await?;
        assert!(
            foreign.metadata.finalizers.unwrap_or_default().is_empty(),
            "a GitOpsCluster naming an Argo CD namespace no principal serves is not claimed"
        );
        for name in ["missing", "badmode", "second", "foreign"] {
            gocs.delete(name, &DeleteParams::default()).await?;
        }

        Ok(())
    }

    /// Deleting the GitOpsCluster offboards every cluster (finalizer): ManifestWorks and cluster
    /// Secrets gone, then the GitOpsCluster itself.
    #[tokio::test]
    async fn deleting_the_gitopscluster_offboards_everything() -> anyhow::Result<()> {
        let f = Fleet::start("operator_delete").await?;
        let (hub, clusters, gocs, secrets) = (&f.hub, &f.clusters, &f.gocs, &f.secrets);
        // Deleting the GitOpsCluster offboards everything (finalizer).
        gocs.delete("fleet", &DeleteParams::default()).await?;
        for c in clusters {
            let works: Api<ManifestWork> = Api::namespaced(hub.clone(), c);
            wait_until(
                &format!("GitOpsCluster deleted and the objects of {c} gone"),
                WAIT,
                || async {
                    Ok::<_, kube::Error>(
                        (gocs.get_opt("fleet").await?.is_none()
                            && works.get_opt(AGENT_WORK_NAME).await?.is_none()
                            && secrets.get_opt(&format!("cluster-{c}")).await?.is_none())
                        .then_some(()),
                    )
                },
            )
            .await?;
        }
        Ok(())
    }
}

/// Two principals, each with its embedded operator, in two namespaces of one hub, and one
/// GitOpsCluster for each (both in a third namespace, each naming its principal's namespace in
/// `spec.argoServer.argoNamespace`): each is reconciled by its principal alone. The principals'
/// CAs differ in validity, and each GitOpsCluster's `CertificatesReady` message carries the end of
/// its operator's CA, so a status written by the other operator would show the other date: every
/// status revision of both is watched while passes of both operators run (each touch of either
/// GitOpsCluster triggers a pass in both), and none may carry the other principal's CA, nor may a
/// principal create a cluster Secret or certificate for the other's GitOpsCluster.
#[tokio::test]
async fn two_principals_on_one_hub_each_reconcile_only_the_gitopscluster_naming_their_argo_cd_namespace(
) -> anyhow::Result<()> {
    use futures::StreamExt;
    use kube::runtime::watcher;

    let planes = shared_planes().await;
    let ctx = TestContext::new("operator_two_principals")?;
    let hub = planes.hub.client().await?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let names = ["a", "b"];
    let namespaces = [ctx.unique("hub-a"), ctx.unique("hub-b")];
    // Each principal's CA, told apart by its end of validity.
    let mut ca_ends = Vec::new();
    for (ns, validity) in namespaces.iter().zip([100, 200]) {
        ensure_namespace(&hub, ns).await?;
        let ca = CertificateAuthority::generate("argocd-agent-ca", days(validity))?;
        Api::<Secret>::namespaced(hub.clone(), ns)
            .create(&PostParams::default(), &ca_secret(ns, &ca))
            .await?;
        ca_ends.push(ca.info().not_after.to_rfc3339());
    }
    let mut principals = Vec::new();
    for (name, ns) in names.iter().zip(&namespaces) {
        principals.push(
            Principal::start(
                name,
                &ctx.dir,
                &planes.hub,
                &pki,
                ns,
                &["--enable-operator=true"],
            )
            .await?,
        );
    }
    // The GitOpsClusters and their Placement (decided: no cluster) in a namespace of neither.
    let gitops_ns = ctx.unique("gitops");
    ensure_namespace(&hub, &gitops_ns).await?;
    let dynamic = |kind: &str, plural: &str| {
        Api::<DynamicObject>::namespaced_with(
            hub.clone(),
            &gitops_ns,
            &resource(
                "cluster.open-cluster-management.io",
                "v1beta1",
                kind,
                plural,
            ),
        )
    };
    dynamic("Placement", "placements")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement",
            "metadata": {"name": "none", "namespace": gitops_ns}, "spec": {}}))?,
        )
        .await?;
    dynamic("PlacementDecision", "placementdecisions")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "PlacementDecision",
            "metadata": {"name": "none-decision-1", "namespace": gitops_ns,
                         "labels": {"cluster.open-cluster-management.io/placement": "none"}}}))?,
        )
        .await?;
    let gocs: Api<GitOpsCluster> = Api::namespaced(hub.clone(), &gitops_ns);
    // Every status revision of both, from before they exist.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let watch = tokio::spawn({
        let (gocs, seen) = (gocs.clone(), seen.clone());
        async move {
            let mut events = watcher(gocs, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(g) | watcher::Event::InitApply(g)) = event {
                    if let Some((_, _, message)) = condition(&g, "CertificatesReady") {
                        seen.lock()
                            .unwrap()
                            .push((g.metadata.name.unwrap_or_default(), message));
                    }
                }
            }
        }
    });
    for (name, (ns, principal)) in names.iter().zip(namespaces.iter().zip(&principals)) {
        gocs.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "apps.open-cluster-management.io/v1alpha1", "kind": "GitOpsCluster",
                "metadata": {"name": name, "namespace": gitops_ns},
                "spec": {"placementRef": {"kind": "Placement", "name": "none"},
                         "argoServer": {"argoNamespace": ns},
                         "argoCDAgentAddon": {"mode": "managed", "principalServerAddress": "127.0.0.1",
                                              "principalServerPort": principal.grpc_port.to_string()}}
            }))?,
        )
        .await?;
    }
    for (name, end) in names.iter().zip(&ca_ends) {
        let g = wait_goc(
            &gocs,
            name,
            &format!("GitOpsCluster {name} reconciled"),
            |g| condition(g, "CertificatesReady").is_some_and(|c| c.0 == "True"),
        )
        .await?;
        let (_, _, message) = condition(&g, "CertificatesReady").unwrap();
        assert!(
            message.contains(end.as_str()),
            "{name}: {message} (its CA ends {end})"
        );
    }
    // Passes of both operators over both GitOpsClusters: every touch is an event for both.
    for round in 0..6 {
        for name in names {
            gocs.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"e2e/touch": round.to_string()}}}),
                ),
            )
            .await?;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A foreign write would differ from the status in place (the other CA's date), so it would
    // happen on every one of these passes; the watch sees the last ones within this grace.
    tokio::time::sleep(Duration::from_secs(2)).await;
    watch.abort();
    let seen = seen.lock().unwrap().clone();
    for (name, other_end) in names.iter().zip(ca_ends.iter().rev()) {
        let revisions: Vec<&String> = seen
            .iter()
            .filter(|(n, _)| n.as_str() == *name)
            .map(|(_, m)| m)
            .collect();
        assert!(!revisions.is_empty(), "{name}: no status revision seen");
        for message in revisions {
            assert!(
                !message.contains(other_end.as_str()),
                "{name}'s status was written by the other principal's operator: {message}"
            );
        }
    }
    for name in names {
        let g = gocs.get(name).await?;
        assert_eq!(
            g.metadata.finalizers.unwrap_or_default(),
            vec![format!(
                "{}-{}",
                argocd_agent_operator::gitops::FINALIZER,
                namespaces[names.iter().position(|n| *n == name).unwrap()]
            )],
            "{name}: one finalizer, its owner's"
        );
    }
    // Each principal's certificates in its own namespace only, from its own CA.
    for (ns, end) in namespaces.iter().zip(&ca_ends) {
        let secrets: Api<Secret> = Api::namespaced(hub.clone(), ns);
        let tls = wait_secret(&secrets, "argocd-agent-principal-tls", |_| true).await?;
        let ca = inspect(&secret_text(
            &secrets.get("argocd-agent-ca").await?,
            TLS_CERT_KEY,
        ))?;
        assert_eq!(ca.not_after.to_rfc3339(), *end, "{ns}: its CA was kept");
        assert!(inspect(&secret_text(&tls, TLS_CERT_KEY))?.not_after <= ca.not_after);
    }
    for name in names {
        gocs.delete(name, &DeleteParams::default()).await?;
    }
    wait_until(
        "both GitOpsClusters released by their operators",
        WAIT,
        || async {
            let left = gocs.list(&ListParams::default()).await?.items.len();
            Ok::<_, kube::Error>((left == 0).then_some(()))
        },
    )
    .await?;
    drop(principals);
    Ok(())
}
