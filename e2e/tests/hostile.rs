//! Hostile agents and clients against the real principal process: each attack is refused and the
//! hub (and the principal's memory, metrics and logs) stay as they were.
//!
//! - Mode pinning: a managed agent that declares itself autonomous at login (to own, overwrite or
//!   delete the hub's Applications in its namespace) is refused with PermissionDenied naming its
//!   pinned mode and the admin command that changes it; the pin comes from the first login or
//!   from the registration (cluster Secret label), and an admin's re-pin takes effect.
//! - Unbounded input in metrics and logs: 1,000,000 distinct unknown event types from four agents
//!   fold into one `unknown` series, and the principal's peak RSS stays within the bound; rejected
//!   input is logged truncated and rate-limited.
//! - Names that are not Kubernetes names (`app?dryRun=All`) are refused before any use.
//! - A token that expired seconds ago is refused (no 60 s leeway).
//! - Memory before authentication: 200 stalled 16 MiB Authenticate and Ping calls, over one
//!   connection and over 13 at once, are refused at their length prefix and keep the principal's
//!   peak RSS within the bound; a connection may open only 16 streams.
//! - Ownership, not names: autonomous agent `team` cannot overwrite or delete the hub mirror
//!   `team-b-x` of agent `team-b`'s project `x` (its own project `b-x` maps to the same name), nor
//!   an AppProject or Application made on the hub; each attempt is an error ACK and a count in
//!   `argocd_principal_mirror_collisions_total{agent_name}`.
//! - Stalled resource proxy request bodies: 500 requests at once from ten agents that send all of
//!   a 16 KiB or 3 MiB body but its last byte: those admitted (64 bodies and at most 8 MiB, of one
//!   agent's at most 8 bodies and 4 MiB; `--max-request-bodies-in-flight`, `…-per-agent`) are
//!   answered 408 and closed after `--request-body-timeout`, the others 429 at once, and the
//!   principal's peak RSS stays within the bound; while one agent holds its 4 MiB, another agent's
//!   2 MiB write and the first agent's reads are served.
//! - Connections per agent: past `--max-connections-per-agent` the next connection gets GOAWAY
//!   (ResourceExhausted) and a count; other agents are unaffected.
//! - gRPC over WebSocket (`--enable-websocket`) held to the same bounds: 200 calls before login
//!   each declaring a 16 MiB message are closed with 1009 from their frame header and keep the
//!   principal's peak RSS within the bound; a stream without a token is refused; past
//!   `--max-connections-per-agent` the next call's upgrade gets HTTP 429 naming the flag.
//! - Redis proxy: 2,000 short-lived SUBSCRIBE clients through a real agent leave no subscriber on
//!   the spoke's (password-protected) Redis once they are gone; the client over
//!   `--redis-proxy-max-connections-per-ip` and the channel over
//!   `--redis-proxy-max-subscriptions-per-connection` get Redis errors (UNSUBSCRIBE frees a
//!   channel's slot and ends it on the spoke); principal RSS stays bounded.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use argocd_agent_proto::event::{Event, EventType, Target};
use e2e::bench::RssUnderAttack;
use e2e::gateway::{
    agent_identity, application, application_resource, appproject_resource, client_tls,
    ensure_namespace, http_get, tls_connect, Agent,
};
use e2e::metrics::Scrape;
use e2e::raw_agent::{send_for_ack, try_authenticate, LonePrincipal};
use e2e::redis::{resp_command, resp_exchange};
use e2e::{shared_planes, wait_until, Redis};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use tonic::Code;

/// Logs in as `mode`; `Err` is "<gRPC code>: <message>".
async fn login(
    s: &LonePrincipal,
    identity: (&str, &str),
    mode: &str,
) -> Result<argocd_agent_proto::pb::authapi::AuthResponse, String> {
    try_authenticate(
        &s.pki,
        &s.principal.address(),
        Some(identity),
        &[b"h2"],
        mode,
    )
    .await
}

/// Applications in `ns` on the hub: name → resourceVersion.
async fn hub_apps(ns: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let client = shared_planes().await.hub.client().await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &application_resource());
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|o| {
            (
                o.metadata.name.unwrap_or_default(),
                o.metadata.resource_version.unwrap_or_default(),
            )
        })
        .collect())
}

/// A new managed agent of `s`, logged in, with its event stream open: (name, sender, inbound).
async fn connected_managed_agent(
    s: &LonePrincipal,
    prefix: &str,
) -> anyhow::Result<(
    String,
    tokio::sync::mpsc::Sender<argocd_agent_proto::pb::eventstreamapi::Event>,
    tonic::Streaming<argocd_agent_proto::pb::eventstreamapi::Event>,
)> {
    let (name, (c, k)) = new_agent(s, prefix)?;
    let tokens = login(s, (&c, &k), "managed")
        .await
        .map_err(anyhow::Error::msg)?;
    let (tx, inbound) = s.subscribe((&c, &k), &tokens.access_token).await?;
    Ok((name, tx, inbound))
}

/// An agent certificate for a fresh name; returns the name and its PEMs.
fn new_agent(s: &LonePrincipal, prefix: &str) -> anyhow::Result<(String, (String, String))> {
    let name = s.ctx.unique(prefix);
    s.pki.issue_agent(&name)?;
    let identity = agent_identity(&s.pki, &name)?;
    Ok((name, identity))
}

#[tokio::test]
async fn a_managed_agent_cannot_log_in_as_autonomous_to_take_over_hub_applications(
) -> anyhow::Result<()> {
    let s = LonePrincipal::start("mode_pin", &[]).await?;
    let ns = s.principal.namespace.clone();
    let client = shared_planes().await.hub.client().await?;
    let (name, (c, k)) = new_agent(&s, "pinned")?;
    // The hub owns an Application in the agent's namespace.
    ensure_namespace(&client, &name).await?;
    let apps: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &name, &application_resource());
    apps.create(
        &PostParams::default(),
        &application("hub-owned", &name, "main"),
    )
    .await?;
    let before = hub_apps(&name).await?;

    // First login: managed. The pin is recorded on the hub.
    let managed = login(&s, (&c, &k), "managed")
        .await
        .map_err(anyhow::Error::msg)?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm = cms.get("argocd-agent-modes").await?;
    assert_eq!(
        cm.data.unwrap_or_default().get(&name).map(String::as_str),
        Some("managed")
    );

    // The attack: the same agent declares itself autonomous.
    let err = login(&s, (&c, &k), "autonomous").await.unwrap_err();
    eprintln!("[hostile] autonomous login of a managed agent: {err}");
    assert!(err.starts_with("PermissionDenied"), "{err}");
    assert!(err.contains("pinned to mode \"managed\""), "{err}");
    assert!(
        err.contains(&format!(
            "kubectl -n {ns} patch configmap argocd-agent-modes --type merge"
        )),
        "{err}"
    );
    // The legitimate mode still works, and its stream carries events.
    login(&s, (&c, &k), "managed")
        .await
        .map_err(anyhow::Error::msg)?;
    let (tx, mut inbound) = s.subscribe((&c, &k), &managed.access_token).await?;
    let probe = Event::new(
        EventType::Unknown("io.example.probe".into()),
        Target::Application,
        &name,
    );
    assert!(send_for_ack(&tx, &mut inbound, &probe).await?.is_some());
    drop((tx, inbound));
    assert_eq!(hub_apps(&name).await?, before, "hub Applications changed");

    // An admin re-pins the agent: autonomous is admitted, managed (and its old token) refused.
    cms.patch(
        "argocd-agent-modes",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {&name: "autonomous"}})),
    )
    .await?;
    wait_until(
        "the re-pin takes effect",
        Duration::from_secs(15),
        || async { Ok::<_, anyhow::Error>(login(&s, (&c, &k), "autonomous").await.ok()) },
    )
    .await?;
    let err = login(&s, (&c, &k), "managed").await.unwrap_err();
    assert!(err.contains("pinned to mode \"autonomous\""), "{err}");
    let Err(stale) = s.subscribe((&c, &k), &managed.access_token).await else {
        panic!("a managed token opened a stream after the re-pin");
    };
    assert_eq!(stale.code(), Code::PermissionDenied, "{stale:?}");
    Ok(())
}

