//! One GitOpsCluster's reconciliation, and the sweep of objects whose GitOpsCluster is gone.
//!
//! A reconciliation of GitOpsCluster G: finalizer → the fleet ([`Fleet`]: placements, cluster
//! assignment, the operator's objects) → PKI (CA) → principal endpoint (discovered, written back
//! into G's spec when it lacks it) → JWT signing key Secret → principal and resource-proxy
//! certificates (their names cover every served GitOpsCluster's endpoint) → per cluster assigned
//! to G: Argo CD cluster secret, agent ManifestWork (certificates reused while current, reissued
//! when not) and the `argoCDCRManifestWork` work → offboarding of the objects G is responsible
//! for ([`Fleet::responsible`]) that are no longer wanted → G's finalizer, once G is deleted and
//! its objects are gone → add-on CSRs of G's clusters → G's status (this operator's conditions
//! and upstream's). Writes happen only when content differs, so reconciling a converged fleet is
//! read-only. A GitOpsCluster whose placement cannot be resolved or whose spec is invalid keeps
//! its existing clusters untouched (a typo must not offboard a fleet) and says why in its
//! status. Only the GitOpsClusters this principal serves ([`argocd_namespace_of`]) are
//! reconciled (this principal's finalizer is its claim: [`finalizer_of`]), so several principals
//! on one hub never overwrite each other's objects; of the others, one this principal still
//! claims (it moved elsewhere) has its objects of this principal removed and the claim released,
//! and one naming a namespace no principal serves is reported by the principal serving its own
//! namespace ([`home_of_unserved`], after [`CLAIM_GRACE`]); any other is neither read nor
//! written. [`sweep`] removes an object no GitOpsCluster wants and whose owner is gone or served
//! elsewhere, including another principal's whose GitOpsCluster is gone (its claim removed by
//! hand: [`Fleet::ours`]).

use std::collections::{BTreeMap, BTreeSet};

use argocd_agent_proto::identity::AgentName;
use base64::Engine;
use chrono::Utc;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

use super::agent_work::{
    agent_readiness, build_agent_manifest_work, embedded_client_tls, hub_labels, AgentDeployment,
    AGENT_WORK_NAME, CLUSTER_NAME_LABEL, OWNER_ANNOTATION, PRINCIPAL_ANNOTATION,
};
use super::argocd_cr::{build_cr_work, cr_work_name, validate, CrDelivery};
use super::certs::{
    ensure_ca, ensure_server_cert, principal_sans, reissue_reason, resource_proxy_sans, CaProblem,
};
use super::crd::*;
use super::csr::process_csrs;
pub use super::fleet::argocd_namespace_of;
use super::fleet::{
    finalizer_of, home_of_unserved, is_live, kube_err, name_in, owner, principal_of, Fleet,
    Responsible, Selection, Stores, Unclaimed, CLAIM_GRACE, INVALID_MODE,
};
use super::placement::goc_key;
use super::server_discovery::{discover_principal_endpoint, endpoint_for, write_back};
use super::upstream_conditions::{
    upstream_conditions, PassFacts, ARGO_SERVER_VERIFIED, REASON_ARGO_SERVER_NOT_FOUND,
};
use super::{OperatorError, OperatorOptions, FINALIZER};
use crate::pki::jwt::{generate_jwt_signing_key, JwtKeyAlgorithm};
use crate::pki::secrets::{
    jwt_secret, SecretStore, JWT_SECRET, PRINCIPAL_TLS_SECRET, RESOURCE_PROXY_TLS_SECRET,
};
use crate::pki::{inspect, CertificateAuthority, IssuedCert};
use crate::pull::manifestwork::{work_is_current, ManifestWork};
use crate::registration::{
    build_cluster_secret, cluster_secret_name, resource_proxy_server_url, ClusterTlsMaterial,
};

/// What happened to one selected cluster in this reconciliation.
struct ClusterOutcome {
    status: ClusterOnboardingStatus,
    registered: bool,
    deployed: bool,
}

impl ClusterOutcome {
    fn failed(mut status: ClusterOnboardingStatus, message: String) -> Self {
        status.message = message;
        ClusterOutcome {
            status,
            registered: false,
            deployed: false,
        }
    }
}

/// What one reconciliation did, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// Clusters with a cluster secret and ManifestWork afterwards.
    pub onboarded: BTreeSet<String>,
    /// Clusters whose objects were removed.
    pub offboarded: BTreeSet<String>,
    /// Add-on CSRs signed.
    pub csrs_signed: usize,
    /// Some work is waiting on others (finalizer cleanup): run again soon.
    pub requeue_soon: bool,
    /// Look again after this long (a GitOpsCluster given time to be claimed by its principal).
    pub recheck_after: Option<std::time::Duration>,
}

/// The fleet's PKI and the principal endpoint, as one live GitOpsCluster needs them.
struct Pki {
    ca: Result<CertificateAuthority, String>,
    server_cert_message: String,
    endpoint: Result<(String, u16), String>,
    jwt: Result<(), String>,
}

