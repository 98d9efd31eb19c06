//! Speaking the agent protocol by hand: a principal started alone (no agent processes), and the
//! client steps an agent takes (mutual-TLS channel, Authenticate, Subscribe, events and their
//! ACKs, answers to resource-proxy requests) with certificates, tokens and events of the test's
//! choosing, so refusal and attack tests can send what a real agent never would.

use std::time::Duration;

use argocd_agent_proto::event::{Event, Target, AGENT_SOURCE};
use argocd_agent_proto::payload::{ResourceRequest, ResourceResponse};
use argocd_agent_proto::pb::authapi::authentication_client::AuthenticationClient;
use argocd_agent_proto::pb::authapi::{AuthRequest, AuthResponse};
use argocd_agent_proto::pb::eventstreamapi::event_stream_client::EventStreamClient;
use argocd_agent_proto::pb::eventstreamapi::Event as WireEvent;
use argocd_agent_proto::version::version_string;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status, Streaming};

use crate::gateway::{client_tls, grpc_channel, https_request, Pki, Principal};
use crate::shared::{shared_planes, TestContext};

/// How long [`next_matching`] waits for the event it looks for.
const EVENT_WAIT: Duration = Duration::from_secs(30);

/// A principal on the shared hub with no agents, its PKI and the test's context.
pub struct LonePrincipal {
    /// The test's context (names, directory, log tails on failure).
    pub ctx: TestContext,
    /// The PKI the principal trusts.
    pub pki: Pki,
    /// The principal, in namespace `argocd-<suffix>`.
    pub principal: Principal,
}

impl LonePrincipal {
    /// Starts a principal for test `test` with `extra` flags and waits until it is ready.
    pub async fn start(test: &str, extra: &[&str]) -> anyhow::Result<LonePrincipal> {
        let planes = shared_planes().await;
        let ctx = TestContext::new(test)?;
        let pki = Pki::create(&ctx.dir.join("pki"))?;
        let principal = Principal::start(
            "p",
            &ctx.dir,
            &planes.hub,
            &pki,
            &ctx.unique("argocd"),
            extra,
        )
        .await?;
        Ok(LonePrincipal {
            ctx,
            pki,
            principal,
        })
    }

    /// Authenticates as a managed agent presenting `identity` (cert PEM, key PEM) over h2.
    pub async fn try_authenticate(&self, identity: (&str, &str)) -> Result<AuthResponse, String> {
        try_authenticate(
            &self.pki,
            &self.principal.address(),
            Some(identity),
            &[b"h2"],
            "managed",
        )
        .await
    }

    /// An HTTP/1.1 `method` request for `path` with `body` through the principal's resource proxy,
    /// presenting `identity`, which the raw agent on (`tx`, `inbound`) answers with `answer`
    /// (status, JSON body): returns the (status, body) the client got and the request the agent
    /// got.
    pub async fn through_resource_proxy(
        &self,
        identity: (&str, &str),
        (method, path, body): (&str, &str, &[u8]),
        (tx, inbound): (&mpsc::Sender<WireEvent>, &mut Streaming<WireEvent>),
        (status, answer): (i64, &str),
    ) -> anyhow::Result<((u16, String), ResourceRequest)> {
        let port = self.principal.resource_proxy_port;
        let (answer, request) = tokio::join!(
            https_request(&self.pki, port, identity, method, path, body),
            answer_resource_request(tx, inbound, status, answer)
        );
        Ok((answer?, request?))
    }

    /// Opens an event stream presenting `identity` and bearer `token`; returns the sender of
    /// outbound events and the inbound stream.
    pub async fn subscribe(
        &self,
        identity: (&str, &str),
        token: &str,
    ) -> Result<(mpsc::Sender<WireEvent>, Streaming<WireEvent>), Status> {
        let tls = client_tls(&self.pki, Some(identity), &[b"h2"])
            .map_err(|e| Status::invalid_argument(format!("client TLS: {e}")))?;
        let ch = grpc_channel(&self.principal.address(), tls)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let (tx, rx) = mpsc::channel(16);
        let mut req = Request::new(ReceiverStream::new(rx));
        req.metadata_mut().insert(
            "authorization",
            token
                .parse()
                .map_err(|_| Status::invalid_argument("token is not ASCII"))?,
        );
        let inbound = EventStreamClient::new(ch)
            .subscribe(req)
            .await?
            .into_inner();
        Ok((tx, inbound))
    }
}

/// Calls Authenticate (method `mtls`) on `ch` asking for `mode`.
pub async fn authenticate(
    ch: tonic::transport::Channel,
    mode: &str,
) -> Result<AuthResponse, Status> {
    let req = AuthRequest {
        method: "mtls".into(),
        credentials: Default::default(),
        mode: mode.into(),
        version: version_string(),
        agent_namespace: "argocd".into(),
    };
    Ok(AuthenticationClient::new(ch)
        .authenticate(req)
        .await?
        .into_inner())
}

/// Authenticates at `addr` presenting `identity` (if any) and offering `alpn`, asking for `mode`;
/// any failure, the TLS handshake included, is `Err` with its gRPC code and message.
pub async fn try_authenticate(
    pki: &Pki,
    addr: &str,
    identity: Option<(&str, &str)>,
    alpn: &[&[u8]],
    mode: &str,
) -> Result<AuthResponse, String> {
    let tls = client_tls(pki, identity, alpn).map_err(|e| e.to_string())?;
    let ch = grpc_channel(addr, tls)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    authenticate(ch, mode)
        .await
        .map_err(|e| format!("{:?}: {}", e.code(), e.message()))
}

/// Reads events until one satisfies `pred`, failing after 30 s or when the stream ends.
pub async fn next_matching(
    inbound: &mut Streaming<WireEvent>,
    pred: impl Fn(&Event) -> bool,
) -> anyhow::Result<Event> {
    tokio::time::timeout(EVENT_WAIT, async {
        loop {
            let wire = inbound
                .message()
                .await?
                .ok_or_else(|| anyhow::anyhow!("stream ended"))?;
            let ev = Event::try_from_stream_event(wire)?;
            if pred(&ev) {
                return Ok(ev);
            }
        }
    })
    .await?
}

/// Waits for the next resource-proxy request on `inbound` and answers it as an agent would, with
/// HTTP `status` and the JSON `body`; returns the request.
async fn answer_resource_request(
    tx: &mpsc::Sender<WireEvent>,
    inbound: &mut Streaming<WireEvent>,
    status: i64,
    body: &str,
) -> anyhow::Result<ResourceRequest> {
    let request = next_matching(inbound, |e| e.target == Target::Resource).await?;
    let response = ResourceResponse {
        uuid: request.event_id.clone(),
        status,
        resource: body.into(),
    };
    tx.send(Event::resource_response(AGENT_SOURCE, &response)?.to_stream_event())
        .await?;
    Ok(request.data_as()?)
}

/// Sends `ev` and returns the error of its ACK (`None` = accepted).
pub async fn send_for_ack(
    tx: &mpsc::Sender<WireEvent>,
    inbound: &mut Streaming<WireEvent>,
    ev: &Event,
) -> anyhow::Result<Option<String>> {
    tx.send(ev.to_stream_event()).await?;
    let id = ev.event_id.clone();
    let ack = next_matching(inbound, move |e| e.is_ack() && e.event_id == id).await?;
    Ok(ack.ack_error().map(str::to_string))
}
