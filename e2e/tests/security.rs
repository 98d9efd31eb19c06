//! The security suite: each attack is refused and leaves the hub as it was. Complements
//! `gateway_refusals.rs` (no/foreign/expired client certificate, HTTP/1.1, token of another
//! agent, refresh token as access token, malformed and oversized events) and `live_view.rs`
//! (resource proxy cross-agent access) with:
//!
//! - TLS: a not-yet-valid client certificate, one whose extended key usage is serverAuth only,
//!   one whose key usage lacks digitalSignature; a TLS 1.2-only client. Policy: the principal
//!   speaks TLS 1.3 only on every listener unless started with `--tls-min-version=tls1.2`.
//! - Tokens: signed by another key, expired, `alg: none`, HS256 keyed with the public key.
//! - The TLS certificate blocklist (`argocd-agentctl blocklist tls`): a listed agent is
//!   disconnected within seconds and refused, also by a restarted principal, until removed.
//! - Isolation: crafted create/spec-update/delete/status events naming another agent's namespace,
//!   or a cluster-scoped object, change nothing outside the sender's own namespace. (Mode pinning,
//!   unbounded metric labels and logs, non-Kubernetes names and pre-auth memory: `hostile.rs`.)
//! - Payloads: 10,000-level nested JSON in an event and in a resource-proxy request body.
//! - Slowloris on the gRPC, resource proxy, Redis proxy and metrics/health ports.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use argocd_agent_proto::event::{Event, EventType, Target};
use argocd_agent_proto::pb::eventstreamapi::Event as WireEvent;
use e2e::gateway::{
    agent_identity, agentctl, application, application_resource, appproject_resource, client_tls,
    ensure_namespace, forge_client_cert_shaped, grpc_channel, http_get, https_request, Agent, Pki,
    Principal,
};
use e2e::metrics::Scrape;
use e2e::raw_agent::{authenticate, send_for_ack, try_authenticate, LonePrincipal};
use e2e::{shared_planes, wait_until};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tonic::{Code, Streaming};

/// The stream still carries events: an unknown event type is ACKed (with an error).
async fn stream_alive(
    tx: &mpsc::Sender<WireEvent>,
    inbound: &mut Streaming<WireEvent>,
    source: &str,
) -> anyhow::Result<()> {
    let probe = Event::new(
        EventType::Unknown("io.example.probe".into()),
        Target::Application,
        source,
    );
    let err = send_for_ack(tx, inbound, &probe).await?;
    anyhow::ensure!(err.is_some(), "the probe was accepted");
    Ok(())
}

/// Sum of the samples of `name` with `labels` on the principal's ops port (an error if the
/// principal does not declare the metric).
async fn metric(p: &Principal, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<f64> {
    Scrape::of(p.ops_port).await?.value(name, labels)
}

/// Applications and AppProjects (kind/namespace/name → resourceVersion) in `namespaces`.
async fn hub_objects(namespaces: &[&str]) -> anyhow::Result<BTreeMap<String, String>> {
    let client = shared_planes().await.hub.client().await?;
    let mut out = BTreeMap::new();
    for ns in namespaces {
        for (kind, res) in [
            ("Application", application_resource()),
            ("AppProject", appproject_resource()),
        ] {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &res);
            for o in api.list(&Default::default()).await?.items {
                out.insert(
                    format!("{kind}/{ns}/{}", o.metadata.name.unwrap_or_default()),
                    o.metadata.resource_version.unwrap_or_default(),
                );
            }
        }
    }
    Ok(out)
}

async fn namespace_exists(name: &str) -> anyhow::Result<bool> {
    let client = shared_planes().await.hub.client().await?;
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    Ok(api.get_opt(name).await?.is_some())
}

/// Issues a certificate for agent `name`, starts it on the first spoke against the principal
/// and waits until it is connected.
async fn connected_agent(s: &LonePrincipal, name: &str) -> anyhow::Result<Agent> {
    s.pki.issue_agent(name)?;
    let agent = Agent::start(
        name,
        &s.ctx.dir,
        &shared_planes().await.spokes[0],
        &s.pki,
        &s.principal.address(),
        &s.ctx.unique("spoke-argocd"),
        &[],
    )
    .await?;
    agent.wait_connected().await?;
    Ok(agent)
}

/// A client certificate for `cn` with the digitalSignature key usage, then shaped by `shape`.
fn forge(
    pki: &Pki,
    cn: &str,
    shape: impl FnOnce(&mut rcgen::CertificateParams),
) -> anyhow::Result<(String, String)> {
    forge_client_cert_shaped(pki, cn, |p| {
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        shape(p);
    })
}