#[tokio::test]
async fn a_registration_label_pins_the_mode_before_any_login() -> anyhow::Result<()> {
    let s = LonePrincipal::start("mode_pin_registration", &[]).await?;
    let ns = s.principal.namespace.clone();
    let client = shared_planes().await.hub.client().await?;
    let (name, (c, k)) = new_agent(&s, "registered")?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {
            "name": format!("cluster-{name}"),
            "labels": {
                "argocd.argoproj.io/secret-type": "cluster",
                "argocd-agent.argoproj-labs.io/agent-name": name,
                "argocd-agent.argoproj-labs.io/agent-mode": "autonomous",
            },
        },
        "stringData": {"name": name, "server": "https://example.invalid", "config": "{}"},
    }))?;
    Api::<Secret>::namespaced(client, &ns)
        .create(&PostParams::default(), &secret)
        .await?;
    let err = wait_until(
        "the registration pin is seen",
        Duration::from_secs(15),
        || async { Ok::<_, anyhow::Error>(login(&s, (&c, &k), "managed").await.err()) },
    )
    .await?;
    eprintln!("[hostile] managed login of a registered autonomous agent: {err}");
    assert!(err.starts_with("PermissionDenied"), "{err}");
    assert!(
        err.contains(&format!("label secret cluster-{name}")),
        "{err}"
    );
    login(&s, (&c, &k), "autonomous")
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_unknown_event_types_fold_into_one_series_and_a_few_log_lines(
) -> anyhow::Result<()> {
    let s = LonePrincipal::start("metric_folding", &[]).await?;
    // 10x the issue's 100,000 distinct types, sent by four agents at once.
    const AGENTS: usize = 4;
    const EVENTS: usize = 1_000_000;
    let mut agents = Vec::new();
    for a in 0..AGENTS {
        agents.push(connected_managed_agent(&s, &format!("noisy{a}")).await?);
    }
    // Each agent's first refusal creates its per-agent series (upstream's
    // `principal_event_processing_time{status,agent_name,resource_type}`): the baseline holds
    // them, so what follows measures growth per distinct type, which must be none.
    for (name, tx, inbound) in &mut agents {
        let probe = Event::new(
            EventType::Unknown("warm-up".into()),
            Target::Unknown("warm-up".into()),
            name.as_str(),
        );
        send_for_ack(tx, inbound, &probe).await?;
    }
    let (_, before) = http_get(s.principal.ops_port, "/metrics").await?;
    let pid = s.principal.process.pid().expect("principal running");
    let rss = RssUnderAttack::start(pid, "1,000,000 distinct unknown event types")?;

    let long = "x".repeat(10_000);
    let started = Instant::now();
    let floods: Vec<_> = agents
        .into_iter()
        .enumerate()
        .map(|(a, (name, tx, mut inbound))| {
            let long = long.clone();
            tokio::spawn(async move {
                // The stream stays open until every event is answered: the sender's end is
                // not the agent's.
                let sending = tx.clone();
                let sender = tokio::spawn(async move {
                    for i in 0..EVENTS / AGENTS {
                        let long = if (a, i) == (0, 7) { long.as_str() } else { "" };
                        let ev = Event::new(
                            EventType::Unknown(format!("io.example.hostile-{a}-{i}-{long}")),
                            Target::Unknown(format!("t{a}-{i}")),
                            &name,
                        );
                        sending.send(ev.to_stream_event()).await?;
                    }
                    anyhow::Ok(())
                });
                let mut refused = 0;
                while refused < EVENTS / AGENTS {
                    let wire = tokio::time::timeout(Duration::from_secs(30), inbound.message())
                        .await??
                        .ok_or_else(|| anyhow::anyhow!("stream ended"))?;
                    let ev = Event::try_from_stream_event(wire)?;
                    if ev.is_ack() && ev.ack_error().is_some() {
                        refused += 1;
                    }
                }
                drop(tx);
                sender.await?
            })
        })
        .collect();
    for flood in floods {
        flood.await??;
    }
    let elapsed = started.elapsed();
    rss.check_bound()?;

    let (_, after) = http_get(s.principal.ops_port, "/metrics").await?;
    let series: Vec<&str> = after
        .lines()
        .filter(|l| l.starts_with("principal_events_received_total{"))
        .collect();
    eprintln!(
        "[hostile] /metrics {} → {} bytes after {EVENTS} unknown types; series: {series:?}",
        before.len(),
        after.len()
    );
    assert!(
        !after.contains("hostile"),
        "a peer-chosen type became a label"
    );
    let unknown: Vec<&&str> = series
        .iter()
        .filter(|l| l.contains("event_type=\"unknown\""))
        .collect();
    assert_eq!(unknown.len(), 1, "{series:?}");
    let count: f64 = unknown[0].rsplit(' ').next().unwrap_or("0").parse()?;
    assert!(count >= (EVENTS + 1) as f64, "{count}");
    // Every refusal is counted as an event error, under one bounded reason.
    let rejected = Scrape::of(s.principal.ops_port).await?.value(
        "argocd_principal_event_errors_total",
        &[("reason", "rejected")],
    )?;
    assert!(rejected >= (EVENTS + 1) as f64, "{rejected}");
    assert!(
        after.len() < before.len() + 1024,
        "/metrics grew from {} to {} bytes",
        before.len(),
        after.len()
    );

    // Logs: a few WARN lines for the burst, none carrying the 10 KB type in full.
    let log = std::fs::read_to_string(s.ctx.dir.join("principal-p.log"))?;
    let warns = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("event rejected"))
        .count();
    let budget = 20 * (elapsed.as_secs() as usize / 10 + 2);
    eprintln!("[hostile] {warns} WARN lines for {EVENTS} rejected events in {elapsed:?}");
    assert!(warns <= budget, "{warns} WARN lines (budget {budget})");
    assert!(
        !log.contains(&long[..1000]),
        "a 10 KB peer string was logged whole"
    );
    Ok(())
}

/// An Application-shaped object named `name` in the spoke namespace `namespace`.
fn spoke_app(name: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": namespace, "uid": uuid::Uuid::new_v4().to_string(), "resourceVersion": "1"},
        "spec": {"project": "default", "destination": {"server": "https://kubernetes.default.svc", "namespace": "default"},
                 "source": {"repoURL": "https://example.invalid/repo.git", "path": "app", "targetRevision": "main"}},
    })
}