impl Pki {
    /// Ensures the CA, the JWT signing key and the server certificates (whose names cover every
    /// served GitOpsCluster's endpoint), and records the discovered endpoint in `goc`'s spec
    /// when it lacks one (as upstream).
    async fn ensure(
        client: &kube::Client,
        opts: &OperatorOptions,
        fleet: &Fleet,
        goc: &GitOpsCluster,
    ) -> Result<Pki, OperatorError> {
        // The PKI Secrets are read from the API, not a store: a CA read stale (absent) would
        // be generated anew over the existing one, invalidating every certificate it signed.
        let store = SecretStore::new(client.clone(), &opts.namespace);
        let ca = match ensure_ca(&store, &opts.certs).await {
            Ok((ca, _)) => Ok(ca),
            Err(CaProblem::Pki(e)) => return Err(e.into()),
            Err(problem) => {
                tracing::warn!(problem = %problem, "fleet CA unusable; not issuing certificates");
                Err(problem.to_string())
            }
        };
        let discovered =
            discover_principal_endpoint(client, &opts.namespace, &opts.principal_service)
                .await
                .map_err(kube_err(format!(
                    "discovering the principal endpoint from service {}/{}",
                    opts.namespace, opts.principal_service
                )))?;
        let flag_address = opts.principal_address.as_deref();
        let endpoint_of =
            |g: &GitOpsCluster| endpoint_for(g, flag_address, opts.principal_port, &discovered);
        if let Some(patch) = write_back(goc, flag_address, opts.principal_port, &discovered) {
            let api: Api<GitOpsCluster> =
                Api::namespaced(client.clone(), &goc.namespace().unwrap_or_default());
            api.patch(
                &goc.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(kube_err(format!(
                "writing the discovered principal endpoint into GitOpsCluster {}",
                goc_key(goc)
            )))?;
            tracing::info!(gitopscluster = %goc_key(goc), %patch, "discovered principal endpoint written into the spec");
        }
        let jwt = ensure_jwt_secret(&store).await;
        let mut server_cert_message = String::new();
        if let Ok(ca) = &ca {
            let mut hosts: Vec<String> = fleet
                .live()
                .filter_map(|g| endpoint_of(g).ok().map(|(host, _)| host))
                .collect();
            hosts.extend(discovered.iter().map(|d| d.address.clone()));
            let principal = ensure_server_cert(
                &store,
                ca,
                &opts.certs,
                PRINCIPAL_TLS_SECRET,
                &principal_sans(opts, &hosts),
            )
            .await?;
            let proxy = ensure_server_cert(
                &store,
                ca,
                &opts.certs,
                RESOURCE_PROXY_TLS_SECRET,
                &resource_proxy_sans(opts),
            )
            .await?;
            server_cert_message = format!(
                "CA valid until {}; principal certificate until {}; resource proxy certificate until {}",
                ca.info().not_after.to_rfc3339(),
                principal.not_after.to_rfc3339(),
                proxy.not_after.to_rfc3339()
            );
        }
        Ok(Pki {
            ca,
            server_cert_message,
            endpoint: endpoint_of(goc),
            jwt,
        })
    }
}

/// Reconciles the GitOpsCluster `goc`, given every GitOpsCluster on the hub (`every`, which
/// includes `goc`), the operator's stores of the other kinds it reads ([`Stores`]) and since when
/// the unserved ones have been unclaimed ([`Unclaimed`]). A GitOpsCluster another principal
/// serves is left alone.
pub async fn reconcile_gitopscluster(
    client: &kube::Client,
    opts: &OperatorOptions,
    stores: &Stores,
    unclaimed: &Unclaimed,
    goc: &GitOpsCluster,
    mut every: Vec<GitOpsCluster>,
) -> Result<Reconciled, OperatorError> {
    let mut summary = Reconciled::default();
    if argocd_namespace_of(goc, opts).is_none() {
        return reconcile_unserved(client, opts, stores, unclaimed, goc, every).await;
    }
    let key = goc_key(goc);
    unclaimed.forget(&key);
    let api: Api<GitOpsCluster> =
        Api::namespaced(client.clone(), &goc.namespace().unwrap_or_default());
    let mut goc = goc.clone();
    // The finalizer (this principal's claim) first, so nothing is created for a GitOpsCluster
    // that could vanish without cleanup; the legacy one is replaced.
    let own = finalizer_of(opts);
    let has = |g: &GitOpsCluster, f: &str| g.finalizers().iter().any(|x| x == f);
    if is_live(&goc) && (!has(&goc, &own) || has(&goc, FINALIZER)) {
        let mut finalizers: Vec<String> = goc
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER && **f != own)
            .cloned()
            .collect();
        finalizers.push(own.clone());
        goc = patch_finalizers(&api, &goc, finalizers).await?;
    }
    every.retain(|g| goc_key(g) != key);
    every.push(goc.clone());
    let fleet = Fleet::gather(client, opts, stores, every).await?;

    let mut outcomes: BTreeMap<String, ClusterOutcome> = BTreeMap::new();
    let mut wanted_cr_works: BTreeSet<(String, String)> = BTreeSet::new();
    // `argoCDCRManifestWork`, validated (as upstream: an invalid one is reported and not
    // delivered).
    let cr_manifests: Option<Result<Vec<Value>, String>> = goc
        .spec
        .argocd_agent_addon
        .argocd_cr_manifest_work
        .as_ref()
        .map(|m| validate(&m.manifests).map(|()| m.manifests.clone()));
    let pki = if is_live(&goc) {
        Some(Pki::ensure(client, opts, &fleet, &goc).await?)
    } else {
        None
    };
    if let Some(pki) = &pki {
        let assigned = fleet
            .assignment
            .iter()
            .filter(|(_, owner)| **owner == key)
            .map(|(cluster, _)| cluster);
        for cluster in assigned {
            let outcome = onboard(
                client,
                opts,
                &fleet,
                &goc,
                pki,
                cluster,
                cr_manifests.as_ref(),
                &mut wanted_cr_works,
            )
            .await?;
            if outcome.registered {
                summary.onboarded.insert(cluster.clone());
            }
            outcomes.insert(cluster.clone(), outcome);
        }
    }

