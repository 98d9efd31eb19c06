//! Transport modes beyond mutual TLS, on the real ground (real kube-apiservers, our binaries, and
//! upstream argocd-agent v0.9.0's Go agent where the wire is crossed):
//!
//! - Service-mesh mode: the principal with `--insecure-plaintext --auth=header:<header>:<regex>`
//!   behind a sidecar stand-in ([`MeshSidecar`], a plain HTTP/2 hop that sets Istio's
//!   `x-forwarded-client-cert` as a sidecar does after terminating mTLS); our agent and upstream's
//!   Go agent with `--insecure-plaintext` connect through it, are named by the header, and get
//!   their hub Applications. Without the sidecar (no header) the principal refuses the login with
//!   its reason, and the name in the header is what decides the agent. With `--enable-websocket`
//!   the plaintext listener tells gRPC over WebSocket from HTTP/2 by the first bytes and the
//!   header decides on both.
//! - TLS material from Kubernetes Secrets (`--tls-secret-name`, `--tls-ca-secret-name` on the
//!   principal, `--tls-secret-name`, `--root-ca-secret-name` on the agent) instead of files: both
//!   sides connect with it, a certificate rotated in the Secret is served to new connections
//!   without a restart, and a missing Secret stops the principal naming it and the flag.
//! - The invalid combinations refused at start with upstream's reasons: header auth without
//!   `--insecure-plaintext`, mtls auth with it, and an agent given both `--insecure-plaintext` and
//!   certificate files.

use std::time::Duration;

use argocd_agent_proto::pb::authapi::authentication_client::AuthenticationClient;
use argocd_agent_proto::pb::authapi::AuthRequest;
use argocd_agent_proto::version::version_string;
use argocd_agent_runtime::dial::{
    dial_grpc_plaintext, dial_grpc_websocket, GrpcChannel, GrpcDialOptions, WebSocketTarget,
};
use argocd_agent_runtime::tls::ReloadingClientConfig;
use argocd_agent_runtime::tls::{parse_certificates, PemInput};
use e2e::binaries::project_binary;
use e2e::gateway::{
    application, client_tls, ensure_namespace, forge_client_cert_shaped, http_get, tls_connect,
    Agent, Pki, Principal,
};
use e2e::mesh_sidecar::{xfcc_for, MeshSidecar, XFCC, XFCC_AGENT_REGEX};
use e2e::upstream::UpstreamAgent;
use e2e::{shared_planes, wait_until, TestContext};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_secs(60);

/// `--auth` of a principal behind the mesh: the agent is the service account in the SPIFFE URI.
fn header_auth() -> String {
    format!("--auth=header:{XFCC}:{XFCC_AGENT_REGEX}")
}

