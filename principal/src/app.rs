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
use crate::hub::Hub;
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
    let hub = Hub::new(client, config.namespace.clone(), registry.clone());
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
            implemented_modes: vec![AgentMode::Managed],
        },
        metrics: metrics.clone(),
    };
    let events = EventStreamService {
        issuer,
        registry,
        hub: hub.clone(),
        metrics,
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
    let _ = tokio::time::timeout(Duration::from_secs(10), grpc_task).await;
    let _ = stop_ops.send(());
    ops.wait().await?;
    Ok(())
}