    let registered: BTreeSet<String> = outcomes
        .iter()
        .filter(|(_, o)| o.registered)
        .map(|(c, _)| c.clone())
        .collect();
    let removed = offboard(
        client,
        &fleet,
        &Responsible::GitOpsCluster(key.clone()),
        &registered,
        &wanted_cr_works,
        &mut summary,
    )
    .await?;

    // A deleted GitOpsCluster's finalizer: released once none of its objects remain.
    if !is_live(&goc) {
        summary.requeue_soon =
            release_once_offboarded(client, opts, &fleet, &goc, |_, _| true).await?;
    }

    let Some(pki) = pki else {
        return Ok(summary);
    };
    // Add-on CSRs of the clusters onboarded here.
    if let Ok(ca) = &pki.ca {
        summary.csrs_signed = process_csrs(
            client,
            ca,
            &summary.onboarded,
            opts.certs.leaf_validity(ca, Utc::now()),
        )
        .await
        .map_err(kube_err("processing add-on CertificateSigningRequests"))?;
    }

    // Status.
    let failures: Vec<String> = outcomes
        .values()
        .filter(|o| !o.registered)
        .map(|o| o.status.name.clone())
        .collect();
    let ca_ok = pki.ca.as_ref().map(|_| ()).map_err(Clone::clone);
    let selection = &fleet.selections[&key];
    let facts = PassFacts {
        server: Some(pki.endpoint.clone()),
        jwt: Some(pki.jwt.clone()),
        server_certs: ca_ok.is_ok().then_some(Ok(())),
        ca: Some(ca_ok),
        placement: Some(
            selection
                .as_ref()
                .map(BTreeSet::len)
                .map_err(|(_, message)| message.clone()),
        ),
        import_failures: failures.clone(),
        work_failures: failures,
        owned_clusters: outcomes.len(),
        argocd_cr: cr_manifests
            .as_ref()
            .map(|c| c.as_ref().map(|_| ()).map_err(Clone::clone)),
        removed_clusters: removed.len(),
    };
    let mut status = goc_status(
        &goc,
        &key,
        selection,
        &fleet,
        &outcomes,
        Some(&pki.ca),
        &pki.server_cert_message,
    );
    let generation = goc.metadata.generation;
    status
        .conditions
        .extend(upstream_conditions(&facts).into_iter().map(|c| Condition {
            type_: c.type_.to_owned(),
            status: c.status.to_owned(),
            reason: c.reason.to_owned(),
            message: c.message,
            observed_generation: generation,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        }));
    write_status(client, &goc, status).await?;
    Ok(summary)
}

/// A GitOpsCluster this principal does not serve. When it carries this principal's claim (its
/// Argo CD namespace moved to another principal, or to one no principal serves), this principal
/// removes what it made for it (the sweep's responsibility, [`Fleet::responsible`]) and then
/// releases its claim. When no principal claims it and this principal serves its own namespace
/// ([`home_of_unserved`]), its status says that no principal serves the namespace it names
/// (multicloud-integrations' `ArgoServerVerified` `False`, `ArgoServerNotFound`), once it has
/// stayed unclaimed for [`CLAIM_GRACE`] (the principal serving it claims it first). Otherwise
/// nothing is read or written.
async fn reconcile_unserved(
    client: &kube::Client,
    opts: &OperatorOptions,
    stores: &Stores,
    unclaimed: &Unclaimed,
    goc: &GitOpsCluster,
    every: Vec<GitOpsCluster>,
) -> Result<Reconciled, OperatorError> {
    let mut summary = Reconciled::default();
    let key = goc_key(goc);
    let every_key: BTreeSet<String> = every.iter().map(goc_key).collect();
    if goc.finalizers().iter().any(|f| *f == finalizer_of(opts)) {
        unclaimed.forget(&key);
        let fleet = Fleet::gather(client, opts, stores, every).await?;
        offboard_swept(client, &fleet, &mut summary).await?;
        if !summary.offboarded.is_empty() {
            tracing::info!(gitopscluster = %key, clusters = ?summary.offboarded, "GitOpsCluster no longer served by this principal; its objects removed");
        }
        summary.requeue_soon = release_once_offboarded(client, opts, &fleet, goc, |cluster, o| {
            fleet.responsible_for(cluster, o) == Responsible::Sweep
        })
        .await?;
        return Ok(summary);
    }
    let Some(named) = home_of_unserved(goc, opts) else {
        unclaimed.forget(&key);
        return Ok(summary);
    };
    let waited = unclaimed.seen(&key, goc, &every_key);
    if waited.is_none_or(|w| w < CLAIM_GRACE) {
        let left = CLAIM_GRACE.saturating_sub(waited.unwrap_or_default());
        if waited.is_none() {
            tracing::info!(gitopscluster = %key, argo_namespace = %named, wait = ?left, "GitOpsCluster names an Argo CD namespace this principal does not serve and no principal has claimed it; waiting for its principal to claim it before reporting it unserved");
        }
        summary.recheck_after = Some(left);
        return Ok(summary);
    }
    let served: Vec<String> = opts.argocd_namespaces().into_iter().collect();
    let message = format!(
        "spec.argoServer.argoNamespace {named:?} is served by no principal on this hub (no principal \
         claims this GitOpsCluster); this principal serves {} and reports here because it serves \
         the GitOpsCluster's namespace; name one of a principal's Argo CD namespaces",
        served.join(", ")
    );
    tracing::info!(gitopscluster = %key, argo_namespace = %named, "GitOpsCluster names an Argo CD namespace no principal serves");
    let generation = goc.metadata.generation;
    let cond = |type_: &str| Condition {
        type_: type_.to_owned(),
        status: "False".to_owned(),
        reason: REASON_ARGO_SERVER_NOT_FOUND.to_owned(),
        message: message.clone(),
        observed_generation: generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    };
    let status = GitOpsClusterStatus {
        conditions: vec![cond(ARGO_SERVER_VERIFIED), cond(CONDITION_READY)],
        observed_generation: generation,
        clusters: Vec::new(),
    };
    write_status(client, goc, status).await?;
    if goc.finalizers().iter().any(|f| f == FINALIZER) {
        // Nobody serves it, so nobody else releases the legacy claim.
        let api: Api<GitOpsCluster> =
            Api::namespaced(client.clone(), &goc.namespace().unwrap_or_default());
        let rest = goc
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        patch_finalizers(&api, goc, rest).await?;
    }
    Ok(summary)
}

