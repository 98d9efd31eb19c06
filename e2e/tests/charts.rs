//! The Helm charts and container images as users get them, through the real `helm` CLI
//! (`e2e::helm`, built by `hack/peers.sh`): each chart is linted (`helm lint --strict`) and rendered
//! (`helm template`) for the hub plane's Kubernetes version, and the output is sent to that real
//! kube-apiserver with `kubectl apply --dry-run=server`, so every object is admitted and validated
//! by the control plane without being stored. The charts' RBAC must equal the rules kept beside
//! the code (`principal/rbac.yaml`, `agent/rbac.yaml`), bad values must be refused by
//! `values.schema.json` with the offending key named, and the Dockerfiles must pass hadolint
//! (installed by `hack/install-chart-tools.sh`) and the image checklist.
//!
//! The charts are also run for real: `helm install` of both charts, then the pod runner
//! (`e2e::pod_runner`, a kubelet in bubblewrap sandboxes) starts the Deployments Helm created with
//! exactly what they say (command, environment, Secret volumes, the ServiceAccount's TokenRequest
//! token in-cluster, read-only root) through a managed Application round trip that the spoke's real
//! Argo CD syncs from the local Git server, its real status back on the hub; any request the
//! apiserver's audit log shows refused (403) fails the test, naming verb and resource.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use argocd_agent_operator::gitops::crd::GitOpsCluster;
use argocd_agent_operator::pki::inspect;
use e2e::argocd::ArgoCd;
use e2e::binaries::workspace_root;
use e2e::discovery::{
    create_endpointless_gitopscluster, register_loopback_node, wait_node_port_written, DISCOVERED,
};
use e2e::gateway::{agentctl, application_resource, ensure_namespace, http_get, text, Agent, Pki};
use e2e::git_server::{demo_manifests, GitServer};
use e2e::helm::{create_principal_secrets, create_secret, installed_deployment, Helm, Release};
use e2e::ocm::{install_crds, CrdSide};
use e2e::pod_runner::{service, Image, Pod, PodRunner, SERVICE_ACCOUNT_DIR};
use e2e::scenario::{demo_application, wait_greeting, wait_synced};
use e2e::{shared_planes, wait_until, ControlPlane, TestContext};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PodTemplateSpec, Secret, Service, ServiceAccount,
};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::{json, Value};

const PRINCIPAL_CHART: &str = "charts/argocd-agent-principal";
const AGENT_CHART: &str = "charts/argocd-agent-agent";

/// Where `hack/install-chart-tools.sh` put hadolint.
fn chart_tools() -> PathBuf {
    std::env::var_os("CHART_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/argocd-agent-rs/chart-tools")
        })
}

/// `helm lint --strict` and `helm template` of `chart` as release `argocd-agent` in `namespace`
/// with `values`, for Kubernetes `kube_version`; Ok(manifest) or Err(Helm's message).
fn render(
    dir: &Path,
    chart: &str,
    namespace: &str,
    values: &str,
    kube_version: Option<&str>,
) -> Result<String, String> {
    render_as(dir, chart, "argocd-agent", namespace, values, kube_version)
}

/// [`render`] as release `release`.
fn render_as(
    dir: &Path,
    chart: &str,
    release: &str,
    namespace: &str,
    values: &str,
    kube_version: Option<&str>,
) -> Result<String, String> {
    let helm = Helm::new(dir, None).expect("the helm peer is built (hack/peers.sh helm)");
    let release = Release::new(release, namespace, workspace_root().join(chart), values);
    helm.lint(&release).map_err(|e| e.to_string())?;
    helm.template(&release, kube_version)
        .map_err(|e| e.to_string())
}

/// The rendered manifest's objects.
fn objects(manifest: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(manifest)
        .filter_map(|doc| {
            let v: Value = serde::Deserialize::deserialize(doc).expect("rendered YAML parses");
            (!v.is_null()).then_some(v)
        })
        .collect()
}

fn of_kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

