//! `spec.argoCDAgentAddon.argoCDCRManifestWork`: user-provided manifests (at least one Argo CD
//! operator `ArgoCD` CR) delivered to every selected cluster in their own ManifestWork, as upstream
//! argocd-pull-integration does: validated first (at least one manifest, each an object, at least
//! one `argoproj.io/v1beta1` `ArgoCD`), the principal endpoint injected into each ArgoCD CR where
//! the user left it empty, and named `argocd-agent-cr-<namespace>-<name>` (cut to 63 characters
//! with a hash suffix).
//!
//! Owns that validation, the injection and the ManifestWork's name and layout. Pure: the
//! controller writes and offboards the work. Unlike upstream, nothing is delivered when the field
//! is unset: upstream's default CR makes the Argo CD operator on the spoke run an agent, and the
//! agent ManifestWork ([`super::agent_work`]) already runs ours.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::agent_work::{hub_labels, OWNER_ANNOTATION};
use crate::pull::manifestwork::{ManifestWork, ManifestWorkSpec, ManifestsTemplate};

/// Prefix of the ManifestWork name (upstream's).
pub const CR_WORK_PREFIX: &str = "argocd-agent-cr";
/// Upstream's label marking the work as a GitOpsCluster's.
pub const GITOPSCLUSTER_LABEL: &str = "apps.open-cluster-management.io/gitopscluster";
/// Upstream's component label and value on the work.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// Value of [`COMPONENT_LABEL`].
pub const COMPONENT_ARGOCD_CR: &str = "argocd-cr";

fn is_argocd_cr(manifest: &Value) -> bool {
    manifest.get("apiVersion").and_then(Value::as_str) == Some("argoproj.io/v1beta1")
        && manifest.get("kind").and_then(Value::as_str) == Some("ArgoCD")
}

/// Checks the manifests as upstream does; the error names the rule broken.
pub fn validate(manifests: &[Value]) -> Result<(), String> {
    if manifests.is_empty() {
        return Err("argoCDCRManifestWork.manifests must contain at least one manifest".into());
    }
    if let Some(i) = manifests.iter().position(|m| !m.is_object()) {
        return Err(format!(
            "argoCDCRManifestWork.manifests[{i}] is not a Kubernetes object"
        ));
    }
    if !manifests.iter().any(is_argocd_cr) {
        return Err("argoCDCRManifestWork.manifests must contain at least one ArgoCD CR (apiVersion: argoproj.io/v1beta1, kind: ArgoCD)".into());
    }
    Ok(())
}

/// Sets the principal endpoint on an ArgoCD CR where it is absent or empty (user values win):
/// `spec.argoCDAgent.agent.client.principalServerAddress`/`Port` when the CR configures
/// `spec.argoCDAgent.agent`, else `spec.extraConfig["agent.principal.server.address"/"port"]`.
/// Other manifests are returned unchanged.
pub fn inject_endpoint(manifest: &Value, address: &str, port: u16) -> Value {
    let mut out = manifest.clone();
    if !is_argocd_cr(&out) {
        return out;
    }
    let port = port.to_string();
    let fill = |map: &mut serde_json::Map<String, Value>, key: &str, value: &str| {
        if map
            .get(key)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            map.insert(key.to_owned(), json!(value));
        }
    };
    let spec = out
        .as_object_mut()
        .expect("an ArgoCD CR is an object")
        .entry("spec")
        .or_insert_with(|| json!({}));
    if !spec.is_object() {
        *spec = json!({});
    }
    let spec = spec.as_object_mut().expect("made an object");
    if let Some(agent) = spec
        .get_mut("argoCDAgent")
        .and_then(|a| a.get_mut("agent"))
        .and_then(Value::as_object_mut)
    {
        let client = agent.entry("client").or_insert_with(|| json!({}));
        if !client.is_object() {
            *client = json!({});
        }
        let client = client.as_object_mut().expect("made an object");
        fill(client, "principalServerAddress", address);
        fill(client, "principalServerPort", &port);
        return out;
    }
    let extra = spec.entry("extraConfig").or_insert_with(|| json!({}));
    if !extra.is_object() {
        *extra = json!({});
    }
    let extra = extra.as_object_mut().expect("made an object");
    fill(extra, "agent.principal.server.address", address);
    fill(extra, "agent.principal.server.port", &port);
    out
}

/// `argocd-agent-cr-<namespace>-<name>`; over 63 characters, cut to 54 and suffixed with `-` and
/// the first 8 hex digits of the full name's SHA-256 (upstream's scheme).
pub fn cr_work_name(goc_namespace: &str, goc_name: &str) -> String {
    let name = format!("{CR_WORK_PREFIX}-{goc_namespace}-{goc_name}");
    if name.len() <= 63 {
        return name;
    }
    let digest = hex::encode(Sha256::digest(name.as_bytes()));
    format!("{}-{}", &name[..63 - 9], &digest[..8])
}

