//! The GitOpsCluster custom resource (apps.open-cluster-management.io/v1alpha1), field-compatible
//! with upstream's (open-cluster-management-io/argocd-pull-integration): `placementRef`,
//! `argoCDAgentAddon` {`mode`, `principalServerAddress`, `principalServerPort`, `agentNamespace`,
//! `operatorNamespace`, `argoCDCRManifestWork`}, `status.conditions`; plus what this operator adds
//! (`argoCDAgentAddon.image`, `argoCDAgentAddon.agentKeyInManifestWork`, `argoServer.argoNamespace`,
//! `status.observedGeneration`, `status.clusters`).
//!
//! Owns the Rust type, this operator's condition vocabulary (upstream's is
//! [`super::upstream_conditions`]) and the generated CRD YAML
//! ([`gitopscluster_crd_yaml`]); a test fails when the checked-in YAML drifts from the type.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Agent mode when `argoCDAgentAddon.mode` is empty.
pub const DEFAULT_MODE: &str = "managed";
/// Namespace of the agent on the managed cluster when `argoCDAgentAddon.agentNamespace` is empty.
pub const DEFAULT_AGENT_NAMESPACE: &str = "argocd";

/// Condition: the Placement was found and its decisions read.
pub const CONDITION_PLACEMENT_RESOLVED: &str = "PlacementResolved";
/// Condition: the CA and the certificates this GitOpsCluster needs are valid and current.
pub const CONDITION_CERTIFICATES_READY: &str = "CertificatesReady";
/// Condition: every selected cluster has its cluster secret in the hub Argo CD.
pub const CONDITION_CLUSTERS_REGISTERED: &str = "ClustersRegistered";
/// Condition: every selected cluster's agent ManifestWork is applied and its Deployment ready.
pub const CONDITION_AGENTS_DEPLOYED: &str = "AgentsDeployed";
/// Condition: all of the above.
pub const CONDITION_READY: &str = "Ready";

/// GitOpsCluster onboards the managed clusters selected by a Placement into the hub Argo CD through
/// argocd-agent: certificates, an Argo CD cluster secret and an agent ManifestWork per cluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "apps.open-cluster-management.io",
    version = "v1alpha1",
    kind = "GitOpsCluster",
    plural = "gitopsclusters",
    namespaced,
    status = "GitOpsClusterStatus",
    shortname = "gitopscluster",
    shortname = "goc",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "GitOpsCluster onboards the managed clusters selected by a Placement into the hub Argo CD through argocd-agent."
)]
#[serde(rename_all = "camelCase")]
pub struct GitOpsClusterSpec {
    /// Reference to the Placement (cluster.open-cluster-management.io) whose decisions select the
    /// managed clusters.
    pub placement_ref: PlacementRef,
    /// How the argocd-agent is deployed on the selected clusters.
    #[serde(rename = "argoCDAgentAddon")]
    pub argocd_agent_addon: ArgoCDAgentAddonSpec,
    /// The hub Argo CD the clusters are registered with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argo_server: Option<ArgoServerSpec>,
}

/// `spec.placementRef` (an ObjectReference, as upstream).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementRef {
    /// API version of the referent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind of the referent; must be `Placement`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name of the Placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Namespace of the Placement (default: the GitOpsCluster's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `spec.argoCDAgentAddon`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArgoCDAgentAddonSpec {
    /// Agent mode: `managed` (the hub owns Applications) or `autonomous` (the spoke does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Container image of the agent (default: the operator's own version of argocd-agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Address (host or IP) agents dial to reach the principal; also added to the principal's
    /// certificate. Default: discovered from the principal Service (LoadBalancer ingress, else a
    /// node's InternalIP for a NodePort Service) and written back here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal_server_address: Option<String>,
    /// Port of the principal. Default: discovered (the Service's TLS port, or its node port for a
    /// NodePort Service) and written back here, else 443.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal_server_port: Option<String>,
    /// Namespace of the agent on the managed cluster (default `argocd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_namespace: Option<String>,
    /// Namespace of the Argo CD operator on the managed cluster (upstream field; not used here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_namespace: Option<String>,
    /// Manifests for the managed clusters, at least one an `argoproj.io/v1beta1` `ArgoCD` CR
    /// (upstream field): delivered in their own ManifestWork `argocd-agent-cr-<namespace>-<name>`,
    /// with the principal endpoint set in each ArgoCD CR that leaves it empty.
    #[serde(
        default,
        rename = "argoCDCRManifestWork",
        skip_serializing_if = "Option::is_none"
    )]
    pub argocd_cr_manifest_work: Option<ArgoCDCRManifestWork>,
    /// Opt-in fallback: issue the agent's private key on the hub and ship it in the ManifestWork.
    /// Default (false): the agent's key stays on its cluster and only a CSR with signer
    /// `open-cluster-management.io/argocd-agent-addon` reaches the hub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_key_in_manifest_work: Option<bool>,
}

/// `spec.argoCDAgentAddon.argoCDCRManifestWork`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ArgoCDCRManifestWork {
    /// Raw Kubernetes manifests.
    #[schemars(schema_with = "raw_objects_schema")]
    pub manifests: Vec<Value>,
}

