//! Runs the agent process once its configuration is valid.
//!
//! Owns: the process lifecycle and the wiring, top to bottom — ops endpoints (metrics, health),
//! the TLS client config (hot reloaded) and the spoke's Kubernetes client, the process-wide
//! [`Outbox`] (outbound events, kept across reconnects and, journalled under `--queue-dir`, across
//! restarts), the mode's sync ([`ManagedSync`] or [`AutonomousSync`]: event handler + spoke
//! watchers), the periodic jittered resync (`--resync-interval`), a managed agent's cluster cache
//! counts ([`crate::cluster_info`], `--cache-refresh-interval`), the [`Connection`] to the
//! principal, and orderly shutdown on SIGTERM/Ctrl-C.

use std::sync::Arc;
use std::time::Duration;

use argocd_agent_proto::sync::{EventHandler, Instrumented};
use argocd_agent_proto::sync::{Outbox, OutboxConfig};
use argocd_agent_runtime::telemetry::{
    shutdown_signal, start_ops_servers, HealthState, MetricsRegistry,
};
use argocd_agent_runtime::tls::{
    expiry, CertificateExpiry, ClientTlsOptions, ReloadingClientConfig, ALPN_H2, ALPN_HTTP1,
};
use tokio::sync::{oneshot, watch};
use tracing::{info, warn};

use crate::autonomous::AutonomousSync;
use crate::config::{AgentConfig, ClientTlsFiles, KubeClientConfig};
use crate::connection::{Connection, ConnectionSettings};
use crate::managed::{ManagedSettings, ManagedSync};
use crate::metrics::AgentMetrics;
use crate::placement::{AppPlacement, PrincipalNamespace};
use crate::reported::Reported;
use argocd_agent_kube::secret_files;
use argocd_agent_proto::mode::AgentMode;
use argocd_agent_proto::sync::resync::jittered;

/// How often the TLS files are checked for rotation.
const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(30);
/// How long shutdown waits for the stream to close.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A configuration problem found at start-up that validation could not see (a PEM file that is
/// not a certificate, an unusable kubeconfig). `main` exits 2 for it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigProblem(pub String);