/// Releases this principal's claim on `goc` (and the legacy one) once none of the objects it
/// owns that `counts` (given their cluster and owner) remain in `fleet`; `true` when some remain
/// (look again soon).
async fn release_once_offboarded(
    client: &kube::Client,
    opts: &OperatorOptions,
    fleet: &Fleet,
    goc: &GitOpsCluster,
    counts: impl Fn(&str, Option<&String>) -> bool,
) -> Result<bool, OperatorError> {
    let key = goc_key(goc);
    let own = finalizer_of(opts);
    if !goc.finalizers().iter().any(|f| *f == own || f == FINALIZER) {
        return Ok(false);
    }
    let works = fleet
        .works
        .iter()
        .map(|w| (w.namespace().unwrap_or_default(), owner(w)));
    let secrets = fleet.cluster_secrets.iter().map(|s| {
        let cluster = s.labels().get(CLUSTER_NAME_LABEL).cloned();
        (cluster.unwrap_or_default(), owner(s))
    });
    let remaining = works
        .chain(secrets)
        .filter(|(cluster, o)| *o == Some(&key) && counts(cluster, *o))
        .count();
    if remaining > 0 {
        // Deleted; released once they are gone.
        return Ok(true);
    }
    let finalizers: Vec<String> = goc
        .finalizers()
        .iter()
        .filter(|f| **f != own && *f != FINALIZER)
        .cloned()
        .collect();
    let api: Api<GitOpsCluster> =
        Api::namespaced(client.clone(), &goc.namespace().unwrap_or_default());
    match patch_finalizers(&api, goc, finalizers).await {
        Ok(_) => {}
        // Gone meanwhile, or being deleted with nothing left to hold.
        Err(OperatorError::Kube {
            source: kube::Error::Api(_),
            ..
        }) => {}
        Err(e) => return Err(e),
    }
    tracing::info!(gitopscluster = %key, "offboarding complete; finalizer released");
    Ok(false)
}

async fn patch_finalizers(
    api: &Api<GitOpsCluster>,
    goc: &GitOpsCluster,
    finalizers: Vec<String>,
) -> Result<GitOpsCluster, OperatorError> {
    api.patch(
        &goc.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
    )
    .await
    .map_err(kube_err(format!(
        "updating the finalizers of GitOpsCluster {}",
        goc_key(goc)
    )))
}