#[tokio::test]
async fn certificates_not_yet_valid_or_not_for_client_auth_are_refused() -> anyhow::Result<()> {
    let s = LonePrincipal::start("cert_usage", &[]).await?;
    let before = hub_objects(&[&s.principal.namespace]).await?;
    let future = forge(&s.pki, &s.ctx.unique("future"), |p| {
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now + time::Duration::days(1);
        p.not_after = now + time::Duration::days(2);
    })?;
    let server_only = forge(&s.pki, &s.ctx.unique("server-only"), |p| {
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    })?;
    let no_signature = forge(&s.pki, &s.ctx.unique("no-signature"), |p| {
        p.key_usages = vec![rcgen::KeyUsagePurpose::KeyEncipherment];
    })?;
    for (case, (c, k)) in [
        ("not yet valid", &future),
        ("serverAuth only", &server_only),
        ("no digitalSignature", &no_signature),
    ] {
        let r = s.try_authenticate((c, k)).await;
        assert!(r.is_err(), "{case}: certificate accepted: {r:?}");
        if case == "no digitalSignature" {
            let err = r.unwrap_err();
            assert!(
                err.starts_with("Unauthenticated") && err.contains("digitalSignature"),
                "{case}: {err}"
            );
        }
    }
    // The same forging with proper usages and validity works: the refusals were about them.
    let good = forge(&s.pki, &s.ctx.unique("good"), |_| {})?;
    s.try_authenticate((&good.0, &good.1))
        .await
        .map_err(anyhow::Error::msg)?;
    // Nothing happened on the hub.
    assert_eq!(hub_objects(&[&s.principal.namespace]).await?, before);
    for n in ["future", "server-only", "no-signature"] {
        assert!(!namespace_exists(&s.ctx.unique(n)).await?);
    }
    assert_eq!(
        metric(&s.principal, "argocd_principal_connected_agents", &[]).await?,
        0.0
    );
    Ok(())
}

/// A rustls client that offers TLS 1.2 only.
fn tls12_only_client(pki: &Pki, identity: (&str, &str)) -> anyhow::Result<rustls::ClientConfig> {
    tls12_client_offering(pki, identity, None)
}

/// A rustls client that offers TLS 1.2 only and, when `suite` names one, only that cipher suite.
fn tls12_client_offering(
    pki: &Pki,
    identity: (&str, &str),
    suite: Option<&str>,
) -> anyhow::Result<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(pki.ca())? {
        roots.add(c?)?;
    }
    let chain = CertificateDer::pem_slice_iter(identity.0.as_bytes()).collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(identity.1.as_bytes())?;
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(suite) = suite {
        provider
            .cipher_suites
            .retain(|s| format!("{:?}", s.suite()) == suite);
        anyhow::ensure!(!provider.cipher_suites.is_empty(), "no suite {suite}");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS12])?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