#[tokio::test]
async fn names_that_are_not_kubernetes_names_are_refused_before_any_use() -> anyhow::Result<()> {
    let s = LonePrincipal::start("hostile_names", &[]).await?;
    let client = shared_planes().await.hub.client().await?;

    // Autonomous: its objects become hub mirrors, so a name would reach a hub apiserver URL.
    let (auto, (c, k)) = new_agent(&s, "auto")?;
    ensure_namespace(&client, &auto).await?;
    let tokens = login(&s, (&c, &k), "autonomous")
        .await
        .map_err(anyhow::Error::msg)?;
    let (tx, mut inbound) = s.subscribe((&c, &k), &tokens.access_token).await?;
    let before = hub_apps(&auto).await?;
    for (case, ty, name, ns) in [
        (
            "query string",
            EventType::Create,
            "app?dryRun=All",
            "argocd",
        ),
        (
            "path traversal",
            EventType::SpecUpdate,
            "a/../../secrets",
            "argocd",
        ),
        ("upper case", EventType::Create, "App", "argocd"),
        (
            "bad namespace",
            EventType::Create,
            "app",
            "argocd?watch=true",
        ),
        ("encoded slash", EventType::Delete, "a%2Fb", "argocd"),
    ] {
        let ev = Event::for_object(ty, Target::Application, &auto, &spoke_app(name, ns))?;
        let err = send_for_ack(&tx, &mut inbound, &ev).await?;
        eprintln!("[hostile] autonomous {case}: {err:?}");
        let err = err.unwrap_or_else(|| panic!("{case}: accepted"));
        assert!(err.contains("DNS-1123"), "{case}: {err}");
    }
    // A valid name still works: the refusals were about the names.
    let ok = Event::for_object(
        EventType::Create,
        Target::Application,
        &auto,
        &spoke_app("fine", "argocd"),
    )?;
    assert_eq!(send_for_ack(&tx, &mut inbound, &ok).await?, None);
    let after = hub_apps(&auto).await?;
    assert_eq!(
        after.keys().filter(|k| !before.contains_key(*k)).count(),
        1,
        "exactly the valid mirror was created: {after:?}"
    );
    drop((tx, inbound));

    // Managed: resync keys and error reports carry names too.
    let (managed, tx, mut inbound) = connected_managed_agent(&s, "man").await?;
    let request_update = Event::new(EventType::RequestUpdate, Target::ResourceResync, &managed)
        .with_json(&json!({"name": "app?dryRun=All", "namespace": "argocd", "uid": "u", "kind": "Application"}))?;
    let error_report = Event::new(EventType::Error, Target::Application, &managed)
        .with_json(&json!({"resourceName": "x?propagationPolicy=Orphan", "message": "m"}))?;
    for (case, ev) in [
        ("request-update", request_update),
        ("error report", error_report),
    ] {
        let err = send_for_ack(&tx, &mut inbound, &ev).await?;
        eprintln!("[hostile] managed {case}: {err:?}");
        assert!(err.is_some_and(|e| e.contains("DNS-1123")), "{case}");
    }
    Ok(())
}

/// Signs `claims` with the principal's PEM private key `pem` (ES256 or RS512, as it does).
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

#[tokio::test]
async fn a_token_that_expired_seconds_ago_is_refused() -> anyhow::Result<()> {
    let s = LonePrincipal::start("token_leeway", &[]).await?;
    let (name, (c, k)) = new_agent(&s, "late")?;
    // Pin the agent first, as a real one would be.
    login(&s, (&c, &k), "managed")
        .await
        .map_err(anyhow::Error::msg)?;
    let key = std::fs::read_to_string(s.pki.dir.join("jwt.key"))?;
    let token = |exp_offset: i64| {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        sign_like_the_principal(
            &key,
            &json!({
                "sub": json!({"clientID": name, "mode": "managed"}).to_string(),
                "iss": "argocd-agent-server", "aud": "argocd-agent-server-access",
                "exp": now + exp_offset, "iat": now - 600, "nbf": now - 600,
                "jti": uuid::Uuid::new_v4().to_string(),
            }),
        )
    };
    // Within jsonwebtoken's default 60 s leeway: refused all the same.
    for ago in [5, 30] {
        let err = s
            .subscribe((&c, &k), &token(-ago)?)
            .await
            .err()
            .unwrap_or_else(|| panic!("a token expired {ago} s ago opened a stream"));
        assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
        assert!(err.message().contains("Expired"), "{err:?}");
    }
    s.subscribe((&c, &k), &token(60)?).await?;
    Ok(())
}

/// One HTTP/2 connection to the principal presenting `identity`; returns the request sender and
/// the server's current SETTINGS_MAX_CONCURRENT_STREAMS as the connection sees it.
async fn h2_connection(
    s: &LonePrincipal,
    identity: (&str, &str),
) -> anyhow::Result<(
    h2::client::SendRequest<bytes::Bytes>,
    tokio::sync::watch::Receiver<usize>,
)> {
    let tls = std::sync::Arc::new(client_tls(&s.pki, Some(identity), &[b"h2"])?);
    let io = tls_connect(&s.principal.address(), tls).await?;
    let (send, mut conn) = h2::client::handshake(io).await?;
    let (max_tx, max_rx) = tokio::sync::watch::channel(0usize);
    tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| {
            let r = std::pin::Pin::new(&mut conn).poll(cx);
            max_tx.send_replace(conn.max_concurrent_send_streams());
            r
        })
        .await;
    });
    Ok((send, max_rx))
}

/// The grpc-status of a call, from its headers or its trailers (within 20 s).
async fn grpc_status(answer: h2::client::ResponseFuture) -> anyhow::Result<String> {
    let resp = tokio::time::timeout(Duration::from_secs(20), answer).await??;
    let status = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    if let Some(s) = status(resp.headers()) {
        return Ok(s);
    }
    let mut body = resp.into_body();
    let trailers = tokio::time::timeout(Duration::from_secs(5), body.trailers()).await??;
    Ok(trailers.as_ref().and_then(status).unwrap_or_default())
}

/// What [`stalled_oversized_calls`] reports for a stream the server refused unprocessed.
const REFUSED_STREAM: &str = "REFUSED_STREAM";