/// Onboards `cluster`, assigned to the live `goc`: its Argo CD cluster secret, agent
/// ManifestWork and Argo CD CR ManifestWork (recorded in `wanted_cr_works`).
#[allow(clippy::too_many_arguments)]
async fn onboard(
    client: &kube::Client,
    opts: &OperatorOptions,
    fleet: &Fleet,
    goc: &GitOpsCluster,
    pki: &Pki,
    cluster: &String,
    cr_manifests: Option<&Result<Vec<Value>, String>>,
    wanted_cr_works: &mut BTreeSet<(String, String)>,
) -> Result<ClusterOutcome, OperatorError> {
    let owner_key = &goc_key(goc);
    let mut status = ClusterOnboardingStatus {
        name: cluster.clone(),
        phase: "Failed".into(),
        mode: goc.mode().to_owned(),
        ..Default::default()
    };
    let agent = match AgentName::new(cluster.as_str()) {
        Ok(a) => a,
        Err(e) => {
            return Ok(ClusterOutcome::failed(
                status,
                format!("cluster name {cluster:?} cannot be an agent name: {e}"),
            ))
        }
    };
    // Read from the API, not a store: the operator keeps no store of namespaces (one get per
    // selected cluster and pass, the only cluster-wide read it needs of them).
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces
        .get_opt(cluster)
        .await
        .map_err(kube_err(format!("reading namespace {cluster}")))?
        .is_none()
    {
        return Ok(ClusterOutcome::failed(status, format!(
            "namespace {cluster:?} does not exist on the hub; is ManagedCluster {cluster:?} registered with OCM (registration creates it)?"
        )));
    }
    let Ok(ca) = &pki.ca else {
        return Ok(ClusterOutcome::failed(
            status,
            "waiting for a usable CA (see condition CertificatesReady)".into(),
        ));
    };
    let addon = &goc.spec.argocd_agent_addon;
    let (principal_address, principal_port) = match &pki.endpoint {
        Ok(endpoint) => endpoint.clone(),
        Err(why) => return Ok(ClusterOutcome::failed(status, why.clone())),
    };
    // Another principal's agent is still on the cluster (its GitOpsCluster lost the cluster to
    // this older one, or is being deleted): that principal removes it; wait, writing nothing for
    // the cluster.
    if let Some(theirs) = fleet.foreign_agent_works.get(cluster.as_str()) {
        let their_goc = owner(theirs).map_or("", String::as_str);
        return Ok(ClusterOutcome::failed(
            status,
            format!(
                "ManifestWork {cluster}/{AGENT_WORK_NAME} belongs to principal {:?} (GitOpsCluster {their_goc:?}); \
                 waiting for it to remove it (if that principal is gone for good: delete \
                 GitOpsCluster {their_goc} and remove its finalizer, and what it left is taken over)",
                principal_of(theirs).map_or("", String::as_str),
            ),
        ));
    }
    let now = Utc::now();
    let validity = opts.certs.leaf_validity(ca, now);

    // Argo CD cluster secret.
    let argocd_ns = argocd_namespace_of(goc, opts).expect("only served GitOpsClusters are live");
    let server_url = resource_proxy_server_url(&opts.resource_proxy_address, &agent)?;
    let secret_name = cluster_secret_name(&agent);
    let existing_secret = fleet.cluster_secrets.iter().find(|s| {
        s.name_any() == secret_name && s.namespace().as_deref() == Some(argocd_ns.as_str())
    });
    let existing_tls = existing_secret.and_then(cluster_secret_tls);
    let tls = match reissue_reason(
        existing_tls.as_ref().map(|t| t.cert_pem.as_str()),
        ca,
        &opts.certs,
        cluster,
        None,
        now,
    ) {
        None => ClusterTlsMaterial {
            ca_pem: ca.cert_pem().to_owned(),
            ..existing_tls.expect("checked")
        },
        Some(reason) => {
            tracing::info!(cluster = %cluster, %reason, "issuing resource-proxy client certificate");
            ClusterTlsMaterial::issue(ca, &agent, validity)?
        }
    };
    status.certificate_not_after = inspect(&tls.cert_pem)
        .ok()
        .map(|i| i.not_after.to_rfc3339());
    let mut desired_secret =
        build_cluster_secret(&agent, &argocd_ns, &server_url, &tls, &hub_labels(cluster));
    stamp(&mut desired_secret.metadata, owner_key, opts);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &argocd_ns);
    if !secret_is_current(existing_secret, &desired_secret) {
        upsert(
            &secrets,
            &secret_name,
            desired_secret,
            existing_secret.map(|s| &s.metadata),
        )
        .await
        .map_err(kube_err(format!(
            "writing secret {argocd_ns}/{secret_name}"
        )))?;
        tracing::info!(cluster = %cluster, secret = %format!("{argocd_ns}/{secret_name}"), "cluster registered with Argo CD");
    }

    // Agent ManifestWork.
    let existing_work = fleet.works.iter().find(|w| {
        w.namespace().as_deref() == Some(cluster.as_str()) && w.name_any() == AGENT_WORK_NAME
    });
    let client_tls: Option<IssuedCert> = if goc.agent_key_in_manifest_work() {
        let current = existing_work.and_then(embedded_client_tls);
        match reissue_reason(
            current.as_ref().map(|c| c.cert_pem.as_str()),
            ca,
            &opts.certs,
            cluster,
            None,
            now,
        ) {
            None => current,
            Some(reason) => {
                tracing::info!(cluster = %cluster, %reason, "issuing agent client certificate (key shipped in the ManifestWork)");
                Some(ca.issue_agent(&agent, validity)?)
            }
        }
    } else {
        None
    };
    let image = addon
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| opts.agent_image.clone());
    let mut desired_work = build_agent_manifest_work(&AgentDeployment {
        cluster,
        owner: owner_key,
        mode: goc.mode(),
        agent_namespace: goc.agent_namespace_or(opts.agent_namespace.as_deref()),
        image: &image,
        principal_address: &principal_address,
        principal_port,
        ca_pem: ca.cert_pem(),
        client_tls: client_tls.as_ref(),
        grants: opts.agent_grants,
    });
    stamp(&mut desired_work.metadata, owner_key, opts);
    if existing_work.is_none_or(|w| !work_is_current(w, &desired_work)) {
        let api: Api<ManifestWork> = Api::namespaced(client.clone(), cluster);
        upsert(
            &api,
            AGENT_WORK_NAME,
            desired_work,
            existing_work.map(|w| &w.metadata),
        )
        .await
        .map_err(kube_err(format!(
            "writing ManifestWork {cluster}/{}",
            AGENT_WORK_NAME
        )))?;
        tracing::info!(cluster = %cluster, mode = goc.mode(), "agent ManifestWork written");
    }
    if let Some(Ok(manifests)) = cr_manifests {
        let name = cr_work_name(&goc.namespace().unwrap_or_default(), &goc.name_any());
        let mut desired = build_cr_work(&CrDelivery {
            cluster,
            owner: owner_key,
            name: &name,
            manifests,
            principal_address: &principal_address,
            principal_port,
        });
        stamp(&mut desired.metadata, owner_key, opts);
        let existing = fleet
            .works
            .iter()
            .find(|w| w.namespace().as_deref() == Some(cluster.as_str()) && w.name_any() == name);
        if existing.is_none_or(|w| !work_is_current(w, &desired)) {
            let api: Api<ManifestWork> = Api::namespaced(client.clone(), cluster);
            upsert(&api, &name, desired, existing.map(|w| &w.metadata))
                .await
                .map_err(kube_err(format!("writing ManifestWork {cluster}/{name}")))?;
            tracing::info!(cluster = %cluster, work = %name, "ArgoCD CR ManifestWork written");
        }
        wanted_cr_works.insert((cluster.clone(), name));
    }
    let readiness = existing_work.map(agent_readiness).unwrap_or_default();
    status.agent_ready = readiness.ready;
    status.phase = if readiness.ready {
        "Onboarded"
    } else {
        "Deploying"
    }
    .into();
    if !readiness.ready {
        status.message = if readiness.applied {
            "ManifestWork applied; waiting for the agent Deployment to become ready".into()
        } else {
            "waiting for the OCM work agent to apply the ManifestWork".into()
        };
    }

    Ok(ClusterOutcome {
        status,
        registered: true,
        deployed: readiness.ready,
    })
}

