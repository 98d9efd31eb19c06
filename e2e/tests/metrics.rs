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
];

/// Names the agent's `/metrics` declares from start-up; `agent_events_received` /
/// `agent_events_sent` are asserted below once traffic has produced samples.
const AGENT_METRICS: &[&str] = &[
    "argocd_agent_connection_status",
    "argocd_agent_connections",
    "argocd_agent_auth_failures",
    "agent_event_propagation_latency_seconds",
    "argocd_agent_outbox_resources",
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

    // Liveness and readiness.
    for (who, port) in [("principal", principal.ops_port), ("agent", agent.ops_port)] {
        let (status, _) = http_get(port, "/healthz").await?;
        assert_eq!(status, 200, "{who} /healthz");
        let (status, body) = http_get(port, "/readyz").await?;
        assert_eq!(status, 200, "{who} /readyz: {body}");
    }
    Ok(())
}
