//! Observability end to end: a principal on the hub and a managed agent on a spoke, scraped over
//! HTTP the way Prometheus would. Asserts the metric names both binaries publish (upstream
//! argocd-agent's where they mean the same thing), that the counters move when an Application
//! flows hub → spoke, and what `/healthz` and `/readyz` answer.

use std::time::Duration;

use e2e::gateway::{
    application, application_resource, ensure_namespace, http_get, Agent, Pki, Principal,
};
use e2e::{shared_planes, wait_until, TestContext};
use kube::api::{Api, DynamicObject, PostParams};

const WAIT: Duration = Duration::from_secs(30);

/// Names the principal's `/metrics` declares from start-up (`# TYPE` lines). Labelled families
/// (`argocd_principal_auth_failures`, `principal_events_*`) appear with their first sample.
const PRINCIPAL_METRICS: &[&str] = &[
    "argocd_principal_connected_agents",
    "argocd_principal_agent_connections",
    "principal_event_processing_time",
    "argocd_principal_event_resends",
    "argocd_principal_resource_proxy_request_duration_seconds",
    "argocd_principal_redis_proxy_request_duration_seconds",
];

/// Names the agent's `/metrics` declares from start-up; `agent_events_received` /
/// `agent_events_sent` are asserted below once traffic has produced samples.
const AGENT_METRICS: &[&str] = &[
    "argocd_agent_connection_status",
    "argocd_agent_connections",
    "argocd_agent_auth_failures",
    "agent_event_propagation_latency_seconds",
    "argocd_agent_outbox_resources",
    "agent_event_processing_time",
    "argocd_agent_event_resends",
];

async fn scrape(port: u16) -> anyhow::Result<String> {
    let (status, body) = http_get(port, "/metrics").await?;
    anyhow::ensure!(status == 200, "/metrics answered {status}: {body}");
    Ok(body)
}

/// The value of the first sample line that starts with `series` (name and, optionally, labels).
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn declared(body: &str, name: &str) -> bool {
    body.lines()
        .any(|l| l.starts_with(&format!("# TYPE {name} ")))
}