/// Runs the agent until SIGTERM/Ctrl-C; an error means a runtime failure (exit 1), or a
/// [`ConfigProblem`] (exit 2).
pub async fn run(config: AgentConfig) -> anyhow::Result<()> {
    let registry = MetricsRegistry::new(env!("CARGO_PKG_VERSION"));
    let metrics = AgentMetrics::register(&registry);
    let certificate_expiry =
        CertificateExpiry::register(&registry, "argocd_agent", expiry::DEFAULT_WARN_BEFORE);
    let health = HealthState::new();
    let (stop_ops, ops_stopped) = oneshot::channel::<()>();
    let ops = start_ops_servers(
        config.metrics_address,
        config.health_address,
        registry,
        health.clone(),
        async move {
            let _ = ops_stopped.await;
        },
    )
    .await?;
    info!(
        version = env!("CARGO_PKG_VERSION"),
        mode = %config.mode,
        principal = %config.server_address,
        transport = if config.enable_websocket {
            "grpc over websocket (http/1.1, a connection per call)"
        } else {
            "grpc (http/2)"
        },
        namespace = %config.namespace,
        metrics = %ops.metrics_addr,
        health = %ops.health_addr,
        "argocd-agent started"
    );

    let client_tls = || match &config.tls {
        Some(files) => load_tls(files, &config).map(Some),
        None => {
            warn!(
                principal = %config.server_address,
                "INSECURE: connecting to the principal WITHOUT TLS (--insecure-plaintext); ensure \
                 Istio or a similar service mesh provides mTLS and names this agent to the principal"
            );
            Ok(None)
        }
    };
    // TLS given as files is checked first: an unusable file is a configuration error (exit 2)
    // even where no cluster can be reached.
    let early_tls = match config.tls_secrets.is_empty() {
        true => Some(client_tls()?),
        false => None,
    };
    let client = kube_client(&config.kube).await?;
    // TLS files that come from Secrets are written before they are loaded.
    let _tls_secrets = secret_files::keep(
        client.clone(),
        &config.namespace,
        &config.tls_secret_dir,
        config.tls_secrets.clone(),
        TLS_RELOAD_INTERVAL,
    )
    .await
    .map_err(|e| ConfigProblem(e.to_string()))?;
    let tls = match early_tls {
        Some(tls) => tls,
        None => client_tls()?,
    };
    let tls_watcher = tls.as_ref().map(|t| t.spawn_watcher(TLS_RELOAD_INTERVAL));
    let expiry_watcher = tls
        .as_ref()
        .map(|t| certificate_expiry.watch("client", t, expiry::CHECK_INTERVAL));

    let outbox_config = OutboxConfig {
        resends: metrics.event_resends.clone(),
        size: metrics.outbox_resources.clone(),
        ..OutboxConfig::default()
    };
    let outbox_capacity = outbox_config.max_resources;
    let (outbox, opened) = Outbox::open(&config.queue_dir, outbox_config).map_err(|e| {
        ConfigProblem(format!(
            "--queue-dir (env ARGOCD_AGENT_QUEUE_DIR) {}: {e}",
            config.queue_dir.display()
        ))
    })?;
    let outbox = Arc::new(outbox);
    if let Some(damage) = &opened.damage {
        warn!(queue_dir = %config.queue_dir.display(), damage = %damage, restored = opened.restored,
            "the outbound queue journal was damaged; events after the damage are lost, so everything is sent again (full resync)");
    } else if opened.restored > 0 {
        info!(queue_dir = %config.queue_dir.display(), restored = opened.restored, "restored queued events from the last run");
    }
    let full_resync = opened.damage.is_some();
    let (stop_tx, stop_rx) = watch::channel(false);
    let principal_namespace = Arc::new(PrincipalNamespace::default());
    let connection = Connection::new(
        ConnectionSettings::from_config(&config, outbox_capacity),
        tls,
        outbox.clone(),
        metrics.clone(),
        health.clone(),
    )
    .report_principal_namespace(principal_namespace.clone());
    let live =
        crate::live::LiveService::start(&config, client.clone(), outbox.clone(), connection.link());
    // Managed agents only, as upstream: the spoke's cache counts for the hub's cluster list.
    let mut cache_info = None;
    let (watchers, resync, mut connection) = match config.mode {
        AgentMode::Managed => {
            let placement = Arc::new(AppPlacement::from_config(
                &config,
                client.clone(),
                principal_namespace,
            ));
            let sync = ManagedSync::placed(
                client,
                ManagedSettings::from_config(&config),
                placement,
                outbox.clone(),
            );
            let watchers = tokio::spawn(sync.clone().run_watchers());
            cache_info = config.cache_refresh_interval.map(|every| {
                crate::cluster_info::spawn(
                    every,
                    crate::live::redis::local_redis(&config),
                    outbox.clone(),
                )
            });
            let periodic = sync.clone();
            let resync = spawn_periodic_resync(config.resync_interval, outbox.clone(), move || {
                let sync = periodic.clone();
                tokio::spawn(async move {
                    if let Err(e) = sync.answer_resync().await {
                        warn!(error = %e, "periodic resync failed; the next one retries");
                    }
                });
            });
            (
                watchers,
                resync,
                tokio::spawn(connection.run(
                    timed(
                        crate::live::LiveDispatch::wrap(sync, live),
                        &metrics,
                        AgentMode::Managed,
                    ),
                    stop_rx,
                )),
            )
        }
        AgentMode::Autonomous => {
            let reported = Reported::open(&config.queue_dir).unwrap_or_else(|e| {
                warn!(queue_dir = %config.queue_dir.display(), error = %e,
                    "cannot read or write the record of what was reported to the principal; keeping it in memory (behind a principal comparing specs only, a restart then sends every object once)");
                Reported::default()
            });
            let sync = AutonomousSync::new(
                client,
                config.namespace.clone(),
                config.label_selector.clone(),
                outbox.clone(),
                full_resync,
                reported,
            );
            let watchers = tokio::spawn(sync.clone().run_watchers());
            let periodic = sync.clone();
            let resync = spawn_periodic_resync(config.resync_interval, outbox.clone(), move || {
                periodic.request_resync()
            });
            let dispatch = timed(
                crate::live::LiveDispatch::wrap(sync.clone(), live),
                &metrics,
                AgentMode::Autonomous,
            );
            (
                watchers,
                resync,
                // Connect once the spoke watches hold their first list, as upstream's agent does
                // (EnsureSynced before maintainConnection): that list only records what exists
                // (the principal's resync compares it), so an object created between the start
                // and a late first list would otherwise reach the hub only through a resync,
                // never through the queue. A first list can be late by a second or more: a
                // kube-apiserver builds a custom resource's watch cache on the first request
                // after it starts or the CRD changes, and until it is ready it refuses a list
                // with a label selector (ours always has the skip-sync one) with 429 and
                // Retry-After: 1 (KEP-4568; unselected, paged lists go to etcd instead).
                tokio::spawn(async move {
                    sync.wait_listed().await;
                    connection.run(dispatch, stop_rx).await
                }),
            )
        }
    };

    let outcome = tokio::select! {
        signal = shutdown_signal() => signal.map(|s| info!(signal = s, "shutting down")).map_err(anyhow::Error::from),
        ended = &mut connection => Err(anyhow::anyhow!("the connection to the principal stopped unexpectedly: {ended:?}")),
    };
    health.set_ready(false, "shutting down");
    let _ = stop_tx.send(true);
    if !connection.is_finished()
        && tokio::time::timeout(SHUTDOWN_GRACE, &mut connection)
            .await
            .is_err()
    {
        warn!("the connection did not close in time; abandoning it");
        connection.abort();
    }
    watchers.abort();
    if let Some(r) = resync {
        r.abort();
    }
    if let Some(c) = cache_info {
        c.abort();
    }
    for watcher in tls_watcher.into_iter().chain(expiry_watcher) {
        watcher.abort();
    }
    let _ = stop_ops.send(());
    ops.wait().await?;
    outcome
}