/// `kubectl --kubeconfig <kubeconfig> <args>`; Ok(stdout) or Err(stdout + stderr).
fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .output()
        .map_err(|e| format!("cannot run kubectl (apt-get install kubectl): {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `kubectl apply [--dry-run=server]` of `manifest` against the plane behind `kubeconfig`.
fn apply(dir: &Path, kubeconfig: &Path, manifest: &str, dry_run: bool) -> Result<String, String> {
    let file = dir.join(format!("rendered-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, manifest).expect("write manifest");
    let file = file.to_str().expect("utf-8 path");
    let mut args = vec!["apply", "-o", "name", "-f", file];
    if dry_run {
        args.push("--dry-run=server");
    }
    kubectl(kubeconfig, &args)
}

/// One granted (apiGroup, resource, verb, resourceName) — resourceName "" = any object.
type Grant = (String, String, String, String);

/// The grants a list of RBAC rules makes; a rule's `resourceNames` narrow it, so they are part of
/// each grant (a chart granting `signers approve` for every signer must not pass for one).
fn grants(rules: &Value) -> BTreeSet<Grant> {
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = BTreeSet::new();
    for rule in rules.as_array().into_iter().flatten() {
        let mut names = strs(&rule["resourceNames"]);
        if names.is_empty() {
            names.push(String::new());
        }
        for g in strs(&rule["apiGroups"]) {
            for r in strs(&rule["resources"]) {
                for v in strs(&rule["verbs"]) {
                    for n in &names {
                        out.insert((g.clone(), r.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
    }
    out
}

/// The grants of every rendered object of `kind` together.
fn rendered_grants(objs: &[Value], kind: &str) -> BTreeSet<Grant> {
    of_kind(objs, kind)
        .into_iter()
        .flat_map(|o| grants(&o["rules"]))
        .collect()
}

/// The rules file beside a binary's code (`principal/rbac.yaml`, `agent/rbac.yaml`).
fn rules_beside_code(path: &str) -> Value {
    let text = std::fs::read_to_string(workspace_root().join(path)).expect("rbac list");
    serde_norway::from_str(&text).expect("rbac list is YAML")
}

const AGENT_VALUES: &str = "agent: {serverAddress: \"principal.example.com:443\"}\n";

/// An agent keeping Applications in their hub namespaces, creating missing ones.
const DESTINATION_AGENT_VALUES: &str = "agent: {serverAddress: \"principal.example.com:443\", \
    destinationBasedMapping: true, createNamespace: true, allowedNamespaces: [\"apps-*\"]}\n";

#[tokio::test]
async fn charts_pass_a_server_side_dry_run_on_a_real_control_plane() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let ctx = TestContext::new("charts-dry-run")?;
    let hub = planes.hub.client().await?;
    let kube_version = hub.apiserver_version().await?.git_version;
    let cases = [
        (PRINCIPAL_CHART, "default values", String::new()),
        (
            PRINCIPAL_CHART,
            "own Secrets, annotated LoadBalancer, PDB by maxUnavailable, ServiceMonitor off",
            "service:\n  type: LoadBalancer\n  annotations: {service.beta.kubernetes.io/aws-load-balancer-type: nlb}\n  loadBalancerSourceRanges: [10.0.0.0/8]\n  externalTrafficPolicy: Local\ntls: {secretName: my-tls, caSecretName: my-ca, caKey: ca.crt}\njwt: {secretName: my-jwt}\nresourceProxy: {tlsSecretName: \"\"}\npodDisruptionBudget: {maxUnavailable: 1}\nprincipal: {allowedNamespaces: [\"team-*\"], logFormat: text}\n".to_string(),
        ),
        (
            PRINCIPAL_CHART,
            "ClusterIP, proxies off, 3 replicas",
            "replicaCount: 3\nservice: {type: ClusterIP}\nresourceProxy: {enabled: false}\nredisProxy: {enabled: false}\n".to_string(),
        ),
        (AGENT_CHART, "managed, persistent queue", AGENT_VALUES.to_string()),
        (
            AGENT_CHART,
            "managed, destination-based mapping",
            DESTINATION_AGENT_VALUES.to_string(),
        ),
        (
            PRINCIPAL_CHART,
            "Redis TLS (hub Redis CA and the proxy's certificate read from their Secrets)",
            "redisProxy: {tls: {enabled: true}}\n".to_string(),
        ),
        (
            PRINCIPAL_CHART,
            "destination-based mapping",
            "principal: {destinationBasedMapping: true, allowedNamespaces: [\"apps-*\"]}\n"
                .to_string(),
        ),
        (
            AGENT_CHART,
            "autonomous, emptyDir queue",
            "agent: {mode: autonomous, serverAddress: \"10.1.2.3:8443\", tlsServerName: principal.hub}\nqueue: {persistence: {enabled: false}}\n".to_string(),
        ),
    ];
    for (chart, case, values) in &cases {
        let ns = ctx.unique("chart");
        ensure_namespace(&hub, &ns).await?;
        let manifest = render(&ctx.dir, chart, &ns, values, Some(&kube_version))
            .unwrap_or_else(|e| panic!("{chart} ({case}) does not render:\n{e}"));
        let admitted =
            apply(&ctx.dir, &planes.hub.kubeconfig, &manifest, true).unwrap_or_else(|e| {
                panic!("{chart} ({case}) refused by the kube-apiserver:\n{e}\n{manifest}")
            });
        // Every rendered object was admitted (kubectl prints one line per object).
        let rendered = objects(&manifest).len();
        assert_eq!(
            admitted.lines().filter(|l| l.contains('/')).count(),
            rendered,
            "{chart} ({case}): {rendered} objects rendered, admitted:\n{admitted}"
        );
        // The control plane kept nothing: it was a dry run.
        let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
            kube::Api::namespaced(hub.clone(), &ns);
        assert!(deployments
            .list(&Default::default())
            .await?
            .items
            .is_empty());
    }
    Ok(())
}

/// The release name whose Service is upstream's fixed `argocd-agent-principal` (the chart's full
/// name is the release name when that contains the chart's name).
const UPSTREAM_NAMED_RELEASE: &str = "argocd-agent-principal";

#[tokio::test]
async fn chart_rbac_grants_exactly_the_rules_kept_beside_the_code() {
    let ctx = TestContext::new("charts-rbac").unwrap();
    // Under the release name that gives the principal Service upstream's name, which is
    // --operator-principal-service's default and the name principal/rbac.yaml lists.
    let render_principal = |values: &str| {
        objects(
            &render_as(
                &ctx.dir,
                PRINCIPAL_CHART,
                UPSTREAM_NAMED_RELEASE,
                "argocd",
                values,
                None,
            )
            .unwrap(),
        )
    };
    let principal = render_principal("");
    let listed = rules_beside_code("principal/rbac.yaml");
    // The operator is on by default: its rules join the principal's own.
    assert_eq!(
        rendered_grants(&principal, "ClusterRole"),
        grants(&listed["cluster"])
            .union(&grants(&listed["operator"]))
            .cloned()
            .collect::<BTreeSet<Grant>>(),
        "principal ClusterRole differs from principal/rbac.yaml `cluster` + `operator`"
    );
    let without_operator = render_principal("operator: {enabled: false}\n");
    assert_eq!(
        rendered_grants(&without_operator, "ClusterRole"),
        grants(&listed["cluster"]),
        "principal ClusterRole without the operator differs from principal/rbac.yaml `cluster`"
    );
    assert_eq!(
        rendered_grants(&principal, "Role"),
        grants(&listed["namespace"])
            .union(&grants(&listed["operatorNamespace"]))
            .cloned()
            .collect::<BTreeSet<Grant>>(),
        "principal Role differs from principal/rbac.yaml `namespace` + `operatorNamespace`"
    );
    assert_eq!(
        rendered_grants(&without_operator, "Role"),
        grants(&listed["namespace"]),
        "principal Role without the operator differs from principal/rbac.yaml `namespace`"
    );
    // Positive control for the split: the operator's own grants are really absent without it.
    for operator_only in [
        (
            String::new(),
            "services".into(),
            "get".into(),
            UPSTREAM_NAMED_RELEASE.into(),
        ),
        (
            String::new(),
            "secrets".into(),
            "create".into(),
            String::new(),
        ),
        (
            String::new(),
            "secrets".into(),
            "delete".into(),
            String::new(),
        ),
        (
            "coordination.k8s.io".into(),
            "leases".into(),
            "update".into(),
            "argocd-agent-operator".into(),
        ),
    ] {
        assert!(
            rendered_grants(&principal, "Role").contains(&operator_only),
            "{operator_only:?} granted with the operator"
        );
        assert!(
            !rendered_grants(&without_operator, "Role").contains(&operator_only),
            "{operator_only:?} granted without the operator"
        );
    }

    // Under any other release name the operator reads that release's Service: the flag the
    // Deployment sets and the one Service name the Role grants are both the rendered Service's.
    for release in ["hub", "argocd-agent", "team-a-gitops"] {
        let objs =
            objects(&render_as(&ctx.dir, PRINCIPAL_CHART, release, "argocd", "", None).unwrap());
        let grpc_service = of_kind(&objs, "Service")
            .into_iter()
            .find(|s| s["spec"]["ports"][0]["name"] == "grpc")
            .and_then(|s| s["metadata"]["name"].as_str())
            .expect("the agent-facing Service")
            .to_owned();
        assert_eq!(
            env_value(&objs, "ARGOCD_PRINCIPAL_OPERATOR_PRINCIPAL_SERVICE")
                .and_then(|e| e["value"].as_str()),
            Some(grpc_service.as_str()),
            "release {release}: --operator-principal-service names the chart's Service"
        );
        let services: BTreeSet<Grant> = rendered_grants(&objs, "Role")
            .into_iter()
            .filter(|(_, r, _, _)| r == "services")
            .collect();
        assert_eq!(
            services,
            BTreeSet::from([(String::new(), "services".into(), "get".into(), grpc_service)]),
            "release {release}: the Role grants get on the chart's Service only"
        );
    }

    // The Secrets the principal reads its TLS material and JWT key from: get on exactly the
    // names the values give (here without the operator, whose own names would join them).
    let own_secrets = render_principal(
        "tls: {secretName: my-tls, caSecretName: my-ca}\njwt: {secretName: my-jwt}\n\
         resourceProxy: {tlsSecretName: \"\"}\noperator: {enabled: false}\n",
    );
    let read: BTreeSet<String> = rendered_grants(&own_secrets, "Role")
        .into_iter()
        .filter(|(_, r, v, _)| r == "secrets" && v == "get")
        .map(|(_, _, _, name)| name)
        .collect();
    assert_eq!(
        read,
        BTreeSet::from(["my-ca", "my-jwt", "my-tls"].map(String::from)),
        "the Role grants get on the values' Secret names only"
    );

    // No Secret is granted cluster-wide: the operator's cluster Secrets live in the release
    // namespace and in a Role per further Argo CD namespace (duplicates and the release
    // namespace itself get none), and only with the operator on.
    assert!(
        !rendered_grants(&principal, "ClusterRole")
            .iter()
            .any(|(_, r, _, _)| r == "secrets"),
        "the principal's ClusterRole grants Secrets"
    );
    let argocd_roles = |values: &str| -> BTreeSet<(String, BTreeSet<Grant>)> {
        let objs = objects(&render(&ctx.dir, PRINCIPAL_CHART, "argocd", values, None).unwrap());
        of_kind(&objs, "Role")
            .into_iter()
            .filter(|r| r["metadata"]["namespace"] != "argocd")
            .map(|r| {
                (
                    r["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    grants(&r["rules"]),
                )
            })
            .collect()
    };
    let extra =
        "operator: {argocdNamespace: gitops, extraArgocdNamespaces: [team-a, gitops, argocd]}\n";
    let for_clusters = grants(&listed["argocdNamespaces"]);
    assert_eq!(
        argocd_roles(extra),
        BTreeSet::from([
            ("gitops".to_owned(), for_clusters.clone()),
            ("team-a".to_owned(), for_clusters),
        ]),
        "a Role per further Argo CD namespace, as principal/rbac.yaml `argocdNamespaces`"
    );
    assert!(
        argocd_roles("operator: {enabled: false, extraArgocdNamespaces: [team-a]}\n").is_empty(),
        "no operator, no Role for its cluster Secrets"
    );

    let agent = objects(&render(&ctx.dir, AGENT_CHART, "argocd", AGENT_VALUES, None).unwrap());
    let listed = rules_beside_code("agent/rbac.yaml");
    // By default the only cluster-wide grant is the live view's reads.
    assert_eq!(
        rendered_grants(&agent, "ClusterRole"),
        grants(&listed["liveView"]),
        "agent live view ClusterRole differs from agent/rbac.yaml `liveView`"
    );
    let agent_values = |extra: &str| {
        objects(
            &render(
                &ctx.dir,
                AGENT_CHART,
                "argocd",
                &format!("{AGENT_VALUES}{extra}\n"),
                None,
            )
            .unwrap(),
        )
    };
    assert!(
        of_kind(&agent_values("liveView: {enabled: false}"), "ClusterRole").is_empty(),
        "without the live view and the web terminal the agent needs nothing cluster-wide"
    );
    let with_writes: BTreeSet<Grant> = grants(&listed["liveView"])
        .union(&grants(&listed["liveViewWrite"]))
        .cloned()
        .collect();
    assert_eq!(
        rendered_grants(&agent_values("liveView: {write: true}"), "ClusterRole"),
        with_writes,
        "agent live view ClusterRole with writes differs from agent/rbac.yaml `liveView` + `liveViewWrite`"
    );
    assert_eq!(
        rendered_grants(
            &agent_values("liveView: {enabled: false}\nterminal: {enabled: true}"),
            "ClusterRole"
        ),
        grants(&listed["terminal"]),
        "agent terminal ClusterRole differs from agent/rbac.yaml `terminal`"
    );
    assert_eq!(
        rendered_grants(&agent, "Role"),
        grants(&listed["namespace"]),
        "agent Role differs from agent/rbac.yaml `namespace`"
    );
    // Destination-based mapping: the same Role, and cluster-wide Applications and namespaces.
    let placed = objects(
        &render(
            &ctx.dir,
            AGENT_CHART,
            "argocd",
            DESTINATION_AGENT_VALUES,
            None,
        )
        .unwrap(),
    );
    assert_eq!(
        rendered_grants(&placed, "Role"),
        grants(&listed["namespace"]),
        "agent Role differs from agent/rbac.yaml `namespace`"
    );
    assert_eq!(
        rendered_grants(&placed, "ClusterRole")
            .difference(&grants(&listed["liveView"]))
            .cloned()
            .collect::<BTreeSet<Grant>>(),
        grants(&listed["destinationMapping"]),
        "agent ClusterRole differs from agent/rbac.yaml `destinationMapping`"
    );
    // No wildcard anywhere but the live view's ClusterRole, whose reach the agent's code narrows
    // to tracked objects.
    for (g, r, v, n) in rendered_grants(&principal, "ClusterRole")
        .into_iter()
        .chain(rendered_grants(&principal, "Role"))
        .chain(rendered_grants(&agent, "Role"))
    {
        assert!(
            g != "*" && r != "*" && v != "*" && n != "*",
            "wildcard grant {g}/{r}/{v}/{n}"
        );
    }
    // Signing is limited to the add-on's signer (operator/src/gitops/csr.rs ADDON_SIGNER).
    for (g, r, v, n) in rendered_grants(&principal, "ClusterRole") {
        if g == "certificates.k8s.io" && r == "signers" {
            assert_eq!(
                n, "open-cluster-management.io/argocd-agent-addon",
                "signers/{v} granted beyond the add-on signer"
            );
        }
    }
    // Cluster-scoped objects, and those the chart puts in namespaces other than its own (the
    // operator's Roles in further Argo CD namespaces), carry the release namespace in their names:
    // the same release installed in two namespaces makes no clashing ClusterRole, Role or binding.
    for (chart, values) in [
        (
            PRINCIPAL_CHART,
            "operator: {extraArgocdNamespaces: [shared]}\n".to_string(),
        ),
        (
            AGENT_CHART,
            format!("{DESTINATION_AGENT_VALUES}liveView: {{write: true}}\nterminal: {{enabled: true}}\n"),
        ),
    ] {
        let cluster_scoped = |namespace: &str| -> BTreeSet<String> {
            objects(&render(&ctx.dir, chart, namespace, &values, None).unwrap())
                .iter()
                .filter(|o| {
                    o["kind"] == "ClusterRole"
                        || o["kind"] == "ClusterRoleBinding"
                        || o["metadata"]["namespace"].as_str().is_some_and(|n| n != namespace)
                })
                .map(|o| {
                    format!(
                        "{}/{}/{}",
                        o["kind"],
                        o["metadata"]["namespace"].as_str().unwrap_or_default(),
                        o["metadata"]["name"]
                    )
                })
                .collect()
        };
        let (a, b) = (cluster_scoped("team-a"), cluster_scoped("team-b"));
        assert!(
            !a.is_empty() && a.is_disjoint(&b),
            "{chart}: cluster-scoped names shared between namespaces: {a:?} / {b:?}"
        );
    }
    // Bindings name the chart's ServiceAccount in the release namespace.
    for b in of_kind(&principal, "ClusterRoleBinding")
        .into_iter()
        .chain(of_kind(&principal, "RoleBinding"))
    {
        assert_eq!(b["subjects"][0]["kind"], "ServiceAccount");
        assert_eq!(b["subjects"][0]["namespace"], "argocd");
        assert_eq!(
            b["subjects"][0]["name"],
            of_kind(&principal, "ServiceAccount")[0]["metadata"]["name"]
        );
    }
}

#[tokio::test]
async fn rendered_pods_are_hardened_probed_and_highly_available() {
    let ctx = TestContext::new("charts-pods").unwrap();
    let principal = objects(
        &render(
            &ctx.dir,
            PRINCIPAL_CHART,
            "argocd",
            "podDisruptionBudget: {enabled: true}\n",
            None,
        )
        .unwrap(),
    );
    let agent = objects(&render(&ctx.dir, AGENT_CHART, "argocd", AGENT_VALUES, None).unwrap());
    for (objs, replicas) in [(&principal, 2), (&agent, 1)] {
        let deploy = of_kind(objs, "Deployment")[0];
        assert_eq!(deploy["spec"]["replicas"], replicas);
        let pod = &deploy["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let c = &pod["containers"][0];
        // The binaries take an empty variable as a value ("" is no byte size, duration or
        // address): unset settings are left out, never rendered empty.
        for e in c["env"].as_array().unwrap() {
            assert!(e["value"] != "", "empty environment variable {}", e["name"]);
        }
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        // The agent's TLS material is mounted read-only from Secrets (a CA's private key never
        // is); the principal's is read through the API, nothing is mounted (so a fresh install
        // is not stuck on a missing Secret volume).
        for m in c["volumeMounts"].as_array().unwrap() {
            if m["mountPath"].as_str().unwrap().starts_with("/app/config") {
                assert_eq!(m["readOnly"], true, "{m}");
            }
        }
        let volumes = pod["volumes"].as_array().unwrap();
        if std::ptr::eq(objs, &principal) {
            assert!(
                volumes.iter().all(|v| v["secret"].is_null()),
                "no Secret volume: {volumes:?}"
            );
            for (name, secret) in [
                (
                    "ARGOCD_PRINCIPAL_TLS_SECRET_NAME",
                    "argocd-agent-principal-tls",
                ),
                ("ARGOCD_PRINCIPAL_TLS_CA_SECRET_NAME", "argocd-agent-ca"),
                ("ARGOCD_PRINCIPAL_JWT_SECRET_NAME", "argocd-agent-jwt"),
                (
                    "ARGOCD_PRINCIPAL_RESOURCE_PROXY_SECRET_NAME",
                    "argocd-agent-resource-proxy-tls",
                ),
            ] {
                assert_eq!(
                    env_value(objs, name).map(|e| &e["value"]),
                    Some(&json!(secret)),
                    "{name}"
                );
            }
        } else {
            let ca = volumes.iter().find(|v| v["name"] == "ca").unwrap();
            assert_eq!(ca["secret"]["items"].as_array().unwrap().len(), 1);
        }
    }
    let pdb = of_kind(&principal, "PodDisruptionBudget");
    assert_eq!(pdb.len(), 1);
    assert_eq!(pdb[0]["spec"]["minAvailable"], 1);
    let services: Vec<&str> = of_kind(&principal, "Service")
        .iter()
        .map(|s| s["spec"]["ports"][0]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        services,
        ["grpc", "resource-proxy", "redis-proxy", "metrics"]
    );
    assert_eq!(
        of_kind(&principal, "Service")[0]["spec"]["type"],
        "LoadBalancer"
    );
    // The agent's queue survives restarts on a PVC kept across uninstalls.
    let pvc = of_kind(&agent, "PersistentVolumeClaim");
    assert_eq!(
        pvc[0]["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    // The principal chart ships the generated CRDs.
    assert!(!of_kind(&principal, "CustomResourceDefinition").is_empty());
}

#[tokio::test]
async fn bad_values_are_refused_naming_the_key() {
    let ctx = TestContext::new("charts-bad-values").unwrap();
    let cases = [
        (PRINCIPAL_CHART, "replicaCount: 0\n", "replicaCount"),
        (PRINCIPAL_CHART, "service: {type: Ingress}\n", "type"),
        // The principal reads the CA from tls.crt/ca.crt and the JWT key from jwt.key only.
        (PRINCIPAL_CHART, "tls: {caKey: bundle.pem}\n", "caKey"),
        (PRINCIPAL_CHART, "jwt: {key: signing.pem}\n", "key"),
        (
            PRINCIPAL_CHART,
            "securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: false}\n",
            "readOnlyRootFilesystem",
        ),
        (
            PRINCIPAL_CHART,
            "principal: {tlsMinVersion: tls1.0}\n",
            "tlsMinVersion",
        ),
        (PRINCIPAL_CHART, "replicas: 2\n", "replicas"),
        // Two active principals would serve the same agents.
        (
            PRINCIPAL_CHART,
            "ha: {enabled: false}\n",
            "ha.enabled must be true",
        ),
        (
            PRINCIPAL_CHART,
            "replicaCount: 3\nha: {enabled: false}\n",
            "ha.enabled must be true",
        ),
        (PRINCIPAL_CHART, "ha: {leaseName: Bad_Name}\n", "leaseName"),
        (
            PRINCIPAL_CHART,
            "operator: {agentLiveView: {enabled: false, write: true}}\n",
            "operator.agentLiveView.write needs operator.agentLiveView.enabled",
        ),
        (
            PRINCIPAL_CHART,
            "redisProxy: {tls: {enabled: true, caSecretName: \"\"}}\n",
            "redisProxy.tls.caSecretName is required",
        ),
        (
            PRINCIPAL_CHART,
            "tracing: {otlpAddress: \"collector:4317/v1/traces\"}\n",
            "otlpAddress",
        ),
        (
            AGENT_CHART,
            "agent: {serverAddress: \"hub:443\"}\ntracing: {otlpAddress: \"no port\"}\n",
            "otlpAddress",
        ),
        (AGENT_CHART, "", "agent.serverAddress is required"),
        (
            AGENT_CHART,
            "agent: {serverAddress: \"https://hub:443\"}\n",
            "serverAddress",
        ),
        (
            AGENT_CHART,
            "agent: {mode: hybrid, serverAddress: \"hub:443\"}\n",
            "mode",
        ),
        (
            AGENT_CHART,
            "agent: {onApplicationRecreate: restart, serverAddress: \"hub:443\"}\n",
            "onApplicationRecreate",
        ),
        (
            AGENT_CHART,
            "agent: {sourceUidMismatchPolicy: merge, serverAddress: \"hub:443\"}\n",
            "sourceUidMismatchPolicy",
        ),
    ];
    for (chart, values, key) in cases {
        match render(&ctx.dir, chart, "argocd", values, None) {
            Ok(_) => panic!("{chart} accepted bad values {values:?}"),
            Err(e) => assert!(
                e.contains(key),
                "{chart} {values:?}: error names no {key}:\n{e}"
            ),
        }
    }
}

/// One `FROM` line's image reference and its stage alias.
fn from_lines(dockerfile: &str) -> Vec<(String, Option<String>)> {
    dockerfile
        .lines()
        .filter_map(|l| l.trim().strip_prefix("FROM "))
        .map(|rest| {
            let mut parts = rest.split_whitespace();
            let image = parts.next().unwrap_or_default().to_string();
            let alias = match (parts.next(), parts.next()) {
                (Some(a), Some(name)) if a.eq_ignore_ascii_case("AS") => Some(name.to_string()),
                _ => None,
            };
            (image, alias)
        })
        .collect()
}

#[test]
fn dockerfiles_follow_the_image_checklist() {
    let root = workspace_root();
    let hadolint = chart_tools().join("bin/hadolint");
    assert!(
        hadolint.is_file(),
        "{} missing: run hack/install-chart-tools.sh",
        hadolint.display()
    );
    let test_sh = std::fs::read_to_string(root.join("hack/test.sh")).unwrap();
    for (file, package, binary) in [
        (
            "Dockerfile.principal",
            "argocd-agent-principal",
            "argocd-principal",
        ),
        ("Dockerfile.agent", "argocd-agent-agent", "argocd-agent"),
    ] {
        let path = root.join(file);
        let out = Command::new(&hadolint).arg(&path).output().unwrap();
        assert!(
            out.status.success(),
            "hadolint {file}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let froms = from_lines(&text);
        assert!(froms.len() >= 2, "{file}: multi-stage build expected");
        for (image, _stage) in &froms {
            let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or_default();
            assert!(
                !tag.is_empty() && tag != "latest" && !tag.contains('/'),
                "{file}: base image {image} must carry an explicit tag or digest"
            );
        }
        let (final_image, _) = froms.last().unwrap();
        assert!(
            final_image.starts_with("gcr.io/distroless/") && final_image.ends_with(":nonroot"),
            "{file}: final stage must be distroless nonroot (CA certificates, no shell), got {final_image}"
        );
        let user = text
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix("USER "))
            .unwrap_or_else(|| panic!("{file}: no USER"));
        let uid = user.split(':').next().unwrap();
        assert!(
            uid == "nonroot" || uid.parse::<u32>().is_ok_and(|u| u != 0),
            "{file}: must run as a non-root user, got USER {user}"
        );
        assert!(
            !text
                .lines()
                .any(|l| l.trim().starts_with("ADD ") && l.contains("://")),
            "{file}: no ADD of URLs (unverified downloads)"
        );
        let build = format!("cargo build --release --locked -p {package} --bin {binary}");
        assert!(text.contains(&build), "{file}: must build with `{build}`");
        assert!(
            text.contains(&format!("ENTRYPOINT [\"/usr/local/bin/{binary}\"]")),
            "{file}: exec-form ENTRYPOINT of the binary"
        );
        assert!(
            text.lines().any(|l| l.contains("Expected size")),
            "{file}: states the expected image size"
        );
    }
    // CI builds with the same --locked discipline the images use.
    assert!(test_sh.contains("cargo build --workspace --bins --locked"));
    let ignore = std::fs::read_to_string(root.join(".dockerignore")).unwrap();
    for entry in [".git", "target"] {
        assert!(
            ignore.lines().any(|l| l.trim() == entry),
            ".dockerignore must leave out {entry}"
        );
    }
}

/// The requests `user` made that the apiserver refused (403), from the plane's audit log, as
/// `verb group/resource[/subresource] [name] in <namespace>`; and how many requests it made.
fn refused_requests(plane: &ControlPlane, user: &str) -> (Vec<String>, usize) {
    let log = std::fs::read_to_string(plane.audit_log()).unwrap_or_default();
    let mut made = 0;
    let mut refused = BTreeSet::new();
    for event in log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        if event["user"]["username"] != user {
            continue;
        }
        made += 1;
        if event["responseStatus"]["code"] != 403 {
            continue;
        }
        let r = &event["objectRef"];
        let mut what = format!(
            "{} {}/{}",
            text(&event, "/verb"),
            text(r, "/apiGroup"),
            text(r, "/resource")
        );
        for (key, fmt) in [("/subresource", "/"), ("/name", " ")] {
            if !text(r, key).is_empty() {
                what.push_str(&format!("{fmt}{}", text(r, key)));
            }
        }
        match text(r, "/namespace").as_str() {
            "" => what.push_str(" cluster-wide"),
            ns => what.push_str(&format!(" in namespace {ns}")),
        }
        refused.insert(what);
    }
    (refused.into_iter().collect(), made)
}

/// Fails naming every request `user` was refused on `plane`. Returns how many requests of
/// `user` the audit log shows.
fn assert_nothing_refused(plane: &ControlPlane, user: &str, chart: &str) -> usize {
    let (refused, made) = refused_requests(plane, user);
    assert!(
        refused.is_empty(),
        "{chart}'s RBAC lacks permissions {user} needed on {} (fix the chart's rbac.yaml and the \
         list beside the code):\n  {}",
        plane.name,
        refused.join("\n  ")
    );
    made
}

/// Hub → spoke → hub: the demo Application created on the hub for agent `agent` reaches the
/// spoke, where the real Argo CD in `argocd`'s namespace syncs `git`'s first commit `revision`
/// into namespace `dest`, and its real status comes back to the hub.
async fn managed_round_trip(
    hub: &ControlPlane,
    spoke: &ControlPlane,
    agent: &str,
    argocd: &ArgoCd,
    (git, revision, dest): (&GitServer, &str, &str),
) -> anyhow::Result<()> {
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub.client().await?, agent, &application_resource());
    let app = demo_application(
        "demo",
        agent,
        &git.url("apps"),
        json!({"server": "https://kubernetes.default.svc", "namespace": dest}),
    );
    hub_apps.create(&PostParams::default(), &app).await?;
    wait_greeting(spoke, dest, "v1")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd.log_tails(20)))?;
    wait_synced(
        &hub_apps,
        "demo",
        revision,
        "the spoke's real Synced+Healthy status on the hub",
        || argocd.log_tails(20),
    )
    .await?;
    Ok(())
}

/// Fails with every pod's log tail.
fn pod_logs(pods: &[&Pod]) -> String {
    pods.iter()
        .map(|p| format!("--- pod {}/{}:\n{}", p.namespace, p.name, p.log_tail(40)))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn helm_installed_principal_and_agent_run_as_their_pods_under_the_charts_rbac(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let started = Instant::now();
    let ctx = TestContext::new("charts-installed")?;
    let (hub, spoke) = (&planes.hub, &planes.spokes[0]);
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let hub_client = hub.client().await?;
    let spoke_client = spoke.client().await?;

    // The principal: its TLS Secrets as the chart expects them, then `helm install` with the
    // chart's defaults (two replicas under HA, the embedded operator on).
    let principal_ns = ctx.unique("argocd");
    ensure_namespace(&hub_client, &principal_ns).await?;
    create_principal_secrets(&hub_client, &principal_ns, &pki, false).await?;
    let hub_helm = Helm::new(&ctx.dir, Some(&hub.kubeconfig))?;
    let release = ctx.unique("hub");
    hub_helm.install(&Release::new(
        &release,
        &principal_ns,
        workspace_root().join(PRINCIPAL_CHART),
        "",
    ))?;
    let (deployment, principal_sa) = installed_deployment(&hub_client, &principal_ns).await?;
    let hub_kubelet = PodRunner::new(hub, &ctx.dir, Image::ours()?).await?;
    let principals = hub_kubelet
        .run_deployment(&principal_ns, &deployment, &[])
        .await?;
    assert_eq!(principals.len(), 2, "the chart's default replicaCount");
    let principal_user = format!("system:serviceaccount:{principal_ns}:{principal_sa}");
    // HA: one replica wins the Lease (its identity is the pod name from the downward API) and
    // is the only Ready one.
    let active = wait_until(
        "one principal pod Ready",
        Duration::from_secs(60),
        || async {
            let mut ready = Vec::new();
            for p in &principals {
                if p.is_ready().await {
                    ready.push(p.name.clone());
                }
            }
            Ok::<_, anyhow::Error>((ready.len() == 1).then(|| ready.remove(0)))
        },
    )
    .await;
    if active.is_err() {
        assert_nothing_refused(hub, &principal_user, PRINCIPAL_CHART);
    }
    let active = active.map_err(|e| {
        anyhow::anyhow!("{e}\n{}", pod_logs(&principals.iter().collect::<Vec<_>>()))
    })?;
    let lease = Api::<Lease>::namespaced(hub_client.clone(), &principal_ns)
        .get("argocd-agent-principal")
        .await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(active.as_str()),
        "the HA Lease holder is the Ready pod"
    );
    // The grpc Service: agents reach the Ready replica only.
    let (grpc_port, _grpc_service) = service(&principals, "grpc")?;

    // The agent: its client certificate Secret, `helm install` pointed at the principal's
    // Service, the pod started on the spoke and reaching the principal through the Service.
    let agent_name = ctx.unique("agent");
    pki.issue_agent(&agent_name)?;
    ensure_namespace(&hub_client, &agent_name).await?;
    let agent_ns = ctx.unique("spoke-argocd");
    // The spoke's real Argo CD in the agent's namespace, as a user installs the agent next to it
    // (so the chart also finds Argo CD's `argocd-redis` Secret), and the demo app in Git.
    let argocd = ArgoCd::start_spoke(&ctx.suffix, &ctx.dir, spoke, &agent_ns, &[]).await?;
    let git = GitServer::start(&ctx.unique("git"))?;
    let revision = git.commit("apps", "demo", &demo_manifests("v1"), "demo v1")?;
    let dest = ctx.unique("demo");
    ensure_namespace(&spoke_client, &dest).await?;
    let (cert, key) = pki.agent_files(&agent_name);
    create_secret(
        &spoke_client,
        &agent_ns,
        "argocd-agent-client-tls",
        "kubernetes.io/tls",
        &[("tls.crt", cert), ("tls.key", key)],
    )
    .await?;
    create_secret(
        &spoke_client,
        &agent_ns,
        "argocd-agent-ca",
        "Opaque",
        &[("ca.crt", pki.ca())],
    )
    .await?;
    let spoke_helm = Helm::new(&ctx.dir, Some(&spoke.kubeconfig))?;
    spoke_helm.install(&Release::new(
        &ctx.unique("spoke"),
        &agent_ns,
        workspace_root().join(AGENT_CHART),
        &format!("agent: {{serverAddress: \"127.0.0.1:{grpc_port}\", tlsServerName: localhost}}\n"),
    ))?;
    let (deployment, agent_sa) = installed_deployment(&spoke_client, &agent_ns).await?;
    let agent_user = format!("system:serviceaccount:{agent_ns}:{agent_sa}");
    let spoke_kubelet = PodRunner::new(spoke, &ctx.dir, Image::ours()?).await?;
    let agents = spoke_kubelet
        .run_deployment(&agent_ns, &deployment, &[grpc_port])
        .await?;
    assert_eq!(agents.len(), 1);
    let agent = &agents[0];
    let metrics = agent.port("metrics").expect("the agent exposes metrics");

    let flow = async {
        agent.wait_ready(Duration::from_secs(60)).await?;
        wait_until(
            &format!("agent {agent_name} connected"),
            Duration::from_secs(60),
            || async move {
                Ok::<_, anyhow::Error>(e2e::metrics::agent_connected(metrics).await?.then_some(()))
            },
        )
        .await?;
        managed_round_trip(hub, spoke, &agent_name, &argocd, (&git, &revision, &dest)).await
    }
    .await;
    // A refused request explains a failed flow better than its time-out, so it is checked first.
    let made = [
        assert_nothing_refused(hub, &principal_user, PRINCIPAL_CHART),
        assert_nothing_refused(spoke, &agent_user, AGENT_CHART),
    ];
    if let Err(e) = flow {
        let mut all: Vec<&Pod> = principals.iter().collect();
        all.push(agent);
        panic!(
            "managed round trip of the Helm-installed pods failed: {e:#}\n{}",
            pod_logs(&all)
        );
    }
    // The audit log saw them (else "nothing refused" would prove nothing).
    assert!(
        made.iter().all(|&n| n > 0),
        "requests of the principal and agent in the audit logs: {made:?}"
    );
    // They ran with what the charts give and nothing else: no kubeconfig, in-cluster config.
    for p in principals.iter().chain(&agents) {
        assert!(
            !p.env.iter().any(|(k, _)| k.contains("KUBECONFIG")),
            "{}: {:?}",
            p.name,
            p.env
        );
        assert_eq!(p.env("KUBERNETES_SERVICE_HOST"), Some("127.0.0.1"));
    }
    assert_eq!(
        agent.env("ARGOCD_AGENT_NAMESPACE"),
        Some(agent_ns.as_str()),
        "fieldRef metadata.namespace"
    );
    eprintln!(
        "[charts] helm-installed principal (2 pods, {active} active) and agent pod: round trip \
         done in {:.1?} ({} hub and {} spoke requests audited, none refused; isolation {:?})",
        started.elapsed(),
        made[0],
        made[1],
        agent.isolation
    );
    hub_helm.uninstall(&release, &principal_ns)?;
    Ok(())
}

/// Server discovery under a release name of the user's choosing: the chart names its Service
/// after the release, hands that name to the embedded operator (`--operator-principal-service`)
/// and grants `get` on it alone. The principal pod started from the installed Deployment reads
/// that Service, finds the node port the real kube-apiserver allocated, writes it into a
/// GitOpsCluster's spec (as upstream) and issues the principal certificate for the release's
/// Service names, with nothing refused by the chart's RBAC. The Node (InternalIP 127.0.0.1) is
/// registered by the test because the planes run no kubelet.
#[tokio::test]
async fn release_named_principal_service_is_discovered_by_the_operator_with_the_node_registered_by_the_test_since_no_kubelet_runs(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let started = Instant::now();
    let ctx = TestContext::new("charts-release-name")?;
    let hub = &planes.hub;
    let client = hub.client().await?;
    // The operator's pass lists ManifestWorks and watches Placements: OCM's hub CRDs.
    install_crds(&client, CrdSide::Hub).await?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let ns = ctx.unique("argocd");
    ensure_namespace(&client, &ns).await?;
    create_principal_secrets(&client, &ns, &pki, true).await?;

    let release = ctx.unique("gitops");
    let service_name = format!("{release}-argocd-agent-principal");
    let helm = Helm::new(&ctx.dir, Some(&hub.kubeconfig))?;
    helm.install(&Release::new(
        &release,
        &ns,
        workspace_root().join(PRINCIPAL_CHART),
        "replicaCount: 1\nha: {enabled: false}\nservice: {type: NodePort}\n",
    ))?;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let node_port = services
        .get(&service_name)
        .await?
        .spec
        .and_then(|s| s.ports)
        .and_then(|ports| {
            ports
                .into_iter()
                .find(|p| p.name.as_deref() == Some("grpc"))
        })
        .and_then(|p| p.node_port)
        .expect("the apiserver allocates the grpc Service's node port");
    let nodes: Api<Node> = Api::all(client.clone());
    let node_name = ctx.unique("node");
    register_loopback_node(&client, &node_name).await?;

    let (deployment, sa) = installed_deployment(&client, &ns).await?;
    let kubelet = PodRunner::new(hub, &ctx.dir, Image::ours()?).await?;
    let pods = kubelet.run_deployment(&ns, &deployment, &[]).await?;
    let pod = &pods[0];
    assert_eq!(
        pod.env("ARGOCD_PRINCIPAL_OPERATOR_PRINCIPAL_SERVICE"),
        Some(service_name.as_str())
    );

    let gocs: Api<GitOpsCluster> = Api::namespaced(client.clone(), &ns);
    create_endpointless_gitopscluster(&gocs, &ns, &ns, "nobody", json!({})).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let in_cluster_name = format!("DNS:{service_name}.{ns}.svc");
    let flow = async {
        wait_node_port_written(&gocs, node_port, Duration::from_secs(90)).await?;
        wait_until(
            &format!("a principal certificate naming {in_cluster_name}"),
            Duration::from_secs(60),
            || async {
                let secret = secrets.get("argocd-agent-principal-tls").await?;
                let pem = secret
                    .data
                    .and_then(|d| d.get("tls.crt").map(|b| b.0.clone()))
                    .unwrap_or_default();
                let sans = inspect(&String::from_utf8_lossy(&pem))
                    .map(|i| i.sans)
                    .unwrap_or_default();
                Ok::<_, kube::Error>(sans.contains(&in_cluster_name).then_some(sans))
            },
        )
        .await
    }
    .await;
    let made = assert_nothing_refused(
        hub,
        &format!("system:serviceaccount:{ns}:{sa}"),
        PRINCIPAL_CHART,
    );
    // Clean up before judging: the Node would change discovery for other tests, and the
    // GitOpsCluster's finalizer is released by the operator while it still runs.
    nodes.delete(&node_name, &DeleteParams::default()).await?;
    gocs.delete(DISCOVERED, &DeleteParams::default()).await?;
    let released = wait_until(
        "the GitOpsCluster's finalizer released",
        Duration::from_secs(60),
        || async { Ok::<_, kube::Error>(gocs.get_opt(DISCOVERED).await?.is_none().then_some(())) },
    )
    .await;
    let sans = flow.map_err(|e| anyhow::anyhow!("{e:#}\n{}", pod.log_tail(60)))?;
    released?;
    assert!(made > 0, "the principal's requests are in the audit log");
    eprintln!(
        "[charts] release {release}: operator discovered Service {service_name} (node port \
         {node_port}) and issued the principal certificate for {sans:?} in {:.1?}",
        started.elapsed()
    );
    helm.uninstall(&release, &ns)?;
    Ok(())
}

/// Issues agent `agent`'s client certificate with `argocd-agentctl pki issue agent` from the CA
/// in the principal's namespace `principal_ns` on `hub`, into the agent's Secrets in `agent_ns` on
/// `spoke`; starts the agent there reading them (its default Secrets) and dialing the principal's
/// gRPC Service (host port `grpc_port`) under the name `server_name`; waits until it is connected.
async fn agent_connects_with_a_certificate_from_the_hub_ca(
    ctx: &TestContext,
    (hub, principal_ns): (&ControlPlane, &str),
    (spoke, agent_ns): (&ControlPlane, &str),
    agent: &str,
    (grpc_port, server_name): (u16, &str),
) -> anyhow::Result<Agent> {
    ensure_namespace(&hub.client().await?, agent).await?;
    ensure_namespace(&spoke.client().await?, agent_ns).await?;
    agentctl(&[
        "pki",
        "issue",
        "agent",
        agent,
        "--namespace",
        principal_ns,
        "--kubeconfig",
        &hub.kubeconfig.display().to_string(),
        "--agent-kubeconfig",
        &spoke.kubeconfig.display().to_string(),
        "--agent-namespace",
        agent_ns,
    ])?;
    let agent = Agent::start_with_transport(
        agent,
        &ctx.dir,
        spoke,
        &format!("127.0.0.1:{grpc_port}"),
        agent_ns,
        &[format!("--tls-server-name={server_name}")],
        &[],
    )
    .await?;
    agent.wait_connected().await?;
    Ok(agent)
}

/// `/readyz` of `pod`: (HTTP status, body).
async fn readyz(pod: &Pod) -> anyhow::Result<(u16, String)> {
    http_get(
        pod.port("health").expect("the chart names the health port"),
        "/readyz",
    )
    .await
}

/// A fresh `helm install` with the chart's defaults (two replicas under HA, the embedded
/// operator on) and none of the Secrets the principal reads but one: the operator creates the
/// CA, the principal certificate (for the release's Service names) and the JWT key before the
/// first read, both replicas start, one becomes Ready, and an agent whose certificate
/// `argocd-agentctl` issues from the bootstrapped CA connects. The one Secret there before, the
/// user's resource proxy certificate from another CA (which the operator's pass would reissue),
/// is left exactly as it was.
#[tokio::test]
async fn fresh_install_with_the_operator_creates_the_missing_secrets_keeps_a_users_and_an_agent_connects(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let started = Instant::now();
    let ctx = TestContext::new("charts-fresh-operator")?;
    let (hub, spoke) = (&planes.hub, &planes.spokes[0]);
    let client = hub.client().await?;
    let ns = ctx.unique("argocd");
    ensure_namespace(&client, &ns).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let other = Pki::create(&ctx.dir.join("users-pki"))?;
    create_secret(
        &client,
        &ns,
        "argocd-agent-resource-proxy-tls",
        "kubernetes.io/tls",
        &[
            ("tls.crt", other.dir.join("principal.crt")),
            ("tls.key", other.dir.join("principal.key")),
        ],
    )
    .await?;
    let users = secrets.get("argocd-agent-resource-proxy-tls").await?;
    for name in [
        "argocd-agent-ca",
        "argocd-agent-principal-tls",
        "argocd-agent-jwt",
    ] {
        assert!(
            secrets.get_opt(name).await?.is_none(),
            "{name} before install"
        );
    }

    let release = ctx.unique("fresh");
    let helm = Helm::new(&ctx.dir, Some(&hub.kubeconfig))?;
    helm.install(&Release::new(
        &release,
        &ns,
        workspace_root().join(PRINCIPAL_CHART),
        "",
    ))?;
    let (deployment, sa) = installed_deployment(&client, &ns).await?;
    let kubelet = PodRunner::new(hub, &ctx.dir, Image::ours()?).await?;
    let principals = kubelet.run_deployment(&ns, &deployment, &[]).await?;
    let user = format!("system:serviceaccount:{ns}:{sa}");
    let active = wait_until(
        "one principal pod Ready on a fresh install",
        Duration::from_secs(90),
        || async {
            let mut ready = 0;
            for p in &principals {
                ready += usize::from(p.is_ready().await);
            }
            Ok::<_, anyhow::Error>((ready == 1).then_some(()))
        },
    )
    .await;
    assert_nothing_refused(hub, &user, PRINCIPAL_CHART);
    active.map_err(|e| {
        anyhow::anyhow!("{e}\n{}", pod_logs(&principals.iter().collect::<Vec<_>>()))
    })?;

    // What the operator created: a CA with its key, the principal certificate from it for the
    // release's Service names, the JWT key.
    let ca = secrets.get("argocd-agent-ca").await?;
    let ca_pem = e2e::secret_text(&ca, "tls.crt");
    assert!(
        !e2e::secret_text(&ca, "tls.key").is_empty(),
        "the CA keeps its key"
    );
    let service_name = format!("{release}-argocd-agent-principal");
    let tls = inspect(&e2e::secret_text(
        &secrets.get("argocd-agent-principal-tls").await?,
        "tls.crt",
    ))?;
    assert!(
        tls.sans.contains(&format!("DNS:{service_name}.{ns}.svc")),
        "{:?}",
        tls.sans
    );
    assert_eq!(
        tls.issuer,
        inspect(&ca_pem)?.subject,
        "issued by the bootstrapped CA"
    );
    assert!(!e2e::secret_text(&secrets.get("argocd-agent-jwt").await?, "jwt.key").is_empty());
    let kept = secrets.get("argocd-agent-resource-proxy-tls").await?;
    assert_eq!(
        (kept.metadata.resource_version, kept.data),
        (users.metadata.resource_version, users.data),
        "the user's Secret is never replaced"
    );

    let (grpc_port, _grpc_service) = service(&principals, "grpc")?;
    let agent = agent_connects_with_a_certificate_from_the_hub_ca(
        &ctx,
        (hub, &ns),
        (spoke, &ctx.unique("spoke")),
        &ctx.unique("agent"),
        (grpc_port, &format!("{service_name}.{ns}.svc")),
    )
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e:#}\n{}",
            pod_logs(&principals.iter().collect::<Vec<_>>())
        )
    })?;
    assert_nothing_refused(hub, &user, PRINCIPAL_CHART);
    eprintln!(
        "[charts] fresh install with the operator: Secrets created, Ready and agent {} connected in {:.1?}",
        agent.name,
        started.elapsed()
    );
    drop(agent);
    helm.uninstall(&release, &ns)?;
    Ok(())
}

/// A fresh `helm install` without the operator and without the Secrets: the principal stays
/// alive and not ready, its `/readyz` and log name the missing Secret and the `argocd-agentctl`
/// command that creates it; once the Secrets exist (made with our `argocd-agentctl`, as the
/// message says) it becomes Ready by itself, same process, and an agent connects.
#[tokio::test]
async fn fresh_install_without_the_operator_says_which_secret_is_missing_and_starts_once_argocd_agentctl_made_them(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let started = Instant::now();
    let ctx = TestContext::new("charts-fresh-no-operator")?;
    let (hub, spoke) = (&planes.hub, &planes.spokes[0]);
    let client = hub.client().await?;
    let ns = ctx.unique("argocd");
    ensure_namespace(&client, &ns).await?;
    let release = ctx.unique("bare");
    let helm = Helm::new(&ctx.dir, Some(&hub.kubeconfig))?;
    helm.install(&Release::new(
        &release,
        &ns,
        workspace_root().join(PRINCIPAL_CHART),
        "replicaCount: 1\nha: {enabled: false}\noperator: {enabled: false}\n",
    ))?;
    let (deployment, sa) = installed_deployment(&client, &ns).await?;
    let kubelet = PodRunner::new(hub, &ctx.dir, Image::ours()?).await?;
    let mut pods = kubelet.run_deployment(&ns, &deployment, &[]).await?;
    let service_name = format!("{release}-argocd-agent-principal");

    // The first Secret it reads is the gRPC certificate's.
    let command = format!("argocd-agentctl pki issue principal -n {ns} --dns {service_name}");
    let (status, body) = wait_until(
        "/readyz naming the missing Secret",
        Duration::from_secs(60),
        || async {
            let (status, body) = readyz(&pods[0]).await.unwrap_or((0, String::new()));
            Ok::<_, anyhow::Error>(
                body.contains("argocd-agent-principal-tls")
                    .then_some((status, body)),
            )
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", pods[0].log_tail(30)))?;
    assert_eq!(status, 503, "not ready: {body}");
    assert!(
        body.contains(&command) && body.contains("not found"),
        "{body}"
    );
    let log = pods[0].log_tail(60);
    assert!(
        log.lines()
            .any(|l| l.contains("argocd-agent-principal-tls") && l.contains(&command)),
        "the log says it too:\n{log}"
    );
    assert!(
        pods[0].process.is_running(),
        "alive, not crash-looping:\n{log}"
    );

    // What the messages say to run.
    let kubeconfig = hub.kubeconfig.display().to_string();
    let dns = format!("{service_name},{service_name}.{ns}.svc");
    let proxy_dns = format!("{release}-argocd-agent-principal-resource-proxy.{ns}.svc");
    for args in [
        vec!["pki", "init"],
        vec!["pki", "issue", "principal", "--dns", dns.as_str()],
        vec![
            "pki",
            "issue",
            "resource-proxy",
            "--dns",
            proxy_dns.as_str(),
        ],
        vec!["jwt", "create-key"],
    ] {
        let mut args = args;
        args.extend([
            "--namespace",
            ns.as_str(),
            "--kubeconfig",
            kubeconfig.as_str(),
        ]);
        agentctl(&args)?;
    }
    pods[0].wait_ready(Duration::from_secs(60)).await?;
    assert!(
        pods[0].process.is_running(),
        "the same process became ready"
    );
    let (grpc_port, _grpc_service) = service(&pods, "grpc")?;
    let agent = agent_connects_with_a_certificate_from_the_hub_ca(
        &ctx,
        (hub, &ns),
        (spoke, &ctx.unique("spoke")),
        &ctx.unique("agent"),
        (grpc_port, &format!("{service_name}.{ns}.svc")),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}\n{}", pods[0].log_tail(40)))?;
    assert_nothing_refused(
        hub,
        &format!("system:serviceaccount:{ns}:{sa}"),
        PRINCIPAL_CHART,
    );
    eprintln!(
        "[charts] fresh install without the operator: waited naming the Secret, Ready after \
         argocd-agentctl made them, agent {} connected in {:.1?}",
        agent.name,
        started.elapsed()
    );
    drop(agent);
    helm.uninstall(&release, &ns)?;
    Ok(())
}

#[tokio::test]
async fn the_pod_runner_starts_a_container_as_a_kubelet_would() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let ctx = TestContext::new("pod-runner")?;
    let plane = &planes.spokes[1];
    let client = plane.client().await?;
    let ns = ctx.unique("kubelet");
    ensure_namespace(&client, &ns).await?;
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "probe"}}))?,
        )
        .await?;
    create_secret(
        &client,
        &ns,
        "creds",
        "Opaque",
        &[("password", {
            let f = ctx.dir.join("password");
            std::fs::write(&f, "s3cret")?;
            f
        })],
    )
    .await?;
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "settings"}, "data": {"mode": "fast"}}),
            )?,
        )
        .await?;
    // A shell "image" (Debian's dash) so the container can report what it sees.
    let shell = Image {
        repository: "registry.test/shell".into(),
        entrypoint: vec!["/usr/local/bin/shell".into()],
        user: Some((65532, Some(65532))),
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        binary: PathBuf::from("/bin/sh"),
    };
    let script = format!(
        "{{ id -u; echo \"$PASSWORD $MODE $POD_NAMESPACE $GREETING\"; cat /etc/creds/password; echo; \
         cat {SERVICE_ACCOUNT_DIR}/namespace; echo; \
         if touch /written 2>/dev/null; then echo root-writable; else echo root-read-only; fi; \
         if touch /scratch/written; then echo scratch-writable; fi; hostname; \
         echo \"$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT\"; }} > /scratch/report.tmp; \
         mv /scratch/report.tmp /scratch/report; exec sleep 600"
    );
    let template: PodTemplateSpec = serde_json::from_value(json!({
        "spec": {
            "serviceAccountName": "probe",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532},
            "containers": [{
                "name": "shell",
                "image": "registry.test/shell:1",
                "args": ["-c", script],
                "env": [
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                    {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "GREETING", "value": "hello-$(MODE)"}
                ],
                "securityContext": {
                    "readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}
                },
                "volumeMounts": [
                    {"name": "creds", "mountPath": "/etc/creds", "readOnly": true},
                    {"name": "scratch", "mountPath": "/scratch"}
                ]
            }],
            "volumes": [
                {"name": "creds", "secret": {"secretName": "creds"}},
                {"name": "scratch", "emptyDir": {}}
            ]
        }
    }))?;
    let kubelet = PodRunner::new(plane, &ctx.dir, vec![shell]).await?;
    let pod = kubelet.run_pod(&ns, "probe-pod", &template, &[]).await?;
    let report_file = pod.dir.join("volumes/scratch/report");
    let report = wait_until(
        "the container's report",
        Duration::from_secs(20),
        || async { Ok::<_, std::io::Error>(std::fs::read_to_string(&report_file).ok()) },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", pod.log_tail(20)))?;
    let lines: Vec<&str> = report.lines().collect();
    let port = plane.url.rsplit_once(':').unwrap().1;
    let uid = match pod.isolation {
        e2e::pod_runner::Isolation::Full => "65532",
        _ => "0",
    };
    assert_eq!(
        lines,
        [
            uid,
            &format!("s3cret fast {ns} hello-fast"),
            "s3cret",
            &ns,
            "root-read-only",
            "scratch-writable",
            "probe-pod",
            &format!("127.0.0.1:{port}"),
        ],
        "{}",
        pod.log_tail(20)
    );
    // The projected token is the ServiceAccount's, from the TokenRequest API, and the CA is
    // the plane's, as kube-rs's in-cluster configuration reads them.
    let sa_dir = pod.dir.join("volumes/kube-api-access");
    assert_eq!(
        std::fs::read_to_string(sa_dir.join("ca.crt"))?,
        std::fs::read_to_string(&plane.ca_file)?
    );
    let token = std::fs::read_to_string(sa_dir.join("token"))?;
    let kubeconfig = ctx.dir.join("probe.kubeconfig");
    plane.write_token_kubeconfig(&kubeconfig, "probe", &token)?;
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
    let as_probe = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?,
    )?;
    let refused = Api::<Secret>::namespaced(as_probe, &ns)
        .list(&ListParams::default())
        .await
        .expect_err("the probe ServiceAccount has no RBAC");
    assert!(
        refused
            .to_string()
            .contains(&format!("system:serviceaccount:{ns}:probe")),
        "{refused}"
    );
    eprintln!("[charts] pod runner isolation here: {:?}", pod.isolation);
    Ok(())
}