#[tokio::test]
async fn both_binaries_publish_their_metrics_and_counters_move_with_traffic() -> anyhow::Result<()>
{
    let planes = shared_planes().await;
    let ctx = TestContext::new("metrics")?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let principal =
        Principal::start("p", &ctx.dir, &planes.hub, &pki, &ctx.unique("argocd"), &[]).await?;
    let name = ctx.unique("agent");
    pki.issue_agent(&name)?;
    let hub = planes.hub.client().await?;
    ensure_namespace(&hub, &name).await?;
    let spoke = &planes.spokes[0];
    let agent = Agent::start(
        &name,
        &ctx.dir,
        spoke,
        &pki,
        &principal.address(),
        &ctx.unique("spoke-argocd"),
        &[],
    )
    .await?;
    agent.wait_connected().await?;

    let body = scrape(principal.ops_port).await?;
    for m in PRINCIPAL_METRICS {
        assert!(declared(&body, m), "principal /metrics lacks {m}:\n{body}");
    }
    let body = scrape(agent.ops_port).await?;
    for m in AGENT_METRICS {
        assert!(declared(&body, m), "agent /metrics lacks {m}:\n{body}");
    }

    // The stream is counted on both sides.
    let port = principal.ops_port;
    wait_until(
        "principal counts the connected agent",
        WAIT,
        || async move {
            let body = scrape(port).await?;
            Ok::<_, anyhow::Error>(
                (sample(&body, "argocd_principal_connected_agents ") == Some(1.0)
                    && sample(&body, "argocd_principal_agent_connections_total ") >= Some(1.0))
                .then_some(()),
            )
        },
    )
    .await?;

    // An Application created on the hub reaches the spoke; the agent counts it and its latency.
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &name, &application_resource());
    hub_apps
        .create(
            &PostParams::default(),
            &application("observed", &name, "v1"),
        )
        .await?;
    let spoke_apps: Api<DynamicObject> = Api::namespaced_with(
        spoke.client().await?,
        &agent.namespace,
        &application_resource(),
    );
    wait_until("the Application on the spoke", WAIT, || async {
        Ok::<_, kube::Error>(spoke_apps.get_opt("observed").await?.map(|_| ()))
    })
    .await?;
    let port = agent.ops_port;
    let body = wait_until("agent counters moved", WAIT, || async move {
        let body = scrape(port).await?;
        let received = sample(
            &body,
            "agent_events_received_total{event_type=\"create\",resource_type=\"application\"}",
        );
        let latency = sample(&body, "agent_event_propagation_latency_seconds_count");
        let acked = body
            .lines()
            .any(|l| l.starts_with("agent_events_sent_total{event_type=\"processed\""));
        Ok::<_, anyhow::Error>(
            (received >= Some(1.0) && latency >= Some(1.0) && acked).then_some(body),
        )
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", agent.process.log_tail(30)))?;
    assert_eq!(sample(&body, "argocd_agent_connection_status "), Some(1.0));
    assert!(
        sample(&body, "agent_event_processing_time_count") >= Some(1.0),
        "the agent timed the create it handled:\n{body}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as f64;
    let client_expiry = sample(
        &body,
        "argocd_agent_certificate_expiry_timestamp_seconds{certificate=\"client\"}",
    );
    assert!(
        client_expiry > Some(now),
        "the agent reports its client certificate's notAfter:\n{body}"
    );

    // The principal: per-agent connection, last event, events sent, gRPC certificate expiry.
    let port = principal.ops_port;
    let agent_series = format!("{{agent_name=\"{name}\"");
    let body = wait_until("principal per-agent series", WAIT, || {
        let agent_series = agent_series.clone();
        async move {
            let body = scrape(port).await?;
            let connected = body.lines().any(|l| {
                l.starts_with(&format!("argocd_principal_agent_connected{agent_series}"))
                    && l.ends_with(" 1")
            });
            let last_event = sample(
                &body,
                &format!("argocd_principal_agent_last_event_timestamp_seconds{agent_series}"),
            );
            let sent = sample(&body, "principal_events_sent_total{event_type=\"create\"}");
            Ok::<_, anyhow::Error>(
                (connected && last_event > Some(0.0) && sent >= Some(1.0)).then_some(body),
            )
        }
    })
    .await?;
    let grpc_expiry = sample(
        &body,
        "argocd_principal_certificate_expiry_timestamp_seconds{certificate=\"grpc\"}",
    );
    assert!(
        grpc_expiry > Some(now),
        "the principal reports its gRPC certificate's notAfter:\n{body}"
    );

    // Liveness and readiness.
    for (who, port) in [("principal", principal.ops_port), ("agent", agent.ops_port)] {
        let (status, _) = http_get(port, "/healthz").await?;
        assert_eq!(status, 200, "{who} /healthz");
        let (status, body) = http_get(port, "/readyz").await?;
        assert_eq!(status, 200, "{who} /readyz: {body}");
    }
    Ok(())
}

/// Traces: the principal and the agent export spans over OTLP, and the agent's `event.handle`
/// span of an Application create continues the principal's trace (`traceparent` in the event).
#[tokio::test]
async fn an_application_create_is_one_trace_across_principal_and_agent() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let ctx = TestContext::new("traces")?;
    let collector = e2e::otlp_collector::OtlpCollector::start().await?;
    let otlp = collector.address();
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let principal = Principal::start(
        "p",
        &ctx.dir,
        &planes.hub,
        &pki,
        &ctx.unique("argocd"),
        &["--otlp-address", &otlp],
    )
    .await?;
    let name = ctx.unique("agent");
    pki.issue_agent(&name)?;
    let hub = planes.hub.client().await?;
    ensure_namespace(&hub, &name).await?;
    let spoke = &planes.spokes[1];
    let agent = Agent::start(
        &name,
        &ctx.dir,
        spoke,
        &pki,
        &principal.address(),
        &ctx.unique("spoke-argocd"),
        &["--otlp-address", &otlp],
    )
    .await?;
    agent.wait_connected().await?;
    Api::<DynamicObject>::namespaced_with(hub.clone(), &name, &application_resource())
        .create(&PostParams::default(), &application("traced", &name, "v1"))
        .await?;
    // The batch exporters send every few seconds.
    let (emit, handle) = wait_until(
        "a principal span continued by the agent",
        Duration::from_secs(60),
        || async {
            let spans = collector.spans();
            let found = spans
                .iter()
                .filter(|s| s.service == "argocd-principal" && s.name == "event.emit")
                .find_map(|emit| {
                    spans
                        .iter()
                        .find(|h| {
                            h.service == "argocd-agent"
                                && h.name == "event.handle"
                                && h.trace_id == emit.trace_id
                                && h.parent_span_id == emit.span_id
                        })
                        .map(|h| (emit.clone(), h.clone()))
                });
            Ok::<_, anyhow::Error>(found)
        },
    )
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}\nspans: {:?}\n{}",
            collector.spans(),
            agent.process.log_tail(20)
        )
    })?;
    assert_ne!(emit.trace_id, "0".repeat(32), "a real trace id");
    assert_eq!(handle.trace_id, emit.trace_id);
    drop(principal);
    Ok(())
}