/// Authenticate over plaintext at `address` (HTTP/2, or gRPC over WebSocket when `websocket`),
/// optionally sending `xfcc` as the mesh header (what a client reaching the principal without a
/// sidecar could send); the principal's answer, or its refusal's message.
async fn plaintext_login_over(
    address: &str,
    xfcc: Option<&str>,
    websocket: bool,
) -> Result<String, String> {
    let channel = if websocket {
        let target = WebSocketTarget::<ReloadingClientConfig>::Plaintext(address.to_string());
        dial_grpc_websocket(target, GrpcDialOptions::default(), 1 << 20)
            .await
            .map(GrpcChannel::WebSocket)
            .map_err(|e| format!("dial: {e}"))?
    } else {
        dial_grpc_plaintext(address, GrpcDialOptions::default())
            .await
            .map(GrpcChannel::Http2)
            .map_err(|e| format!("dial: {e}"))?
    };
    let mut req = tonic::Request::new(AuthRequest {
        method: "header".into(),
        credentials: Default::default(),
        mode: "managed".into(),
        version: version_string(),
        agent_namespace: "argocd".into(),
    });
    if let Some(value) = xfcc {
        req.metadata_mut()
            .insert(XFCC, value.parse().expect("ascii header"));
    }
    AuthenticationClient::new(channel)
        .authenticate(req)
        .await
        .map(|r| r.into_inner().access_token)
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

/// [`plaintext_login_over`] HTTP/2.
async fn plaintext_login(address: &str, xfcc: Option<&str>) -> Result<String, String> {
    plaintext_login_over(address, xfcc, false).await
}

/// An Application created in `agent`'s hub namespace reaches its spoke namespace `spoke_ns`.
async fn hub_app_reaches_spoke(
    hub: &kube::Client,
    spoke: &kube::Client,
    agent: &str,
    spoke_ns: &str,
    app: &str,
    logs: impl Fn() -> String,
) -> anyhow::Result<()> {
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), agent, &e2e::gateway::application_resource());
    hub_apps
        .create(&PostParams::default(), &application(app, agent, "v1"))
        .await?;
    let spoke_apps: Api<DynamicObject> = Api::namespaced_with(
        spoke.clone(),
        spoke_ns,
        &e2e::gateway::application_resource(),
    );
    wait_until(&format!("{app} on {agent}'s spoke"), WAIT, || async {
        Ok::<_, kube::Error>(spoke_apps.get_opt(app).await?.map(|_| ()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))
}

/// A principal with header auth on its plaintext listener (`extra` flags beside) in a fresh test
/// context `name`, with the context and its PKI.
async fn mesh_principal(
    name: &str,
    extra: &[&str],
) -> anyhow::Result<(TestContext, Pki, Principal)> {
    let planes = shared_planes().await;
    let ctx = TestContext::new(name)?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let mut args = vec!["--insecure-plaintext".to_string(), header_auth()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let principal = Principal::start(
        "p",
        &ctx.dir,
        &planes.hub,
        &pki,
        &ctx.unique("argocd"),
        &args,
    )
    .await?;
    Ok((ctx, pki, principal))
}

#[tokio::test]
async fn header_auth_behind_a_mesh_sidecar_names_our_agent_and_serves_it() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let (ctx, _pki, principal) = mesh_principal("mesh_ours", &[]).await?;
    let hub = planes.hub.client().await?;
    assert!(
        principal
            .process
            .log_tail(200)
            .contains("INSECURE: the agent gRPC listener runs WITHOUT TLS"),
        "the principal warns loudly about plaintext:\n{}",
        principal.process.log_tail(40)
    );

    // The agent's name comes from the sidecar's header; it has no certificate at all.
    let name = ctx.unique("mesh-agent");
    ensure_namespace(&hub, &name).await?;
    let sidecar =
        MeshSidecar::start(&principal.address(), XFCC, &xfcc_for(&name, "agents")).await?;
    let spoke_ns = ctx.unique("spoke-argocd");
    let agent = Agent::start_plaintext(
        &name,
        &ctx.dir,
        &planes.spokes[0],
        &sidecar.address(),
        &spoke_ns,
        &[],
    )
    .await?;
    agent.wait_connected().await?;
    assert!(
        agent
            .process
            .log_tail(200)
            .contains("INSECURE: connecting to the principal WITHOUT TLS"),
        "the agent warns loudly about plaintext:\n{}",
        agent.process.log_tail(40)
    );
    let spoke = planes.spokes[0].client().await?;
    hub_app_reaches_spoke(&hub, &spoke, &name, &spoke_ns, "mesh-app", || {
        format!(
            "--- principal ---\n{}\n--- agent ---\n{}",
            principal.process.log_tail(30),
            agent.process.log_tail(30)
        )
    })
    .await?;

    // Straight to the principal, no sidecar, no header: refused, saying which header is missing.
    let refused = plaintext_login(&principal.address(), None)
        .await
        .unwrap_err();
    assert!(
        refused.starts_with("Unauthenticated")
            && refused.contains("header \"x-forwarded-client-cert\" not found"),
        "{refused}"
    );
    // A header the regex does not match names nobody; one naming an invalid agent neither.
    let refused = plaintext_login(&principal.address(), Some("Hash=abc"))
        .await
        .unwrap_err();
    assert!(
        refused.contains("does not match the extraction regex"),
        "{refused}"
    );
    let refused = plaintext_login(
        &principal.address(),
        Some(&xfcc_for("Not_A_Name", "agents")),
    )
    .await
    .unwrap_err();
    assert!(refused.contains("names an invalid agent"), "{refused}");
    // Positive control: the same call with a well-formed header is answered with a token.
    let token = plaintext_login(
        &principal.address(),
        Some(&xfcc_for("other-agent", "agents")),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert!(!token.is_empty());
    Ok(())
}

/// `--insecure-plaintext` with `--enable-websocket`: without TLS there is no ALPN, so the
/// listener tells each connection by its first bytes; a login over gRPC-over-WebSocket (the
/// header travelling on the upgrade, as a sidecar passing HTTP/1.1 would set it) and one over
/// HTTP/2 on the same port are both answered, and both are refused without the header.
#[tokio::test]
async fn header_auth_on_the_plaintext_listener_serves_websocket_and_http2_on_one_port(
) -> anyhow::Result<()> {
    let (_ctx, _pki, principal) = mesh_principal("mesh_websocket", &["--enable-websocket"]).await?;
    let address = principal.address();
    for websocket in [true, false] {
        let token =
            plaintext_login_over(&address, Some(&xfcc_for("ws-agent", "agents")), websocket)
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "websocket={websocket}: {e}\n{}",
                        principal.process.log_tail(30)
                    )
                })?;
        assert!(!token.is_empty());
        let refused = plaintext_login_over(&address, None, websocket)
            .await
            .unwrap_err();
        assert!(
            refused.starts_with("Unauthenticated")
                && refused.contains("header \"x-forwarded-client-cert\" not found"),
            "websocket={websocket}: {refused}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn upstream_go_agent_with_header_creds_through_the_sidecar_on_our_principal(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let (ctx, pki, principal) = mesh_principal("mesh_go", &[]).await?;
    let hub = planes.hub.client().await?;
    let name = ctx.unique("go-mesh");
    ensure_namespace(&hub, &name).await?;
    // The Go agent's certificate names somebody else: in plaintext mode it is not used, and the
    // header alone decides who the agent is.
    pki.issue_agent("not-this-agent")?;
    let sidecar =
        MeshSidecar::start(&principal.address(), XFCC, &xfcc_for(&name, "agents")).await?;
    let spoke_ns = ctx.unique("spoke-argocd");
    let agent = UpstreamAgent::start(
        "not-this-agent",
        &ctx.dir,
        &planes.spokes[1],
        &pki,
        &sidecar.address(),
        "managed",
        &spoke_ns,
        None,
        &["--insecure-plaintext", "--creds=header:"],
    )
    .await?;
    let spoke = planes.spokes[1].client().await?;
    hub_app_reaches_spoke(&hub, &spoke, &name, &spoke_ns, "go-mesh-app", || {
        format!(
            "--- principal ---\n{}\n--- go agent ---\n{}",
            principal.process.log_tail(30),
            agent.process.log_tail(30)
        )
    })
    .await?;
    Ok(())
}

/// Runs `binary` with `args` (no environment) to its exit; (exit code, stderr).
fn run_to_exit(binary: &str, args: &[String]) -> (Option<i32>, String) {
    let out = std::process::Command::new(project_binary(binary).expect("built"))
        .args(args)
        .env_clear()
        .output()
        .expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn invalid_transport_and_auth_combinations_are_refused_with_their_reason(
) -> anyhow::Result<()> {
    let ctx = TestContext::new("transport_flags")?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    pki.issue_agent("agent")?;
    let principal = |extra: &[&str]| {
        let mut args: Vec<String> = pki.principal_args().to_vec();
        args.extend([
            "--namespace=argocd".to_string(),
            "--listen-address=127.0.0.1:0".into(),
        ]);
        args.extend(extra.iter().map(|s| s.to_string()));
        run_to_exit("argocd-principal", &args)
    };
    // Header auth over TLS would trust a header any client can send: refused, as upstream does.
    let (code, stderr) = principal(&[&header_auth()]);
    assert_eq!(code, Some(2), "{stderr}");
    for reason in [
        "header-based authentication requires --insecure-plaintext=true",
        "add --insecure-plaintext",
        "--auth=mtls:<regex>",
    ] {
        assert!(stderr.contains(reason), "{reason}: {stderr}");
    }
    // mtls auth without TLS has no certificate to read.
    let (code, stderr) = principal(&["--insecure-plaintext"]);
    assert_eq!(code, Some(2), "{stderr}");
    for reason in [
        "mtls authentication cannot be used with --insecure-plaintext",
        "remove --insecure-plaintext",
        "--auth=header:<header>:<regex>",
    ] {
        assert!(stderr.contains(reason), "{reason}: {stderr}");
    }
    // A malformed header config says what the format is.
    let (code, stderr) = principal(&["--insecure-plaintext", "--auth=header:x-agent-id"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("format <header-name>:<extraction-regex>"),
        "{stderr}"
    );

    // The agent: plaintext with certificate files is refused (they would not be used); half a
    // key pair is refused as upstream does.
    let (cert, key) = pki.agent_files("agent");
    let agent = |extra: &[String]| {
        let mut args = vec![
            "--server-address=127.0.0.1:1".to_string(),
            "--namespace=argocd".into(),
            format!("--queue-dir={}", ctx.dir.join("queue").display()),
        ];
        args.extend(extra.iter().cloned());
        run_to_exit("argocd-agent", &args)
    };
    let (code, stderr) = agent(&[
        "--insecure-plaintext".into(),
        format!("--tls-client-cert={}", cert.display()),
        format!("--tls-client-key={}", key.display()),
        format!("--tls-ca={}", pki.ca().display()),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--tls-client-cert") && stderr.contains("--insecure-plaintext"),
        "{stderr}"
    );
    let (code, stderr) = agent(&[format!("--tls-client-cert={}", cert.display())]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("both --tls-client-cert and --tls-client-key have to be given"),
        "{stderr}"
    );
    Ok(())
}

/// Creates or replaces Secret `name` in `namespace` with `fields` (type `kubernetes.io/tls` when
/// `tls`).
async fn put_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    tls: bool,
    fields: &[(&str, Vec<u8>)],
) -> anyhow::Result<()> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        type_: tls.then(|| "kubernetes.io/tls".to_string()),
        data: Some(
            fields
                .iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.clone())))
                .collect(),
        ),
        ..Default::default()
    };
    api.patch(
        name,
        &PatchParams::apply("transport-modes-test").force(),
        &Patch::Apply(&secret),
    )
    .await?;
    Ok(())
}

