//! The agent ManifestWork: one per managed cluster, in the cluster's namespace on the hub,
//! carrying everything the agent needs on its cluster — Namespace, ServiceAccount, a Role limited
//! to the agent namespace, the cluster-wide grants the operator's [`AgentGrants`] choose (the live
//! view's reads, its writes, the web terminal's exec), the CA (and, only as an opt-in fallback, the
//! client certificate and key), the parameters ConfigMap and the Deployment — with feedback rules
//! that bring the Deployment's readiness back into the ManifestWork status.
//!
//! Owns the payload layout (names, mount paths, arguments, ports, volumes) and reading things
//! back out of a ManifestWork (embedded client certificate, agent readiness). Pure: no apiserver.
//!
//! The payload runs the agent as the agent chart does: the image's own entrypoint, a read-only
//! root filesystem with writable `emptyDir`s for the offline queue and `/tmp`, the metrics and
//! health ports with probes, and a Role and ClusterRoles granting exactly the rules of
//! `agent/rbac.yaml` `namespace`, `liveView`, `liveViewWrite` and `terminal` (the API calls the
//! agent's code makes), chosen as the agent chart's `liveView.enabled`, `liveView.write` and
//! `terminal.enabled` choose them and named as the chart names them, read from that file at build
//! time so the two cannot drift.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};

use crate::pki::secrets::{
    AGENT_CA_SECRET, AGENT_CLIENT_TLS_SECRET, CA_CERT_KEY, TLS_CERT_KEY, TLS_KEY_KEY,
};
use crate::pki::IssuedCert;
use crate::pull::manifestwork::{
    DeleteOption, FeedbackRule, JsonPath, ManifestConfigOption, ManifestWork, ManifestWorkSpec,
    ManifestsTemplate, ResourceIdentifier, SelectivelyOrphan, UpdateStrategy,
};

/// Name of the agent ManifestWork in each cluster namespace.
pub const AGENT_WORK_NAME: &str = "argocd-agent";
/// Name of the agent's Deployment, ServiceAccount, Role and RoleBinding on the spoke.
pub const AGENT_DEPLOYMENT: &str = "argocd-agent-agent";
/// Name of the agent's parameters ConfigMap on the spoke.
pub const AGENT_PARAMS_CONFIGMAP: &str = "argocd-agent-params";
/// ConfigMap key: principal host.
pub const PARAM_SERVER_ADDRESS: &str = "agent.server.address";
/// ConfigMap key: principal port.
pub const PARAM_SERVER_PORT: &str = "agent.server.port";
/// ConfigMap key: agent mode.
pub const PARAM_MODE: &str = "agent.mode";
/// ConfigMap key: agent namespace.
pub const PARAM_NAMESPACE: &str = "agent.namespace";
/// Label on everything the operator creates on the hub.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_OPERATOR: &str = "argocd-agent-operator";
/// Label naming the managed cluster of a hub object (upstream's label).
pub const CLUSTER_NAME_LABEL: &str = "apps.open-cluster-management.io/cluster-name";
/// Annotation naming the owning GitOpsCluster as `namespace/name`.
pub const OWNER_ANNOTATION: &str = "apps.open-cluster-management.io/gitopscluster";
/// Annotation naming the principal (its namespace) whose operator created a hub object, so that
/// with several principals on one hub each knows its own objects even after the GitOpsCluster
/// that owned them moved to another principal.
pub const PRINCIPAL_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/principal";
/// Feedback value name for the Deployment's ready replicas.
pub const FEEDBACK_READY_REPLICAS: &str = "readyReplicas";

const TLS_MOUNT: &str = "/app/config/tls";
const CA_MOUNT: &str = "/app/config/ca";
/// Where the agent keeps its offline queue (the agent's default `--queue-dir`, as in the chart).
pub const QUEUE_MOUNT: &str = "/var/lib/argocd-agent/queue";
const TMP_MOUNT: &str = "/tmp";
/// Container port of the agent's `/metrics` (the agent's default, as in the chart).
pub const METRICS_PORT: u16 = 8181;
/// Container port of the agent's `/healthz` and `/readyz`.
pub const HEALTH_PORT: u16 = 8001;

/// The API calls the agent's code makes, as RBAC rules (see its header).
const AGENT_RBAC: &str = include_str!("../../../agent/rbac.yaml");