/// Makes `calls` calls on a connection (Authenticate and Ping in turn), as many at once as the
/// connection allows (once its SETTINGS arrived): each claims a message of 16 MiB − 1 and sends `frame` (as much of it as
/// flow control lets through) without ending, holding its body until answered. Returns the
/// grpc-status of each.
async fn stalled_oversized_calls(
    (mut send, mut max_streams): (
        h2::client::SendRequest<bytes::Bytes>,
        tokio::sync::watch::Receiver<usize>,
    ),
    calls: usize,
    frame: bytes::Bytes,
) -> anyhow::Result<Vec<String>> {
    tokio::time::timeout(Duration::from_secs(10), max_streams.wait_for(|m| *m == 16)).await??;
    let mut answers = Vec::new();
    for i in 0..calls {
        let path = if i % 2 == 0 {
            "/authapi.Authentication/Authenticate"
        } else {
            "/eventstreamapi.EventStream/Ping"
        };
        send = tokio::time::timeout(Duration::from_secs(20), send.ready())
            .await
            .map_err(|_| anyhow::anyhow!("no stream slot freed within 20 s (call {i})"))??;
        let req = http::Request::post(format!("https://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())?;
        let (answer, mut body) = send.send_request(req, false)?;
        let _ = body.send_data(frame.clone(), false);
        answers.push(tokio::spawn(async move {
            // The server may refuse a stream outright (RST_STREAM REFUSED_STREAM: not processed at
            // all) when its slot is not yet free on its side; that is a refusal too.
            let status = match grpc_status(answer).await {
                Err(e)
                    if e.downcast_ref::<h2::Error>().and_then(h2::Error::reason)
                        == Some(h2::Reason::REFUSED_STREAM) =>
                {
                    Ok(REFUSED_STREAM.to_string())
                }
                other => other,
            };
            drop(body);
            status
        }));
    }
    let mut statuses = Vec::new();
    for answer in answers {
        statuses.push(answer.await??);
    }
    Ok(statuses)
}

#[tokio::test]
async fn stalled_oversized_calls_before_authentication_do_not_grow_the_principal(
) -> anyhow::Result<()> {
    let s = LonePrincipal::start("preauth_memory", &[]).await?;
    let (_, (c, k)) = new_agent(&s, "big")?;
    let pid = s.principal.process.pid().expect("principal running");

    // 10x the issue's 20 stalled ~16 MiB Authenticate calls: 200 calls, each claiming a message
    // just under the post-login limit (16 MiB) and sending all of it.
    const CALLS: usize = 200;
    let mut frame = vec![0u8];
    frame.extend_from_slice(&((16u32 << 20) - 1).to_be_bytes());
    frame.resize(5 + (16 << 20) - 1, b'z');
    let frame = bytes::Bytes::from(frame);
    let started = Instant::now();
    let mut statuses = BTreeMap::new();

    // Over one connection, 16 at a time (its stream cap).
    let one = RssUnderAttack::start(pid, "200 stalled 16 MiB calls before login, one connection")?;
    let connection = h2_connection(&s, (&c, &k)).await?;
    for status in stalled_oversized_calls(connection, CALLS, frame.clone()).await? {
        *statuses.entry(status).or_insert(0) += 1;
    }
    one.check_bound()?;

    // Over 13 connections at once (16 calls each, the last 8): all 200 in flight together.
    let several =
        RssUnderAttack::start(pid, "200 stalled 16 MiB calls before login, 13 connections")?;
    let mut connections = Vec::new();
    for first in (0..CALLS).step_by(16) {
        let connection = h2_connection(&s, (&c, &k)).await?;
        let calls = (CALLS - first).min(16);
        connections.push(tokio::spawn(stalled_oversized_calls(
            connection,
            calls,
            frame.clone(),
        )));
    }
    let connection_count = connections.len();
    for connection in connections {
        for status in connection.await?? {
            *statuses.entry(status).or_insert(0) += 1;
        }
    }
    several.check_bound()?;
    eprintln!(
        "[hostile] {} stalled 16 MiB calls (one connection, then {connection_count}) in {:?}; \
         gRPC statuses {statuses:?}",
        2 * CALLS,
        started.elapsed()
    );
    // Every call is answered while its body is still open: refused at the length prefix (or, the
    // odd one, refused as a stream before any processing), most of them by their size.
    assert!(
        statuses
            .keys()
            .all(|s| s == "11" || s == "8" || s == REFUSED_STREAM),
        "calls not refused as too large: {statuses:?}"
    );
    let by_size = statuses.get("11").unwrap_or(&0) + statuses.get("8").unwrap_or(&0);
    assert!(by_size >= CALLS, "{statuses:?}");
    assert_eq!(statuses.values().sum::<usize>(), 2 * CALLS);
    // The principal still serves agents.
    login(&s, (&c, &k), "managed")
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(())
}

/// The principal counted a connection over `--max-connections-per-agent`.
async fn assert_over_cap_counted(s: &LonePrincipal) -> anyhow::Result<()> {
    let metrics = Scrape::of(s.principal.ops_port).await?;
    let refused = metrics.value(
        "argocd_principal_auth_failures",
        &[("reason", "too_many_connections")],
    )?;
    anyhow::ensure!(refused >= 1.0, "refusal not counted");
    Ok(())
}

#[tokio::test]
async fn an_agent_holding_its_cap_of_connections_gets_goaway_for_the_next_one() -> anyhow::Result<()>
{
    let s = LonePrincipal::start("conn_cap", &["--max-connections-per-agent=2"]).await?;
    let (_, (c, k)) = new_agent(&s, "conns")?;
    let held = [
        h2_connection(&s, (&c, &k)).await?,
        h2_connection(&s, (&c, &k)).await?,
    ];
    // The server's SETTINGS arrived on both: they are admitted, not just accepted.
    for (_, max) in &held {
        let mut max = max.clone();
        tokio::time::timeout(Duration::from_secs(10), max.wait_for(|m| *m == 16)).await??;
    }
    let refused = login(&s, (&c, &k), "managed").await;
    eprintln!("[hostile] third connection of one agent: {refused:?}");
    assert!(refused.is_err(), "a third connection was served");
    assert_over_cap_counted(&s).await?;
    assert!(
        s.principal
            .process
            .log_tail(50)
            .contains("--max-connections-per-agent=2"),
        "the log names the flag"
    );
    // Another agent is not affected, and a closed connection frees its place.
    let (_, other) = new_agent(&s, "other")?;
    login(&s, (&other.0, &other.1), "managed")
        .await
        .map_err(anyhow::Error::msg)?;
    drop(held);
    wait_until(
        "a login once a connection closed",
        Duration::from_secs(10),
        || async { Ok::<_, String>(login(&s, (&c, &k), "managed").await.ok()) },
    )
    .await?;
    Ok(())
}

/// A gRPC-over-WebSocket call in progress (the test speaks the wire by hand).
type WsCall =
    tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// Opens a gRPC-over-WebSocket call to `path` as agent `identity`, the upgrade as grpc-http1's
/// client sends it (ALPN http/1.1, subprotocol grpc-ws, the gRPC headers on the upgrade); `Err`
/// is a refused upgrade's HTTP status and text.
async fn websocket_call(
    s: &LonePrincipal,
    identity: (&str, &str),
    path: &str,
) -> anyhow::Result<Result<WsCall, (u16, String)>> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let tls = std::sync::Arc::new(client_tls(&s.pki, Some(identity), &[b"http/1.1"])?);
    let io = tls_connect(&s.principal.address(), tls).await?;
    let mut request = format!("wss://localhost{path}").into_client_request()?;
    let h = request.headers_mut();
    h.insert("content-type", "application/grpc".parse()?);
    h.insert("te", "trailers".parse()?);
    h.insert("sec-websocket-protocol", "grpc-ws".parse()?);
    match tokio_tungstenite::client_async(request, io).await {
        Ok((ws, _)) => Ok(Ok(ws)),
        Err(tokio_tungstenite::tungstenite::Error::Http(refused)) => Ok(Err((
            refused.status().as_u16(),
            String::from_utf8_lossy(refused.body().as_deref().unwrap_or_default()).into_owned(),
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Sends, under `call`'s WebSocket, the header of a binary frame declaring a gRPC message of
/// 16 MiB and its first 64 KiB, then reads what the principal answers until it closes; the close
/// code it sent, if any.
async fn oversized_frame(mut call: WsCall) -> anyhow::Result<Option<u16>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = call.get_mut();
    let declared: u64 = 5 + (16 << 20) - 1;
    let mut bytes = vec![0x82u8, 0x80 | 127];
    bytes.extend(declared.to_be_bytes());
    bytes.extend([7, 7, 7, 7]); // the mask key
    bytes.extend([0u8; 64 << 10]);
    let _ = io.write_all(&bytes).await;
    let _ = io.flush().await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), io.read_to_end(&mut answer)).await;
    // An unmasked close frame: 0x88, its length, then the code.
    Ok(answer
        .windows(4)
        .find(|w| w[0] == 0x88 && w[1] >= 2 && w[1] < 126)
        .map(|w| u16::from_be_bytes([w[2], w[3]])))
}

#[tokio::test]
async fn websocket_calls_are_held_to_the_native_bounds_before_login() -> anyhow::Result<()> {
    let s = LonePrincipal::start(
        "ws_bounds",
        &["--enable-websocket", "--max-connections-per-agent=256"],
    )
    .await?;
    let (_, (c, k)) = new_agent(&s, "ws")?;
    let pid = s.principal.process.pid().expect("principal running");

    // Each call is a connection: 200 at once, Authenticate and Ping in turn, each declaring a
    // message of 16 MiB (the post-login limit) where 64 KiB is allowed before a session.
    const CALLS: usize = 200;
    let rss = RssUnderAttack::start(pid, "200 stalled 16 MiB WebSocket calls before login")?;
    let mut calls = Vec::new();
    for i in 0..CALLS {
        let path = if i % 2 == 0 {
            "/authapi.Authentication/Authenticate"
        } else {
            "/eventstreamapi.EventStream/Ping"
        };
        let call = websocket_call(&s, (&c, &k), path)
            .await?
            .map_err(|refused| anyhow::anyhow!("upgrade {i} refused: {refused:?}"))?;
        calls.push(tokio::spawn(oversized_frame(call)));
    }
    let mut codes = BTreeMap::new();
    for call in calls {
        *codes.entry(call.await??).or_insert(0) += 1;
    }
    rss.check_bound()?;
    eprintln!("[hostile] {CALLS} oversized WebSocket calls before login: close codes {codes:?}");
    assert_eq!(
        codes,
        BTreeMap::from([(Some(1009), CALLS)]),
        "each closed as too big"
    );

    // A stream without a token is answered trailers-only, Unauthenticated, saying why.
    let mut subscribe = websocket_call(&s, (&c, &k), "/eventstreamapi.EventStream/Subscribe")
        .await?
        .map_err(|refused| anyhow::anyhow!("{refused:?}"))?;
    let first = loop {
        match tokio::time::timeout(Duration::from_secs(20), subscribe.next()).await? {
            Some(Ok(tokio_tungstenite::tungstenite::Message::Binary(b))) => break b,
            Some(Ok(_)) => continue,
            other => anyhow::bail!("no answer to an unauthenticated Subscribe: {other:?}"),
        }
    };
    use argocd_agent_runtime::grpc_websocket::frame;
    let frame::Frame::Metadata(block) = frame::decode(first)? else {
        anyhow::bail!("the answer is not metadata");
    };
    let headers = frame::parse_metadata(&block)?;
    assert_eq!(headers["grpc-status"], "16", "{headers:?}");
    assert!(
        headers["grpc-message"]
            .to_str()?
            .contains("missing%20authorization%20metadata"),
        "{headers:?}"
    );
    // The principal still serves agents, natively.
    login(&s, (&c, &k), "managed")
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(())
}

#[tokio::test]
async fn an_agent_holding_its_cap_of_websocket_calls_gets_429_naming_the_flag() -> anyhow::Result<()>
{
    let s = LonePrincipal::start(
        "ws_cap",
        &["--enable-websocket", "--max-connections-per-agent=2"],
    )
    .await?;
    let (_, (c, k)) = new_agent(&s, "wscap")?;
    let version = "/versionapi.Version/Version";
    // Two calls open (the principal waits for their request message): the agent's cap.
    let held = [
        websocket_call(&s, (&c, &k), version).await?,
        websocket_call(&s, (&c, &k), version).await?,
    ];
    assert!(held.iter().all(Result::is_ok), "the first two are switched");
    let refused = websocket_call(&s, (&c, &k), version).await?;
    let Err((status, text)) = refused else {
        anyhow::bail!("a third call was switched");
    };
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("--max-connections-per-agent=2"), "{text}");
    assert_over_cap_counted(&s).await?;
    // Another agent is not affected, and a finished call frees its place.
    let (_, other) = new_agent(&s, "wsother")?;
    assert!(websocket_call(&s, (&other.0, &other.1), version)
        .await?
        .is_ok());
    drop(held);
    wait_until(
        "a call once one closed",
        Duration::from_secs(10),
        || async {
            Ok::<_, anyhow::Error>(
                websocket_call(&s, (&c, &k), version)
                    .await?
                    .ok()
                    .map(|_| ()),
            )
        },
    )
    .await?;
    Ok(())
}

/// An AppProject-shaped object named `name` as a spoke holds it.
fn spoke_project(name: &str, description: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": name, "namespace": "argocd", "uid": uuid::Uuid::new_v4().to_string()},
        "spec": {"description": description, "sourceRepos": ["*"]},
    })
}