/// A new server certificate for localhost/127.0.0.1 from the PKI's CA: (cert PEM, key PEM).
fn new_principal_certificate(pki: &Pki) -> anyhow::Result<(String, String)> {
    forge_client_cert_shaped(pki, "principal-rotated", |p| {
        p.subject_alt_names = vec![
            rcgen::SanType::DnsName("localhost".try_into().expect("dns name")),
            rcgen::SanType::IpAddress([127, 0, 0, 1].into()),
        ];
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    })
}

/// The DER of the certificate the principal at `address` presents to a new connection.
async fn served_certificate(pki: &Pki, address: &str, agent: &str) -> anyhow::Result<Vec<u8>> {
    let (cert, key) = pki.agent_files(agent);
    let (cert, key) = (
        std::fs::read_to_string(cert)?,
        std::fs::read_to_string(key)?,
    );
    let tls = client_tls(pki, Some((&cert, &key)), &[b"h2"])?;
    let stream = tls_connect(address, std::sync::Arc::new(tls)).await?;
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or_else(|| anyhow::anyhow!("no server certificate"))?;
    Ok(leaf.as_ref().to_vec())
}

fn der_of(pem: &str) -> Vec<u8> {
    let certs = parse_certificates(PemInput::new("test", pem.as_bytes())).expect("certificate");
    certs[0].as_ref().to_vec()
}

