//! Runs the principal process once its configuration is valid.
//!
//! Owns the process lifecycle and the composition of the connection path, top to bottom: ops
//! endpoints (metrics, health) → hub client and watches → TLS listener with certificate identity →
//! gRPC services (authentication, version, event stream), one set of routes served as native gRPC
//! and, with `--enable-websocket`, as gRPC over WebSocket ([`crate::websocket`]) → orderly
//! shutdown on SIGTERM/Ctrl-C.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use argocd_agent_proto::mode::AgentMode;
use argocd_agent_proto::pb::authapi::authentication_server::AuthenticationServer;
use argocd_agent_proto::pb::eventstreamapi::event_stream_server::EventStreamServer;
use argocd_agent_proto::pb::logstreamapi::log_stream_service_server::LogStreamServiceServer;
use argocd_agent_proto::pb::terminalstreamapi::terminal_stream_service_server::TerminalStreamServiceServer;
use argocd_agent_proto::pb::versionapi::version_server::VersionServer;
use argocd_agent_proto::sync::OutboxConfig;
use argocd_agent_runtime::grpc_websocket::socket::Keepalive;
use argocd_agent_runtime::redis_client::RedisTarget;
use argocd_agent_runtime::redis_pool::RedisPool;
use argocd_agent_runtime::telemetry::{
    shutdown_signal, start_ops_servers, HealthState, MetricsRegistry,
};
use argocd_agent_runtime::tls::reload::ReloadingServerConfig;
use argocd_agent_runtime::tls::{expiry, CertificateExpiry, ServerTlsOptions, ALPN_H2, ALPN_HTTP1};
use tokio::sync::oneshot;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::CompressionEncoding::Gzip;
use tracing::{info, warn};

use crate::auth::{AuthPolicy, AuthService, VersionService};
use crate::compression::like_request;
use crate::config::AuthMethod;
use crate::config::{JwtKeySource, KubeClientConfig, PrincipalConfig};
use crate::eventstream::EventStreamService;
use crate::hub::{Hub, HubOptions};
use crate::listener::{accept_loop, plaintext_accept_loop};
use crate::metrics::PrincipalMetrics;
use crate::sessions::AgentRegistry;
use crate::tokens::TokenIssuer;

/// How often certificate files are checked for rotation.
const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(5);
/// The gRPC listener's pings to agents (HTTP/2 PING, or WebSocket ping per call): the link is
/// dead when one goes unanswered.
const GRPC_KEEPALIVE: Keepalive = Keepalive {
    interval: Duration::from_secs(30),
    timeout: Duration::from_secs(10),
};

/// The hub's Kubernetes client (`--kubeconfig` / `--kubecontext`, see [`argocd_agent_kube::client`]).
pub async fn kube_client(cfg: &KubeClientConfig) -> anyhow::Result<kube::Client> {
    Ok(argocd_agent_kube::client::client(
        cfg.kubeconfig.as_deref(),
        cfg.context.as_deref(),
        argocd_agent_kube::client::ClientFlags {
            kubeconfig: "--kubeconfig (env ARGOCD_PRINCIPAL_KUBECONFIG)",
            context: "--kubecontext (env ARGOCD_PRINCIPAL_KUBECONTEXT)",
        },
    )
    .await?)
}

fn token_issuer(config: &PrincipalConfig) -> anyhow::Result<TokenIssuer> {
    let issuer = match &config.jwt_key {
        source @ (JwtKeySource::File(path) | JwtKeySource::Secret { path, .. }) => {
            let pem = std::fs::read_to_string(path)
                .with_context(|| format!("reading {} {}", source.flag(), path.display()))?;
            TokenIssuer::from_pem(
                &pem,
                config.access_token_lifetime,
                config.refresh_token_lifetime,
            )
            .with_context(|| format!("the JWT signing key of {}", source.flag()))?
        }
        JwtKeySource::GenerateInsecure => {
            warn!("using a generated JWT signing key (--insecure-jwt-generate): tokens do not survive a restart");
            TokenIssuer::generate(config.access_token_lifetime, config.refresh_token_lifetime)?
        }
    };
    Ok(issuer)
}