/// What decides one cluster's ArgoCD CR ManifestWork.
pub struct CrDelivery<'a> {
    /// Managed cluster (the work's namespace).
    pub cluster: &'a str,
    /// Owning GitOpsCluster, `namespace/name`.
    pub owner: &'a str,
    /// The work's name ([`cr_work_name`]).
    pub name: &'a str,
    /// The validated manifests.
    pub manifests: &'a [Value],
    /// Principal host injected into ArgoCD CRs.
    pub principal_address: &'a str,
    /// Principal port injected into ArgoCD CRs.
    pub principal_port: u16,
}

/// The ManifestWork delivering the manifests, endpoint injected, labelled as upstream (plus this
/// operator's managed-by label and owner annotation, by which it is offboarded).
pub fn build_cr_work(d: &CrDelivery<'_>) -> ManifestWork {
    let mut labels = hub_labels(d.cluster);
    labels.insert(GITOPSCLUSTER_LABEL.to_owned(), "true".to_owned());
    labels.insert(COMPONENT_LABEL.to_owned(), COMPONENT_ARGOCD_CR.to_owned());
    ManifestWork {
        metadata: ObjectMeta {
            name: Some(d.name.to_owned()),
            namespace: Some(d.cluster.to_owned()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                OWNER_ANNOTATION.to_owned(),
                d.owner.to_owned(),
            )])),
            ..Default::default()
        },
        spec: ManifestWorkSpec {
            workload: ManifestsTemplate {
                manifests: d
                    .manifests
                    .iter()
                    .map(|m| inject_endpoint(m, d.principal_address, d.principal_port))
                    .collect(),
            },
            ..Default::default()
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argocd(spec: Value) -> Value {
        json!({"apiVersion": "argoproj.io/v1beta1", "kind": "ArgoCD", "metadata": {"name": "argocd"}, "spec": spec})
    }

    #[test]
    fn manifests_need_an_argocd_cr() {
        assert!(validate(&[]).unwrap_err().contains("at least one manifest"));
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
        assert!(validate(std::slice::from_ref(&cm))
            .unwrap_err()
            .contains("at least one ArgoCD CR"));
        assert!(validate(&[cm.clone(), json!("text")])
            .unwrap_err()
            .contains("manifests[1] is not a Kubernetes object"));
        let old = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "ArgoCD"});
        assert!(
            validate(&[old]).is_err(),
            "only v1beta1 counts, as upstream"
        );
        assert_eq!(validate(&[cm, argocd(json!({}))]), Ok(()));
    }

    #[test]
    fn endpoint_is_injected_where_empty_and_user_values_are_kept() {
        let structured = argocd(json!({"argoCDAgent": {"agent": {"enabled": true}}}));
        let out = inject_endpoint(&structured, "principal.example.com", 443);
        assert_eq!(
            out["spec"]["argoCDAgent"]["agent"]["client"],
            json!({"principalServerAddress": "principal.example.com", "principalServerPort": "443"})
        );
        let user = argocd(json!({"argoCDAgent": {"agent": {"client": {
            "principalServerAddress": "mine.example.com", "principalServerPort": ""}}}}));
        let out = inject_endpoint(&user, "principal.example.com", 8443);
        assert_eq!(
            out["spec"]["argoCDAgent"]["agent"]["client"],
            json!({"principalServerAddress": "mine.example.com", "principalServerPort": "8443"})
        );
        let plain = argocd(json!({"extraConfig": {"agent.principal.server.port": "9443"}}));
        let out = inject_endpoint(&plain, "10.0.0.5", 30443);
        assert_eq!(
            out["spec"]["extraConfig"],
            json!({"agent.principal.server.address": "10.0.0.5", "agent.principal.server.port": "9443"})
        );
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {}});
        assert_eq!(
            inject_endpoint(&cm, "x", 1),
            cm,
            "other manifests untouched"
        );
    }

    #[test]
    fn work_is_named_as_upstream_and_cut_to_63_characters() {
        assert_eq!(
            cr_work_name("argocd", "gitops"),
            "argocd-agent-cr-argocd-gitops"
        );
        let long = cr_work_name("openshift-gitops", &"g".repeat(60));
        assert_eq!(long.len(), 63);
        assert!(
            long.starts_with("argocd-agent-cr-openshift-gitops-ggg"),
            "{long}"
        );
        assert_ne!(long, cr_work_name("openshift-gitops", &"g".repeat(61)));
        let work = build_cr_work(&CrDelivery {
            cluster: "cluster1",
            owner: "argocd/gitops",
            name: "argocd-agent-cr-argocd-gitops",
            manifests: &[argocd(json!({}))],
            principal_address: "p.example.com",
            principal_port: 443,
        });
        let labels = work.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[GITOPSCLUSTER_LABEL], "true");
        assert_eq!(labels[COMPONENT_LABEL], COMPONENT_ARGOCD_CR);
        assert_eq!(work.metadata.namespace.as_deref(), Some("cluster1"));
        assert_eq!(
            work.spec.workload.manifests[0]["spec"]["extraConfig"]
                ["agent.principal.server.address"],
            "p.example.com"
        );
    }
}