#[tokio::test]
async fn tls12_only_client_is_refused_unless_the_principal_allows_tls12() -> anyhow::Result<()> {
    let s = LonePrincipal::start("tls12", &[]).await?;
    let name = s.ctx.unique("old-tls");
    s.pki.issue_agent(&name)?;
    let (c, k) = agent_identity(&s.pki, &name)?;
    let tls12 = tls12_only_client(&s.pki, (&c, &k))?;
    let r = match grpc_channel(&s.principal.address(), tls12.clone()).await {
        Ok(ch) => authenticate(ch, "managed").await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    assert!(r.is_err(), "a TLS 1.2-only client was served: {r:?}");
    assert!(
        metric(
            &s.principal,
            "argocd_principal_auth_failures_total",
            &[("reason", "tls_handshake")]
        )
        .await?
            >= 1.0
    );
    // The documented escape hatch: --tls-min-version=tls1.2 lets the same client in.
    let lenient = Principal::start(
        "lenient",
        &s.ctx.dir,
        &shared_planes().await.hub,
        &s.pki,
        &s.ctx.unique("argocd-lenient"),
        &["--tls-min-version=tls1.2"],
    )
    .await?;
    let ch = grpc_channel(&lenient.address(), tls12).await?;
    authenticate(ch, "managed").await?;
    Ok(())
}

#[tokio::test]
async fn tls_max_version_and_cipher_suites_decide_which_clients_and_agents_get_in(
) -> anyhow::Result<()> {
    // The PKI's keys are ECDSA P-256: its TLS 1.2 suites are the ECDHE_ECDSA ones.
    const SUITE: &str = "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384";
    const OTHER: &str = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256";
    let suite_flag = format!("--tls-ciphersuites={SUITE}");
    let tls12_flags = [
        "--tls-min-version=tls1.2",
        "--tls-max-version=tls1.2",
        &suite_flag,
    ];
    let s = LonePrincipal::start("tls_policy", &tls12_flags).await?;
    let name = s.ctx.unique("tls-agent");
    s.pki.issue_agent(&name)?;
    let (c, k) = agent_identity(&s.pki, &name)?;
    let login = |tls: rustls::ClientConfig| {
        let address = s.principal.address();
        async move {
            match grpc_channel(&address, tls).await {
                Ok(ch) => authenticate(ch, "managed").await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    let handshake_failures = [("reason", "tls_handshake")];
    let refused_before = Scrape::of(s.principal.ops_port)
        .await?
        .baseline("argocd_principal_auth_failures", &handshake_failures);
    let tls13 = login(client_tls(&s.pki, Some((&c, &k)), &[b"h2"])?).await;
    assert!(
        tls13.is_err(),
        "a TLS 1.3 client got past --tls-max-version=tls1.2"
    );
    let other = login(tls12_client_offering(&s.pki, (&c, &k), Some(OTHER))?).await;
    assert!(other.is_err(), "a client without {SUITE} was served");
    assert_eq!(
        metric(
            &s.principal,
            "argocd_principal_auth_failures",
            &[("reason", "tls_handshake")]
        )
        .await?
            - refused_before,
        2.0,
        "both refusals are TLS handshake failures"
    );
    login(tls12_client_offering(&s.pki, (&c, &k), Some(SUITE))?)
        .await
        .map_err(anyhow::Error::msg)?;

    // Our agent with the same flags connects; with its defaults (TLS 1.3 only) it cannot.
    let spoke = &shared_planes().await.spokes[0];
    let namespace = s.ctx.unique("tls-agent-ns");
    let agent = Agent::start(
        &name,
        &s.ctx.dir,
        spoke,
        &s.pki,
        &s.principal.address(),
        &namespace,
        &tls12_flags,
    )
    .await?;
    agent.wait_connected().await?;
    drop(agent);
    let default_agent = Agent::start(
        &name,
        &s.ctx.dir,
        spoke,
        &s.pki,
        &s.principal.address(),
        &namespace,
        &[],
    )
    .await?;
    let before = metric(
        &s.principal,
        "argocd_principal_auth_failures",
        &[("reason", "tls_handshake")],
    )
    .await?;
    wait_until(
        "the TLS 1.3-only agent refused",
        Duration::from_secs(30),
        || async {
            let now = metric(
                &s.principal,
                "argocd_principal_auth_failures",
                &[("reason", "tls_handshake")],
            )
            .await?;
            Ok::<_, anyhow::Error>((now > before).then_some(()))
        },
    )
    .await?;
    assert!(
        !e2e::metrics::agent_connected(default_agent.ops_port).await?,
        "a TLS 1.3-only agent connected to a TLS 1.2-only principal"
    );
    Ok(())
}

#[tokio::test]
async fn agent_identity_from_upstreams_uri_regex_names_the_agent_by_its_capture_group(
) -> anyhow::Result<()> {
    // Upstream's SPIFFE form: the name is the regex's first capture group, not the CN.
    let s = LonePrincipal::start(
        "identity_regex",
        &["--auth=mtls:uri:spiffe://example\\.org/ns/argocd-agents/sa/([a-z0-9-]+)$"],
    )
    .await?;
    let name = s.ctx.unique("spiffe-agent");
    let spiffe = format!("spiffe://example.org/ns/argocd-agents/sa/{name}");
    let (cert, key) = forge_client_cert_shaped(&s.pki, "cn-is-not-the-name", |p| {
        p.subject_alt_names = vec![rcgen::SanType::URI(spiffe.as_str().try_into().unwrap())];
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    })?;
    let (cert_file, key_file) = s.pki.agent_files(&name);
    std::fs::create_dir_all(cert_file.parent().expect("agents dir"))?;
    std::fs::write(&cert_file, &cert)?;
    std::fs::write(&key_file, &key)?;
    // A certificate whose URI does not match is refused with the reason.
    let (other_cert, other_key) = forge_client_cert_shaped(&s.pki, &name, |p| {
        p.subject_alt_names = vec![rcgen::SanType::URI(
            "spiffe://example.org/ns/elsewhere/sa/x".try_into().unwrap(),
        )];
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    })?;
    let refused = s.try_authenticate((&other_cert, &other_key)).await;
    let err = refused.expect_err("a certificate outside the URI pattern was accepted");
    assert!(err.contains("does not match the agent name regex"), "{err}");

    // Our agent with the SPIFFE certificate serves the hub namespace its URI names.
    ensure_namespace(&shared_planes().await.hub.client().await?, &name).await?;
    let spoke = &shared_planes().await.spokes[0];
    let spoke_ns = s.ctx.unique("spiffe-spoke");
    let agent = Agent::start(
        &name,
        &s.ctx.dir,
        spoke,
        &s.pki,
        &s.principal.address(),
        &spoke_ns,
        &[],
    )
    .await?;
    agent.wait_connected().await?;
    hub_application(&name, "via-spiffe").await?;
    let spoke_apps: Api<DynamicObject> =
        Api::namespaced_with(spoke.client().await?, &spoke_ns, &application_resource());
    wait_until(
        "the app on the SPIFFE agent's spoke",
        Duration::from_secs(30),
        || async { Ok::<_, kube::Error>(spoke_apps.get_opt("via-spiffe").await?.map(|_| ())) },
    )
    .await?;
    Ok(())
}

/// JWT claims as the principal issues them.
fn claims(agent: &str, audience: &str, exp_offset: i64) -> Value {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    json!({
        "sub": json!({"clientID": agent, "mode": "managed"}).to_string(),
        "iss": "argocd-agent-server",
        "aud": audience,
        "exp": now + exp_offset,
        "iat": now - 60,
        "nbf": now - 60,
        "jti": uuid::Uuid::new_v4().to_string(),
    })
}

/// Signs `claims` with the PEM private key `pem` the way the principal would (ES256 or RS512).
fn sign_like_the_principal(pem: &str, claims: &Value) -> anyhow::Result<String> {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let pair = rcgen::KeyPair::from_pem(pem)?;
    let (alg, key) = if pair.is_compatible(&rcgen::PKCS_ECDSA_P256_SHA256) {
        (Algorithm::ES256, EncodingKey::from_ec_pem(pem.as_bytes())?)
    } else {
        (Algorithm::RS512, EncodingKey::from_rsa_pem(pem.as_bytes())?)
    };
    Ok(jsonwebtoken::encode(&Header::new(alg), claims, &key)?)
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[tokio::test]
async fn forged_expired_and_algorithm_confused_tokens_are_refused() -> anyhow::Result<()> {
    let s = LonePrincipal::start("jwt", &[]).await?;
    let name = s.ctx.unique("tok");
    s.pki.issue_agent(&name)?;
    let (c, k) = agent_identity(&s.pki, &name)?;
    let real_key = std::fs::read_to_string(s.pki.dir.join("jwt.key"))?;
    let public_pem = rcgen::KeyPair::from_pem(&real_key)?.public_key_pem();
    let access = "argocd-agent-server-access";
    let before = hub_objects(&[&s.principal.namespace]).await?;

    let other_key = rcgen::KeyPair::generate()?.serialize_pem();
    let forged = sign_like_the_principal(&other_key, &claims(&name, access, 300))?;
    let expired = sign_like_the_principal(&real_key, &claims(&name, access, -3600))?;
    let unsigned = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"JWT"}"#),
        b64(claims(&name, access, 300).to_string().as_bytes())
    );
    let hs256 = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims(&name, access, 300),
        &jsonwebtoken::EncodingKey::from_secret(public_pem.as_bytes()),
    )?;
    for (case, token) in [
        ("signed by another key", &forged),
        ("expired", &expired),
        ("alg none", &unsigned),
        ("HS256 keyed with the public key", &hs256),
    ] {
        let err = s
            .subscribe((&c, &k), token)
            .await
            .err()
            .unwrap_or_else(|| panic!("{case}: a stream opened"));
        assert_eq!(err.code(), Code::Unauthenticated, "{case}: {err:?}");
    }
    assert!(
        metric(
            &s.principal,
            "argocd_principal_auth_failures_total",
            &[("reason", "invalid_token")]
        )
        .await?
            >= 4.0
    );
    // The forging itself is sound: the real key with a live expiry opens a stream.
    let genuine = sign_like_the_principal(&real_key, &claims(&name, access, 300))?;
    let (tx, mut inbound) = s.subscribe((&c, &k), &genuine).await?;
    stream_alive(&tx, &mut inbound, &name).await?;
    assert_eq!(hub_objects(&[&s.principal.namespace]).await?, before);
    Ok(())
}

/// `argocd-agentctl blocklist tls …` against the hub, in namespace `ns`.
fn blocklist(hub_kubeconfig: &str, ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["blocklist", "tls"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--kubeconfig", hub_kubeconfig, "-n", ns]);
    agentctl(&all)
}

#[tokio::test]
async fn blocklisted_agent_is_disconnected_within_seconds_and_refused_until_removed(
) -> anyhow::Result<()> {
    let s = LonePrincipal::start("blocklist", &[]).await?;
    let planes = shared_planes().await;
    let ns = s.principal.namespace.clone();
    let name = s.ctx.unique("listed");
    let agent = connected_agent(&s, &name).await?;
    let (cert_path, _) = s.pki.agent_files(&name);
    let cert_arg = cert_path.display().to_string();
    let before = hub_objects(&[&ns]).await?;
    let hub = planes.hub.kubeconfig.display().to_string();

    // Listed: the live stream is closed within seconds.
    blocklist(&hub, &ns, &["add", "--cert", &cert_arg, "--reason", "e2e"])?;
    let listed = blocklist(&hub, &ns, &["list"])?;
    let fingerprint = listed
        .split_whitespace()
        .next()
        .expect("one fingerprint listed")
        .to_string();
    assert_eq!(fingerprint.len(), 64, "{listed}");
    let t0 = Instant::now();
    let principal = &s.principal;
    wait_until(
        "the blocklisted agent is disconnected",
        Duration::from_secs(15),
        || async move {
            Ok::<_, anyhow::Error>(
                (metric(principal, "argocd_principal_connected_agents", &[]).await? == 0.0)
                    .then_some(()),
            )
        },
    )
    .await?;
    let disconnect = t0.elapsed();
    eprintln!("[security] blocklisted agent disconnected after {disconnect:?}");
    assert!(disconnect <= Duration::from_secs(10), "{disconnect:?}");
    // Its reconnects are refused with reason `blocklisted`, and it stays out.
    wait_until(
        "the agent's reconnects are refused as blocklisted",
        Duration::from_secs(30),
        || async move {
            Ok::<_, anyhow::Error>(
                (metric(
                    principal,
                    "argocd_principal_auth_failures_total",
                    &[("reason", "blocklisted")],
                )
                .await?
                    >= 1.0)
                    .then_some(()),
            )
        },
    )
    .await?;
    assert_eq!(
        metric(&s.principal, "argocd_principal_connected_agents", &[]).await?,
        0.0
    );
    // Removed: the agent comes back by itself.
    blocklist(&hub, &ns, &["remove", &fingerprint])?;
    assert!(blocklist(&hub, &ns, &["list"])?.trim().is_empty());
    agent.wait_connected().await?;

    // Listed again by fingerprint; a restarted principal reads the list before admitting anyone.
    blocklist(&hub, &ns, &["add", &fingerprint.to_lowercase()])?;
    let mut old = s.principal;
    old.process.stop();
    let restarted = Principal::start("p2", &s.ctx.dir, &planes.hub, &s.pki, &ns, &[]).await?;
    let (c, k) = agent_identity(&s.pki, &name)?;
    let r = try_authenticate(
        &s.pki,
        &restarted.address(),
        Some((&c, &k)),
        &[b"h2"],
        "managed",
    )
    .await;
    assert!(
        r.is_err(),
        "a blocklisted certificate was admitted after restart: {r:?}"
    );
    assert!(
        metric(
            &restarted,
            "argocd_principal_auth_failures_total",
            &[("reason", "blocklisted")]
        )
        .await?
            >= 1.0
    );
    blocklist(&hub, &ns, &["remove", &fingerprint])?;
    let (pki, address, c, k) = (&s.pki, restarted.address(), &c, &k);
    let address = &address;
    wait_until(
        "the removed certificate is admitted again",
        Duration::from_secs(30),
        || async move {
            Ok::<_, anyhow::Error>(
                try_authenticate(pki, address, Some((c, k)), &[b"h2"], "managed")
                    .await
                    .ok(),
            )
        },
    )
    .await?;
    // Bad input to the CLI is a usage error.
    assert!(blocklist(&hub, &ns, &["add", "not-a-fingerprint"]).is_err());
    assert_eq!(hub_objects(&[&ns]).await?, before);
    Ok(())
}

/// Creates Application `name` in `ns` on the hub; returns it as JSON.
async fn hub_application(ns: &str, name: &str) -> anyhow::Result<Value> {
    let client = shared_planes().await.hub.client().await?;
    ensure_namespace(&client, ns).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &application_resource());
    let created = api
        .create(&PostParams::default(), &application(name, ns, "HEAD"))
        .await?;
    Ok(serde_json::to_value(created)?)
}

#[tokio::test]
async fn crafted_events_cannot_touch_another_agents_objects() -> anyhow::Result<()> {
    let s = LonePrincipal::start("isolation", &[]).await?;
    let (a, b) = (s.ctx.unique("agent-a"), s.ctx.unique("agent-b"));
    for n in [&a, &b] {
        s.pki.issue_agent(n)?;
    }
    // B's Application on the hub, and one in another namespace.
    let victim = hub_application(&b, "victim").await?;
    let other_ns = s.ctx.unique("elsewhere");
    hub_application(&other_ns, "bystander").await?;
    let watched = [
        b.as_str(),
        other_ns.as_str(),
        s.principal.namespace.as_str(),
    ];
    let before = hub_objects(&watched).await?;
    let (ca, ka) = agent_identity(&s.pki, &a)?;

    // A, managed, speaking the raw protocol.
    let tokens = s
        .try_authenticate((&ca, &ka))
        .await
        .map_err(anyhow::Error::msg)?;
    let (tx, mut inbound) = s.subscribe((&ca, &ka), &tokens.access_token).await?;
    let mut spoofed = victim.clone();
    spoofed["spec"]["source"]["targetRevision"] = json!("evil");
    spoofed["status"] = json!({"sync": {"status": "Synced"}, "health": {"status": "Healthy"}});
    let cluster_scoped = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": s.ctx.unique("evil-ns")}});
    // A managed agent may not create or change hub objects at all; a delete confirmation for
    // an Application its own namespace lacks is a no-op (ACKed without error).
    for (case, ty, obj, refused) in [
        ("create in B's namespace", EventType::Create, &spoofed, true),
        (
            "spec-update in B's namespace",
            EventType::SpecUpdate,
            &spoofed,
            true,
        ),
        (
            "status-update of B's Application",
            EventType::StatusUpdate,
            &spoofed,
            true,
        ),
        (
            "delete in B's namespace",
            EventType::Delete,
            &spoofed,
            false,
        ),
        (
            "create of a cluster-scoped object",
            EventType::Create,
            &cluster_scoped,
            true,
        ),
    ] {
        let ev = Event::for_object(ty, Target::Application, &a, obj)?;
        let err = send_for_ack(&tx, &mut inbound, &ev).await?;
        eprintln!("[security] managed {case}: {err:?}");
        if refused {
            assert!(err.is_some(), "managed: {case} was accepted");
        }
    }
    stream_alive(&tx, &mut inbound, &a).await?;
    drop((tx, inbound));

    // A, autonomous: its objects are mirrored into its own namespace, never anywhere else. A's
    // mode is pinned to managed by its first login; an admin re-pins it (principal/src/mode_pin.rs).
    let hub = shared_planes().await.hub.client().await?;
    ensure_namespace(&hub, &a).await?;
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(hub, &s.principal.namespace)
        .patch(
            "argocd-agent-modes",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"data": {&a: "autonomous"}})),
        )
        .await?;
    let tokens = wait_until(
        "A is re-pinned autonomous",
        Duration::from_secs(15),
        || async {
            Ok::<_, anyhow::Error>(
                try_authenticate(
                    &s.pki,
                    &s.principal.address(),
                    Some((&ca, &ka)),
                    &[b"h2"],
                    "autonomous",
                )
                .await
                .ok(),
            )
        },
    )
    .await?;
    let (tx, mut inbound) = s.subscribe((&ca, &ka), &tokens.access_token).await?;
    for (case, ty, obj) in [
        ("create in B's namespace", EventType::Create, &spoofed),
        (
            "spec-update in B's namespace",
            EventType::SpecUpdate,
            &spoofed,
        ),
        ("delete in B's namespace", EventType::Delete, &spoofed),
        (
            "create of a cluster-scoped object",
            EventType::Create,
            &cluster_scoped,
        ),
    ] {
        let ev = Event::for_object(ty, Target::Application, &a, obj)?;
        let err = send_for_ack(&tx, &mut inbound, &ev).await?;
        eprintln!("[security] autonomous {case}: {err:?}");
    }
    let project = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "default", "namespace": b}, "spec": {}});
    let ev = Event::for_object(EventType::Create, Target::AppProject, &a, &project)?;
    eprintln!(
        "[security] autonomous AppProject named default: {:?}",
        send_for_ack(&tx, &mut inbound, &ev).await?
    );
    stream_alive(&tx, &mut inbound, &a).await?;

    // B's objects, the other namespace and the principal's namespace are exactly as they were,
    // except that an autonomous AppProject may only ever appear as `<A>-…`.
    let after = hub_objects(&watched).await?;
    for (key, rv) in &before {
        assert_eq!(after.get(key), Some(rv), "{key} changed or vanished");
    }
    for key in after.keys().filter(|k| !before.contains_key(*k)) {
        assert!(
            key.starts_with(&format!("AppProject/{}/{a}-", s.principal.namespace)),
            "an event of agent {a} created {key}"
        );
    }
    assert!(!namespace_exists(&s.ctx.unique("evil-ns")).await?);
    Ok(())
}