fn raw_objects_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}

/// `spec.argoServer` (the field name of upstream's earlier GitOpsCluster).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArgoServerSpec {
    /// Namespace of the hub Argo CD, served by one principal on the hub (default: the
    /// GitOpsCluster's own namespace, as upstream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argo_namespace: Option<String>,
}

/// `status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitOpsClusterStatus {
    /// PlacementResolved, CertificatesReady, ClustersRegistered, AgentsDeployed and Ready, and
    /// upstream's condition types (RBACReady, ServerDiscovered, JWTSecretReady, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One entry per cluster selected by the placement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterOnboardingStatus>,
}

/// `status.clusters[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterOnboardingStatus {
    /// Managed cluster (and agent) name.
    pub name: String,
    /// `Onboarded`, `Deploying`, `Conflict` or `Failed`.
    pub phase: String,
    /// What is wrong and what to do, when not onboarded.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Agent mode deployed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
    /// The agent Deployment reported ready through the ManifestWork feedback.
    #[serde(default)]
    pub agent_ready: bool,
    /// End of validity of the cluster's client certificate, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_not_after: Option<String>,
}

impl GitOpsCluster {
    /// The agent mode (`managed` when unset).
    pub fn mode(&self) -> &str {
        self.spec
            .argocd_agent_addon
            .mode
            .as_deref()
            .filter(|m| !m.is_empty())
            .unwrap_or(DEFAULT_MODE)
    }

    /// The agent namespace on the managed clusters.
    pub fn agent_namespace(&self) -> &str {
        self.agent_namespace_or(None)
    }

    /// The agent namespace on the managed clusters: the spec's, else `default`, else `argocd`.
    pub fn agent_namespace_or<'a>(&'a self, default: Option<&'a str>) -> &'a str {
        self.spec
            .argocd_agent_addon
            .agent_namespace
            .as_deref()
            .filter(|m| !m.is_empty())
            .or(default.filter(|d| !d.is_empty()))
            .unwrap_or(DEFAULT_AGENT_NAMESPACE)
    }

    /// Whether the agent's private key is shipped in the ManifestWork (opt-in fallback).
    pub fn agent_key_in_manifest_work(&self) -> bool {
        self.spec
            .argocd_agent_addon
            .agent_key_in_manifest_work
            .unwrap_or(false)
    }
}

/// The CRD YAML checked in under `charts/argocd-agent-principal/crds/gitopsclusters.yaml` (and
/// installed by the e2e harness from `e2e/crds/`).
pub fn gitopscluster_crd_yaml() -> String {
    let mut crd = serde_json::to_value(GitOpsCluster::crd()).expect("a CRD serialises");
    // kube 1.20 rejects schema defaults on status fields written as empty; keep none but `mode`.
    strip_status_defaults(&mut crd);
    let yaml = serde_norway::to_string(&crd).expect("a CRD serialises");
    format!("# Generated from argocd_agent_operator::gitops::crd::GitOpsClusterSpec; do not edit.\n---\n{yaml}")
}

fn strip_status_defaults(node: &mut Value) {
    match node {
        Value::Object(map) => {
            map.remove("default");
            for (key, child) in map.iter_mut() {
                if key == "properties" {
                    child
                        .as_object_mut()
                        .into_iter()
                        .flat_map(|p| p.values_mut())
                        .for_each(strip_status_defaults);
                } else {
                    strip_status_defaults(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_status_defaults),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_gitopscluster_yaml_deserialises() {
        let obj: GitOpsCluster = serde_norway::from_str(
            r#"
apiVersion: apps.open-cluster-management.io/v1alpha1
kind: GitOpsCluster
metadata: {name: gitops, namespace: openshift-gitops}
spec:
  placementRef: {kind: Placement, apiVersion: cluster.open-cluster-management.io/v1beta1, name: all}
  argoCDAgentAddon:
    mode: autonomous
    principalServerAddress: principal.example.com
    principalServerPort: "443"
    agentNamespace: agents
    operatorNamespace: openshift-gitops-operator
"#,
        )
        .unwrap();
        assert_eq!(obj.mode(), "autonomous");
        assert_eq!(obj.agent_namespace(), "agents");
        assert_eq!(obj.spec.placement_ref.name.as_deref(), Some("all"));
        assert!(!obj.agent_key_in_manifest_work());
        let back = serde_json::to_value(&obj.spec).unwrap();
        assert_eq!(back["argoCDAgentAddon"]["principalServerPort"], "443");
    }

    #[test]
    fn checked_in_crd_matches_the_type() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let generated = gitopscluster_crd_yaml();
        for path in [
            root.join("charts/argocd-agent-principal/crds/gitopsclusters.yaml"),
            root.join("e2e/crds/apps.open-cluster-management.io_gitopsclusters.yaml"),
        ] {
            if std::env::var_os("UPDATE_CRDS").is_some() {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &generated).unwrap();
            }
            let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                checked_in == generated,
                "{} is out of date with gitops::crd::GitOpsClusterSpec; regenerate with \
                 UPDATE_CRDS=1 cargo test -p argocd-agent-operator checked_in_crd_matches_the_type",
                path.display()
            );
        }
    }
}