/// AppProjects in `ns` on the hub: name → (resourceVersion, description).
async fn hub_projects(ns: &str) -> anyhow::Result<BTreeMap<String, (String, String)>> {
    let client = shared_planes().await.hub.client().await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &appproject_resource());
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|o| {
            let description = o.data["spec"]["description"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (
                o.metadata.name.unwrap_or_default(),
                (o.metadata.resource_version.unwrap_or_default(), description),
            )
        })
        .collect())
}

#[tokio::test]
async fn an_agent_cannot_write_or_delete_hub_objects_it_does_not_own_by_choosing_names(
) -> anyhow::Result<()> {
    let s = LonePrincipal::start("mirror_ownership", &[]).await?;
    let ns = s.principal.namespace.clone();
    let client = shared_planes().await.hub.client().await?;
    // Agent `team` and agent `team-b`: `team`'s project `b-x` and `team-b`'s project `x` are both
    // `team-b-x` on the hub.
    let team = s.ctx.unique("team");
    let team_b = format!("{team}-b");
    let mut streams = Vec::new();
    for agent in [&team, &team_b] {
        s.pki.issue_agent(agent)?;
        let (c, k) = agent_identity(&s.pki, agent)?;
        ensure_namespace(&client, agent).await?;
        let tokens = login(&s, (&c, &k), "autonomous")
            .await
            .map_err(anyhow::Error::msg)?;
        streams.push(s.subscribe((&c, &k), &tokens.access_token).await?);
    }
    let (b_tx, mut b_in) = streams.pop().expect("team-b");
    let (tx, mut inbound) = streams.pop().expect("team");

    // The victims: team-b's mirror, and an AppProject and an Application made on the hub.
    let victim = spoke_project("x", "team-b's");
    let ev = Event::for_object(EventType::Create, Target::AppProject, &team_b, &victim)?;
    assert_eq!(send_for_ack(&b_tx, &mut b_in, &ev).await?, None);
    let projects: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &appproject_resource());
    let admin_project: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": format!("{team}-admin"), "namespace": ns},
        "spec": {"description": "the hub's", "sourceRepos": ["*"]},
    }))?;
    projects
        .create(&PostParams::default(), &admin_project)
        .await?;
    let apps: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &team, &application_resource());
    apps.create(
        &PostParams::default(),
        &application("hub-owned", &team, "main"),
    )
    .await?;
    let projects_before = hub_projects(&ns).await?;
    let apps_before = hub_apps(&team).await?;
    assert_eq!(
        projects_before
            .get(&format!("{team_b}-x"))
            .map(|p| p.1.as_str()),
        Some("team-b's")
    );

    // The attacks, by agent `team`; the deletes carry no uid (no source-uid check to fail).
    let no_uid = |mut v: Value| {
        v["metadata"]
            .as_object_mut()
            .expect("metadata")
            .remove("uid");
        v
    };
    let attacks = [
        (
            "create b-x",
            EventType::Create,
            Target::AppProject,
            spoke_project("b-x", "team's"),
        ),
        (
            "spec-update b-x",
            EventType::SpecUpdate,
            Target::AppProject,
            spoke_project("b-x", "team's"),
        ),
        (
            "delete b-x",
            EventType::Delete,
            Target::AppProject,
            no_uid(spoke_project("b-x", "")),
        ),
        (
            "create admin",
            EventType::Create,
            Target::AppProject,
            spoke_project("admin", "team's"),
        ),
        (
            "delete admin",
            EventType::Delete,
            Target::AppProject,
            no_uid(spoke_project("admin", "")),
        ),
        (
            "spec-update hub-owned",
            EventType::SpecUpdate,
            Target::Application,
            spoke_app("hub-owned", "argocd"),
        ),
        (
            "delete hub-owned",
            EventType::Delete,
            Target::Application,
            no_uid(spoke_app("hub-owned", "argocd")),
        ),
    ];
    for (case, ty, target, obj) in &attacks {
        let ev = Event::for_object(ty.clone(), target.clone(), &team, obj)?;
        let err = send_for_ack(&tx, &mut inbound, &ev).await?;
        eprintln!("[hostile] {case}: {err:?}");
        let err = err.unwrap_or_else(|| panic!("{case}: accepted"));
        assert!(err.contains("not this agent's mirror"), "{case}: {err}");
        assert!(
            !err.contains(&format!("agent {team_b}")) && !err.contains(&format!("\"{team_b}\"")),
            "{case} names the owner: {err}"
        );
    }
    // The agent's own names still work.
    let own = spoke_project("own", "team's");
    let ev = Event::for_object(EventType::Create, Target::AppProject, &team, &own)?;
    assert_eq!(send_for_ack(&tx, &mut inbound, &ev).await?, None);
    let ev = Event::for_object(EventType::Delete, Target::AppProject, &team, &no_uid(own))?;
    assert_eq!(send_for_ack(&tx, &mut inbound, &ev).await?, None);

    // Nothing of anyone else changed, now or after the principal's reverting of hub edits had
    // its chance; the owner still updates its mirror.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let projects_after = hub_projects(&ns).await?;
    assert_eq!(projects_after, projects_before, "hub AppProjects changed");
    assert_eq!(
        hub_apps(&team).await?,
        apps_before,
        "hub Applications changed"
    );
    let mut newer = victim.clone();
    newer["spec"]["description"] = json!("team-b's v2");
    let ev = Event::for_object(EventType::SpecUpdate, Target::AppProject, &team_b, &newer)?;
    assert_eq!(send_for_ack(&b_tx, &mut b_in, &ev).await?, None);
    assert_eq!(
        hub_projects(&ns)
            .await?
            .get(&format!("{team_b}-x"))
            .map(|p| p.1.clone()),
        Some("team-b's v2".to_string())
    );

    let metrics = Scrape::of(s.principal.ops_port).await?;
    let collisions = "argocd_principal_mirror_collisions";
    let count = metrics.value(collisions, &[("agent_name", &team)])?;
    eprintln!("[hostile] {collisions}{{agent_name={team}}} {count}");
    assert_eq!(count, attacks.len() as f64);
    assert_eq!(
        metrics.sample(collisions, &[("agent_name", &team_b)]),
        None,
        "the victim {team_b} is counted as a collider"
    );
    Ok(())
}