/// The rules of one list of `agent/rbac.yaml` (`namespace`, `liveView`, ...).
fn agent_rbac_rules(list: &str) -> Vec<Value> {
    // The file is part of the build and parsed by a unit test, so this cannot fail at run time.
    let mut lists: BTreeMap<String, Vec<Value>> =
        serde_norway::from_str(AGENT_RBAC).expect("agent/rbac.yaml maps names to lists of rules");
    lists
        .remove(list)
        .unwrap_or_else(|| panic!("agent/rbac.yaml has a `{list}` list of rules"))
}

/// The rules of `agent/rbac.yaml`'s `namespace` list: what the agent's Role grants in its namespace.
pub fn agent_role_rules() -> Vec<Value> {
    agent_rbac_rules("namespace")
}

/// The rules of `agent/rbac.yaml`'s `liveView` list: what the agent's ClusterRole grants so the
/// hub's Argo CD sees the live state of the cluster's applications (the chart's default too).
pub fn agent_live_view_rules() -> Vec<Value> {
    agent_rbac_rules("liveView")
}

/// The rules of `agent/rbac.yaml`'s `liveViewWrite` list: what the live view's ClusterRole adds
/// so the hub can run resource actions and delete one resource (the chart's `liveView.write`).
pub fn agent_live_view_write_rules() -> Vec<Value> {
    agent_rbac_rules("liveViewWrite")
}

/// The rules of `agent/rbac.yaml`'s `terminal` list: what the web terminal's ClusterRole grants
/// (the chart's `terminal.enabled`).
pub fn agent_terminal_rules() -> Vec<Value> {
    agent_rbac_rules("terminal")
}

/// Name of the agent's live view ClusterRole and ClusterRoleBinding on a spoke (as the chart's).
pub fn agent_live_view_role(agent_namespace: &str) -> String {
    format!("{AGENT_DEPLOYMENT}-{agent_namespace}-live")
}

/// Name of the agent's web terminal ClusterRole and ClusterRoleBinding on a spoke (as the chart's).
pub fn agent_terminal_role(agent_namespace: &str) -> String {
    format!("{AGENT_DEPLOYMENT}-{agent_namespace}-terminal")
}

/// The cluster-wide grants an agent gets, the choices of the agent chart: `live_view` is
/// `liveView.enabled` (on by default), `live_view_write` is `liveView.write` and `terminal` is
/// `terminal.enabled` (both off by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentGrants {
    /// The live view's reads (`agent/rbac.yaml` `liveView`).
    pub live_view: bool,
    /// Also the live view's writes (`liveViewWrite`); only together with `live_view`.
    pub live_view_write: bool,
    /// The web terminal's exec (`terminal`).
    pub terminal: bool,
}

impl Default for AgentGrants {
    /// The chart's defaults: reads on, writes and terminal off.
    fn default() -> Self {
        AgentGrants {
            live_view: true,
            live_view_write: false,
            terminal: false,
        }
    }
}

impl AgentGrants {
    /// The live view ClusterRole's rules, `None` without the live view.
    fn live_view_rules(&self) -> Option<Vec<Value>> {
        self.live_view.then(|| {
            let mut rules = agent_live_view_rules();
            if self.live_view_write {
                rules.extend(agent_live_view_write_rules());
            }
            rules
        })
    }
}

/// A ClusterRole with `rules` and its ClusterRoleBinding to the agent's ServiceAccount.
fn cluster_role_for_agent(name: &str, rules: Vec<Value>, ns: &str, labels: &Value) -> [Value; 2] {
    [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": name, "labels": labels},
               "rules": rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": name, "labels": labels},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": AGENT_DEPLOYMENT, "namespace": ns}]}),
    ]
}