/// Runs `resync` every `--resync-interval` (jittered) while the stream is up; `None` when off.
fn spawn_periodic_resync(
    interval: Option<Duration>,
    outbox: Arc<Outbox>,
    resync: impl Fn() + Send + 'static,
) -> Option<tokio::task::JoinHandle<()>> {
    let interval = interval?;
    Some(tokio::spawn(async move {
        loop {
            tokio::time::sleep(jittered(interval)).await;
            if outbox.is_connected() {
                tracing::debug!("periodic resync");
                resync();
            }
        }
    }))
}

/// The client TLS config from the certificate files, reloaded when they change.
/// `handler` with each event's outcome and processing time observed in
/// `agent_event_processing_time{status,agent_mode,resource_type}` and failures in `agent_errors`.
fn timed<H: EventHandler>(
    handler: Arc<H>,
    metrics: &AgentMetrics,
    mode: AgentMode,
) -> Arc<Instrumented<Arc<H>>> {
    Arc::new(Instrumented::new(
        handler,
        metrics.handling.for_peer("agent_mode", mode.as_str()),
    ))
}

fn load_tls(
    files: &ClientTlsFiles,
    config: &AgentConfig,
) -> Result<ReloadingClientConfig, ConfigProblem> {
    let options = ClientTlsOptions::new(&files.ca)
        .with_client_cert(&files.cert, &files.key)
        .with_alpn(&[if config.enable_websocket {
            ALPN_HTTP1
        } else {
            ALPN_H2
        }])
        .with_policy(config.tls_policy.clone());
    ReloadingClientConfig::load(options).map_err(|e| {
        ConfigProblem(format!(
            "--tls-client-cert/--tls-client-key/--tls-ca (env ARGOCD_AGENT_TLS_CLIENT_CERT, \
             ARGOCD_AGENT_TLS_CLIENT_KEY, ARGOCD_AGENT_TLS_CA): {e}"
        ))
    })
}

/// The spoke's Kubernetes client (`--kubeconfig` / `--kubecontext`, see
/// [`argocd_agent_kube::client`]); a configuration that cannot be loaded is a usage problem.
async fn kube_client(k: &KubeClientConfig) -> anyhow::Result<kube::Client> {
    argocd_agent_kube::client::client(
        k.kubeconfig.as_deref(),
        k.context.as_deref(),
        argocd_agent_kube::client::ClientFlags {
            kubeconfig: "--kubeconfig (env ARGOCD_AGENT_KUBECONFIG)",
            context: "--kubecontext (env ARGOCD_AGENT_KUBECONTEXT)",
        },
    )
    .await
    .map_err(|e| {
        anyhow::Error::new(ConfigProblem(format!(
            "cannot load the Kubernetes client configuration: {e}"
        )))
    })
}