/// What one stalled-body request of [`stall_bodies`] saw: the agent it was for, the body length
/// it declared, the answer read before the close (empty when the close reset the connection
/// first) and how long after its head the close came.
struct StalledBody {
    agent: String,
    declared: usize,
    answer: String,
    closed_after: Duration,
}

impl StalledBody {
    /// The answer's status line ("" when none was read).
    fn status(&self) -> &str {
        self.answer.lines().next().unwrap_or_default()
    }

    /// Whether the answer (if one was read) is `code`.
    fn answered(&self, code: u16) -> bool {
        let status = self.status();
        status.is_empty() || status.starts_with(&format!("HTTP/1.1 {code} "))
    }
}

/// The largest body the resource proxy accepts, less one byte: a body of this length that sends
/// all but its last byte holds 4 MiB in the proxy.
const BIG_BODY: usize = (4 << 20) - 1;

/// The stalled-body attack on the resource proxy of `s`: for each of `agents` (name, certificate
/// and key PEM), one TLS connection per entry of `declared` (handshakes 64 at a time, so that a
/// loaded machine does not time them out); once all are connected, each sends a request head
/// declaring a body of that length, then all of the body but its last byte as fast as the
/// principal takes it, and waits for the principal to answer and close (at most `within`).
/// Returns once every head was sent: how long sending them took, and the requests.
async fn stall_bodies(
    s: &LonePrincipal,
    agents: &[(String, (String, String))],
    declared: &[usize],
    within: Duration,
) -> anyhow::Result<(
    Duration,
    Vec<tokio::task::JoinHandle<anyhow::Result<StalledBody>>>,
)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = format!("127.0.0.1:{}", s.principal.resource_proxy_port);
    let body = bytes::Bytes::from(vec![b' '; BIG_BODY]);
    let handshakes = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut connecting = Vec::new();
    for (name, (c, k)) in agents {
        let tls = std::sync::Arc::new(client_tls(&s.pki, Some((c, k)), &[b"http/1.1"])?);
        for &size in declared {
            let (handshakes, tls, address) = (handshakes.clone(), tls.clone(), address.clone());
            let name = name.clone();
            connecting.push(tokio::spawn(async move {
                let _turn = handshakes.acquire_owned().await?;
                anyhow::Ok((name, size, tls_connect(&address, tls).await?))
            }));
        }
    }
    let mut connections = Vec::new();
    for c in connecting {
        connections.push(c.await??);
    }
    let (sent_tx, mut sent_rx) = tokio::sync::mpsc::channel(connections.len());
    let count = connections.len();
    let started = Instant::now();
    let requests = connections
        .into_iter()
        .map(|(agent, declared, conn)| {
            let (body, sent) = (body.slice(..declared - 1), sent_tx.clone());
            tokio::spawn(async move {
                let (mut read, mut write) = tokio::io::split(conn);
                let head = format!(
                    "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: localhost\r\n\
                     Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
                );
                write.write_all(head.as_bytes()).await?;
                let sent_at = Instant::now();
                let _ = sent.send(()).await;
                // The principal reads a body it admitted; the rest waits in the socket.
                let writer = tokio::spawn(async move {
                    let _ = write.write_all(&body).await;
                    let _ = write.flush().await;
                    write
                });
                let mut answer = Vec::new();
                let closed = tokio::time::timeout(within, read.read_to_end(&mut answer)).await;
                writer.abort();
                anyhow::ensure!(closed.is_ok(), "connection still open after {within:?}");
                anyhow::Ok(StalledBody {
                    agent,
                    declared,
                    answer: String::from_utf8_lossy(&answer).into_owned(),
                    closed_after: sent_at.elapsed(),
                })
            })
        })
        .collect();
    drop(sent_tx);
    for _ in 0..count {
        if sent_rx.recv().await.is_none() {
            break; // a request failed: its error is in its result
        }
    }
    Ok((started.elapsed(), requests))
}

/// Asserts that each of `bodies` was refused at once (429 with `Retry-After: 1` and its
/// connection closed, within `timeout` / 2) or held until `timeout` and then answered 408 (a
/// close may reset the connection before the client reads the answer); returns those held.
fn held_or_refused(bodies: &[StalledBody], timeout: Duration) -> anyhow::Result<Vec<&StalledBody>> {
    let mut held = Vec::new();
    for b in bodies {
        let took = b.closed_after;
        if took < timeout / 2 {
            anyhow::ensure!(b.answered(429), "refused with {:?}", b.status());
            let answer = b.answer.to_ascii_lowercase();
            anyhow::ensure!(
                b.status().is_empty()
                    || (answer.contains("retry-after: 1\r\n")
                        && answer.contains("connection: close\r\n")
                        && answer.contains("retry once they arrived")),
                "{}",
                b.answer
            );
        } else {
            anyhow::ensure!(b.answered(408), "held, then {:?}", b.status());
            anyhow::ensure!(
                took >= timeout - Duration::from_millis(500) && took <= timeout * 2,
                "closed {took:?} after the request head (--request-body-timeout={timeout:?})"
            );
            held.push(b);
        }
    }
    Ok(held)
}

/// How many of `bodies` each agent has, and how many bytes they declare.
fn per_agent(bodies: &[&StalledBody]) -> BTreeMap<String, (usize, usize)> {
    let mut out = BTreeMap::new();
    for b in bodies {
        let (n, bytes) = out.entry(b.agent.clone()).or_insert((0, 0));
        *n += 1;
        *bytes += b.declared;
    }
    out
}

