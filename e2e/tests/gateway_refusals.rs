//! Bad input at the principal's gRPC port gets a clear refusal and breaks nothing: missing, foreign,
//! expired or misnamed client certificates, HTTP/1.1 clients, a token presented on another agent's
//! certificate, malformed and unknown events (the stream survives), oversized messages.

use std::time::Duration;

use argocd_agent_proto::event::{Event, EventType, Target};
use argocd_agent_proto::pb::cloudevents::CloudEvent;
use argocd_agent_proto::pb::eventstreamapi::Event as WireEvent;
use e2e::gateway::{agent_identity, client_tls, forge_client_cert, grpc_channel, tls_connect, Pki};
use e2e::raw_agent::{authenticate, send_for_ack, try_authenticate, LonePrincipal};
use tonic::Code;

#[tokio::test]
async fn client_without_certificate_is_refused() -> anyhow::Result<()> {
    let s = LonePrincipal::start("no_client_cert", &[]).await?;
    let r = try_authenticate(&s.pki, &s.principal.address(), None, &[b"h2"], "managed").await;
    assert!(
        r.is_err(),
        "a client without certificate was authenticated: {r:?}"
    );
    Ok(())
}

#[tokio::test]
async fn certificate_from_another_ca_is_refused() -> anyhow::Result<()> {
    let s = LonePrincipal::start("foreign_ca", &[]).await?;
    let other = Pki::create(&s.ctx.dir.join("other-pki"))?;
    other.issue_agent("intruder")?;
    let (c, k) = agent_identity(&other, "intruder")?;
    let r = s.try_authenticate((&c, &k)).await;
    assert!(
        r.is_err(),
        "a certificate from a foreign CA was accepted: {r:?}"
    );
    Ok(())
}

#[tokio::test]
async fn expired_certificate_is_refused() -> anyhow::Result<()> {
    let s = LonePrincipal::start("expired_cert", &[]).await?;
    let now = time::OffsetDateTime::now_utc();
    let (c, k) = forge_client_cert(
        &s.pki,
        "late-agent",
        now - time::Duration::days(10),
        now - time::Duration::days(1),
    )?;
    let r = s.try_authenticate((&c, &k)).await;
    assert!(r.is_err(), "an expired certificate was accepted: {r:?}");
    // The same name with a valid certificate works, so the refusal was about expiry.
    let (c, k) = forge_client_cert(
        &s.pki,
        "late-agent",
        now - time::Duration::days(1),
        now + time::Duration::days(1),
    )?;
    s.try_authenticate((&c, &k))
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(())
}

#[tokio::test]
async fn http1_client_cannot_negotiate_a_connection() -> anyhow::Result<()> {
    let s = LonePrincipal::start("http1", &[]).await?;
    s.pki.issue_agent("h1")?;
    let (c, k) = agent_identity(&s.pki, "h1")?;
    let tls = client_tls(&s.pki, Some((&c, &k)), &[b"http/1.1"])?;
    let handshake = tls_connect(&s.principal.address(), std::sync::Arc::new(tls)).await;
    let err = handshake.expect_err("an HTTP/1.1-only client completed the TLS handshake");
    assert!(
        err.to_string().to_lowercase().contains("protocol"),
        "unexpected error: {err}"
    );
    Ok(())
}

#[tokio::test]
async fn certificate_naming_an_invalid_agent_is_refused_with_the_reason() -> anyhow::Result<()> {
    let s = LonePrincipal::start("invalid_name", &[]).await?;
    let now = time::OffsetDateTime::now_utc();
    let (c, k) = forge_client_cert(
        &s.pki,
        "Bad_Name",
        now - time::Duration::days(1),
        now + time::Duration::days(1),
    )?;
    let err = s
        .try_authenticate((&c, &k))
        .await
        .expect_err("invalid name accepted");
    assert!(
        err.starts_with("Unauthenticated") && err.contains("invalid agent"),
        "{err}"
    );
    Ok(())
}