/// Starts the resource proxy and the Redis proxy when configured; returns the resource proxy's
/// certificate watchers (reload, and the expiry gauge `certificate="resource-proxy"`).
#[allow(clippy::too_many_arguments)]
async fn start_live_view(
    config: &PrincipalConfig,
    registry: &Arc<AgentRegistry>,
    live: &Arc<crate::live::LiveRequests>,
    policy: &crate::listener::ConnectionPolicy,
    tokens: &Arc<TokenIssuer>,
    metrics: &PrincipalMetrics,
    certificate_expiry: &CertificateExpiry,
    destination_mapping: Option<Arc<Hub>>,
    hub_redis: &RedisTarget,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut watchers = Vec::new();
    if let Some(rp) = &config.resource_proxy {
        let tls = ReloadingServerConfig::load(
            ServerTlsOptions::new(&rp.tls.cert, &rp.tls.key)
                .require_client_certs(&rp.tls.client_ca)
                .with_alpn(&[b"h2", b"http/1.1"])
                .with_policy(config.tls_policy.clone()),
        )
        .context("loading the resource proxy's TLS files")?;
        watchers.push(tls.spawn_watcher(TLS_RELOAD_INTERVAL));
        // Checked at the reload pace (a cheap load): the gauge follows a rotation within seconds.
        watchers.push(certificate_expiry.watch("resource-proxy", &tls, TLS_RELOAD_INTERVAL));
        let proxy = Arc::new(crate::resource_proxy::ResourceProxy {
            registry: registry.clone(),
            live: live.clone(),
            tokens: tokens.clone(),
            metrics: metrics.resource_proxy.clone(),
            body_timeout: config.request_body_timeout,
            body_budget: crate::resource_proxy::BodyBudget::new(
                config.max_request_bodies_in_flight,
                (
                    crate::resource_proxy::MAX_BODY_BYTES_IN_FLIGHT,
                    crate::resource_proxy::MAX_AGENT_BODY_BYTES_IN_FLIGHT,
                ),
            ),
            terminal: crate::terminal::TerminalPolicy::new(
                config.terminal_idle_timeout,
                config.terminal_max_sessions,
                config.terminal_max_sessions_per_agent,
                metrics.terminal.clone(),
            ),
        });
        let addr = crate::resource_proxy::serve(rp.address, tls, proxy, policy.clone())
            .await
            .with_context(|| format!("cannot listen on --resource-proxy-address {}", rp.address))?;
        info!(%addr, "resource proxy listening");
    }
    if let Some(addr) = config.redis_proxy_address {
        let proxy = Arc::new(crate::redis_proxy::RedisProxy {
            registry: registry.clone(),
            live: live.clone(),
            upstream: hub_redis.clone(),
            credentials: config.redis_credentials.clone(),
            max_request_size: config.redis_proxy_max_request_size,
            max_connections_per_ip: config.redis_proxy_max_connections_per_ip,
            max_subscriptions_per_connection: config.redis_proxy_max_subscriptions_per_connection,
            metrics: metrics.redis_proxy.clone(),
            destination_mapping,
        });
        let tls = match &config.redis_proxy_tls {
            None => None,
            Some((cert, key)) => {
                let tls = ReloadingServerConfig::load(
                    ServerTlsOptions::new(cert, key).with_policy(config.tls_policy.clone()),
                )
                .context("loading the Redis proxy's TLS files (--redis-tls-enabled)")?;
                watchers.push(tls.spawn_watcher(TLS_RELOAD_INTERVAL));
                watchers.push(certificate_expiry.watch("redis-proxy", &tls, TLS_RELOAD_INTERVAL));
                Some(tls)
            }
        };
        let serves_tls = tls.is_some();
        let addr = crate::redis_proxy::serve(addr, proxy, policy.request_header_timeout, tls)
            .await
            .with_context(|| format!("cannot listen on --redis-proxy-address {addr}"))?;
        info!(%addr, upstream = %config.redis_server_address, tls = serves_tls, upstream_tls = config.redis_tls.is_some(), "redis proxy listening");
    }
    Ok(watchers)
}