/// The value of env var `name` in the rendered Deployment's container (None when not set).
fn env_value<'a>(objs: &'a [Value], name: &str) -> Option<&'a Value> {
    of_kind(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("container env")
        .iter()
        .find(|e| e["name"] == name)
}

/// The Lease names the principal's Role lets it read and renew.
fn lease_names(objs: &[Value]) -> BTreeSet<String> {
    rendered_grants(objs, "Role")
        .into_iter()
        .filter(|(g, r, v, _)| g == "coordination.k8s.io" && r == "leases" && v == "update")
        .map(|(_, _, _, n)| n)
        .collect()
}

#[tokio::test]
async fn ha_and_tracing_values_render_into_the_environment() {
    let ctx = TestContext::new("charts-ha-env").unwrap();
    let principal =
        |values: &str| objects(&render(&ctx.dir, PRINCIPAL_CHART, "argocd", values, None).unwrap());
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let strategy = |objs: &[Value]| {
        of_kind(objs, "Deployment")[0]["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"]
            .clone()
    };

    // Two replicas (the default): one active, elected by the Lease; its name granted; no
    // tracing unless asked; rollouts replace the pods at once (a standby is never Ready).
    let two = principal("");
    assert_eq!(of_kind(&two, "Deployment")[0]["spec"]["replicas"], 2);
    for (name, value) in [
        ("ARGOCD_PRINCIPAL_HA_ENABLED", "true"),
        ("ARGOCD_PRINCIPAL_HA_LEASE_NAME", "argocd-agent-principal"),
        ("ARGOCD_PRINCIPAL_HA_LEASE_DURATION", "10s"),
        ("ARGOCD_PRINCIPAL_HA_RENEW_INTERVAL", "2s"),
    ] {
        assert_eq!(env_value(&two, name).unwrap()["value"], value, "{name}");
    }
    assert_eq!(
        env_value(&two, "ARGOCD_PRINCIPAL_HA_IDENTITY").unwrap()["valueFrom"]["fieldRef"]
            ["fieldPath"],
        "metadata.name"
    );
    assert!(env_value(&two, "ARGOCD_PRINCIPAL_OTLP_ADDRESS").is_none());
    assert_eq!(strategy(&two), "100%");
    assert_eq!(
        lease_names(&two),
        names(&["argocd-agent-operator", "argocd-agent-principal"])
    );
    assert!(
        of_kind(&two, "PodDisruptionBudget").is_empty(),
        "PDB is opt-in"
    );
    // The operator tells Argo CD (and its resource proxy certificate) the chart's own Service.
    let proxy_service = of_kind(&two, "Service")
        .into_iter()
        .find(|s| s["spec"]["ports"][0]["name"] == "resource-proxy")
        .unwrap()["metadata"]["name"]
        .clone();
    assert_eq!(
        env_value(&two, "ARGOCD_PRINCIPAL_OPERATOR_RESOURCE_PROXY_ADDRESS").unwrap()["value"],
        format!("{}.argocd.svc:9090", proxy_service.as_str().unwrap())
    );

    // A custom Lease name is what the binary gets and what the Role grants.
    let custom = principal("replicaCount: 3\nha: {leaseName: hub-principal, leaseDuration: 15s}\n");
    assert_eq!(
        env_value(&custom, "ARGOCD_PRINCIPAL_HA_LEASE_NAME").unwrap()["value"],
        "hub-principal"
    );
    assert_eq!(
        env_value(&custom, "ARGOCD_PRINCIPAL_HA_LEASE_DURATION").unwrap()["value"],
        "15s"
    );
    assert_eq!(
        lease_names(&custom),
        names(&["argocd-agent-operator", "hub-principal"])
    );

    // One replica without HA: no HA settings, no HA Lease grant, ordinary rollouts; tracing on.
    let one = principal(
        "replicaCount: 1\nha: {enabled: false}\ntracing: {otlpAddress: \"otel-collector.monitoring:4317\"}\npodDisruptionBudget: {enabled: true}\n",
    );
    assert_eq!(of_kind(&one, "Deployment")[0]["spec"]["replicas"], 1);
    assert_eq!(
        env_value(&one, "ARGOCD_PRINCIPAL_HA_ENABLED").unwrap()["value"],
        "false"
    );
    for name in ["LEASE_NAME", "LEASE_DURATION", "RENEW_INTERVAL", "IDENTITY"] {
        assert!(env_value(&one, &format!("ARGOCD_PRINCIPAL_HA_{name}")).is_none());
    }
    assert_eq!(
        env_value(&one, "ARGOCD_PRINCIPAL_OTLP_ADDRESS").unwrap()["value"],
        "otel-collector.monitoring:4317"
    );
    assert_eq!(strategy(&one), 0);
    assert_eq!(lease_names(&one), names(&["argocd-agent-operator"]));
    assert!(
        of_kind(&one, "PodDisruptionBudget").is_empty(),
        "a PDB over one pod would block every drain"
    );
    // Neither HA nor the operator: no Lease grant at all.
    let none = principal("replicaCount: 1\nha: {enabled: false}\noperator: {enabled: false}\n");
    assert!(!rendered_grants(&none, "Role")
        .iter()
        .any(|(g, r, _, _)| g == "coordination.k8s.io" && r == "leases"));
    // The PDB when asked for with several replicas.
    let pdb = principal("podDisruptionBudget: {enabled: true}\n");
    assert_eq!(
        of_kind(&pdb, "PodDisruptionBudget")[0]["spec"]["minAvailable"],
        1
    );

    // The agent's tracing.
    let agent = objects(
        &render(
            &ctx.dir,
            AGENT_CHART,
            "argocd",
            &format!("{AGENT_VALUES}tracing: {{otlpAddress: \"http://otel:4317\"}}\n"),
            None,
        )
        .unwrap(),
    );
    assert_eq!(
        env_value(&agent, "ARGOCD_AGENT_OTLP_ADDRESS").unwrap()["value"],
        "http://otel:4317"
    );
    let plain = objects(&render(&ctx.dir, AGENT_CHART, "argocd", AGENT_VALUES, None).unwrap());
    assert!(env_value(&plain, "ARGOCD_AGENT_OTLP_ADDRESS").is_none());
}