/// Removes the objects `who` is responsible for that are no longer wanted: an agent
/// ManifestWork or cluster secret of a cluster not `registered`, an Argo CD CR ManifestWork not
/// in `wanted_cr_works`. Returns the clusters offboarded, by the GitOpsCluster that owned them.
async fn offboard(
    client: &kube::Client,
    fleet: &Fleet,
    who: &Responsible,
    registered: &BTreeSet<String>,
    wanted_cr_works: &BTreeSet<(String, String)>,
    summary: &mut Reconciled,
) -> Result<BTreeSet<String>, OperatorError> {
    let mut removed = BTreeSet::new();
    for work in &fleet.works {
        let cluster = work.namespace().unwrap_or_default();
        if &fleet.responsible(&cluster, work) != who {
            continue;
        }
        let wanted = work.name_any() == AGENT_WORK_NAME
            || wanted_cr_works.contains(&(cluster.clone(), work.name_any()));
        if wanted && registered.contains(&cluster) {
            continue;
        }
        let api: Api<ManifestWork> = Api::namespaced(client.clone(), &cluster);
        delete_ignoring_missing(&api, &work.name_any())
            .await
            .map_err(kube_err(format!("deleting ManifestWork {}", name_in(work))))?;
        tracing::info!(cluster = %cluster, work = %work.name_any(), "ManifestWork removed");
        if work.name_any() == AGENT_WORK_NAME {
            if owner(work).is_some_and(|o| who == &Responsible::GitOpsCluster(o.clone())) {
                removed.insert(cluster.clone());
            }
            summary.offboarded.insert(cluster);
        }
    }
    for secret in &fleet.cluster_secrets {
        let cluster = secret
            .labels()
            .get(CLUSTER_NAME_LABEL)
            .cloned()
            .unwrap_or_default();
        if &fleet.responsible(&cluster, secret) != who || registered.contains(&cluster) {
            continue;
        }
        let ns = secret.namespace().unwrap_or_default();
        let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
        delete_ignoring_missing(&api, &secret.name_any())
            .await
            .map_err(kube_err(format!("deleting secret {}", name_in(secret))))?;
        tracing::info!(cluster = %cluster, secret = %name_in(secret), "cluster secret removed (offboarded)");
        summary.offboarded.insert(cluster);
    }
    Ok(removed)
}

/// Removes the operator's objects that no GitOpsCluster wants and whose GitOpsCluster is gone
/// (or that name none), given every GitOpsCluster on the hub. Returns the clusters offboarded.
pub async fn sweep(
    client: &kube::Client,
    opts: &OperatorOptions,
    stores: &Stores,
    every: Vec<GitOpsCluster>,
) -> Result<BTreeSet<String>, OperatorError> {
    let fleet = Fleet::gather(client, opts, stores, every).await?;
    let mut summary = Reconciled::default();
    offboard_swept(client, &fleet, &mut summary).await?;
    Ok(summary.offboarded)
}

/// Offboards every object of the operator's that `fleet` leaves to the sweep (no GitOpsCluster
/// this principal serves wants it), into `summary`.
async fn offboard_swept(
    client: &kube::Client,
    fleet: &Fleet,
    summary: &mut Reconciled,
) -> Result<(), OperatorError> {
    offboard(
        client,
        fleet,
        &Responsible::Sweep,
        &BTreeSet::new(),
        &BTreeSet::new(),
        summary,
    )
    .await?;
    Ok(())
}

