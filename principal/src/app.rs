//! Runs the principal process once its configuration is valid.
//!
//! Owns the process lifecycle and the composition of the connection path, top to bottom: ops
//! endpoints (metrics, health) → hub client and watches → TLS listener with certificate identity →
//! gRPC services (authentication, version, event stream) → orderly shutdown on SIGTERM/Ctrl-C.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use argocd_agent_proto::pb::authapi::authentication_server::AuthenticationServer;
use argocd_agent_proto::pb::eventstreamapi::event_stream_server::EventStreamServer;
use argocd_agent_proto::pb::versionapi::version_server::VersionServer;
use argocd_agent_proto::sync::OutboxConfig;
use argocd_agent_proto::telemetry::flags::AgentMode;
use argocd_agent_proto::telemetry::{
    shutdown_signal, start_ops_servers, HealthState, MetricsRegistry,
};
use argocd_agent_proto::tls::reload::ReloadingServerConfig;
use argocd_agent_proto::tls::{ServerTlsOptions, TlsPolicy};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::oneshot;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{info, warn};

use crate::auth::{AuthPolicy, AuthService, VersionService};
use crate::config::{JwtKeySource, KubeClientConfig, PrincipalConfig};
use crate::eventstream::EventStreamService;
use crate::hub::{Hub, HubOptions};
use crate::listener::accept_loop;
use crate::metrics::PrincipalMetrics;
use crate::sessions::AgentRegistry;
use crate::tokens::TokenIssuer;

/// How often certificate files are checked for rotation.
const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// A Kubernetes client from an explicit kubeconfig/context, or the in-cluster/default config.
pub async fn kube_client(cfg: &KubeClientConfig) -> anyhow::Result<kube::Client> {
    let options = KubeConfigOptions {
        context: cfg.context.clone(),
        ..Default::default()
    };
    let config = match &cfg.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig given and no in-cluster configuration found")?,
    };
    Ok(kube::Client::try_from(config)?)
}

fn token_issuer(config: &PrincipalConfig) -> anyhow::Result<TokenIssuer> {
    let issuer = match &config.jwt_key {
        JwtKeySource::File(path) => {
            let pem = std::fs::read_to_string(path)
                .with_context(|| format!("reading --jwt-key {}", path.display()))?;
            TokenIssuer::from_pem(
                &pem,
                config.access_token_lifetime,
                config.refresh_token_lifetime,
            )?
        }
        JwtKeySource::GenerateInsecure => {
            warn!("using a generated JWT signing key (--insecure-jwt-generate): tokens do not survive a restart");
            TokenIssuer::generate(config.access_token_lifetime, config.refresh_token_lifetime)?
        }
    };
    Ok(issuer)
}

/// Starts the resource proxy and the Redis proxy when configured; returns the resource proxy's
/// certificate watcher.
async fn start_live_view(
    config: &PrincipalConfig,
    registry: &Arc<AgentRegistry>,
    live: &Arc<crate::live::LiveRequests>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let mut watcher = None;
    if let Some(rp) = &config.resource_proxy {
        let tls = ReloadingServerConfig::load(
            ServerTlsOptions::new(&rp.tls.cert, &rp.tls.key)
                .require_client_certs(&rp.tls.client_ca)
                .with_alpn(&[b"h2", b"http/1.1"])
                .with_policy(TlsPolicy {
                    min_version: config.tls_min_version,
                }),
        )
        .context("loading the resource proxy's TLS files")?;
        watcher = Some(tls.spawn_watcher(TLS_RELOAD_INTERVAL));
        let proxy = Arc::new(crate::resource_proxy::ResourceProxy {
            registry: registry.clone(),
            live: live.clone(),
        });
        let addr = crate::resource_proxy::serve(rp.address, tls, proxy)
            .await
            .with_context(|| format!("cannot listen on --resource-proxy-address {}", rp.address))?;
        info!(%addr, "resource proxy listening");
    }
    if let Some(addr) = config.redis_proxy_address {
        let proxy = Arc::new(crate::redis_proxy::RedisProxy {
            registry: registry.clone(),
            live: live.clone(),
            upstream: config.redis_server_address.to_string(),
        });
        let addr = crate::redis_proxy::serve(addr, proxy)
            .await
            .with_context(|| format!("cannot listen on --redis-proxy-address {addr}"))?;
        info!(%addr, upstream = %config.redis_server_address, "redis proxy listening");
    }
    Ok(watcher)
}