#[tokio::test]
async fn token_of_one_agent_on_another_agents_certificate_is_refused() -> anyhow::Result<()> {
    let s = LonePrincipal::start("token_mismatch", &[]).await?;
    for n in ["agent-a", "agent-b"] {
        s.pki.issue_agent(n)?;
    }
    let (ca, ka) = agent_identity(&s.pki, "agent-a")?;
    let (cb, kb) = agent_identity(&s.pki, "agent-b")?;
    let tokens = s
        .try_authenticate((&ca, &ka))
        .await
        .map_err(anyhow::Error::msg)?;
    let err = s
        .subscribe((&cb, &kb), &tokens.access_token)
        .await
        .expect_err("stream opened with a foreign token");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("agent-a") && err.message().contains("agent-b"),
        "{}",
        err.message()
    );
    // A refresh token is not an access token.
    let err = s
        .subscribe((&ca, &ka), &tokens.refresh_token)
        .await
        .expect_err("refresh token accepted as access token");
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    // And the right pairing works.
    s.subscribe((&ca, &ka), &tokens.access_token).await?;
    Ok(())
}

#[tokio::test]
async fn autonomous_mode_is_refused_when_the_principal_allows_only_managed() -> anyhow::Result<()> {
    let s = LonePrincipal::start("autonomous_auth", &["--allowed-agent-modes=managed"]).await?;
    s.pki.issue_agent("auto")?;
    let (c, k) = agent_identity(&s.pki, "auto")?;
    let ch = grpc_channel(
        &s.principal.address(),
        client_tls(&s.pki, Some((&c, &k)), &[b"h2"])?,
    )
    .await?;
    let err = authenticate(ch, "autonomous")
        .await
        .expect_err("autonomous accepted");
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(
        err.message().contains("autonomous") && err.message().contains("--allowed-agent-modes"),
        "{}",
        err.message()
    );
    Ok(())
}

#[tokio::test]
async fn stream_survives_malformed_and_unknown_events() -> anyhow::Result<()> {
    let s = LonePrincipal::start("bad_events", &[]).await?;
    s.pki.issue_agent("probe")?;
    let (c, k) = agent_identity(&s.pki, "probe")?;
    let tokens = s
        .try_authenticate((&c, &k))
        .await
        .map_err(anyhow::Error::msg)?;
    let (tx, mut inbound) = s.subscribe((&c, &k), &tokens.access_token).await?;

    // Not a CloudEvent at all (no type, wrong spec version): dropped, nothing to ACK.
    let garbage = CloudEvent {
        spec_version: "0.1".into(),
        ..Default::default()
    };
    tx.send(WireEvent {
        event: Some(garbage),
    })
    .await?;
    // An event type nobody knows: ACKed with an error.
    let unknown = Event::new(
        EventType::Unknown("io.example.nonsense".into()),
        Target::Application,
        "probe",
    );
    let err = send_for_ack(&tx, &mut inbound, &unknown).await?;
    assert!(
        err.as_deref().is_some_and(|m| m.contains("not accepted")),
        "{err:?}"
    );
    // Status for an Application the hub does not have: ACKed with an error naming it.
    let app = serde_json::json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "ghost", "namespace": "argocd", "uid": "u-1", "resourceVersion": "1"}, "status": {}});
    let status = Event::for_object(EventType::StatusUpdate, Target::Application, "probe", &app)?;
    let err = send_for_ack(&tx, &mut inbound, &status).await?;
    assert!(
        err.as_deref().is_some_and(|m| m.contains("ghost")),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn oversized_message_is_refused_and_the_agent_can_reconnect() -> anyhow::Result<()> {
    let s = LonePrincipal::start("oversized", &["--grpc-max-message-size=64KiB"]).await?;
    s.pki.issue_agent("big")?;
    let (c, k) = agent_identity(&s.pki, "big")?;
    let tokens = s
        .try_authenticate((&c, &k))
        .await
        .map_err(anyhow::Error::msg)?;
    let (tx, mut inbound) = s.subscribe((&c, &k), &tokens.access_token).await?;
    let mut big = Event::new(EventType::StatusUpdate, Target::Application, "big");
    big.data = Some(vec![b' '; 128 * 1024]);
    tx.send(big.to_stream_event()).await?;
    let end = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match inbound.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await?;
    let status = end.expect_err("the stream should end with an error status");
    assert!(
        status.message().contains("too large") || status.message().contains("length"),
        "{status:?}"
    );
    // The principal is unharmed: a new stream opens.
    s.subscribe((&c, &k), &tokens.access_token).await?;
    Ok(())
}
