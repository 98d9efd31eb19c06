//! Observability end to end: a principal on the hub and a managed agent on a spoke, scraped over
//! HTTP the way Prometheus would. Asserts the metric names both binaries publish (upstream
//! argocd-agent's where they mean the same thing), that the counters move when an Application
//! flows hub → spoke, that each resource-proxy request and Redis-proxy command is counted by
//! agent and outcome, that a rotated resource-proxy certificate is served to new handshakes and
//! reported by the expiry gauge while open connections carry on, and what `/healthz` and
//! `/readyz` answer.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use e2e::gateway::{
    agent_identity, application, application_resource, client_tls, ensure_namespace, http_get,
    tls_connect, Agent, Pki, Principal,
};
use e2e::redis::resp_exchange;
use e2e::{shared_planes, wait_until, Redis, TestContext};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
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

/// An HTTP/1.1 connection to the resource proxy on `port` presenting `identity` (cert PEM, key
/// PEM), and the DER of the leaf certificate the proxy presented in the handshake.
async fn proxy_connection(
    pki: &Pki,
    port: u16,
    identity: (&str, &str),
) -> anyhow::Result<(SendRequest<Empty<Bytes>>, Vec<u8>)> {
    let tls = client_tls(pki, Some(identity), &[b"http/1.1"])?;
    let stream = tls_connect(&format!("127.0.0.1:{port}"), Arc::new(tls)).await?;
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|c| c.to_vec())
        .ok_or_else(|| anyhow::anyhow!("the resource proxy presented no certificate"))?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok((sender, leaf))
}

/// `GET path` on `conn`; returns the status once the whole body has arrived.
async fn proxy_get(conn: &mut SendRequest<Empty<Bytes>>, path: &str) -> anyhow::Result<u16> {
    conn.ready().await?;
    let request = http::Request::get(path)
        .header(http::header::HOST, "localhost")
        .body(Empty::new())?;
    let response = conn.send_request(request).await?;
    let status = response.status().as_u16();
    response.into_body().collect().await?;
    Ok(status)
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
    let spoke_redis = Redis::start(&ctx.unique("spoke-redis"))?;
    let agent = Agent::start(
        &name,
        &ctx.dir,
        spoke,
        &pki,
        &principal.address(),
        &ctx.unique("spoke-argocd"),
        &[&format!("--redis-address={}", spoke_redis.address())],
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
    assert_eq!(
        sample(
            &body,
            "argocd_principal_certificate_expiry_timestamp_seconds{certificate=\"resource-proxy\"}"
        ),
        grpc_expiry,
        "the resource proxy presents the gRPC certificate by default:\n{body}"
    );

    // Proxied requests: counted once each, by agent and outcome; the proxy's own answers (agent
    // away, hub Redis unreachable) also as errors with their reason.
    let away = ctx.unique("away");
    pki.issue_agent(&away)?;
    for (who, expected) in [(&name, 200), (&away, 502)] {
        let (cert, key) = agent_identity(&pki, who)?;
        let (mut conn, _) =
            proxy_connection(&pki, principal.resource_proxy_port, (&cert, &key)).await?;
        assert_eq!(proxy_get(&mut conn, "/api").await?, expected, "{who}");
    }
    let mut redis =
        tokio::net::TcpStream::connect(("127.0.0.1", principal.redis_proxy_port)).await?;
    let key = format!("app|managed-resources|{name}_guestbook");
    assert_eq!(resp_exchange(&mut redis, &["GET", &key]).await?, "$-1\r\n");
    // No hub Redis runs for this principal: the proxy answers PING with an error.
    let ping = resp_exchange(&mut redis, &["PING"]).await?;
    assert!(ping.starts_with("-ERR"), "{ping}");
    let body = scrape(principal.ops_port).await?;
    let rp = "argocd_principal_resource_proxy";
    let redis_proxy = "argocd_principal_redis_proxy";
    for (series, count) in [
        (format!("{rp}_requests_total{{agent_name=\"{name}\",code=\"200\"}}"), 1.0),
        (format!("{rp}_requests_total{{agent_name=\"{away}\",code=\"502\"}}"), 1.0),
        (
            format!("{rp}_errors_total{{agent_name=\"{away}\",code=\"502\",reason=\"ServiceUnavailable\"}}"),
            1.0,
        ),
        (format!("{rp}_request_duration_seconds_count"), 2.0),
        (format!("{redis_proxy}_requests_total{{agent_name=\"{name}\",command=\"GET\"}}"), 1.0),
        (format!("{redis_proxy}_requests_total{{agent_name=\"\",command=\"PING\"}}"), 1.0),
        (
            format!("{redis_proxy}_errors_total{{agent_name=\"\",command=\"PING\",reason=\"upstream_unavailable\"}}"),
            1.0,
        ),
        (format!("{redis_proxy}_request_duration_seconds_count"), 2.0),
    ] {
        assert_eq!(sample(&body, &format!("{series} ")), Some(count), "{series}:\n{body}");
    }
    for absent in [
        format!("{rp}_errors_total{{agent_name=\"{name}\""),
        format!("{redis_proxy}_errors_total{{agent_name=\"{name}\""),
    ] {
        assert!(
            !body.contains(&absent),
            "answered by the agent, not an error: {absent}\n{body}"
        );
    }

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

/// A server certificate for `localhost`/`127.0.0.1` signed by the PKI's CA, valid until
/// `not_after`; returns (cert PEM, key PEM).
fn server_certificate(
    pki: &Pki,
    not_after: time::OffsetDateTime,
) -> anyhow::Result<(String, String)> {
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(pki.dir.join("ca.key"))?)?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&std::fs::read_to_string(pki.ca())?, ca_key)?;
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()])?;
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse()?));
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "argocd-agent-resource-proxy");
    params.not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    params.not_after = not_after;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Replaces `path` the way a Secret volume update does: a new file renamed over the old one.
