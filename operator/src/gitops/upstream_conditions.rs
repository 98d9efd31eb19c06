//! The GitOpsCluster conditions of upstream argocd-pull-integration (its 14 condition types and
//! 5 reasons), so tools keyed on upstream's status read this operator's GitOpsClusters unchanged.
//!
//! Owns the vocabulary and the pure translation of what one reconciliation found for a GitOpsCluster
//! ([`PassFacts`]) into those conditions. This operator's own conditions (`Ready`,
//! `PlacementResolved`, ...) are written beside them by the controller. Upstream steps this
//! operator has no counterpart for — the add-on manager's RBAC, the AddOnTemplate and
//! AddOnDeploymentConfig/ManagedClusterAddOn (the agent is deployed by ManifestWork, not by the
//! add-on framework) — are reported `True` with a message that says so, so "all True" still means
//! "onboarded" to such tools.

/// Upstream open-cluster-management-io/multicloud-integrations' GitOpsCluster (whose
/// `spec.argoServer.argoNamespace` this operator reads): the Argo CD that field names was found.
/// Written `False` ([`REASON_ARGO_SERVER_NOT_FOUND`]) on a GitOpsCluster naming a namespace no
/// principal on the hub serves, by the principal serving the GitOpsCluster's own namespace.
pub const ARGO_SERVER_VERIFIED: &str = "ArgoServerVerified";
/// multicloud-integrations' reason of [`ARGO_SERVER_VERIFIED`] `False`.
pub const REASON_ARGO_SERVER_NOT_FOUND: &str = "ArgoServerNotFound";
/// Upstream: RBAC for the add-on manager is ready.
pub const RBAC_READY: &str = "RBACReady";
/// Upstream: the principal's address and port are known.
pub const SERVER_DISCOVERED: &str = "ServerDiscovered";
/// Upstream: the principal's JWT signing key Secret exists.
pub const JWT_SECRET_READY: &str = "JWTSecretReady";
/// Upstream: the CA exists.
pub const CA_CERTIFICATE_READY: &str = "CACertificateReady";
/// Upstream: the principal's server certificate is issued.
pub const PRINCIPAL_CERTIFICATE_READY: &str = "PrincipalCertificateReady";
/// Upstream: the resource proxy's server certificate is issued.
pub const RESOURCE_PROXY_CERTIFICATE_READY: &str = "ResourceProxyCertificateReady";
/// Upstream: the Placement has been evaluated.
pub const PLACEMENT_EVALUATED: &str = "PlacementEvaluated";
/// Upstream: the selected clusters are registered with the hub Argo CD.
pub const CLUSTERS_IMPORTED: &str = "ClustersImported";
/// Upstream: the per-cluster ManifestWork is written.
pub const MANIFEST_WORK_CREATED: &str = "ManifestWorkCreated";
/// Upstream: the `argoCDCRManifestWork` manifests are delivered.
pub const ARGOCD_CR_DELIVERED: &str = "ArgoCDCRDelivered";
/// Upstream: the agent is configured on every selected cluster.
pub const ADDON_CONFIGURED: &str = "AddonConfigured";
/// Upstream: the Placement tolerates the unreachable/unavailable taints.
pub const PLACEMENT_TOLERATION_CONFIGURED: &str = "PlacementTolerationConfigured";
/// Upstream: the AddOnTemplate is current.
pub const ADDON_TEMPLATE_READY: &str = "AddOnTemplateReady";
/// Upstream: clusters removed from the placement were offboarded (only set when some were).
pub const REMOVED_CLUSTERS_CLEANED_UP: &str = "RemovedClustersCleanedUp";

/// Upstream reason: the step succeeded.
pub const REASON_SUCCESS: &str = "Success";
/// Upstream reason: the step failed.
pub const REASON_FAILED: &str = "Failed";
/// Upstream reason: the step has not run yet.
pub const REASON_IN_PROGRESS: &str = "InProgress";
/// Upstream reason: the principal's address or port is unknown.
pub const REASON_SERVER_NOT_DISCOVERED: &str = "ServerNotDiscovered";
/// Upstream reason: the Placement selects no cluster.
pub const REASON_NO_CLUSTERS: &str = "NoClusters";

/// One condition: type, status (`True`/`False`/`Unknown`), reason, message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamCondition {
    /// Condition type.
    pub type_: &'static str,
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// One of the `REASON_*` constants.
    pub reason: &'static str,
    /// What happened.
    pub message: String,
}