/// `[[[…]]]` nested `depth` levels.
fn nested_json(depth: usize) -> Vec<u8> {
    let mut v = vec![b'['; depth];
    v.extend(std::iter::repeat_n(b']', depth));
    v
}

#[tokio::test]
async fn deeply_nested_json_gets_a_clean_error_and_everything_keeps_working() -> anyhow::Result<()>
{
    let s = LonePrincipal::start("nested", &[]).await?;
    let before = hub_objects(&[&s.principal.namespace]).await?;

    // In an event's data: ACKed with an error, the stream carries on.
    let probe = s.ctx.unique("deep");
    s.pki.issue_agent(&probe)?;
    let (c, k) = agent_identity(&s.pki, &probe)?;
    let tokens = s
        .try_authenticate((&c, &k))
        .await
        .map_err(anyhow::Error::msg)?;
    let (tx, mut inbound) = s.subscribe((&c, &k), &tokens.access_token).await?;
    let mut deep = Event::new(EventType::StatusUpdate, Target::Application, &probe);
    deep.data = Some(nested_json(10_000));
    let err = send_for_ack(&tx, &mut inbound, &deep).await?;
    assert!(err.is_some(), "10,000-level JSON was accepted");
    eprintln!("[security] nested event refused: {err:?}");
    stream_alive(&tx, &mut inbound, &probe).await?;
    drop((tx, inbound));

    // In a resource-proxy request body, relayed to a real agent: an error status, and the same
    // connection path serves the next request.
    let name = s.ctx.unique("rp");
    let agent = connected_agent(&s, &name).await?;
    let (c, k) = agent_identity(&s.pki, &name)?;
    let port = s.principal.resource_proxy_port;
    let (status, body) = https_request(
        &s.pki,
        port,
        (&c, &k),
        "POST",
        "/api/v1/namespaces/default/configmaps",
        &nested_json(10_000),
    )
    .await?;
    eprintln!("[security] nested resource-proxy body: {status} {body:.200}");
    assert!((400..600).contains(&status), "{status} {body:.300}");
    let (status, body) = https_request(&s.pki, port, (&c, &k), "GET", "/api", b"").await?;
    assert_eq!(status, 200, "{body:.300}");
    agent.wait_connected().await?;
    assert!(matches!(
        http_get(s.principal.ops_port, "/healthz").await?,
        (200, _)
    ));
    assert_eq!(hub_objects(&[&s.principal.namespace]).await?, before);
    Ok(())
}