/// Creates the principal's JWT signing key Secret when missing (as upstream; an ES256 key, which
/// the principal reads as well as upstream's RSA-4096 and generates in microseconds). An existing
/// Secret is never replaced: sessions signed with it stay valid.
pub(crate) async fn ensure_jwt_secret(store: &SecretStore) -> Result<(), String> {
    let ns = store.namespace().to_owned();
    if store
        .get(JWT_SECRET)
        .await
        .map_err(|e| e.to_string())?
        .is_some()
    {
        return Ok(());
    }
    let key = generate_jwt_signing_key(JwtKeyAlgorithm::Es256).map_err(|e| e.to_string())?;
    store
        .write(&jwt_secret(&ns, &key), false)
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(secret = %format!("{ns}/{JWT_SECRET}"), "JWT signing key Secret created");
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn goc_status(
    goc: &GitOpsCluster,
    key: &str,
    selection: &Selection,
    fleet: &Fleet,
    outcomes: &BTreeMap<String, ClusterOutcome>,
    ca_state: Option<&Result<CertificateAuthority, String>>,
    server_cert_message: &str,
) -> GitOpsClusterStatus {
    let generation = goc.metadata.generation;
    let cond = |type_: &str, ok: bool, reason: &str, message: String| Condition {
        type_: type_.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    };
    let mut clusters = Vec::new();
    let mut conditions = Vec::new();
    match selection {
        Err((reason, message)) => {
            let placement_failed = reason != INVALID_MODE;
            conditions.push(if placement_failed {
                cond(
                    CONDITION_PLACEMENT_RESOLVED,
                    false,
                    reason,
                    format!("{message}; clusters onboarded earlier are left as they are"),
                )
            } else {
                cond(
                    CONDITION_PLACEMENT_RESOLVED,
                    true,
                    "Resolved",
                    "placement not evaluated while the spec is invalid".into(),
                )
            });
            conditions.push(cond(
                CONDITION_AGENTS_DEPLOYED,
                false,
                reason,
                message.clone(),
            ));
            conditions.push(cond(CONDITION_READY, false, reason, message.clone()));
        }
        Ok(selected) => {
            conditions.push(cond(
                CONDITION_PLACEMENT_RESOLVED,
                true,
                "Resolved",
                format!("{} cluster(s) selected", selected.len()),
            ));
            let mut conflicts = Vec::new();
            let mut unregistered = Vec::new();
            let mut not_ready = Vec::new();
            for c in selected {
                match fleet.assignment.get(c) {
                    Some(owner) if owner != key => {
                        conflicts.push(format!("{c} (owned by {owner})"));
                        clusters.push(ClusterOnboardingStatus {
                            name: c.clone(),
                            phase: "Conflict".into(),
                            message: conflict_message(c, owner, fleet.claims.get(owner)),
                            mode: goc.mode().to_owned(),
                            ..Default::default()
                        });
                    }
                    _ => {
                        let o = &outcomes[c];
                        if !o.registered {
                            unregistered.push(format!("{c}: {}", o.status.message));
                        } else if !o.deployed {
                            not_ready.push(c.clone());
                        }
                        clusters.push(o.status.clone());
                    }
                }
            }
            match ca_state {
                Some(Err(problem)) => conditions.push(cond(
                    CONDITION_CERTIFICATES_READY,
                    false,
                    "CAUnusable",
                    problem.clone(),
                )),
                _ => conditions.push(cond(
                    CONDITION_CERTIFICATES_READY,
                    true,
                    "Issued",
                    server_cert_message.to_owned(),
                )),
            }
            let registered_ok = conflicts.is_empty() && unregistered.is_empty();
            let (reason, message) = if !conflicts.is_empty() {
                (
                    "ClusterConflict",
                    format!(
                        "clusters selected by an older GitOpsCluster are skipped: {}",
                        conflicts.join(", ")
                    ),
                )
            } else if !unregistered.is_empty() {
                ("RegistrationFailed", unregistered.join("; "))
            } else {
                (
                    "Registered",
                    format!("{} cluster secret(s) in the hub Argo CD", selected.len()),
                )
            };
            conditions.push(cond(
                CONDITION_CLUSTERS_REGISTERED,
                registered_ok,
                reason,
                message,
            ));
            let deployed_ok = registered_ok && not_ready.is_empty();
            conditions.push(cond(
                CONDITION_AGENTS_DEPLOYED,
                deployed_ok,
                if deployed_ok { "AgentsReady" } else { "WaitingForAgents" },
                if not_ready.is_empty() {
                    "every agent Deployment reports ready".into()
                } else {
                    format!("agent not ready yet on: {} (see the ManifestWork argocd-agent in each cluster namespace)", not_ready.join(", "))
                },
            ));
            let all_ok = deployed_ok && !matches!(ca_state, Some(Err(_)));
            conditions.push(cond(
                CONDITION_READY,
                all_ok,
                if all_ok { "Ready" } else { "NotReady" },
                if all_ok {
                    "every selected cluster is onboarded".into()
                } else {
                    "see the other conditions".into()
                },
            ));
        }
    }
    GitOpsClusterStatus {
        conditions,
        observed_generation: generation,
        clusters,
    }
}

/// Why `cluster` is skipped: the older GitOpsCluster `owner` manages it; when another principal
/// serves `owner` (its `claim`), how to release a principal gone for good, since a claim does
/// not expire.
fn conflict_message(cluster: &str, owner: &str, claim: Option<&String>) -> String {
    let mut message = format!(
        "also selected by GitOpsCluster {owner}, which is older and manages it; remove {cluster} from one of the two placements"
    );
    if let Some(claim) = claim {
        let (namespace, name) = owner.split_once('/').unwrap_or(("", owner));
        message.push_str(&format!(
            ". {owner} is another principal's (its claim: finalizer {claim}); a claim does not \
             expire while that principal is down. If it is gone for good, release the cluster: \
             `kubectl -n {namespace} delete gitopscluster {name} --wait=false` and remove \
             finalizer {claim} from it; what it left is then removed or taken over here"
        ));
    }
    message
}

async fn write_status(
    client: &kube::Client,
    goc: &GitOpsCluster,
    mut status: GitOpsClusterStatus,
) -> Result<(), OperatorError> {
    let old = goc.status.clone().unwrap_or_default();
    // Like upstream, the record of the last removal stays until the next one replaces it.
    let removal = super::upstream_conditions::REMOVED_CLUSTERS_CLEANED_UP;
    if !status.conditions.iter().any(|c| c.type_ == removal) {
        if let Some(prev) = old.conditions.iter().find(|c| c.type_ == removal) {
            status.conditions.push(prev.clone());
        }
    }
    for c in &mut status.conditions {
        if let Some(prev) = old.conditions.iter().find(|p| p.type_ == c.type_) {
            if prev.status == c.status {
                c.last_transition_time = prev.last_transition_time.clone();
            }
        }
    }
    if old == status {
        return Ok(());
    }
    for c in &status.conditions {
        let prev = old.conditions.iter().find(|p| p.type_ == c.type_);
        if prev.is_none_or(|p| p.status != c.status || p.reason != c.reason) {
            tracing::info!(gitopscluster = %goc_key(goc), condition = %c.type_, status = %c.status, reason = %c.reason, message = %c.message, "condition changed");
        }
    }
    let api: Api<GitOpsCluster> =
        Api::namespaced(client.clone(), &goc.namespace().unwrap_or_default());
    api.patch_status(
        &goc.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .map_err(kube_err(format!(
        "writing status of GitOpsCluster {}",
        goc_key(goc)
    )))?;
    Ok(())
}

/// The resource-proxy client certificate stored in an Argo CD cluster secret.
fn cluster_secret_tls(secret: &Secret) -> Option<ClusterTlsMaterial> {
    let config = secret.data.as_ref()?.get("config")?;
    let config: Value = serde_json::from_slice(&config.0).ok()?;
    let field = |k: &str| -> Option<String> {
        let b = base64::engine::general_purpose::STANDARD
            .decode(config.pointer(&format!("/tlsClientConfig/{k}"))?.as_str()?)
            .ok()?;
        String::from_utf8(b).ok()
    };
    Some(ClusterTlsMaterial {
        ca_pem: field("caData")?,
        cert_pem: field("certData")?,
        key_pem: field("keyData")?,
    })
}

/// Marks a hub object as made by this principal for the GitOpsCluster `owner_key`.
fn stamp(meta: &mut ObjectMeta, owner_key: &str, opts: &OperatorOptions) {
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    annotations.insert(OWNER_ANNOTATION.to_owned(), owner_key.to_owned());
    annotations.insert(PRINCIPAL_ANNOTATION.to_owned(), opts.namespace.clone());
}

fn secret_is_current(existing: Option<&Secret>, desired: &Secret) -> bool {
    let Some(existing) = existing else {
        return false;
    };
    let contains = |have: &Option<BTreeMap<String, String>>,
                    want: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    existing.data == desired.data
        && contains(&existing.metadata.labels, &desired.metadata.labels)
        && contains(
            &existing.metadata.annotations,
            &desired.metadata.annotations,
        )
}

/// What a replace must keep of the object it replaces: its resourceVersion (optimistic
/// concurrency) and the finalizers others put on it (OCM's work agent holds the ManifestWork with
/// `cluster.open-cluster-management.io/manifest-work-cleanup` until it removed what it applied;
/// a PUT without it would let a deletion orphan the agent on the spoke).
fn carry_over(existing: &ObjectMeta, desired: &mut ObjectMeta) {
    desired.resource_version = existing.resource_version.clone();
    let mut finalizers = desired.finalizers.take().unwrap_or_default();
    for f in existing.finalizers.iter().flatten() {
        if !finalizers.contains(f) {
            finalizers.push(f.clone());
        }
    }
    desired.finalizers = (!finalizers.is_empty()).then_some(finalizers);
}

async fn upsert<K>(
    api: &Api<K>,
    name: &str,
    mut obj: K,
    existing: Option<&ObjectMeta>,
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match existing {
        Some(existing) => {
            carry_over(existing, obj.meta_mut());
            api.replace(name, &PostParams::default(), &obj).await?;
        }
        None => {
            api.create(&PostParams::default(), &obj).await?;
        }
    }
    Ok(())
}

async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replacing_keeps_the_finalizers_others_hold() {
        let existing = ObjectMeta {
            resource_version: Some("42".into()),
            finalizers: Some(vec![
                "cluster.open-cluster-management.io/manifest-work-cleanup".into(),
            ]),
            ..ObjectMeta::default()
        };
        let mut desired = ObjectMeta::default();
        carry_over(&existing, &mut desired);
        assert_eq!(desired.resource_version.as_deref(), Some("42"));
        assert_eq!(desired.finalizers, existing.finalizers);

        let mut own = ObjectMeta {
            finalizers: Some(vec!["mine".into()]),
            ..ObjectMeta::default()
        };
        carry_over(&existing, &mut own);
        assert_eq!(
            own.finalizers.unwrap(),
            [
                "mine",
                "cluster.open-cluster-management.io/manifest-work-cleanup"
            ]
        );

        let mut none = ObjectMeta::default();
        carry_over(&ObjectMeta::default(), &mut none);
        assert_eq!(none.finalizers, None, "no empty finalizer list is written");
    }

    #[test]
    fn a_conflict_with_another_principal_says_how_to_release_its_claim() {
        let ours = conflict_message("c1", "team/older", None);
        assert!(ours.contains("GitOpsCluster team/older"), "{ours}");
        assert!(!ours.contains("finalizer"), "same principal: {ours}");
        let claim = format!("{FINALIZER}-hub-a");
        let theirs = conflict_message("c1", "team/older", Some(&claim));
        assert!(theirs.contains("does not expire"), "{theirs}");
        assert!(
            theirs.contains("kubectl -n team delete gitopscluster older")
                && theirs.contains(&claim),
            "{theirs}"
        );
    }
}