/// What one reconciliation found for its GitOpsCluster. `None` for a step it did not reach.
#[derive(Clone, Debug, Default)]
pub struct PassFacts {
    /// The principal endpoint (`host`, `port`) the agents dial, or why it is unknown.
    pub server: Option<Result<(String, u16), String>>,
    /// The JWT signing key Secret exists (or why not).
    pub jwt: Option<Result<(), String>>,
    /// The CA is usable (or why not).
    pub ca: Option<Result<(), String>>,
    /// The principal and resource-proxy certificates are current.
    pub server_certs: Option<Result<(), String>>,
    /// The Placement's selection (cluster count), or why it could not be read.
    pub placement: Option<Result<usize, String>>,
    /// Clusters whose cluster Secret could not be written, out of those this GitOpsCluster owns.
    pub import_failures: Vec<String>,
    /// Clusters whose agent ManifestWork could not be written.
    pub work_failures: Vec<String>,
    /// Clusters this GitOpsCluster onboards in this reconciliation.
    pub owned_clusters: usize,
    /// `argoCDCRManifestWork`: `None` when not set; else delivered or why not.
    pub argocd_cr: Option<Result<(), String>>,
    /// Clusters offboarded in this reconciliation because they left the placement.
    pub removed_clusters: usize,
}

/// Cluster names as upstream lists them in messages: up to three, then the total.
fn join_clusters(clusters: &[String]) -> String {
    if clusters.len() <= 3 {
        format!("[{}]", clusters.join(" "))
    } else {
        format!(
            "[{}]... ({} total)",
            clusters[..3].join(" "),
            clusters.len()
        )
    }
}

fn cond(type_: &'static str, ok: bool, reason: &'static str, message: String) -> UpstreamCondition {
    UpstreamCondition {
        type_,
        status: if ok { "True" } else { "False" },
        reason,
        message,
    }
}

fn pending(type_: &'static str) -> UpstreamCondition {
    UpstreamCondition {
        type_,
        status: "Unknown",
        reason: REASON_IN_PROGRESS,
        message: "Reconciliation in progress".into(),
    }
}

/// A step's condition from its outcome: `None` → Unknown/InProgress.
fn step(
    type_: &'static str,
    outcome: Option<&Result<(), String>>,
    success: &str,
    failure: &str,
) -> UpstreamCondition {
    match outcome {
        None => pending(type_),
        Some(Ok(())) => cond(type_, true, REASON_SUCCESS, success.to_owned()),
        Some(Err(e)) => cond(type_, false, REASON_FAILED, format!("{failure}: {e}")),
    }
}