#[tokio::test]
async fn tls_from_secrets_on_both_sides_and_a_rotated_principal_certificate_is_served(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let ctx = TestContext::new("tls_secrets")?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let hub = planes.hub.client().await?;
    let read = |f: &str| std::fs::read(pki.dir.join(f)).expect("pki file");
    // No PEM files: both sides fall back to their Secrets.
    let jwt_only = [pki.jwt_key_arg()];

    // Without the Secrets the principal waits, alive and not ready, naming the Secret, the
    // flag and the command that creates it.
    let missing_ns = ctx.unique("no-secrets");
    ensure_namespace(&hub, &missing_ns).await?;
    let mut waiting = Principal::spawn_with_credentials(
        "waiting",
        &ctx.dir,
        &planes.hub,
        &jwt_only,
        &missing_ns,
        &[],
    )?;
    let missing =
        format!("--tls-secret-name: Secret {missing_ns}/argocd-agent-principal-tls: not found");
    let body = wait_until(
        "/readyz of a principal without its TLS Secret",
        WAIT,
        || async {
            let (status, body) = http_get(waiting.ops_port, "/readyz").await?;
            Ok::<_, anyhow::Error>((status == 503 && body.contains(&missing)).then_some(body))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", waiting.process.log_tail(20)))?;
    assert!(
        body.contains("argocd-agentctl pki issue principal"),
        "{body}"
    );
    let log = waiting.process.log_tail(20);
    assert!(log.contains(&missing), "{log}");
    assert!(
        waiting.process.is_running(),
        "waits instead of exiting:\n{log}"
    );
    drop(waiting);

    // The principal's certificate and the agent CA from Secrets in its namespace.
    let principal_ns = ctx.unique("argocd");
    ensure_namespace(&hub, &principal_ns).await?;
    put_secret(
        &hub,
        &principal_ns,
        "argocd-agent-principal-tls",
        true,
        &[
            ("tls.crt", read("principal.crt")),
            ("tls.key", read("principal.key")),
        ],
    )
    .await?;
    put_secret(
        &hub,
        &principal_ns,
        "argocd-agent-ca",
        true,
        &[("tls.crt", read("ca.crt")), ("tls.key", read("ca.key"))],
    )
    .await?;
    let principal = Principal::spawn_with_credentials(
        "p",
        &ctx.dir,
        &planes.hub,
        &jwt_only,
        &principal_ns,
        &[],
    )?;
    principal.wait_ready().await?;

    // The agent's client certificate and the CA from Secrets in its spoke namespace.
    let name = ctx.unique("secret-agent");
    pki.issue_agent(&name)?;
    ensure_namespace(&hub, &name).await?;
    let spoke = planes.spokes[0].client().await?;
    let spoke_ns = ctx.unique("spoke-argocd");
    ensure_namespace(&spoke, &spoke_ns).await?;
    let (agent_cert, agent_key) = pki.agent_files(&name);
    put_secret(
        &spoke,
        &spoke_ns,
        "argocd-agent-client-tls",
        true,
        &[
            ("tls.crt", std::fs::read(agent_cert)?),
            ("tls.key", std::fs::read(agent_key)?),
        ],
    )
    .await?;
    put_secret(
        &spoke,
        &spoke_ns,
        "argocd-agent-ca",
        false,
        &[("ca.crt", read("ca.crt"))],
    )
    .await?;
    let agent = Agent::start_with_transport(
        &name,
        &ctx.dir,
        &planes.spokes[0],
        &principal.address(),
        &spoke_ns,
        &["--tls-server-name=localhost".to_string()],
        &[],
    )
    .await?;
    agent.wait_connected().await?;
    hub_app_reaches_spoke(&hub, &spoke, &name, &spoke_ns, "secret-app", || {
        format!(
            "--- principal ---\n{}\n--- agent ---\n{}",
            principal.process.log_tail(30),
            agent.process.log_tail(30)
        )
    })
    .await?;
    assert_eq!(
        served_certificate(&pki, &principal.address(), &name).await?,
        der_of(&String::from_utf8(read("principal.crt"))?),
        "the principal serves the certificate of its Secret"
    );

    // Rotation: a new certificate in the Secret is what new connections get, without a restart.
    let (rotated_cert, rotated_key) = new_principal_certificate(&pki)?;
    put_secret(
        &hub,
        &principal_ns,
        "argocd-agent-principal-tls",
        true,
        &[
            ("tls.crt", rotated_cert.clone().into_bytes()),
            ("tls.key", rotated_key.into_bytes()),
        ],
    )
    .await?;
    let rotated = der_of(&rotated_cert);
    wait_until("the rotated certificate is served", WAIT, || {
        let (pki, address, name, rotated) = (&pki, principal.address(), &name, &rotated);
        async move {
            let served = served_certificate(pki, &address, name).await?;
            Ok::<_, anyhow::Error>((&served == rotated).then_some(()))
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", principal.process.log_tail(30)))?;
    // And the agent, trusting the same CA, still gets through to it after a restart.
    let mut agent = agent;
    agent.process.restart()?;
    agent.wait_connected().await?;
    Ok(())
}