/// Everything that decides the content of one cluster's agent ManifestWork.
#[derive(Clone, Debug)]
pub struct AgentDeployment<'a> {
    /// Managed cluster (= agent name, certificate CN, hub namespace).
    pub cluster: &'a str,
    /// Owning GitOpsCluster, `namespace/name`.
    pub owner: &'a str,
    /// `managed` or `autonomous`.
    pub mode: &'a str,
    /// Agent namespace on the spoke.
    pub agent_namespace: &'a str,
    /// Container image.
    pub image: &'a str,
    /// Principal host the agent dials.
    pub principal_address: &'a str,
    /// Principal port.
    pub principal_port: u16,
    /// CA certificate, PEM.
    pub ca_pem: &'a str,
    /// Client certificate and key to ship (opt-in fallback); `None`: the key stays on the spoke.
    pub client_tls: Option<&'a IssuedCert>,
    /// The cluster-wide grants.
    pub grants: AgentGrants,
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The agent's command-line arguments inside the Deployment.
pub fn agent_args(d: &AgentDeployment<'_>) -> Vec<String> {
    vec![
        format!(
            "--server-address={}",
            host_port(d.principal_address, d.principal_port)
        ),
        format!("--mode={}", d.mode),
        format!("--namespace={}", d.agent_namespace),
        format!("--tls-client-cert={TLS_MOUNT}/{TLS_CERT_KEY}"),
        format!("--tls-client-key={TLS_MOUNT}/{TLS_KEY_KEY}"),
        format!("--tls-ca={CA_MOUNT}/{CA_CERT_KEY}"),
        format!("--queue-dir={QUEUE_MOUNT}"),
        format!("--metrics-address=0.0.0.0:{METRICS_PORT}"),
        format!("--health-address=0.0.0.0:{HEALTH_PORT}"),
    ]
}

/// The payload objects, in apply order.
pub fn agent_manifests(d: &AgentDeployment<'_>) -> Vec<Value> {
    let ns = d.agent_namespace;
    let labels = json!({"app.kubernetes.io/name": AGENT_DEPLOYMENT, "app.kubernetes.io/part-of": "argocd-agent"});
    let mut out = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": AGENT_DEPLOYMENT, "namespace": ns, "labels": labels}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": AGENT_DEPLOYMENT, "namespace": ns, "labels": labels},
        "rules": agent_role_rules()}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": AGENT_DEPLOYMENT, "namespace": ns, "labels": labels},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AGENT_DEPLOYMENT},
               "subjects": [{"kind": "ServiceAccount", "name": AGENT_DEPLOYMENT, "namespace": ns}]}),
    ];
    if let Some(rules) = d.grants.live_view_rules() {
        out.extend(cluster_role_for_agent(
            &agent_live_view_role(ns),
            rules,
            ns,
            &labels,
        ));
    }
    if d.grants.terminal {
        out.extend(cluster_role_for_agent(
            &agent_terminal_role(ns),
            agent_terminal_rules(),
            ns,
            &labels,
        ));
    }
    out.push(
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
           "metadata": {"name": AGENT_CA_SECRET, "namespace": ns, "labels": labels},
           "data": {CA_CERT_KEY: b64(d.ca_pem)}}),
    );
    if let Some(tls) = d.client_tls {
        out.push(json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": AGENT_CLIENT_TLS_SECRET, "namespace": ns, "labels": labels},
            "data": {TLS_CERT_KEY: b64(&tls.cert_pem), TLS_KEY_KEY: b64(&tls.key_pem), CA_CERT_KEY: b64(d.ca_pem)}}));
    }
    out.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": AGENT_PARAMS_CONFIGMAP, "namespace": ns, "labels": labels},
    "data": {
        PARAM_SERVER_ADDRESS: d.principal_address,
        PARAM_SERVER_PORT: d.principal_port.to_string(),
        PARAM_MODE: d.mode,
        PARAM_NAMESPACE: ns,
    }}));
    out.push(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": AGENT_DEPLOYMENT, "namespace": ns, "labels": labels},
        "spec": {
            "replicas": 1,
            // One agent per cluster: the old pod lets go before the new one starts.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": AGENT_DEPLOYMENT}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": AGENT_DEPLOYMENT,
                    "automountServiceAccountToken": true,
                    "containers": [{
                        "name": "agent",
                        "image": d.image,
                        "args": agent_args(d),
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                            "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}},
                        "ports": [
                            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
                            {"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"}
                        ],
                        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "health"}},
                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "health"}},
                        "volumeMounts": [
                            {"name": "client-tls", "mountPath": TLS_MOUNT, "readOnly": true},
                            {"name": "ca", "mountPath": CA_MOUNT, "readOnly": true},
                            {"name": "queue", "mountPath": QUEUE_MOUNT},
                            {"name": "tmp", "mountPath": TMP_MOUNT}
                        ]
                    }],
                    "volumes": [
                        {"name": "client-tls", "secret": {"secretName": AGENT_CLIENT_TLS_SECRET}},
                        {"name": "ca", "secret": {"secretName": AGENT_CA_SECRET}},
                        {"name": "queue", "emptyDir": {}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}
                    ]
                }
            }
        }}));
    out
}

