//! The GitOpsCluster operator, embedded in `argocd-principal`: every managed cluster selected by a
//! GitOpsCluster's Placement gets certificates, a place in the hub Argo CD (cluster secret) and an
//! agent (ManifestWork), with no manual step; clusters leaving the placement, and deleted
//! GitOpsClusters (finalizer), leave nothing behind.
//!
//! Owns the run loop ([`run_operator`]): leader election ([`lease`]) so that one replica
//! reconciles, watches on everything a pass depends on (GitOpsClusters, PlacementDecisions,
//! Placements, the operator's ManifestWorks and Secrets, add-on CSRs) coalesced into passes, and a
//! periodic pass for certificate renewal. The pass itself is [`controller::reconcile_all`]; the
//! pieces are [`crd`], [`placement`], [`server_discovery`], [`certs`], [`agent_work`],
//! [`argocd_cr`], [`csr`] and [`upstream_conditions`]; [`bootstrap`] creates the principal's
//! missing Secrets at its start.

pub mod agent_work;
pub mod argocd_cr;
pub mod bootstrap;
pub mod certs;
pub mod controller;
pub mod crd;
pub mod csr;
pub mod flags;
pub mod placement;
pub mod server_discovery;
pub mod upstream_conditions;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{stream, StreamExt};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use tokio::sync::watch;

use crate::pki::PkiError;
use crate::pull::manifestwork::ManifestWork;
use crate::registration::{RegistrationError, DEFAULT_RESOURCE_PROXY_ADDRESS};
use argocd_agent_kube::CancellationToken;

pub use certs::CertPolicy;
pub use controller::reconcile_all;
pub use crd::{GitOpsCluster, GitOpsClusterSpec, GitOpsClusterStatus};
pub use flags::{OperatorFlags, OperatorSettings};

/// Finalizer that holds a deleted GitOpsCluster until its clusters are offboarded.
pub const FINALIZER: &str = "apps.open-cluster-management.io/argocd-agent-cleanup";
/// Default Lease name.
pub const LEASE_NAME: &str = "argocd-agent-operator";
/// Events within this window become one pass.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// Everything that can fail in a pass.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// A Kubernetes call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
    /// Certificate issuance or Secret storage failed.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// Cluster registration input was invalid.
    #[error(transparent)]
    Registration(#[from] RegistrationError),
    /// A Secret of the principal could not be created at start-up.
    #[error("creating the principal's missing Secrets: {0}")]
    Bootstrap(String),
}

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// The principal's namespace: PKI Secrets, the Lease, server discovery.
    pub namespace: String,
    /// Namespace of the hub Argo CD (default: `namespace`); a GitOpsCluster may override it
    /// with one of [`OperatorOptions::argocd_namespaces`].
    pub argocd_namespace: Option<String>,
    /// Further namespaces a GitOpsCluster may name as its Argo CD namespace.
    pub extra_argocd_namespaces: Vec<String>,
    /// Address the hub Argo CD uses for the resource proxy (`host:port`).
    pub resource_proxy_address: String,
    /// Agent image when the GitOpsCluster names none.
    pub agent_image: String,
    /// Principal host agents dial when the GitOpsCluster names none (overrides discovery).
    pub principal_address: Option<String>,
    /// Principal port agents dial when the GitOpsCluster names none.
    pub principal_port: Option<u16>,
    /// The principal's Service in `namespace`: server discovery reads it, and its in-cluster DNS
    /// names go into the principal's certificate.
    pub principal_service: String,
    /// Agent namespace on the spokes when the GitOpsCluster names none (default `argocd`).
    pub agent_namespace: Option<String>,
    /// The cluster-wide grants every agent ManifestWork carries (live view, its writes, terminal).
    pub agent_grants: agent_work::AgentGrants,
    /// Certificate lifetimes and renewal.
    pub certs: CertPolicy,
    /// Pass interval without events (certificate renewal, drift).
    pub resync: Duration,
    /// Lease name.
    pub lease_name: String,
    /// This replica's identity in the Lease.
    pub identity: String,
    /// Lease validity without renewal.
    pub lease_duration: Duration,
    /// Lease renewal/retry interval.
    pub lease_retry: Duration,
}

