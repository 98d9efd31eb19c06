//! The GitOpsCluster operator, embedded in `argocd-principal`: every managed cluster selected by a
//! GitOpsCluster's Placement gets certificates, a place in the hub Argo CD (cluster secret) and an
//! agent (ManifestWork), with no manual step; clusters leaving the placement, and deleted
//! GitOpsClusters (finalizer), leave nothing behind.
//!
//! Owns how the operator runs ([`run_operator`]): Lease election so that one replica
//! reconciles, and, while leading, a `kube::runtime::Controller` of GitOpsClusters
//! ([`run_controllers`]): one watch and store per kind it reads ([`SharedWatch`], as the pull
//! model's controllers), which reconciliations read instead of the API ([`fleet::Stores`]), each change mapped to the GitOpsClusters it concerns ([`triggers`]),
//! one GitOpsCluster reconciled at a time ([`controller::reconcile_gitopscluster`], over the
//! fleet's global decisions in [`fleet`]), failures retried with backoff, and every
//! GitOpsCluster again each resync interval (certificate renewal, drift); beside it the sweep of
//! objects whose GitOpsCluster is gone ([`controller::sweep`]). The pieces are [`crd`],
//! [`placement`], [`server_discovery`], [`certs`], [`agent_work`], [`argocd_cr`], [`csr`] and
//! [`upstream_conditions`]; [`bootstrap`] creates the principal's missing Secrets at its start.

pub mod agent_work;
pub mod argocd_cr;
pub mod bootstrap;
pub mod certs;
pub mod controller;
pub mod crd;
pub mod csr;
pub mod flags;
pub mod fleet;
pub mod placement;
pub mod server_discovery;
pub mod triggers;
pub mod upstream_conditions;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{stream, FutureExt, Stream, StreamExt};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::ResourceExt;
use tokio::sync::watch;

use crate::pki::PkiError;
use crate::pull::manifestwork::ManifestWork;
use crate::pull::watches::{self, touched, SharedWatch};
use crate::registration::{RegistrationError, DEFAULT_RESOURCE_PROXY_ADDRESS};
use argocd_agent_kube::CancellationToken;

pub use certs::CertPolicy;
pub use controller::{reconcile_gitopscluster, Reconciled};
pub use crd::{GitOpsCluster, GitOpsClusterSpec, GitOpsClusterStatus};
pub use flags::{OperatorFlags, OperatorSettings};

/// Finalizer that holds a deleted GitOpsCluster until its clusters are offboarded.
pub const FINALIZER: &str = "apps.open-cluster-management.io/argocd-agent-cleanup";
/// Default Lease name.
pub const LEASE_NAME: &str = "argocd-agent-operator";
/// Triggers of one GitOpsCluster within this window become one reconciliation.
const DEBOUNCE: Duration = Duration::from_millis(200);
/// First retry after a failed reconciliation (doubling with each further failure).
const RETRY: Duration = Duration::from_secs(5);
/// Next look while a deleted GitOpsCluster waits for its objects to go.
const SOON: Duration = Duration::from_secs(1);

/// Everything that can fail in a reconciliation.
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

/// Runs the operator against the hub until `shutdown` completes: elects a leader among replicas
/// and, while leader, runs the controllers ([`run_controllers`]); a replica that loses the Lease
/// stops them and waits to lead again.
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
    tracing::info!(namespace = %opts.namespace, identity = %opts.identity, "GitOpsCluster operator started");
    loop {
        let leads = async { leader.wait_for(|l| *l).await.is_ok() };
        tokio::select! {
            () = shutdown.cancelled() => break,
            leads = leads => if !leads { break },
        }
        let term = shutdown.child_token();
        let running = tokio::spawn(run_controllers(client.clone(), opts.clone(), term.clone()));
        let follows = async { leader.wait_for(|l| !*l).await.is_ok() };
        tokio::select! {
            () = shutdown.cancelled() => {}
            _ = follows => tracing::info!("GitOpsCluster operator lost the Lease; not reconciling"),
        }
        term.cancel();
        let _ = running.await;
    }
    let _ = election.await;
    tracing::info!("GitOpsCluster operator stopped");
}