/// Upstream's conditions for what the reconciliation found (`RemovedClustersCleanedUp` only when clusters
/// were removed, as upstream).
pub fn upstream_conditions(facts: &PassFacts) -> Vec<UpstreamCondition> {
    let mut out = vec![cond(
        RBAC_READY,
        true,
        REASON_SUCCESS,
        "no add-on manager RBAC needed: the principal embeds the operator".into(),
    )];
    out.push(match &facts.server {
        None => pending(SERVER_DISCOVERED),
        Some(Ok((host, port))) => cond(
            SERVER_DISCOVERED,
            true,
            REASON_SUCCESS,
            format!("Server at {host}:{port}"),
        ),
        Some(Err(e)) => cond(
            SERVER_DISCOVERED,
            false,
            REASON_SERVER_NOT_DISCOVERED,
            format!("Server discovery failed: {e}"),
        ),
    });
    out.push(step(
        JWT_SECRET_READY,
        facts.jwt.as_ref(),
        "JWT secret created successfully",
        "Failed to create JWT secret",
    ));
    out.push(step(
        CA_CERTIFICATE_READY,
        facts.ca.as_ref(),
        "CA certificate created successfully",
        "Failed to create CA certificate",
    ));
    let certs = facts.server_certs.as_ref();
    out.push(step(
        PRINCIPAL_CERTIFICATE_READY,
        certs,
        "Principal certificate generated successfully",
        "Failed to generate principal certificate",
    ));
    out.push(step(
        RESOURCE_PROXY_CERTIFICATE_READY,
        certs,
        "Resource proxy certificate generated successfully",
        "Failed to generate resource proxy certificate",
    ));
    out.push(cond(
        ADDON_TEMPLATE_READY,
        true,
        REASON_SUCCESS,
        "no AddOnTemplate needed: the agent is deployed by ManifestWork".into(),
    ));
    // The tolerations are ensured while the Placement is read (placement::resolve).
    let placement_read: Option<Result<(), String>> = facts
        .placement
        .as_ref()
        .map(|p| p.as_ref().map(|_| ()).map_err(Clone::clone));
    out.push(step(
        PLACEMENT_TOLERATION_CONFIGURED,
        placement_read.as_ref(),
        "Placement tolerations configured successfully",
        "Failed to configure placement tolerations",
    ));
    out.push(match &facts.placement {
        None => pending(PLACEMENT_EVALUATED),
        Some(Ok(0)) => cond(
            PLACEMENT_EVALUATED,
            true,
            REASON_NO_CLUSTERS,
            "No managed clusters selected by placement".into(),
        ),
        Some(Ok(n)) => cond(
            PLACEMENT_EVALUATED,
            true,
            REASON_SUCCESS,
            format!("Evaluated {n} managed clusters"),
        ),
        Some(Err(e)) => cond(
            PLACEMENT_EVALUATED,
            false,
            REASON_FAILED,
            format!("Failed to evaluate placement: {e}"),
        ),
    });
    let evaluated = matches!(facts.placement, Some(Ok(n)) if n > 0);
    let per_cluster = |type_: &'static str, failures: &[String], ok: String, failed: &str| {
        if !evaluated {
            pending(type_)
        } else if failures.is_empty() {
            cond(type_, true, REASON_SUCCESS, ok)
        } else {
            cond(
                type_,
                false,
                REASON_FAILED,
                format!("{failed}: {}", join_clusters(failures)),
            )
        }
    };
    let n = facts.owned_clusters;
    out.push(per_cluster(
        CLUSTERS_IMPORTED,
        &facts.import_failures,
        format!("Imported {n} clusters to ArgoCD"),
        "Failed to import clusters",
    ));
    out.push(per_cluster(
        MANIFEST_WORK_CREATED,
        &facts.work_failures,
        format!("Created ManifestWorks for {n} clusters"),
        "Failed to create ManifestWorks for clusters",
    ));
    out.push(per_cluster(
        ADDON_CONFIGURED,
        &facts.work_failures,
        format!("Addon configured for {n} clusters (agent ManifestWork; no ManagedClusterAddOn)"),
        "Failed to configure addon for clusters",
    ));
    if let Some(cr) = &facts.argocd_cr {
        out.push(step(
            ARGOCD_CR_DELIVERED,
            Some(cr),
            &format!("ArgoCD CR ManifestWork created for {n} clusters"),
            "ArgoCD CR not delivered",
        ));
    }
    if facts.removed_clusters > 0 {
        out.push(cond(
            REMOVED_CLUSTERS_CLEANED_UP,
            true,
            REASON_SUCCESS,
            format!("Cleaned up {} removed cluster(s)", facts.removed_clusters),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find<'a>(conditions: &'a [UpstreamCondition], type_: &str) -> &'a UpstreamCondition {
        conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("no {type_} in {conditions:?}"))
    }

    #[test]
    fn a_converged_pass_sets_every_upstream_condition_true() {
        let facts = PassFacts {
            server: Some(Ok(("principal.example.com".into(), 443))),
            jwt: Some(Ok(())),
            ca: Some(Ok(())),
            server_certs: Some(Ok(())),
            placement: Some(Ok(2)),
            owned_clusters: 2,
            argocd_cr: Some(Ok(())),
            removed_clusters: 1,
            ..Default::default()
        };
        let conditions = upstream_conditions(&facts);
        let types: Vec<&str> = conditions.iter().map(|c| c.type_).collect();
        assert_eq!(types.len(), 14, "{types:?}");
        for c in &conditions {
            assert_eq!((c.status, c.reason), ("True", REASON_SUCCESS), "{c:?}");
        }
        assert_eq!(
            find(&conditions, SERVER_DISCOVERED).message,
            "Server at principal.example.com:443"
        );
        assert_eq!(
            find(&conditions, PLACEMENT_EVALUATED).message,
            "Evaluated 2 managed clusters"
        );
    }

    #[test]
    fn failures_and_unreached_steps_use_upstreams_reasons() {
        let facts = PassFacts {
            server: Some(Err("no external endpoint found".into())),
            placement: Some(Ok(0)),
            ..Default::default()
        };
        let conditions = upstream_conditions(&facts);
        let server = find(&conditions, SERVER_DISCOVERED);
        assert_eq!(
            (server.status, server.reason),
            ("False", REASON_SERVER_NOT_DISCOVERED)
        );
        let placement = find(&conditions, PLACEMENT_EVALUATED);
        assert_eq!(
            (placement.status, placement.reason),
            ("True", REASON_NO_CLUSTERS)
        );
        let jwt = find(&conditions, JWT_SECRET_READY);
        assert_eq!((jwt.status, jwt.reason), ("Unknown", REASON_IN_PROGRESS));
        assert!(
            conditions
                .iter()
                .all(|c| c.type_ != ARGOCD_CR_DELIVERED && c.type_ != REMOVED_CLUSTERS_CLEANED_UP),
            "only set when there is something to report"
        );

        let failed = upstream_conditions(&PassFacts {
            placement: Some(Ok(5)),
            import_failures: ["a", "b", "c", "d"].map(String::from).to_vec(),
            argocd_cr: Some(Err("no ArgoCD CR".into())),
            ..Default::default()
        });
        let imported = find(&failed, CLUSTERS_IMPORTED);
        assert_eq!((imported.status, imported.reason), ("False", REASON_FAILED));
        assert_eq!(
            imported.message,
            "Failed to import clusters: [a b c]... (4 total)"
        );
        let cr = find(&failed, ARGOCD_CR_DELIVERED);
        assert_eq!((cr.status, cr.reason), ("False", REASON_FAILED));
        let tolerations = find(
            &upstream_conditions(&PassFacts {
                placement: Some(Err("Placement p/x not found".into())),
                ..Default::default()
            }),
            PLACEMENT_TOLERATION_CONFIGURED,
        )
        .clone();
        assert_eq!(
            (tolerations.status, tolerations.reason),
            ("False", REASON_FAILED)
        );
    }
}