#[tokio::test]
async fn stalled_resource_proxy_request_bodies_past_the_caps_are_refused_and_memory_stays_flat(
) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(10);
    // The connections wait for each other before sending their heads, so that all of them are
    // stalled at once.
    let s = LonePrincipal::start(
        "stalled_bodies",
        &["--request-body-timeout=10s", "--request-header-timeout=60s"],
    )
    .await?;
    // 10x the issue's 50: 500 stalled bodies from ten agents, half of them of 3 MiB and half of
    // 16 KiB, so that each cap is reached whatever order they arrive in: 50 bodies of each agent
    // (8 may be in flight), 500 together (64 may), 75 MiB declared by each agent (4 MiB may: one
    // large body and small ones), 750 MiB in all (8 MiB may: two large bodies and small ones).
    // The small ones always fit the bytes, so exactly 64 are held. The proxy reads a body only
    // for a connected agent's requests.
    const AGENTS: usize = 10;
    const PER_AGENT: usize = 50;
    const LARGE: usize = 3 << 20;
    let declared: Vec<usize> = (0..PER_AGENT)
        .map(|i| if i % 2 == 0 { LARGE } else { 16 << 10 })
        .collect();
    let mut agents = Vec::new();
    let mut streams = Vec::new();
    for a in 0..AGENTS {
        let (name, (c, k)) = new_agent(&s, &format!("stall{a}"))?;
        let tokens = login(&s, (&c, &k), "managed")
            .await
            .map_err(anyhow::Error::msg)?;
        streams.push(s.subscribe((&c, &k), &tokens.access_token).await?);
        agents.push((name, (c, k)));
    }
    let pid = s.principal.process.pid().expect("principal running");
    let rss = RssUnderAttack::start(
        pid,
        "500 stalled resource-proxy request bodies (16 KiB and 3 MiB) from 10 agents",
    )?;
    let (sending, requests) = stall_bodies(&s, &agents, &declared, timeout * 3).await?;
    let mut bodies = Vec::new();
    for r in requests {
        bodies.push(r.await??);
    }
    let held = held_or_refused(&bodies, timeout)?;
    let large = held.iter().filter(|b| b.declared == LARGE).count();
    let by_agent = per_agent(&held);
    eprintln!(
        "[hostile] {} stalled bodies (heads sent within {sending:?}): {} held and answered 408 \
         ({large} of 3 MiB; per agent, bodies and bytes: {by_agent:?}), the others refused 429 at \
         once",
        bodies.len(),
        held.len()
    );
    anyhow::ensure!(
        sending < timeout / 2,
        "the heads took {sending:?} to send: the attack was not at once"
    );
    // Within every cap: --max-request-bodies-in-flight(-per-agent) and the bytes.
    assert_eq!(held.len(), 64, "bodies held");
    assert!(
        by_agent
            .values()
            .all(|(n, bytes)| *n <= 8 && *bytes <= 4 << 20),
        "{by_agent:?}"
    );
    assert!(
        held.iter().map(|b| b.declared).sum::<usize>() <= 8 << 20,
        "{large} bodies of 3 MiB held"
    );
    // The proxy counted them so.
    let metrics = Scrape::of(s.principal.ops_port).await?;
    let counted = |code| {
        metrics.value(
            "argocd_principal_resource_proxy_requests",
            &[("code", code)],
        )
    };
    assert_eq!(counted("408")? as usize, held.len());
    assert_eq!(counted("429")? as usize, AGENTS * PER_AGENT - held.len());
    // The bodies held and the buffers of their connections, not what was declared nor one
    // buffer per attacking connection.
    rss.check_bound()?;
    // The agents' streams outlived it.
    for ((name, _), (tx, mut inbound)) in agents.iter().zip(streams) {
        let probe = Event::new(
            EventType::Unknown("probe".into()),
            Target::Application,
            name,
        );
        send_for_ack(&tx, &mut inbound, &probe).await?;
    }
    Ok(())
}

#[tokio::test]
async fn an_agent_stalling_request_bodies_leaves_room_for_the_writes_of_others(
) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(10);
    let s =
        LonePrincipal::start("stalled_bodies_isolation", &["--request-body-timeout=10s"]).await?;
    let (hog, hog_tx, mut hog_in) = connected_managed_agent(&s, "hog").await?;
    let (other, other_tx, mut other_in) = connected_managed_agent(&s, "other").await?;
    let hog_pem = agent_identity(&s.pki, &hog)?;
    let other_pem = agent_identity(&s.pki, &other)?;
    // Three bodies of 4 MiB at once: together they would fill the 8 MiB the proxy holds.
    let (_, requests) = stall_bodies(
        &s,
        &[(hog.clone(), hog_pem.clone())],
        &[BIG_BODY; 3],
        timeout * 3,
    )
    .await?;
    let hog_answered = |code: &'static str| {
        let hog = hog.clone();
        let port = s.principal.ops_port;
        async move {
            let metrics = Scrape::of(port).await?;
            let labels = [("agent_name", hog.as_str()), ("code", code)];
            anyhow::Ok(metrics.sample("argocd_principal_resource_proxy_requests", &labels))
        }
    };
    // A refusal means the first body was admitted: it fits any cap.
    wait_until(
        "one of the hog's bodies refused",
        Duration::from_secs(10),
        || hog_answered("429"),
    )
    .await?;

    // While the hog holds 4 MiB, another agent writes 2 MiB (what the raw agent's stream takes in
    // one event), and the hog itself reads.
    let started = Instant::now();
    let write = format!(
        r#"{{"kind":"ConfigMap","data":{{"x":"{}"}}}}"#,
        "y".repeat(2 << 20)
    );
    let post = (
        "POST",
        "/api/v1/namespaces/default/configmaps",
        write.as_bytes(),
    );
    let other_pem = (other_pem.0.as_str(), other_pem.1.as_str());
    let ((status, body), relayed) = s
        .through_resource_proxy(other_pem, post, (&other_tx, &mut other_in), (201, "{}"))
        .await?;
    assert_eq!(status, 201, "{body:.300}");
    assert!(relayed.body == write.as_bytes(), "the body relayed whole");
    let get = (
        "GET",
        "/api/v1/namespaces/default/configmaps/x",
        b"".as_slice(),
    );
    let ((status, _), _) = s
        .through_resource_proxy(
            (&hog_pem.0, &hog_pem.1),
            get,
            (&hog_tx, &mut hog_in),
            (200, "{}"),
        )
        .await?;
    assert_eq!(status, 200, "a request without a body takes no place");
    let took = started.elapsed();
    assert!(took < timeout / 2, "served only after {took:?}");
    assert_eq!(
        hog_answered("408").await?,
        None,
        "the hog's body is still held"
    );

    let mut bodies = Vec::new();
    for r in requests {
        bodies.push(r.await??);
    }
    let held = held_or_refused(&bodies, timeout)?;
    eprintln!(
        "[hostile] three stalled 4 MiB bodies of one agent: {} held; another agent's 2 MiB write \
         and the agent's read served in {took:?}",
        held.len()
    );
    assert_eq!(held.len(), 1, "the hog's bodies held");
    for b in bodies
        .iter()
        .filter(|b| !b.status().is_empty() && b.answered(429))
    {
        assert!(b.answer.contains("one agent's may declare"), "{}", b.answer);
    }
    Ok(())
}

/// Reads from `conn` until what arrived contains `needle` (within 10 s); returns it all.
async fn read_until(conn: &mut tokio::net::TcpStream, needle: &str) -> anyhow::Result<String> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !String::from_utf8_lossy(&buf).contains(needle) {
            if conn.read_buf(&mut buf).await? == 0 {
                break;
            }
        }
        anyhow::Ok(())
    })
    .await
    .map_err(|_| {
        anyhow::anyhow!(
            "no {needle:?} within 10 s: {:?}",
            String::from_utf8_lossy(&buf)
        )
    })??;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Clients connected to `redis` besides the one asking, as its `CLIENT LIST` counts them.