impl OperatorOptions {
    /// Defaults for a principal in `namespace`.
    pub fn new(namespace: &str) -> Self {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "argocd-principal".into());
        OperatorOptions {
            namespace: namespace.to_owned(),
            argocd_namespace: None,
            extra_argocd_namespaces: Vec::new(),
            resource_proxy_address: DEFAULT_RESOURCE_PROXY_ADDRESS.to_owned(),
            agent_image: format!(
                "ghcr.io/argocd-agent-rs/argocd-agent:{}",
                env!("CARGO_PKG_VERSION")
            ),
            principal_address: None,
            principal_port: None,
            principal_service: certs::PRINCIPAL_SERVICE.to_owned(),
            agent_namespace: None,
            agent_grants: agent_work::AgentGrants::default(),
            certs: CertPolicy::default(),
            resync: Duration::from_secs(60),
            lease_name: LEASE_NAME.to_owned(),
            identity: format!("{host}-{:08x}", rand::random::<u32>()),
            lease_duration: Duration::from_secs(15),
            lease_retry: Duration::from_secs(5),
        }
    }

    /// The hub Argo CD namespace.
    pub fn argocd_namespace(&self) -> &str {
        self.argocd_namespace.as_deref().unwrap_or(&self.namespace)
    }

    /// Every namespace the operator keeps cluster Secrets in, and so the only ones a
    /// GitOpsCluster may name as its Argo CD namespace: the principal's, the default Argo CD
    /// namespace and the extra ones. The operator lists and watches Secrets in these only (a Role
    /// in each, no cluster-wide Secret grant).
    pub fn argocd_namespaces(&self) -> BTreeSet<String> {
        [self.namespace.as_str(), self.argocd_namespace()]
            .into_iter()
            .map(str::to_owned)
            .chain(self.extra_argocd_namespaces.iter().cloned())
            .collect()
    }
}

fn triggers<K>(api: Api<K>, config: watcher::Config) -> stream::BoxStream<'static, ()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher(api, config)
        .default_backoff()
        .filter_map(|event| async move {
            match event {
                Ok(
                    watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone,
                ) => Some(()),
                Ok(_) => None,
                Err(e) => {
                    tracing::debug!(error = %e, "operator watch error (retrying)");
                    None
                }
            }
        })
        .boxed()
}

/// When the next pass is due: a burst of events is one pass, and the earliest request wins, so
/// a steady stream of events cannot postpone a pass (unlike a trailing debounce).
#[derive(Default)]
struct NextPass(Option<tokio::time::Instant>);

impl NextPass {
    /// Asks for a pass within `delay`.
    fn within(&mut self, delay: Duration) {
        let at = tokio::time::Instant::now() + delay;
        self.0 = Some(self.0.map_or(at, |due| due.min(at)));
    }

    /// Completes when the pass is due (never when none was asked for).
    async fn due(&self) {
        match self.0 {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

/// Runs the operator against the hub until `shutdown` completes: elects a leader among replicas
/// and, while leader, reconciles on every relevant change and every `resync`.
pub async fn run_operator(
    client: kube::Client,
    opts: OperatorOptions,
    shutdown: CancellationToken,
) {
    let (leader_tx, mut leader) = watch::channel(false);
    let election = tokio::spawn(argocd_agent_kube::lease::run_election(
        client.clone(),
        argocd_agent_kube::lease::LeaseConfig {
            name: opts.lease_name.clone(),
            namespace: opts.namespace.clone(),
            identity: opts.identity.clone(),
            duration: opts.lease_duration,
            retry: opts.lease_retry,
        },
        leader_tx,
        shutdown.clone(),
    ));
    let managed = watcher::Config::default().labels(&format!(
        "{}={}",
        agent_work::MANAGED_BY_LABEL,
        agent_work::MANAGED_BY_OPERATOR
    ));
    let cluster_secrets = opts.argocd_namespaces().into_iter().map(|ns| {
        triggers(
            Api::<Secret>::namespaced(client.clone(), &ns),
            managed.clone(),
        )
    });
    let mut events = stream::select_all(
        [
            triggers(
                Api::<GitOpsCluster>::all(client.clone()),
                watcher::Config::default(),
            ),
            triggers(
                Api::<DynamicObject>::all_with(
                    client.clone(),
                    &placement::placement_decision_resource(),
                ),
                watcher::Config::default(),
            ),
            triggers(
                Api::<DynamicObject>::all_with(client.clone(), &placement::placement_resource()),
                watcher::Config::default(),
            ),
            triggers(Api::<ManifestWork>::all(client.clone()), managed.clone()),
            triggers(
                Api::<Secret>::namespaced(client.clone(), &opts.namespace),
                watcher::Config::default()
                    .fields(&format!("metadata.name={}", crate::pki::secrets::CA_SECRET)),
            ),
            triggers(
                Api::<CertificateSigningRequest>::all(client.clone()),
                watcher::Config::default(),
            ),
        ]
        .into_iter()
        .chain(cluster_secrets),
    );
    tracing::info!(namespace = %opts.namespace, identity = %opts.identity, "GitOpsCluster operator started");
    let mut next_pass = NextPass::default();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(()) = events.next() => next_pass.within(DEBOUNCE),
            changed = leader.changed() => {
                if changed.is_err() { break; }
                if *leader.borrow() { next_pass.within(Duration::ZERO); }
            }
            () = next_pass.due() => {
                next_pass = NextPass::default();
                if !*leader.borrow() { continue; }
                match reconcile_all(&client, &opts).await {
                    Ok(summary) => {
                        tracing::debug!(?summary, "operator pass done");
                        next_pass.within(if summary.requeue_soon { Duration::from_secs(1) } else { opts.resync });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "operator pass failed; retrying");
                        next_pass.within(Duration::from_secs(5));
                    }
                }
            }
        }
    }
    let _ = election.await;
    tracing::info!("GitOpsCluster operator stopped");
}