/// What the operator's controllers share.
struct Context {
    client: kube::Client,
    opts: OperatorOptions,
    gocs: Store<GitOpsCluster>,
    /// What a reconciliation reads of the other kinds.
    stores: fleet::Stores,
    /// Consecutive failures per object, for the retry backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// Since when GitOpsClusters naming a namespace no principal claimed have been unclaimed.
    unclaimed: fleet::Unclaimed,
}

impl Context {
    /// Every GitOpsCluster on the hub.
    fn every_goc(&self) -> Vec<GitOpsCluster> {
        self.gocs
            .state()
            .iter()
            .map(|g| g.as_ref().clone())
            .collect()
    }

    fn succeeded(&self, key: &str) {
        self.failures.lock().expect("not poisoned").remove(key);
    }

    /// When to retry `key` after its `n`th consecutive failure: [`RETRY`] doubling, at most
    /// the resync interval.
    fn failed(&self, key: String) -> Duration {
        let mut failures = self.failures.lock().expect("not poisoned");
        let n = failures.entry(key).or_default();
        *n = n.saturating_add(1);
        let cap = self.opts.resync.max(RETRY);
        RETRY.saturating_mul(1 << (*n - 1).min(16)).min(cap)
    }
}

/// Runs the GitOpsCluster controller and the orphan sweep until `shutdown`.
///
/// The GitOpsCluster controller reconciles one GitOpsCluster at a time
/// ([`controller::reconcile_gitopscluster`], one at a time because the fleet's PKI is shared),
/// again every `resync` (certificate renewal, drift), triggered by the GitOpsCluster itself and
/// by every object a reconciliation reads ([`triggers`]). The sweep runs per ManifestWork and
/// cluster Secret of the operator whose GitOpsCluster is gone or unnamed ([`controller::sweep`]).
pub async fn run_controllers(
    client: kube::Client,
    opts: OperatorOptions,
    shutdown: CancellationToken,
) {
    let all = watcher::Config::default;
    let managed = all().labels(&format!(
        "{}={}",
        agent_work::MANAGED_BY_LABEL,
        agent_work::MANAGED_BY_OPERATOR
    ));
    let decision_resource = placement::placement_decision_resource();
    let placement_resource = placement::placement_resource();
    let mut gocs = SharedWatch::new(
        "GitOpsCluster",
        Api::<GitOpsCluster>::all(client.clone()),
        all(),
        (),
    );
    let mut decisions = SharedWatch::new(
        "PlacementDecision",
        Api::<DynamicObject>::all_with(client.clone(), &decision_resource),
        all(),
        decision_resource,
    );
    let mut placements = SharedWatch::new(
        "Placement",
        Api::<DynamicObject>::all_with(client.clone(), &placement_resource),
        all(),
        placement_resource,
    );
    let mut works = SharedWatch::new(
        "operator ManifestWork",
        Api::<ManifestWork>::all(client.clone()),
        managed.clone(),
        (),
    );
    let mut ca = SharedWatch::new(
        "fleet CA Secret",
        Api::<Secret>::namespaced(client.clone(), &opts.namespace),
        all().fields(&format!("metadata.name={}", crate::pki::secrets::CA_SECRET)),
        (),
    );
    let mut csrs = SharedWatch::new(
        "CertificateSigningRequest",
        Api::<CertificateSigningRequest>::all(client.clone()),
        all(),
        (),
    );
    let mut secrets: Vec<SharedWatch<Secret>> = opts
        .argocd_namespaces()
        .iter()
        .map(|ns| {
            SharedWatch::new(
                "operator cluster Secret",
                Api::namespaced(client.clone(), ns),
                managed.clone(),
                (),
            )
        })
        .collect();

    let main = gocs.subscribe();
    let ctx = Arc::new(Context {
        client: client.clone(),
        opts: opts.clone(),
        gocs: main.store.clone(),
        stores: fleet::Stores {
            placements: placements.store(),
            decisions: decisions.store(),
            works: works.store(),
            secrets: secrets.iter().map(SharedWatch::store).collect(),
        },
        failures: Mutex::default(),
        unclaimed: fleet::Unclaimed::default(),
    });
    let gocs_store = main.store.clone();
    let by = || gocs_store.clone();
    let mut controller = Controller::for_stream(touched(main.events), main.store)
        .reconcile_on(mapped(
            gocs.subscribe().events,
            concerning(by(), triggers::of_gitopscluster),
        ))
        .reconcile_on(mapped(
            decisions.subscribe().events,
            concerning(by(), triggers::of_placement_decision),
        ))
        .reconcile_on(mapped(
            placements.subscribe().events,
            concerning(by(), triggers::of_placement),
        ))
        .reconcile_on(mapped(
            csrs.subscribe().events,
            concerning(by(), triggers::of_csr),
        ))
        .reconcile_on(mapped(
            works.subscribe().events,
            concerning(by(), |gocs: &[Arc<GitOpsCluster>], w: &ManifestWork| {
                triggers::of_cluster_object(
                    gocs,
                    &w.namespace().unwrap_or_default(),
                    fleet::owner(w),
                )
            }),
        ))
        .reconcile_all_on(touched(ca.subscribe().events).map(|_| ()));
    for watch in &mut secrets {
        controller = controller.reconcile_on(mapped(
            watch.subscribe().events,
            concerning(by(), |gocs: &[Arc<GitOpsCluster>], s: &Secret| {
                let cluster = s
                    .labels()
                    .get(agent_work::CLUSTER_NAME_LABEL)
                    .cloned()
                    .unwrap_or_default();
                triggers::of_cluster_object(gocs, &cluster, fleet::owner(s))
            }),
        ));
    }
    let config = watches::controller_config(1, DEBOUNCE);
    // Every reconciliation reads these stores: it starts once they are all filled.
    let reads: Vec<_> = [main.ready.clone()]
        .into_iter()
        .chain([placements.ready(), decisions.ready(), works.ready()])
        .chain(secrets.iter().map(SharedWatch::ready))
        .collect();

    // The sweep: per object of the operator, and for those of a GitOpsCluster just deleted.
    let sweep_works = {
        let sub = works.subscribe();
        let owned = owned_by_deleted(gocs.subscribe().events, sub.store.clone());
        Controller::for_stream(touched(sub.events), sub.store).reconcile_on(owned)
    };
    let sweep_secrets: Vec<_> = secrets
        .iter_mut()
        .map(|watch| {
            let sub = watch.subscribe();
            let owned = owned_by_deleted(gocs.subscribe().events, sub.store.clone());
            Controller::for_stream(touched(sub.events), sub.store).reconcile_on(owned)
        })
        .collect();

    let mut running: Vec<BoxFuture<'static, ()>> = vec![
        watches::run_controller(
            "GitOpsCluster",
            reads.clone(),
            controller,
            config.clone(),
            reconcile,
            retry,
            ctx.clone(),
            shutdown.clone(),
        )
        .boxed(),
        watches::run_controller(
            "operator ManifestWork sweep",
            reads.clone(),
            sweep_works,
            config.clone(),
            sweep_orphan,
            retry,
            ctx.clone(),
            shutdown.clone(),
        )
        .boxed(),
    ];
    for sweep_secrets in sweep_secrets {
        running.push(
            watches::run_controller(
                "operator cluster Secret sweep",
                reads.clone(),
                sweep_secrets,
                config.clone(),
                sweep_orphan,
                retry,
                ctx.clone(),
                shutdown.clone(),
            )
            .boxed(),
        );
    }
    for watch in [gocs.run(shutdown.clone()).boxed()]
        .into_iter()
        .chain([
            decisions.run(shutdown.clone()).boxed(),
            placements.run(shutdown.clone()).boxed(),
            works.run(shutdown.clone()).boxed(),
            ca.run(shutdown.clone()).boxed(),
            csrs.run(shutdown.clone()).boxed(),
        ])
        .chain(secrets.into_iter().map(|w| w.run(shutdown.clone()).boxed()))
    {
        running.push(watch);
    }
    tracing::info!("GitOpsCluster controllers started");
    futures::future::join_all(running).await;
}