/// Ends every agent stream once the gRPC listener has reloaded a config that trusts another client
/// CA (`--tls-ca` rotated), so agents reconnect at once and are verified against the new CA: a
/// stream authenticated under a rotated-out CA does not outlive it. Renewals under the same CA keep
/// the streams.
fn end_streams_on_client_ca_rotation(
    tls: ReloadingServerConfig,
    ca_path: std::path::PathBuf,
    registry: Arc<AgentRegistry>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut trusted = std::fs::read(&ca_path).ok();
        let mut loaded = tls.current();
        let mut tick = tokio::time::interval(TLS_RELOAD_INTERVAL);
        loop {
            tick.tick().await;
            let now = tls.current();
            if Arc::ptr_eq(&now, &loaded) {
                continue;
            }
            loaded = now;
            let ca = std::fs::read(&ca_path).ok();
            if ca == trusted {
                continue;
            }
            trusted = ca;
            let sessions = registry.all();
            info!(
                agents = sessions.len(),
                "client CA rotated; ending agent streams so agents reconnect under the new CA"
            );
            for session in sessions {
                session.take_over(session.mode());
            }
        }
    })
}

/// Runs the principal until SIGTERM/Ctrl-C; an error means a runtime failure (exit 1).
pub async fn run(config: PrincipalConfig) -> anyhow::Result<()> {
    let registry_metrics = MetricsRegistry::new(env!("CARGO_PKG_VERSION"));
    let metrics = Arc::new(PrincipalMetrics::register(&registry_metrics));
    let ha_metrics = crate::leadership::HaMetrics::register(&registry_metrics);
    let certificate_expiry = CertificateExpiry::register(
        &registry_metrics,
        "argocd_principal",
        expiry::DEFAULT_WARN_BEFORE,
    );
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

    let client = kube_client(&config.kube).await?;
    // Files that come from Secrets (TLS, JWT key) are written before anything below loads them;
    // missing Secrets are created by the operator or waited for, not ready meanwhile.
    let _secret_files =
        crate::startup_secrets::keep_secret_files(&client, &config, &health, TLS_RELOAD_INTERVAL)
            .await?;
    let issuer = Arc::new(token_issuer(&config)?);
    let _jwt_reload = config.jwt_key.path().map(|path| {
        issuer.clone().spawn_key_reload(
            path.to_path_buf(),
            config.jwt_key.flag(),
            TLS_RELOAD_INTERVAL,
        )
    });
    let tls = if config.insecure_plaintext {
        tracing::warn!(
            listen_address = %config.listen_address,
            "INSECURE: the agent gRPC listener runs WITHOUT TLS (--insecure-plaintext): agents are \
             named by the service mesh's identity header, so nothing but the mesh sidecar may be \
             able to reach this address; ensure Istio or a similar service mesh provides mTLS"
        );
        None
    } else {
        Some(
            ReloadingServerConfig::load(
                ServerTlsOptions::new(&config.tls.cert, &config.tls.key)
                    .require_client_certs(&config.tls.client_ca)
                    .with_alpn(if config.enable_websocket {
                        &[ALPN_H2, ALPN_HTTP1]
                    } else {
                        &[ALPN_H2]
                    })
                    .with_policy(config.tls_policy.clone()),
            )
            .context("loading the gRPC listener's TLS files")?,
        )
    };
    let _tls_watcher = tls.as_ref().map(|t| t.spawn_watcher(TLS_RELOAD_INTERVAL));
    let _tls_expiry = tls
        .as_ref()
        .map(|t| certificate_expiry.watch("grpc", t, expiry::CHECK_INTERVAL));

    let registry = Arc::new(AgentRegistry::new(
        OutboxConfig {
            resends: metrics.event_resends.clone(),
            ..OutboxConfig::default()
        },
        metrics.outbox_resources.clone(),
    ));
    let _trust_rotation = tls.clone().map(|tls| {
        end_streams_on_client_ca_rotation(tls, config.tls.client_ca.clone(), registry.clone())
    });
    let live = crate::live::LiveRequests::new();
    let hub_redis = RedisTarget::new(
        "hub redis",
        config.redis_server_address.to_string(),
        config.redis_credentials.clone(),
        config.redis_tls.as_ref(),
    );
    let cluster_info = crate::cluster_info::ClusterInfoWriter::start(
        client.clone(),
        &config.namespace,
        crate::cluster_info::HubCache {
            redis: Arc::new(RedisPool::new(
                hub_redis.clone(),
                crate::cluster_info::IDLE_CONNECTIONS,
                crate::cluster_info::REPLY_TIMEOUT,
            )),
            compression: config.redis_compression,
        },
    );
    for connected in [true, false] {
        let writer = cluster_info.clone();
        let hook: crate::live::ConnectHook =
            Arc::new(move |agent: &str| writer.connection_changed(agent, connected));
        if connected {
            live.on_agent_connected(hook);
        } else {
            live.on_agent_disconnected(hook);
        }
    }
    let blocklist = Arc::new(crate::blocklist::Blocklist::default());
    let _blocklist_watch = blocklist.spawn_watch(client.clone(), &config.namespace);
    let policy = crate::listener::ConnectionPolicy {
        handshake_timeout: config.tls_handshake_timeout,
        request_header_timeout: config.request_header_timeout,
        blocklist,
    };
    if let Some(reg) = &config.self_registration {
        let reg = crate::self_registration::SelfRegistration::new(
            client.clone(),
            config.namespace.clone(),
            reg.clone(),
            issuer.clone(),
        );
        live.on_agent_connected(reg.on_connect());
    }
    let hub = Hub::with_options(
        crate::write_limit::limit_writes(client.clone(), crate::write_limit::HUB_WRITE_CONCURRENCY),
        config.namespace.clone(),
        registry.clone(),
        HubOptions {
            namespace_create: config.namespace_create.clone(),
            resync_interval: config.resync_interval,
            selection: crate::hub::HubSelection {
                allowed_namespaces: config.allowed_namespaces.clone(),
                label_selector: config.label_selector.clone(),
                // The embedded operator's pull model reads every Application: one watch for both.
                share_applications: config.enable_operator,
            },
            mapping: crate::hub::AppMapping::from_flag(config.destination_based_mapping),
            mirror_collisions: metrics.mirror_collisions.clone(),
            changes: metrics.hub_changes.clone(),
        },
    );
    let stop_operator = argocd_agent_kube::CancellationToken::new();
    let operator_stopped = stop_operator.clone();
    let leadership = crate::leadership::Leadership::start(
        client.clone(),
        config.ha.clone(),
        ha_metrics,
        operator_stopped.clone(),
    );
    let operator = config.enable_operator.then(|| {
        let mut opts = argocd_agent_operator::gitops::OperatorOptions::with_settings(
            &config.namespace,
            &config.operator,
        );
        if let Some(ha) = &config.ha {
            // The operator's own Lease then names this replica and keeps the HA pace.
            opts.identity = ha.identity.clone();
            opts.lease_duration = ha.lease_duration;
            opts.lease_retry = ha.renew_interval;
        }
        // The pull model handles the Applications of the Argo CD namespaces this principal
        // serves, so several principals on one hub never act on one another's.
        let pull = argocd_agent_operator::pull::PullModelOptions {
            argocd_namespace: config.namespace.clone(),
            application_namespaces: Some(opts.argocd_namespaces()),
            feedback: config.operator.pull_feedback,
            ..Default::default()
        };
        let pull_stopped = operator_stopped.clone();
        // The hub's Application informer is the pull model's too (the hub narrows its own view
        // to --allowed-namespaces and --label-selector): one Application watch and store.
        let applications = match hub.application_events() {
            Some(events) => argocd_agent_operator::pull::ApplicationSource::Informer(events),
            None => argocd_agent_operator::pull::ApplicationSource::OwnWatch,
        };
        let (client, leadership) = (client.clone(), leadership.clone());
        async move {
            // Only the active replica runs the operator and the pull model.
            tokio::select! {
                () = leadership.active() => {}
                () = operator_stopped.cancelled() => return,
            }
            let pull_model = tokio::spawn(argocd_agent_operator::pull::run_pull_model_from(
                client.clone(),
                pull,
                applications,
                pull_stopped,
            ));
            let gitops = tokio::spawn(argocd_agent_operator::gitops::run_operator(
                client,
                opts,
                operator_stopped,
            ));
            let (gitops, pull_model) = tokio::join!(gitops, pull_model);
            if let Ok(Err(e)) = pull_model {
                tracing::error!(error = %e, "the OCM pull-model controllers failed");
            }
            drop(gitops);
        }
    });
    let operator = operator.map(tokio::spawn);
    let client_for_identity = client.clone();
    tokio::spawn(hub.clone().run());
    // After the hub: under destination-based mapping the Redis proxy asks it which agent an
    // application's key goes to.
    let _live_view_tls_watchers = start_live_view(
        &config,
        &registry,
        &live,
        &policy,
        &issuer,
        &metrics,
        &certificate_expiry,
        config.destination_based_mapping.then(|| hub.clone()),
        &hub_redis,
    )
    .await?;

    let listener = tokio::net::TcpListener::bind(config.listen_address)
        .await
        .with_context(|| {
            format!(
                "cannot listen on --listen-address {}",
                config.listen_address
            )
        })?;
    let grpc_addr = listener.local_addr()?;
    let max = config.grpc_max_message_size;
    let pins = crate::mode_pin::ModePins::spawn(client_for_identity.clone(), &config.namespace);
    let auth = AuthService {
        issuer: issuer.clone(),
        policy: AuthPolicy {
            principal_namespace: config.namespace.clone(),
            allowed_modes: config.allowed_agent_modes.clone(),
            implemented_modes: vec![AgentMode::Managed, AgentMode::Autonomous],
        },
        metrics: metrics.clone(),
        pins: pins.clone(),
    };
    let identity = crate::identity::PrincipalIdentity::spawn(
        client_for_identity,
        config.namespace.clone(),
        Duration::from_secs(5),
    );
    let log_stream = crate::log_stream::LogStreamRelay {
        issuer: issuer.clone(),
        metrics: metrics.clone(),
        live: live.clone(),
    };
    let terminal_stream = crate::terminal::TerminalStreamRelay {
        issuer: issuer.clone(),
        metrics: metrics.clone(),
        sessions: live.terminals().clone(),
    };
    let stop_streams = tokio_util::sync::CancellationToken::new();
    let events = EventStreamService {
        issuer,
        registry,
        hub: hub.clone(),
        metrics: metrics.clone(),
        live,
        identity,
        pins,
        cluster_info,
        shutdown: stop_streams.clone(),
    };
    // gzip both ways, as upstream agents started with --enable-compression use it on every call
    // (answers are compressed only on calls whose client compresses: `compression`).
    let routes = tonic::service::Routes::new(like_request(
        AuthenticationServer::new(auth)
            .max_decoding_message_size(crate::auth::AUTH_MAX_MESSAGE_SIZE)
            .max_encoding_message_size(max)
            .accept_compressed(Gzip)
            .send_compressed(Gzip),
    ))
    .add_service(like_request(
        VersionServer::new(VersionService)
            .max_decoding_message_size(crate::auth::AUTH_MAX_MESSAGE_SIZE)
            .accept_compressed(Gzip)
            .send_compressed(Gzip),
    ))
    .add_service(like_request(
        tonic::service::interceptor::InterceptedService::new(
            {
                let events = Arc::new(events);
                let server = |limit: usize| {
                    EventStreamServer::from_arc(events.clone())
                        .max_decoding_message_size(limit)
                        .max_encoding_message_size(max)
                        .accept_compressed(Gzip)
                        .send_compressed(Gzip)
                };
                crate::eventstream::PingLimited {
                    stream: server(max),
                    ping: server(crate::auth::AUTH_MAX_MESSAGE_SIZE),
                }
            },
            {
                let leadership = leadership.clone();
                move |req| leadership.admit(req)
            },
        ),
    ))
    // Container logs pushed by upstream agents (ours answer on the event stream).
    .add_service(like_request(
        tonic::service::interceptor::InterceptedService::new(
            LogStreamServiceServer::new(log_stream)
                .max_decoding_message_size(max)
                .accept_compressed(Gzip)
                .send_compressed(Gzip),
            {
                let leadership = leadership.clone();
                move |req| leadership.admit(req)
            },
        ),
    ))
    // Web terminal sessions, which every agent opens per terminal-request event.
    .add_service(like_request(
        tonic::service::interceptor::InterceptedService::new(
            TerminalStreamServiceServer::new(terminal_stream)
                .max_decoding_message_size(crate::terminal::MAX_CALL_MESSAGE)
                .accept_compressed(Gzip)
                .send_compressed(Gzip),
            {
                let leadership = leadership.clone();
                move |req| leadership.admit(req)
            },
        ),
    ));
    // --enable-websocket: HTTP/1.1 connections carry gRPC over WebSocket to the same routes.
    let http1 = config.enable_websocket.then(|| {
        crate::websocket::http1_calls(crate::websocket::WebSocketSettings {
            routes: routes.clone(),
            max_message_size: max,
            keepalive: GRPC_KEEPALIVE,
            header_timeout: config.request_header_timeout,
        })
    });
    let incoming = match (tls, &config.auth) {
        (Some(tls), AuthMethod::Mtls(source)) => accept_loop(
            listener,
            tls,
            source.clone(),
            metrics.clone(),
            policy,
            config.keepalive_min_interval,
            crate::listener::ConnectionLimit::new(config.max_connections_per_agent),
            http1,
        ),
        (None, AuthMethod::Header(header)) => plaintext_accept_loop(
            listener,
            header.clone(),
            policy,
            config.keepalive_min_interval,
            http1,
        ),
        // PrincipalConfig::validate refuses the other pairings.
        _ => anyhow::bail!(
            "--auth={} cannot be served {} TLS",
            config.auth.name(),
            if config.insecure_plaintext {
                "without"
            } else {
                "with"
            }
        ),
    };

    let (stop_grpc, grpc_stopped) = oneshot::channel::<()>();
    let grpc = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(GRPC_KEEPALIVE.interval))
        .http2_keepalive_timeout(Some(GRPC_KEEPALIVE.timeout))
        .max_concurrent_streams(crate::auth::MAX_STREAMS_PER_CONNECTION)
        .add_routes(routes)
        .serve_with_incoming_shutdown(ReceiverStream::new(incoming), async move {
            let _ = grpc_stopped.await;
        });
    let grpc_task = tokio::spawn(grpc);
    info!(
        version = env!("CARGO_PKG_VERSION"),
        namespace = %config.namespace,
        grpc = %grpc_addr,
        websocket = config.enable_websocket,
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
        let (hub, leadership) = (hub.clone(), leadership.clone());
        tokio::spawn(async move {
            hub.wait_synced().await;
            info!("hub watches synced");
            leadership.publish_readiness(&health).await;
        })
    };

    let lost_lease = tokio::select! {
        signal = shutdown_signal() => {
            info!(signal = signal?, "shutting down");
            false
        }
        () = leadership.lost() => true,
    };
    ready.abort();
    health.set_ready(false, "shutting down");
    // Agent streams never end by themselves; the server's graceful stop would wait for them.
    stop_streams.cancel();
    let _ = stop_grpc.send(());
    stop_operator.cancel();
    if let Some(operator) = operator {
        let _ = tokio::time::timeout(Duration::from_secs(5), operator).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), grpc_task).await;
    let _ = stop_ops.send(());
    ops.wait().await?;
    anyhow::ensure!(
        !lost_lease,
        "lost the HA Lease to another replica; exiting so this one restarts as a standby"
    );
    Ok(())
}