/// Hub-side labels of objects the operator creates for `cluster`.
pub fn hub_labels(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_OPERATOR.to_owned()),
        (CLUSTER_NAME_LABEL.to_owned(), cluster.to_owned()),
    ])
}

/// Offboarding removes the agent, never its namespace: the namespace is created if missing but
/// may hold what the agent does not own (by default `argocd`, where the spoke's Argo CD runs).
pub fn agent_delete_option(agent_namespace: &str) -> DeleteOption {
    DeleteOption {
        propagation_policy: "SelectivelyOrphan".into(),
        selectively_orphans: Some(SelectivelyOrphan {
            orphaning_rules: vec![ResourceIdentifier {
                group: String::new(),
                resource: "namespaces".into(),
                name: agent_namespace.to_owned(),
                namespace: String::new(),
            }],
        }),
    }
}

/// The agent ManifestWork for one cluster.
pub fn build_agent_manifest_work(d: &AgentDeployment<'_>) -> ManifestWork {
    ManifestWork {
        metadata: ObjectMeta {
            name: Some(AGENT_WORK_NAME.to_owned()),
            namespace: Some(d.cluster.to_owned()),
            labels: Some(hub_labels(d.cluster)),
            annotations: Some(BTreeMap::from([(
                OWNER_ANNOTATION.to_owned(),
                d.owner.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: ManifestWorkSpec {
            workload: ManifestsTemplate {
                manifests: agent_manifests(d),
            },
            manifest_configs: vec![ManifestConfigOption {
                resource_identifier: ResourceIdentifier {
                    group: "apps".into(),
                    resource: "deployments".into(),
                    name: AGENT_DEPLOYMENT.into(),
                    namespace: d.agent_namespace.to_owned(),
                },
                feedback_rules: vec![
                    FeedbackRule {
                        type_: "WellKnownStatus".into(),
                        json_paths: vec![],
                    },
                    FeedbackRule {
                        type_: "JSONPaths".into(),
                        json_paths: vec![JsonPath {
                            name: FEEDBACK_READY_REPLICAS.into(),
                            path: ".status.readyReplicas".into(),
                        }],
                    },
                ],
                update_strategy: Some(UpdateStrategy {
                    type_: "Update".into(),
                    server_side_apply: None,
                }),
            }],
            delete_option: Some(agent_delete_option(d.agent_namespace)),
        },
        status: None,
    }
}

fn payload<'w>(work: &'w ManifestWork, kind: &str, name: &str) -> Option<&'w Value> {
    work.spec.workload.manifests.iter().find(|m| {
        m.get("kind").and_then(Value::as_str) == Some(kind)
            && m.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
    })
}

/// A data value of a payload Secret, decoded.
pub fn payload_secret_text(work: &ManifestWork, secret: &str, key: &str) -> Option<String> {
    use base64::Engine;
    let data =
        payload(work, "Secret", secret)?.pointer(&format!("/data/{}", key.replace('/', "~1")))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.as_str()?)
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// The client certificate and key shipped in the ManifestWork, if any.
pub fn embedded_client_tls(work: &ManifestWork) -> Option<IssuedCert> {
    Some(IssuedCert {
        cert_pem: payload_secret_text(work, AGENT_CLIENT_TLS_SECRET, TLS_CERT_KEY)?,
        key_pem: payload_secret_text(work, AGENT_CLIENT_TLS_SECRET, TLS_KEY_KEY)?,
    })
}

/// What the work agent reported back about the agent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentReadiness {
    /// The ManifestWork's `Applied` condition is True.
    pub applied: bool,
    /// The agent Deployment has at least one ready replica.
    pub ready: bool,
}

/// Reads the work agent's status and the Deployment feedback.
pub fn agent_readiness(work: &ManifestWork) -> AgentReadiness {
    let Some(status) = &work.status else {
        return AgentReadiness::default();
    };
    let applied = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Applied" && c.status == "True");
    let ready = status
        .resource_status
        .manifests
        .iter()
        .filter(|m| {
            m.resource_meta.kind == "Deployment" && m.resource_meta.name == AGENT_DEPLOYMENT
        })
        .flat_map(|m| &m.status_feedback.values)
        .any(|v| {
            (v.name == FEEDBACK_READY_REPLICAS || v.name == "ReadyReplicas")
                && v.field_value.integer.unwrap_or(0) >= 1
        });
    AgentReadiness { applied, ready }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{days, CertificateAuthority};

    fn deployment<'a>(ca: &'a str, tls: Option<&'a IssuedCert>) -> AgentDeployment<'a> {
        AgentDeployment {
            cluster: "cluster1",
            owner: "ns/gitops",
            mode: "managed",
            agent_namespace: "argocd",
            image: "example/agent:1",
            principal_address: "10.0.0.1",
            principal_port: 8443,
            ca_pem: ca,
            client_tls: tls,
            grants: AgentGrants::default(),
        }
    }

    #[test]
    fn payload_carries_agent_config_and_no_key_by_default() {
        let ca = CertificateAuthority::generate("argocd-agent-ca", days(10)).unwrap();
        let work = build_agent_manifest_work(&deployment(ca.cert_pem(), None));
        assert_eq!(work.metadata.namespace.as_deref(), Some("cluster1"));
        assert_eq!(
            work.metadata.labels.as_ref().unwrap()[CLUSTER_NAME_LABEL],
            "cluster1"
        );
        let kinds: Vec<&str> = work
            .spec
            .workload
            .manifests
            .iter()
            .map(|m| m["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "Namespace",
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "ClusterRole",
                "ClusterRoleBinding",
                "Secret",
                "ConfigMap",
                "Deployment"
            ]
        );
        assert!(embedded_client_tls(&work).is_none());
        assert_eq!(
            payload_secret_text(&work, AGENT_CA_SECRET, CA_CERT_KEY).as_deref(),
            Some(ca.cert_pem())
        );
        let dep = payload(&work, "Deployment", AGENT_DEPLOYMENT).unwrap();
        let args: Vec<&str> = dep["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(args.contains(&"--server-address=10.0.0.1:8443"));
        assert!(args.contains(&"--mode=managed"));
        let role = payload(&work, "Role", AGENT_DEPLOYMENT).unwrap();
        assert!(
            !role.to_string().contains("\"*\""),
            "least privilege: no wildcards"
        );
        assert_eq!(
            work.spec.manifest_configs[0].resource_identifier.resource,
            "deployments"
        );
    }

    fn agent_container(work: &ManifestWork) -> (&Value, &Value) {
        let dep = payload(work, "Deployment", AGENT_DEPLOYMENT).unwrap();
        let pod = &dep["spec"]["template"]["spec"];
        (&pod["containers"][0], pod)
    }

    fn args_of(container: &Value) -> Vec<&str> {
        container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect()
    }

    #[test]
    fn read_only_root_has_a_writable_volume_at_the_queue_dir() {
        let ca = CertificateAuthority::generate("argocd-agent-ca", days(10)).unwrap();
        let work = build_agent_manifest_work(&deployment(ca.cert_pem(), None));
        let (container, pod) = agent_container(&work);
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        let queue_dir = args_of(container)
            .iter()
            .find_map(|a| a.strip_prefix("--queue-dir="))
            .expect("the queue dir is named")
            .to_owned();
        let mounts = container["volumeMounts"].as_array().unwrap();
        let volumes = pod["volumes"].as_array().unwrap();
        // Every mount has its volume; the queue's is writable and needs nothing from the cluster.
        for m in mounts {
            assert!(
                volumes.iter().any(|v| v["name"] == m["name"]),
                "mount {m} has no volume"
            );
        }
        let queue = mounts
            .iter()
            .find(|m| m["mountPath"] == queue_dir.as_str())
            .expect("a volume is mounted at the queue dir");
        assert_ne!(queue["readOnly"], true);
        let volume = volumes.iter().find(|v| v["name"] == queue["name"]).unwrap();
        assert!(volume.get("emptyDir").is_some(), "{volume}");
        assert!(
            mounts.iter().any(|m| m["mountPath"] == "/tmp"),
            "a writable /tmp"
        );
    }

    #[test]
    fn container_uses_the_image_entrypoint_and_exposes_its_ops_ports() {
        let ca = CertificateAuthority::generate("argocd-agent-ca", days(10)).unwrap();
        let work = build_agent_manifest_work(&deployment(ca.cert_pem(), None));
        let (container, pod) = agent_container(&work);
        assert!(
            container.get("command").is_none(),
            "the image's ENTRYPOINT runs"
        );
        assert_eq!(pod["serviceAccountName"], AGENT_DEPLOYMENT);
        let args = args_of(container);
        let ports = container["ports"].as_array().unwrap();
        for (name, flag) in [
            ("metrics", "--metrics-address"),
            ("health", "--health-address"),
        ] {
            let port = ports.iter().find(|p| p["name"] == name).unwrap()["containerPort"]
                .as_u64()
                .unwrap();
            assert!(
                args.contains(&format!("{flag}=0.0.0.0:{port}").as_str()),
                "{flag} listens on the {name} port {port}: {args:?}"
            );
        }
        assert_eq!(container["readinessProbe"]["httpGet"]["port"], "health");
    }

    #[test]
    fn role_grants_exactly_the_rules_of_agent_rbac_yaml() {
        let ca = CertificateAuthority::generate("argocd-agent-ca", days(10)).unwrap();
        let work = build_agent_manifest_work(&deployment(ca.cert_pem(), None));
        let role = payload(&work, "Role", AGENT_DEPLOYMENT).unwrap();
        let rules = agent_role_rules();
        assert!(!rules.is_empty());
        assert_eq!(role["rules"], Value::Array(rules.clone()));
        // Managed mode writes the spoke copies of the hub's repository Secrets.
        let secrets = rules
            .iter()
            .find(|r| {
                r["resources"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("secrets"))
            })
            .expect("a rule for secrets");
        for verb in ["get", "list", "watch", "create", "update", "delete"] {
            assert!(
                secrets["verbs"].as_array().unwrap().contains(&json!(verb)),
                "secrets {verb}"
            );
        }
        let binding = payload(&work, "RoleBinding", AGENT_DEPLOYMENT).unwrap();
        assert_eq!(binding["subjects"][0]["name"], AGENT_DEPLOYMENT);
        assert_eq!(binding["subjects"][0]["namespace"], "argocd");
        // The live view's reads, cluster-wide, bound to the same ServiceAccount.
        let live = agent_live_view_role("argocd");
        let cluster_role = payload(&work, "ClusterRole", &live).unwrap();
        assert_eq!(cluster_role["rules"], Value::Array(agent_live_view_rules()));
        let binding = payload(&work, "ClusterRoleBinding", &live).unwrap();
        assert_eq!(binding["roleRef"]["name"], live.as_str());
        assert_eq!(binding["subjects"][0]["name"], AGENT_DEPLOYMENT);
        assert_eq!(binding["subjects"][0]["namespace"], "argocd");
    }

    /// The live view's and the terminal's ClusterRoles as `grants` render them (`None`: absent),
    /// each checked to be bound to the agent's ServiceAccount.
    fn cluster_grants(grants: AgentGrants) -> (Option<Value>, Option<Value>) {
        let ca = CertificateAuthority::generate("argocd-agent-ca", days(10)).unwrap();
        let mut d = deployment(ca.cert_pem(), None);
        d.grants = grants;
        let work = build_agent_manifest_work(&d);
        let role = |name: &str| {
            let rules = payload(&work, "ClusterRole", name).map(|r| r["rules"].clone());
            let binding = payload(&work, "ClusterRoleBinding", name);
            assert_eq!(
                rules.is_some(),
                binding.is_some(),
                "{name}: role and binding together"
            );
            if let Some(b) = binding {
                assert_eq!(b["roleRef"]["name"], name);
                assert_eq!(
                    b["subjects"],
                    json!([{"kind": "ServiceAccount", "name": AGENT_DEPLOYMENT, "namespace": "argocd"}])
                );
            }
            rules
        };
        (
            role(&agent_live_view_role("argocd")),
            role(&agent_terminal_role("argocd")),
        )
    }

    fn verbs_on_every_kind(rules: &Value) -> Vec<String> {
        rules
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["apiGroups"] == json!(["*"]) && r["resources"] == json!(["*"]))
            .flat_map(|r| r["verbs"].as_array().unwrap().clone())
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn cluster_grants_are_the_agent_charts_choices() {
        // Default: the live view's reads only, as the chart's liveView.enabled=true, write=false.
        let (live, terminal) = cluster_grants(AgentGrants::default());
        let live = live.expect("the live view is granted by default");
        assert_eq!(live, Value::Array(agent_live_view_rules()));
        assert_eq!(verbs_on_every_kind(&live), ["get"]);
        assert!(terminal.is_none(), "no exec by default");

        // liveView.write: the same ClusterRole adds the writes.
        let (live, terminal) = cluster_grants(AgentGrants {
            live_view_write: true,
            ..AgentGrants::default()
        });
        let live = live.unwrap();
        let mut expected = agent_live_view_rules();
        expected.extend(agent_live_view_write_rules());
        assert_eq!(live, Value::Array(expected));
        assert_eq!(
            verbs_on_every_kind(&live),
            ["get", "create", "update", "patch", "delete"]
        );
        assert!(terminal.is_none());

        // terminal.enabled: its own ClusterRole, pods get and pods/exec get+create.
        let (_, terminal) = cluster_grants(AgentGrants {
            terminal: true,
            ..AgentGrants::default()
        });
        let terminal = terminal.expect("the terminal's ClusterRole");
        assert_eq!(terminal, Value::Array(agent_terminal_rules()));
        assert!(terminal.as_array().unwrap().iter().any(|r| {
            r["resources"] == json!(["pods/exec"])
                && r["verbs"].as_array().unwrap().contains(&json!("create"))
        }));

        // liveView.enabled=false: no cluster-wide grant at all (the terminal's stands alone).
        let (live, terminal) = cluster_grants(AgentGrants {
            live_view: false,
            live_view_write: false,
            terminal: true,
        });
        assert!(live.is_none());
        assert!(terminal.is_some());
        let (live, terminal) = cluster_grants(AgentGrants {
            live_view: false,
            ..AgentGrants::default()
        });
        assert!(live.is_none() && terminal.is_none());
    }

    #[test]
    fn offboarding_orphans_the_agent_namespace_only() {
        let ca = CertificateAuthority::generate("argocd-agent-ca", days(10)).unwrap();
        let work = build_agent_manifest_work(&deployment(ca.cert_pem(), None));
        let option = serde_json::to_value(work.spec.delete_option.as_ref().unwrap()).unwrap();
        assert_eq!(
            option,
            json!({"propagationPolicy": "SelectivelyOrphan", "selectivelyOrphans": {
                "orphaningRules": [{"group": "", "resource": "namespaces", "name": "argocd"}]}})
        );
        // The orphaned namespace is the one the payload creates; nothing else is orphaned.
        let ns = payload(&work, "Namespace", "argocd").expect("the payload creates it");
        assert_eq!(ns["apiVersion"], "v1");
    }

    #[test]
    fn opt_in_key_is_shipped_and_read_back() {
        let ca = CertificateAuthority::generate("argocd-agent-ca", days(10)).unwrap();
        let tls = ca.issue_client("cluster1", days(1)).unwrap();
        let work = build_agent_manifest_work(&deployment(ca.cert_pem(), Some(&tls)));
        assert_eq!(embedded_client_tls(&work), Some(tls));
    }

    #[test]
    fn readiness_comes_from_the_deployment_feedback() {
        let ca = CertificateAuthority::generate("argocd-agent-ca", days(10)).unwrap();
        let mut work = build_agent_manifest_work(&deployment(ca.cert_pem(), None));
        assert_eq!(agent_readiness(&work), AgentReadiness::default());
        work.status = Some(
            serde_json::from_value(json!({
                "conditions": [{"type": "Applied", "status": "True"}],
                "resourceStatus": {"manifests": [{
                    "resourceMeta": {"kind": "Deployment", "name": AGENT_DEPLOYMENT, "namespace": "argocd"},
                    "statusFeedback": {"values": [{"name": "ReadyReplicas", "fieldValue": {"type": "Integer", "integer": 1}}]}
                }]}
            }))
            .unwrap(),
        );
        assert_eq!(
            agent_readiness(&work),
            AgentReadiness {
                applied: true,
                ready: true
            }
        );
    }

    #[test]
    fn ipv6_principal_is_bracketed() {
        assert_eq!(host_port("::1", 8443), "[::1]:8443");
        assert_eq!(host_port("principal", 443), "principal:443");
    }
}