/// Every env var the flags of binary `name` are mirrored by, as its `--help` lists them
/// (`[env: NAME=...]`): what the binary reads, whichever way its flags were declared.
fn env_names_in_help(name: &str) -> BTreeSet<String> {
    let binary = e2e::binaries::project_binary(name).unwrap();
    let out = std::process::Command::new(&binary)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{name} --help failed");
    String::from_utf8_lossy(&out.stdout)
        .split("[env: ")
        .skip(1)
        .filter_map(|rest| rest.split(['=', ']']).next().map(String::from))
        .collect()
}

#[tokio::test]
async fn every_rendered_variable_is_one_the_binary_reads() {
    let ctx = TestContext::new("charts-env-names").unwrap();
    // Every optional setting set, so every variable the templates can emit is rendered.
    let principal = "principal: {allowedNamespaces: [team-a], namespaceCreate: {enable: true, pattern: \"^edge-\", labels: {team: edge, tier: spoke}}, destinationBasedMapping: true, labelSelector: a=b, grpcMaxMessageSize: 32MiB, enableWebSocket: true}\n\
        operator: {principalAddress: hub.example.com, principalPort: 8443, resourceProxyAddress: \"proxy:9090\", agentImage: img, argocdNamespace: argocd, agentNamespace: argocd, extraArgocdNamespaces: [team-a, team-b], agentLiveView: {enabled: true, write: true}, agentTerminal: {enabled: true}, pullResourceFeedback: true}\n\
        tracing: {otlpAddress: \"collector:4317\"}\n";
    let agent = "agent: {serverAddress: \"hub:443\", tlsServerName: hub, enableWebSocket: true, destinationBasedMapping: true, createNamespace: true, allowedNamespaces: [a], keepaliveInterval: 30s, heartbeatInterval: 10s, reconnectBackoffMax: 1m, resyncInterval: 5m, labelSelector: a=b, sourceUidMismatchPolicy: upsert, ignoreUnmanagedApps: true, onApplicationRecreate: resync}\n\
        tracing: {otlpAddress: \"collector:4317\"}\n";
    for (chart, values, binary) in [
        (PRINCIPAL_CHART, principal, "argocd-principal"),
        (AGENT_CHART, agent, "argocd-agent"),
    ] {
        let objs = objects(&render(&ctx.dir, chart, "argocd", values, None).unwrap());
        let known = env_names_in_help(binary);
        assert!(
            known.contains("ARGOCD_PRINCIPAL_KUBECONFIG")
                || known.contains("ARGOCD_AGENT_KUBECONFIG"),
            "{binary} --help lists no env vars: {known:?}"
        );
        let env = of_kind(&objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
            ["env"]
            .as_array()
            .unwrap()
            .clone();
        for e in env {
            let name = e["name"].as_str().unwrap();
            assert!(
                known.contains(name),
                "{chart} sets {name}, which the binary does not read"
            );
        }
        // enableWebSocket turns --enable-websocket on; off by default, it is not rendered.
        let websocket = if binary == "argocd-principal" {
            "ARGOCD_PRINCIPAL_ENABLE_WEBSOCKET"
        } else {
            "ARGOCD_AGENT_ENABLE_WEBSOCKET"
        };
        assert_eq!(
            env_value(&objs, websocket).map(|e| &e["value"]),
            Some(&Value::from("true")),
            "{chart}: {websocket}"
        );
        let default_values = if binary == "argocd-principal" {
            ""
        } else {
            AGENT_VALUES
        };
        let defaults = objects(&render(&ctx.dir, chart, "argocd", default_values, None).unwrap());
        assert!(
            env_value(&defaults, websocket).is_none(),
            "{chart}: {websocket} by default"
        );
    }
    let objs = objects(&render(&ctx.dir, PRINCIPAL_CHART, "argocd", principal, None).unwrap());
    assert_eq!(
        env_value(&objs, "ARGOCD_PRINCIPAL_OPERATOR_EXTRA_ARGOCD_NAMESPACES").map(|e| &e["value"]),
        Some(&Value::from("team-a,team-b"))
    );
    // The agents' grants and the pull model's resource feedback: all set above; by default the
    // agent chart's grants (reads only) and upstream's feedback.
    let defaults = objects(&render(&ctx.dir, PRINCIPAL_CHART, "argocd", "", None).unwrap());
    for (name, default) in [
        ("ARGOCD_PRINCIPAL_OPERATOR_AGENT_LIVE_VIEW", "true"),
        ("ARGOCD_PRINCIPAL_OPERATOR_AGENT_LIVE_VIEW_WRITE", "false"),
        ("ARGOCD_PRINCIPAL_OPERATOR_AGENT_TERMINAL", "false"),
        ("ARGOCD_PRINCIPAL_OPERATOR_PULL_RESOURCE_FEEDBACK", "false"),
    ] {
        assert_eq!(
            env_value(&objs, name).map(|e| &e["value"]),
            Some(&Value::from("true")),
            "{name}"
        );
        assert_eq!(
            env_value(&defaults, name).map(|e| &e["value"]),
            Some(&Value::from(default)),
            "{name} by default"
        );
    }
    assert_eq!(
        env_value(&objs, "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_LABELS").map(|e| &e["value"]),
        Some(&Value::from("team=edge,tier=spoke"))
    );
    assert_eq!(
        env_value(&objs, "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_PATTERN").map(|e| &e["value"]),
        Some(&Value::from("^edge-"))
    );
}