/// Opens `n` TCP connections to `port` that send nothing.
async fn idle_connections(port: u16, n: usize) -> anyhow::Result<Vec<tokio::net::TcpStream>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(tokio::net::TcpStream::connect(("127.0.0.1", port)).await?);
    }
    Ok(out)
}

/// Waits until the server closed `conn` (EOF or error); returns how long that took from `t0`, or
/// `None` if it was still open after 30 s.
async fn closed_by_server(mut conn: impl AsyncRead + Unpin, t0: Instant) -> Option<Duration> {
    let mut buf = [0u8; 512];
    let r = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    r.ok().map(|_| t0.elapsed())
}

/// A connection that sends `payload` one byte every 500 ms until the server closes it.
async fn trickle(port: u16, payload: &'static [u8], t0: Instant) -> anyhow::Result<Duration> {
    let conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let (r, mut w) = conn.into_split();
    let writer = tokio::spawn(async move {
        for b in payload.iter().cycle() {
            if w.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let closed = closed_by_server(r, t0).await;
    writer.abort();
    closed.ok_or_else(|| anyhow::anyhow!("a trickling connection to {port} was never closed"))
}

#[tokio::test]
async fn slowloris_connections_are_closed_and_real_clients_still_served() -> anyhow::Result<()> {
    let timeout = Duration::from_secs(3);
    let s = LonePrincipal::start(
        "slowloris",
        &[
            "--tls-handshake-timeout=3s",
            "--request-header-timeout=3s",
            // A hub Redis that refuses at once, so the proxy answers PING with an error quickly.
            "--redis-server-address=127.0.0.1:1",
        ],
    )
    .await?;
    let p = &s.principal;
    let name = s.ctx.unique("real");
    s.pki.issue_agent(&name)?;
    let (c, k) = agent_identity(&s.pki, &name)?;

    // 200 silent connections, 50 on each listener, plus trickling ones on the closing listeners.
    let t0 = Instant::now();
    let mut silent = Vec::new();
    for port in [
        p.grpc_port,
        p.resource_proxy_port,
        p.redis_proxy_port,
        p.ops_port,
    ] {
        // Each one is watched from now on, so its closing time is measured while the real
        // clients below are being served.
        let watchers: Vec<_> = idle_connections(port, 50)
            .await?
            .into_iter()
            .map(|c| tokio::spawn(closed_by_server(c, t0)))
            .collect();
        silent.push((port, watchers));
    }
    let trickling: Vec<_> = [
        (p.grpc_port, b"\x16\x03\x01\x02\x00".as_slice()),
        (p.resource_proxy_port, b"\x16\x03\x01\x02\x00".as_slice()),
        (p.redis_proxy_port, b"*1\r\n$4\r\nPING".as_slice()),
    ]
    .into_iter()
    .map(|(port, payload)| (port, tokio::spawn(trickle(port, payload, t0))))
    .collect();

    // Meanwhile real clients are served on every listener.
    let served = Instant::now();
    let tokens = s
        .try_authenticate((&c, &k))
        .await
        .map_err(anyhow::Error::msg)?;
    let (tx, mut inbound) = s.subscribe((&c, &k), &tokens.access_token).await?;
    stream_alive(&tx, &mut inbound, &name).await?;
    // The resource proxy relays a request to this raw agent, which answers it at once (left
    // unanswered, the proxy would wait its fixed 30 s answer timeout).
    let ((status, body), _) = s
        .through_resource_proxy(
            (&c, &k),
            ("GET", "/api", b""),
            (&tx, &mut inbound),
            (200, r#"{"kind":"APIVersions"}"#),
        )
        .await?;
    assert_eq!(
        status, 200,
        "resource proxy did not relay the answer: {body:.300}"
    );
    let mut redis = tokio::net::TcpStream::connect(("127.0.0.1", p.redis_proxy_port)).await?;
    redis.write_all(b"*1\r\n$4\r\nPING\r\n").await?;
    let mut reply = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(40), redis.read(&mut reply)).await??;
    assert!(n > 0, "redis proxy did not answer");
    assert!(matches!(http_get(p.ops_port, "/readyz").await?, (200, _)));
    eprintln!(
        "[security] real clients served on all four listeners in {:?} with 200 idle connections open",
        served.elapsed()
    );

    // The silent connections on the gRPC, resource proxy and Redis proxy ports are closed after
    // the timeout (plus a little), the trickling ones too.
    let bound = timeout + Duration::from_secs(5);
    for (port, conns) in silent {
        if port == p.ops_port {
            continue;
        }
        let mut closed = Vec::new();
        for watcher in conns {
            closed.push(watcher.await?);
        }
        let slowest = closed.iter().flatten().max().copied();
        eprintln!("[security] silent connections to port {port}: slowest closed after {slowest:?}");
        assert!(
            closed.iter().all(|d| d.is_some_and(|d| d <= bound)),
            "port {port}: {closed:?}"
        );
    }
    for (port, task) in trickling {
        let took = task.await??;
        eprintln!("[security] trickling connection to port {port} closed after {took:?}");
        assert!(took <= bound, "port {port}: {took:?}");
    }
    // The real stream outlived all of that.
    stream_alive(&tx, &mut inbound, &name).await?;
    Ok(())
}

/// A Redis proxy client declaring a request over `--redis-proxy-max-request-size` (default
/// 16 MiB) — a bulk string of 1 GiB, an array of 100 million elements — gets a RESP error and its
/// connection closed as soon as the header is read, without the proxy waiting for (or making room
/// for) the declared bytes; nothing reaches the hub's Redis, and a client connected to the same
/// principal keeps being served.
#[tokio::test]
async fn oversized_redis_requests_are_refused_from_their_header_and_other_clients_are_served(
) -> anyhow::Result<()> {
    use e2e::redis::{resp_command, resp_exchange};
    let hub_redis = e2e::Redis::start("redis-max-request")?;
    let s = LonePrincipal::start(
        "redis_max_request",
        &[&format!("--redis-server-address={}", hub_redis.address())],
    )
    .await?;
    let port = s.principal.redis_proxy_port;
    let mut normal = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    assert_eq!(
        resp_exchange(&mut normal, &["SET", "before", "1"]).await?,
        "+OK\r\n"
    );

    let mut huge_set = resp_command(&["SET", "huge"]);
    huge_set[1] = b'3'; // three elements: the value's header follows, not its bytes
    huge_set.extend_from_slice(b"$1073741824\r\n");
    let attacks: [&[u8]; 2] = [&huge_set, b"*100000000\r\n"];
    for attack in attacks {
        let started = Instant::now();
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        conn.write_all(attack).await?;
        let mut reply = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut reply)).await??;
        let reply = String::from_utf8_lossy(&reply);
        assert!(
            reply.starts_with("-ERR Protocol error") && reply.contains("limit of 16777216 bytes"),
            "{:?}: {reply}",
            String::from_utf8_lossy(attack)
        );
        // Refused from the header: not after the 10 s command deadline.
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    assert_eq!(
        resp_exchange(&mut normal, &["GET", "before"]).await?,
        "$1\r\n1\r\n"
    );
    assert_eq!(
        resp_exchange(&mut normal, &["EXISTS", "huge"]).await?,
        ":0\r\n"
    );
    let refused = metric(
        &s.principal,
        "argocd_principal_redis_proxy_errors_total",
        &[
            ("agent_name", ""),
            ("command", "INVALID"),
            ("reason", "request_too_large"),
        ],
    )
    .await?;
    assert_eq!(refused, 2.0);
    Ok(())
}