/// Runs the principal until SIGTERM/Ctrl-C; an error means a runtime failure (exit 1).
pub async fn run(config: PrincipalConfig) -> anyhow::Result<()> {
    let registry_metrics = MetricsRegistry::new(env!("CARGO_PKG_VERSION"));
    let metrics = Arc::new(PrincipalMetrics::register(&registry_metrics));
    let health = HealthState::new();
    let (stop_ops, ops_stopped) = oneshot::channel::<()>();
    let ops = start_ops_servers(
        config.metrics_address,
        config.health_address,
        registry_metrics,
        health.clone(),
        async move {
            let _ = ops_stopped.await;
        },
    )
    .await?;
    if let Some(otlp) = &config.otlp_address {
        warn!(otlp_address = %otlp, "not yet implemented: OTLP trace export; --otlp-address is ignored");
    }

    let client = kube_client(&config.kube).await?;
    let issuer = Arc::new(token_issuer(&config)?);
    let tls = ReloadingServerConfig::load(
        ServerTlsOptions::new(&config.tls.cert, &config.tls.key)
            .require_client_certs(&config.tls.client_ca)
            .with_alpn(&[b"h2"])
            .with_policy(TlsPolicy {
                min_version: config.tls_min_version,
            }),
    )
    .context("loading the gRPC listener's TLS files")?;
    let _tls_watcher = tls.spawn_watcher(TLS_RELOAD_INTERVAL);

    let registry = Arc::new(AgentRegistry::new(OutboxConfig::default()));
    let live = crate::live::LiveRequests::new();
    let _live_view_tls_watcher = start_live_view(&config, &registry, &live).await?;
    let (stop_operator, operator_stopped) = argocd_agent_operator::pull::Shutdown::new();
    let operator = config.enable_operator.then(|| {
        let opts = argocd_agent_operator::gitops::OperatorOptions::new(&config.namespace);
        let pull = argocd_agent_operator::pull::PullModelOptions {
            argocd_namespace: config.namespace.clone(),
            ..Default::default()
        };
        let pull_stopped = operator_stopped.clone().requested();
        let pull_model = tokio::spawn(argocd_agent_operator::pull::run_pull_model(
            client.clone(),
            pull,
            pull_stopped,
        ));
        let gitops = tokio::spawn(argocd_agent_operator::gitops::run_operator(
            client.clone(),
            opts,
            operator_stopped,
        ));
        async move {
            let (gitops, pull_model) = tokio::join!(gitops, pull_model);
            if let Ok(Err(e)) = pull_model {
                tracing::error!(error = %e, "the OCM pull-model controllers failed");
            }
            drop(gitops);
        }
    });
    let operator = operator.map(tokio::spawn);
    let hub = Hub::with_options(
        client,
        config.namespace.clone(),
        registry.clone(),
        HubOptions {
            namespace_create: config.namespace_create_enable,
            resync_interval: config.resync_interval,
        },
    );
    tokio::spawn(hub.clone().run());

    let listener = tokio::net::TcpListener::bind(config.listen_address)
        .await
        .with_context(|| {
            format!(
                "cannot listen on --listen-address {}",
                config.listen_address
            )
        })?;
    let grpc_addr = listener.local_addr()?;
    let incoming = accept_loop(listener, tls, config.auth.clone(), metrics.clone());

    let max = config.grpc_max_message_size;
    let auth = AuthService {
        issuer: issuer.clone(),
        policy: AuthPolicy {
            principal_namespace: config.namespace.clone(),
            allowed_modes: config.allowed_agent_modes.clone(),
            implemented_modes: vec![AgentMode::Managed, AgentMode::Autonomous],
        },
        metrics: metrics.clone(),
    };
    let events = EventStreamService {
        issuer,
        registry,
        hub: hub.clone(),
        metrics,
        live,
    };
    let (stop_grpc, grpc_stopped) = oneshot::channel::<()>();
    let mut server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    let grpc = server
        .add_service(
            AuthenticationServer::new(auth)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .add_service(VersionServer::new(VersionService))
        .add_service(
            EventStreamServer::new(events)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .serve_with_incoming_shutdown(ReceiverStream::new(incoming), async move {
            let _ = grpc_stopped.await;
        });
    let grpc_task = tokio::spawn(grpc);
    info!(
        version = env!("CARGO_PKG_VERSION"),
        namespace = %config.namespace,
        grpc = %grpc_addr,
        metrics = %ops.metrics_addr,
        health = %ops.health_addr,
        "argocd-principal started"
    );

    health.set_ready(
        false,
        "waiting for the hub watches to list Applications and AppProjects",
    );
    let ready = {
        let health = health.clone();
        let hub = hub.clone();
        tokio::spawn(async move {
            hub.wait_synced().await;
            health.set_ready(true, "serving");
            info!("hub watches synced; ready");
        })
    };

    let signal = shutdown_signal().await?;
    info!(signal, "shutting down");
    ready.abort();
    health.set_ready(false, "shutting down");
    let _ = stop_grpc.send(());
    let _ = stop_operator.send(true);
    if let Some(operator) = operator {
        let _ = tokio::time::timeout(Duration::from_secs(5), operator).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), grpc_task).await;
    let _ = stop_ops.send(());
    ops.wait().await?;
    Ok(())
}