fn replace_file(path: &std::path::Path, content: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Hot reload and expiry of the resource proxy's own certificate (`--resource-proxy-tls-*`):
/// after the files are rotated, new handshakes get the new certificate, the expiry gauge moves
/// to its `notAfter`, and a connection opened before the rotation keeps being served.
#[tokio::test]
async fn a_rotated_resource_proxy_certificate_is_served_and_reported_without_dropping_connections(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let ctx = TestContext::new("rp_cert")?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let now = time::OffsetDateTime::now_utc().replace_nanosecond(0)?;
    let (first_expiry, second_expiry) = (
        now + time::Duration::days(20),
        now + time::Duration::days(90),
    );
    let (cert_path, key_path) = (ctx.dir.join("rp.crt"), ctx.dir.join("rp.key"));
    let (cert, key) = server_certificate(&pki, first_expiry)?;
    replace_file(&key_path, &key)?;
    replace_file(&cert_path, &cert)?;
    let principal = Principal::start(
        "p",
        &ctx.dir,
        &planes.hub,
        &pki,
        &ctx.unique("argocd"),
        &[
            &format!("--resource-proxy-tls-cert={}", cert_path.display()),
            &format!("--resource-proxy-tls-key={}", key_path.display()),
        ],
    )
    .await?;
    let gauge =
        "argocd_principal_certificate_expiry_timestamp_seconds{certificate=\"resource-proxy\"} ";
    let ops = principal.ops_port;
    let reported = |expected: time::OffsetDateTime| async move {
        let body = scrape(ops).await?;
        Ok::<_, anyhow::Error>(
            (sample(&body, gauge) == Some(expected.unix_timestamp() as f64)).then_some(()),
        )
    };
    wait_until("the first certificate's notAfter", WAIT, || {
        reported(first_expiry)
    })
    .await?;

    let client = ctx.unique("argocd-server");
    pki.issue_agent(&client)?;
    let (client_cert, client_key) = agent_identity(&pki, &client)?;
    let identity = (client_cert.as_str(), client_key.as_str());
    let port = principal.resource_proxy_port;
    let (mut open, leaf) = proxy_connection(&pki, port, identity).await?;
    let first_der = certificate_der(&cert)?;
    assert_eq!(
        leaf, first_der,
        "the proxy presents --resource-proxy-tls-cert"
    );
    // No agent of that name is connected: the proxy itself answers 502.
    assert_eq!(proxy_get(&mut open, "/version").await?, 502);

    let (cert, key) = server_certificate(&pki, second_expiry)?;
    replace_file(&key_path, &key)?;
    replace_file(&cert_path, &cert)?;
    let second_der = certificate_der(&cert)?;
    wait_until("new handshakes get the rotated certificate", WAIT, || {
        let (second_der, pki) = (second_der.clone(), &pki);
        async move {
            let (_, leaf) = proxy_connection(pki, port, identity).await?;
            Ok::<_, anyhow::Error>((leaf == second_der).then_some(()))
        }
    })
    .await?;
    wait_until("the rotated certificate's notAfter", WAIT, || {
        reported(second_expiry)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", principal.process.log_tail(20)))?;
    assert_eq!(
        proxy_get(&mut open, "/version").await?,
        502,
        "the connection opened before the rotation is still served"
    );
    Ok(())
}

/// The DER of the first certificate in `pem`.
fn certificate_der(pem: &str) -> anyhow::Result<Vec<u8>> {
    use rustls::pki_types::pem::PemObject;
    Ok(rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())?.to_vec())
}