/// The clients of `redis` holding a subscription (`sub`, `psub` or `ssub` above 0 in CLIENT LIST):
/// the agent's pooled command connections are not counted, they stay open by design.
async fn redis_subscribers(redis: &Redis) -> anyhow::Result<usize> {
    let password = redis.password.as_deref().unwrap_or_default();
    let mut probe = redis_connection(&redis.address(), password).await?;
    let list = resp_exchange(&mut probe, &["CLIENT", "LIST"]).await?;
    let subscribed = |line: &str| {
        line.split_whitespace().any(
            |field| matches!(field.split_once('='), Some(("sub" | "psub" | "ssub", n)) if n != "0"),
        )
    };
    Ok(list
        .lines()
        .filter(|l| l.contains("id=") && subscribed(l))
        .count())
}

/// A connection to `address` authenticated with `password`.
async fn redis_connection(address: &str, password: &str) -> anyhow::Result<tokio::net::TcpStream> {
    let mut conn = tokio::net::TcpStream::connect(address).await?;
    let ok = resp_exchange(&mut conn, &["AUTH", password]).await?;
    anyhow::ensure!(ok == "+OK\r\n", "AUTH answered {ok:?}");
    Ok(conn)
}

#[tokio::test]
async fn short_lived_redis_subscriptions_end_on_the_spoke_when_the_client_goes_and_clients_are_capped(
) -> anyhow::Result<()> {
    const PER_IP: usize = 100;
    const WAVES: usize = 20;
    let planes = shared_planes().await;
    let hub_password = format!("hub-{}", uuid::Uuid::new_v4().simple());
    let spoke_password = format!("spoke-{}", uuid::Uuid::new_v4().simple());
    let hub_redis = Redis::start_with_password(&format!("subs-{hub_password}"), &hub_password)?;
    let spoke_redis =
        Redis::start_with_password(&format!("subs-{spoke_password}"), &spoke_password)?;
    let s = LonePrincipal::start(
        "redis_subscriptions",
        &[
            &format!("--redis-server-address={}", hub_redis.address()),
            &format!("--redis-password={hub_password}"),
            &format!("--redis-proxy-max-connections-per-ip={PER_IP}"),
            "--redis-proxy-max-subscriptions-per-connection=2",
        ],
    )
    .await?;
    let (ctx, pki, principal) = (&s.ctx, &s.pki, &s.principal);
    let name = ctx.unique("subs");
    pki.issue_agent(&name)?;
    let agent = Agent::start(
        &name,
        &ctx.dir,
        &planes.spokes[0],
        pki,
        &principal.address(),
        &ctx.unique("spoke-argocd"),
        &[
            &format!("--redis-address={}", spoke_redis.address()),
            &format!("--redis-password={spoke_password}"),
        ],
    )
    .await?;
    agent.wait_connected().await?;
    let proxy = format!("127.0.0.1:{}", principal.redis_proxy_port);
    let pid = principal.process.pid().expect("principal running");
    let baseline_clients = redis_subscribers(&spoke_redis).await?;
    let rss = RssUnderAttack::start(pid, "2,000 short-lived Redis SUBSCRIBE clients")?;

    // 10x the issue's 200: waves of PER_IP clients that each SUBSCRIBE to a key of the agent
    // and go away once the agent confirmed.
    let mut peak_clients = baseline_clients;
    let started = Instant::now();
    for wave in 0..WAVES {
        let mut open = Vec::new();
        for i in 0..PER_IP {
            // The principal frees the slots of the last wave as it sees each connection end.
            let mut conn = wait_until("a free slot on the proxy", Duration::from_secs(10), || {
                redis_connection(&proxy, &hub_password).map(|c| c.map(Some))
            })
            .await?;
            let channel = format!("app|resources-tree|{name}_app{wave}x{i}|1.8.3");
            let reply = resp_exchange(&mut conn, &["SUBSCRIBE", &channel]).await?;
            anyhow::ensure!(reply.starts_with("*3"), "SUBSCRIBE answered {reply:?}");
            open.push(conn);
        }
        if wave == 0 {
            // Every slot of this IP is taken: the next client is told so, in Redis's words.
            let mut over = tokio::net::TcpStream::connect(&proxy).await?;
            let refused = read_until(&mut over, "\r\n").await?;
            eprintln!("[hostile] client over the per-IP cap: {refused:?}");
            assert!(
                refused.starts_with("-ERR max number of clients reached")
                    && refused.contains("--redis-proxy-max-connections-per-ip"),
                "{refused}"
            );
            peak_clients = redis_subscribers(&spoke_redis).await?;
        }
        drop(open);
    }
    let took = started.elapsed();
    let spoke_clients = wait_until(
        "the spoke Redis back to its subscribers before the attack",
        Duration::from_secs(30),
        || async {
            match redis_subscribers(&spoke_redis).await? {
                n if n <= baseline_clients => Ok(Some(n)),
                n => Err(anyhow::anyhow!("{n} clients")),
            }
        },
    )
    .await;
    eprintln!(
        "[hostile] {} short-lived SUBSCRIBE clients in {took:?} ({PER_IP} at once): spoke Redis \
         clients {baseline_clients} → {peak_clients} with a wave open → back to {:?}",
        WAVES * PER_IP,
        spoke_clients.as_ref().ok()
    );
    assert!(
        peak_clients > baseline_clients,
        "the agent subscribed on its Redis ({peak_clients} clients)"
    );
    spoke_clients.map_err(|e| anyhow::anyhow!("{e}\n{}", agent.process.log_tail(20)))?;
    rss.check_bound()?;

    // One connection holds at most two channels on agents; the third is refused, not dropped.
    let mut conn = redis_connection(&proxy, &hub_password).await?;
    use tokio::io::AsyncWriteExt;
    let channels: Vec<String> = (0..3)
        .map(|i| format!("app|resources-tree|{name}_capped{i}|1.8.3"))
        .collect();
    let mut cmd = vec!["SUBSCRIBE"];
    cmd.extend(channels.iter().map(String::as_str));
    conn.write_all(&resp_command(&cmd)).await?;
    let replies = read_until(&mut conn, "until that agent closes it)\r\n").await?;
    assert_eq!(
        replies.matches("$9\r\nsubscribe\r\n").count(),
        2,
        "{replies}"
    );
    assert!(
        replies.contains("max number of subscriptions reached")
            && replies.contains("--redis-proxy-max-subscriptions-per-connection"),
        "{replies}"
    );
    // The connection still serves.
    let pong = resp_exchange(&mut conn, &["PING"]).await?;
    assert!(pong.to_ascii_uppercase().contains("PONG"), "{pong}");

    // UNSUBSCRIBE frees a slot: the agent ends that channel's subscriber on the spoke Redis at
    // once (the other channel's stays), and a new channel fits.
    let holding = redis_subscribers(&spoke_redis).await?;
    let reply = resp_exchange(&mut conn, &["UNSUBSCRIBE", &channels[0]]).await?;
    assert!(
        reply.contains("unsubscribe") && reply.contains(&channels[0]) && reply.ends_with(":1\r\n"),
        "{reply}"
    );
    let after_unsubscribe = wait_until(
        "the agent ended the unsubscribed channel on its Redis",
        Duration::from_secs(10),
        || async {
            match redis_subscribers(&spoke_redis).await? {
                n if n == holding - 1 => Ok(Some(n)),
                n => Err(anyhow::anyhow!("{n} clients (holding {holding})")),
            }
        },
    )
    .await?;
    let reply = resp_exchange(&mut conn, &["SUBSCRIBE", &channels[2]]).await?;
    eprintln!(
        "[hostile] spoke Redis clients {holding} → {after_unsubscribe} after UNSUBSCRIBE; \
         SUBSCRIBE of another channel: {reply:?}"
    );
    assert!(
        reply.starts_with("*3") && reply.contains(&channels[2]) && reply.ends_with(":2\r\n"),
        "{reply}"
    );
    Ok(())
}