/// The GitOpsClusters a watch's objects concern, by `concerns`, as reconcile triggers.
fn mapped<K, F>(
    events: impl Stream<Item = watcher::Event<K>> + Send + 'static,
    mut concerns: F,
) -> impl Stream<Item = ObjectRef<GitOpsCluster>> + Send + 'static
where
    K: Send + 'static,
    F: FnMut(K) -> Vec<ObjectRef<GitOpsCluster>> + Send + 'static,
{
    touched(events).flat_map(move |obj| match obj {
        Ok(obj) => stream::iter(concerns(obj)),
        Err(_) => stream::iter(Vec::new()),
    })
}

/// `concerns` over the GitOpsClusters in `store`.
fn concerning<K>(
    store: Store<GitOpsCluster>,
    concerns: impl Fn(&[Arc<GitOpsCluster>], &K) -> Vec<ObjectRef<GitOpsCluster>> + Send + 'static,
) -> impl FnMut(K) -> Vec<ObjectRef<GitOpsCluster>> + Send + 'static {
    move |obj| concerns(&store.state(), &obj)
}

/// The objects in `store` created by a GitOpsCluster when it is deleted, for the sweep.
fn owned_by_deleted<K>(
    gocs: impl Stream<Item = watcher::Event<GitOpsCluster>> + Send + 'static,
    store: Store<K>,
) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    watches::triggers(gocs, move |event| match event {
        watcher::Event::Delete(goc) => {
            let key = placement::goc_key(&goc);
            store
                .state()
                .iter()
                .filter(|o| fleet::owner(o.as_ref()) == Some(&key))
                .map(|o| ObjectRef::from_obj(o.as_ref()))
                .collect()
        }
        _ => Vec::new(),
    })
}

