//! Agent client certificates through OCM add-on registration: the agent's private key is made on
//! its cluster and only a CertificateSigningRequest (signer
//! `open-cluster-management.io/argocd-agent-addon`) reaches the hub. The operator approves and
//! signs such a CSR with the fleet CA when it comes from an onboarded cluster and asks for a
//! client certificate with CN = the cluster name and nothing else; otherwise it denies it with a
//! reason. CSRs for other signers, and CSRs of clusters this principal does not onboard (another
//! principal's operator on the same hub may), are never touched.
//!
//! Owns the review rule ([`review_csr`]) and the approve/sign/deny writes.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::pki::CertificateAuthority;

/// The signer name of the argocd-agent add-on (upstream's).
pub const ADDON_SIGNER: &str = "open-cluster-management.io/argocd-agent-addon";
/// Label OCM's registration agent puts on add-on CSRs, naming the cluster.
pub const CSR_CLUSTER_LABEL: &str = "open-cluster-management.io/cluster-name";

/// What to do with a CSR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CsrDecision {
    /// Not ours, or already decided.
    Ignore,
    /// Sign it as a client certificate for this cluster.
    Sign(String),
    /// Deny it, saying why.
    Deny(String),
}

fn decided(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.as_ref();
    status.and_then(|s| s.certificate.as_ref()).is_some()
        || status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Denied" || c.type_ == "Failed"))
}

/// Reviews a CSR: ours only if its signer is [`ADDON_SIGNER`]; signed only for an onboarded
/// cluster, requested by that cluster's OCM identity, for client auth.
pub fn review_csr(csr: &CertificateSigningRequest, onboarded: &BTreeSet<String>) -> CsrDecision {
    if csr.spec.signer_name != ADDON_SIGNER || decided(csr) {
        return CsrDecision::Ignore;
    }
    let Some(cluster) = csr
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(CSR_CLUSTER_LABEL))
        .filter(|c| !c.is_empty())
    else {
        return CsrDecision::Deny(format!("no {CSR_CLUSTER_LABEL} label"));
    };
    if !onboarded.contains(cluster) {
        // Another principal's operator on this hub may onboard it (each reviews only the clusters
        // of the GitOpsClusters it owns); a CSR nobody onboards stays pending until the
        // apiserver's CSR cleaner removes it.
        return CsrDecision::Ignore;
    }
    let user = csr.spec.username.as_deref().unwrap_or_default();
    let expected = format!("system:open-cluster-management:{cluster}:");
    if !user.starts_with(&expected) {
        return CsrDecision::Deny(format!(
            "requested by {user:?}, not by cluster {cluster:?}'s agent ({expected}*)"
        ));
    }
    let usages = csr.spec.usages.clone().unwrap_or_default();
    if let Some(u) = usages.iter().find(|u| {
        !matches!(
            u.as_str(),
            "client auth" | "digital signature" | "key encipherment"
        )
    }) {
        return CsrDecision::Deny(format!(
            "usage {u:?} requested; only client auth is allowed"
        ));
    }
    CsrDecision::Sign(cluster.clone())
}

fn condition(type_: &str, reason: &str, message: &str) -> CertificateSigningRequestCondition {
    CertificateSigningRequestCondition {
        type_: type_.to_owned(),
        status: "True".to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_update_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        ..CertificateSigningRequestCondition::default()
    }
}

/// Approves and signs, or denies, every pending add-on CSR. Returns how many were signed.
pub async fn process_csrs(
    client: &kube::Client,
    ca: &CertificateAuthority,
    onboarded: &BTreeSet<String>,
    validity: Duration,
) -> Result<usize, kube::Error> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let pp = PatchParams::default();
    let mut signed = 0;
    for csr in api.list(&Default::default()).await?.items {
        let name = csr.metadata.name.clone().unwrap_or_default();
        let decision = review_csr(&csr, onboarded);
        let (cluster, pem) = match decision {
            CsrDecision::Ignore => continue,
            CsrDecision::Deny(reason) => {
                tracing::warn!(csr = %name, %reason, "denying add-on CSR");
                let patch = json!({"status": {"conditions": [condition("Denied", "ArgoCDAgentAddonRefused", &reason)]}});
                api.patch_approval(&name, &pp, &Patch::Merge(&patch))
                    .await?;
                continue;
            }
            CsrDecision::Sign(cluster) => {
                let request = String::from_utf8_lossy(&csr.spec.request.0).into_owned();
                (cluster.clone(), ca.sign_csr(&request, &cluster, validity))
            }
        };
        match pem {
            Err(e) => {
                let reason = e.to_string();
                tracing::warn!(csr = %name, %cluster, %reason, "denying add-on CSR");
                let patch = json!({"status": {"conditions": [condition("Denied", "ArgoCDAgentAddonRefused", &reason)]}});
                api.patch_approval(&name, &pp, &Patch::Merge(&patch))
                    .await?;
            }
            Ok(cert) => {
                let approved = json!({"status": {"conditions": [condition("Approved", "ArgoCDAgentAddonApproved", "cluster is onboarded by a GitOpsCluster")]}});
                api.patch_approval(&name, &pp, &Patch::Merge(&approved))
                    .await?;
                let status = json!({"status": {"certificate": ByteString(cert.into_bytes())}});
                api.patch_status(&name, &pp, &Patch::Merge(&status)).await?;
                tracing::info!(csr = %name, %cluster, "signed add-on client certificate");
                signed += 1;
            }
        }
    }
    Ok(signed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr(
        signer: &str,
        cluster: Option<&str>,
        user: &str,
        usages: &[&str],
    ) -> CertificateSigningRequest {
        serde_json::from_value(json!({
            "metadata": {"name": "x", "labels": cluster.map(|c| json!({CSR_CLUSTER_LABEL: c})).unwrap_or(json!({}))},
            "spec": {"signerName": signer, "request": "", "username": user, "usages": usages}
        }))
        .unwrap()
    }

    #[test]
    fn only_addon_csrs_of_onboarded_clusters_from_their_own_identity_are_signed() {
        let onboarded = BTreeSet::from(["c1".to_string()]);
        let user = "system:open-cluster-management:c1:agent-x";
        assert_eq!(
            review_csr(
                &csr(ADDON_SIGNER, Some("c1"), user, &["client auth"]),
                &onboarded
            ),
            CsrDecision::Sign("c1".into())
        );
        assert_eq!(
            review_csr(
                &csr(
                    "kubernetes.io/kube-apiserver-client",
                    Some("c1"),
                    user,
                    &["client auth"]
                ),
                &onboarded
            ),
            CsrDecision::Ignore
        );
        // Not onboarded here: left to the principal that onboards it, never denied.
        assert_eq!(
            review_csr(
                &csr(
                    ADDON_SIGNER,
                    Some("c2"),
                    "system:open-cluster-management:c2:a",
                    &["client auth"],
                ),
                &onboarded
            ),
            CsrDecision::Ignore
        );
        for bad in [
            csr(ADDON_SIGNER, None, user, &["client auth"]),
            csr(
                ADDON_SIGNER,
                Some("c1"),
                "system:open-cluster-management:c2:a",
                &["client auth"],
            ),
            csr(ADDON_SIGNER, Some("c1"), user, &["server auth"]),
        ] {
            assert!(matches!(review_csr(&bad, &onboarded), CsrDecision::Deny(_)));
        }
    }
}
