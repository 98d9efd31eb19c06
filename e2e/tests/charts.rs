//! The Helm charts and container images as users get them: each chart is linted and rendered by
//! Helm's own engine (`hack/render-charts.sh`, tools from `hack/install-helm.sh`) against the hub
//! plane's API versions, and the output is sent to that real kube-apiserver with
//! `kubectl apply --dry-run=server`, so every object is admitted and validated by the control plane
//! without being stored. The charts' RBAC must equal the rules kept beside the code
//! (`principal/rbac.yaml`, `agent/rbac.yaml`), bad values must be refused by `values.schema.json`
//! with the offending key named, and the Dockerfiles must pass hadolint and the image checklist.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::binaries::workspace_root;
use e2e::gateway::ensure_namespace;
use e2e::{shared_planes, TestContext};
use serde_json::Value;

const PRINCIPAL_CHART: &str = "charts/argocd-agent-principal";
const AGENT_CHART: &str = "charts/argocd-agent-agent";

/// Where `hack/install-helm.sh` put the chart tools.
fn chart_tools() -> PathBuf {
    std::env::var_os("CHART_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/argocd-agent-rs/chart-tools")
        })
}

/// Runs `hack/render-charts.sh chart --values <values> [--kubeconfig]`; Ok(manifest) or Err(stderr).
fn render(
    dir: &Path,
    chart: &str,
    namespace: &str,
    values: &str,
    kubeconfig: Option<&Path>,
) -> Result<String, String> {
    let values_file = dir.join(format!("values-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&values_file, values).expect("write values file");
    let root = workspace_root();
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("hack/render-charts.sh"))
        .arg(root.join(chart))
        .arg(format!("--namespace={namespace}"))
        .arg("--release=argocd-agent")
        .arg(format!("--values={}", values_file.display()));
    if let Some(k) = kubeconfig {
        cmd.arg(format!("--kubeconfig={}", k.display()));
    }
    let out = cmd.output().expect("run hack/render-charts.sh");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if stderr.contains("chart tools not installed") {
        panic!("{stderr}");
    }
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(stderr)
    }
}

/// The rendered manifest's objects.
fn objects(manifest: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(manifest)
        .filter_map(|doc| {
            let v: Value = serde::Deserialize::deserialize(doc).expect("rendered YAML parses");
            (!v.is_null()).then_some(v)
        })
        .collect()
}

fn of_kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

/// `kubectl apply --dry-run=server` of `manifest` against the plane behind `kubeconfig`.
fn server_dry_run(dir: &Path, kubeconfig: &Path, manifest: &str) -> Result<String, String> {
    let file = dir.join(format!("rendered-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, manifest).expect("write manifest");
    let out = Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["apply", "--dry-run=server", "-o", "name", "-f"])
        .arg(&file)
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
    serde_yaml::from_str(&text).expect("rbac list is YAML")
}

const AGENT_VALUES: &str = "agent: {serverAddress: \"principal.example.com:443\"}\n";

#[tokio::test]
async fn charts_pass_a_server_side_dry_run_on_a_real_control_plane() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let ctx = TestContext::new("charts-dry-run")?;
    let hub = planes.hub.client().await?;
    let cases = [
        (PRINCIPAL_CHART, "default values", String::new()),
        (
            PRINCIPAL_CHART,
            "own Secrets, annotated LoadBalancer, PDB by maxUnavailable, ServiceMonitor off",
            "service:\n  type: LoadBalancer\n  annotations: {service.beta.kubernetes.io/aws-load-balancer-type: nlb}\n  loadBalancerSourceRanges: [10.0.0.0/8]\n  externalTrafficPolicy: Local\ntls: {secretName: my-tls, caSecretName: my-ca, caKey: bundle.pem}\njwt: {secretName: my-jwt, key: signing.pem}\nresourceProxy: {tlsSecretName: \"\"}\npodDisruptionBudget: {maxUnavailable: 1}\nprincipal: {allowedNamespaces: [\"team-*\"], logFormat: text}\n".to_string(),
        ),
        (
            PRINCIPAL_CHART,
            "ClusterIP, proxies off, 3 replicas",
            "replicaCount: 3\nservice: {type: ClusterIP}\nresourceProxy: {enabled: false}\nredisProxy: {enabled: false}\n".to_string(),
        ),
        (AGENT_CHART, "managed, persistent queue", AGENT_VALUES.to_string()),
        (
            AGENT_CHART,
            "autonomous, emptyDir queue",
            "agent: {mode: autonomous, serverAddress: \"10.1.2.3:8443\", tlsServerName: principal.hub}\nqueue: {persistence: {enabled: false}}\n".to_string(),
        ),
    ];
    for (chart, case, values) in &cases {
        let ns = ctx.unique("chart");
        ensure_namespace(&hub, &ns).await?;
        let manifest = render(&ctx.dir, chart, &ns, values, Some(&planes.hub.kubeconfig))
            .unwrap_or_else(|e| panic!("{chart} ({case}) does not render:\n{e}"));
        let admitted =
            server_dry_run(&ctx.dir, &planes.hub.kubeconfig, &manifest).unwrap_or_else(|e| {
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

#[tokio::test]
async fn chart_rbac_grants_exactly_the_rules_kept_beside_the_code() {
    let ctx = TestContext::new("charts-rbac").unwrap();
    let principal = objects(&render(&ctx.dir, PRINCIPAL_CHART, "argocd", "", None).unwrap());
    let listed = rules_beside_code("principal/rbac.yaml");
    assert_eq!(
        rendered_grants(&principal, "ClusterRole"),
        grants(&listed["cluster"]),
        "principal ClusterRole differs from principal/rbac.yaml `cluster`"
    );
    assert_eq!(
        rendered_grants(&principal, "Role"),
        grants(&listed["namespace"]),
        "principal Role differs from principal/rbac.yaml `namespace`"
    );

    let agent = objects(&render(&ctx.dir, AGENT_CHART, "argocd", AGENT_VALUES, None).unwrap());
    let listed = rules_beside_code("agent/rbac.yaml");
    assert!(
        of_kind(&agent, "ClusterRole").is_empty(),
        "the agent needs nothing cluster-wide"
    );
    assert_eq!(
        rendered_grants(&agent, "Role"),
        grants(&listed["namespace"]),
        "agent Role differs from agent/rbac.yaml `namespace`"
    );
    // No wildcard anywhere.
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
    let principal = objects(&render(&ctx.dir, PRINCIPAL_CHART, "argocd", "", None).unwrap());
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
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        // TLS material is mounted read-only from Secrets; a CA's private key never is.
        for m in c["volumeMounts"].as_array().unwrap() {
            if m["mountPath"].as_str().unwrap().starts_with("/app/config") {
                assert_eq!(m["readOnly"], true, "{m}");
            }
        }
        let ca = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "ca")
            .unwrap();
        assert_eq!(ca["secret"]["items"].as_array().unwrap().len(), 1);
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
        "{} missing: run hack/install-helm.sh",
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