async fn reconcile(goc: Arc<GitOpsCluster>, ctx: Arc<Context>) -> Result<Action, OperatorError> {
    let key = placement::goc_key(&goc);
    let done = match controller::reconcile_gitopscluster(
        &ctx.client,
        &ctx.opts,
        &ctx.stores,
        &ctx.unclaimed,
        &goc,
        ctx.every_goc(),
    )
    .await
    {
        Ok(done) => done,
        Err(OperatorError::Kube {
            action,
            source: kube::Error::Api(s),
        }) if s.code == 409 => {
            // A write based on a store that had not yet seen an earlier write (or a concurrent
            // one): the store catches up by the next pass, soon.
            tracing::debug!(gitopscluster = %key, %action, "conflict on a write; looking again soon");
            return Ok(Action::requeue(SOON));
        }
        Err(e) => return Err(e),
    };
    ctx.succeeded(&key);
    tracing::debug!(gitopscluster = %key, ?done, "GitOpsCluster reconciled");
    Ok(Action::requeue(if done.requeue_soon {
        SOON
    } else {
        done.recheck_after
            .map_or(ctx.opts.resync, |after| after.min(ctx.opts.resync))
    }))
}

/// Sweeps when `obj`, this principal's, names no GitOpsCluster or one that is gone or that
/// this principal no longer serves, or when `obj`, another principal's, outlived its
/// GitOpsCluster (that principal's claim was removed by hand: [`fleet::Fleet::ours`]), and looks
/// again every `resync` while it does (the cluster may be assigned meanwhile: its GitOpsCluster
/// decides).
async fn sweep_orphan<K>(obj: Arc<K>, ctx: Arc<Context>) -> Result<Action, OperatorError>
where
    K: kube::Resource<DynamicType = ()>,
{
    let owner = fleet::owner(obj.as_ref());
    let gocs = ctx.gocs.state();
    let exists = |o: &String| gocs.iter().any(|g| placement::goc_key(g) == *o);
    let orphan = if fleet::principal_of(obj.as_ref()).is_some_and(|p| *p != ctx.opts.namespace) {
        // Another principal's: left to it while its GitOpsCluster exists.
        owner.is_some_and(|o| !exists(o))
    } else {
        owner.is_none_or(|o| {
            !gocs.iter().any(|g| {
                placement::goc_key(g) == *o && fleet::argocd_namespace_of(g, &ctx.opts).is_some()
            })
        })
    };
    if !orphan {
        return Ok(Action::await_change());
    }
    let offboarded =
        controller::sweep(&ctx.client, &ctx.opts, &ctx.stores, ctx.every_goc()).await?;
    if !offboarded.is_empty() {
        tracing::info!(clusters = ?offboarded, "objects of no GitOpsCluster removed");
    }
    ctx.succeeded(&fleet::name_in(obj.as_ref()));
    Ok(Action::requeue(ctx.opts.resync))
}

fn retry<K>(obj: Arc<K>, error: &OperatorError, ctx: Arc<Context>) -> Action
where
    K: kube::Resource<DynamicType = ()>,
{
    let name = fleet::name_in(obj.as_ref());
    let after = ctx.failed(name.clone());
    tracing::warn!(object = %name, error = %error, retry_in = ?after, "GitOpsCluster operator: reconciliation failed; retrying");
    Action::requeue(after)
}
