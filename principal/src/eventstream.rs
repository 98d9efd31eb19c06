//! The `eventstreamapi.EventStream` service: one bidirectional `Subscribe` stream per agent.
//!
//! Path of a stream: the connection's certificate identity and the access token must name the same
//! agent ([`authorize_stream`]), whose mode must still be the pinned one ([`crate::mode_pin`]); the agent's session is taken over (an older stream of the same agent
//! ends); the checksum resync the connection calls for ([`crate::hub::Hub::on_connect`]; an
//! autonomous agent's hub namespace must exist or be creatable) is queued; then the shared delivery engine runs the
//! stream until either side ends it, a newer stream of the agent supersedes it or the principal shuts down. Undelivered events stay in the session's outbox. Every event
//! sent carries the principal's identity (`principaluid`, [`crate::identity`]) once it is known.

use std::pin::Pin;
use std::sync::Arc;

use argocd_agent_proto::event::{stamp_principal_uid, stream_event_labels};
use argocd_agent_proto::mode::AgentMode;
use argocd_agent_proto::pb::eventstreamapi::event_stream_server::EventStream;
use argocd_agent_proto::pb::eventstreamapi::{
    Event as WireEvent, PingRequest, PongReply, PushSummary,
};
use argocd_agent_proto::sync::{run_stream, Instrumented, Lanes, StreamEnd};
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::authorize_stream;
use crate::hub::Hub;
use crate::inbound::AgentInbound;
use crate::metrics::PrincipalMetrics;
use crate::sessions::AgentRegistry;
use crate::tokens::TokenIssuer;

/// Number of inbound processing lanes per agent stream.
const LANES: usize = 8;
/// Events buffered per lane before the stream reader waits.
const LANE_DEPTH: usize = 64;

/// Implements `eventstreamapi.EventStream`.
pub struct EventStreamService {
    /// Token validation.
    pub issuer: Arc<TokenIssuer>,
    /// Sessions.
    pub registry: Arc<AgentRegistry>,
    /// Hub view.
    pub hub: Arc<Hub>,
    /// Metrics.
    pub metrics: Arc<PrincipalMetrics>,
    /// Live requests waiting on agents (told when an agent's stream starts and ends).
    pub live: Arc<crate::live::LiveRequests>,
    /// The principal's identity, stamped on every event sent.
    pub identity: crate::identity::PrincipalIdentity,
    /// Each agent's pinned mode (checked again: an admin may have re-pinned it).
    pub pins: Arc<crate::mode_pin::ModePins>,
    /// Agents' cluster info in the hub Argo CD's cache.
    pub cluster_info: Arc<crate::cluster_info::ClusterInfoWriter>,
    /// Cancelled when the principal shuts down: every stream then ends (the agents reconnect to
    /// the next principal), so the gRPC server's graceful stop does not wait for them.
    pub shutdown: tokio_util::sync::CancellationToken,
}

type EventResponseStream = Pin<Box<dyn Stream<Item = Result<WireEvent, Status>> + Send>>;

#[tonic::async_trait]
impl EventStream for EventStreamService {
    type SubscribeStream = EventResponseStream;

    async fn subscribe(
        &self,
        req: Request<Streaming<WireEvent>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let (agent, mode) = authorize_stream(&req, &self.issuer, &self.metrics)?;
        // A token issued before an admin re-pinned the agent does not open a stream.
        self.pins
            .verify(&agent, mode)
            .await
            .inspect_err(|_| self.metrics.auth_failure("mode_pinned"))?;
        if mode == AgentMode::Autonomous {
            if let Err(reason) = self.hub.ensure_agent_namespace(agent.as_str()).await {
                tracing::error!(
                    agent = agent.as_str(),
                    "refusing an autonomous agent: {reason}"
                );
                return Err(Status::failed_precondition(reason));
            }
        }
        let session = self.registry.get_or_create(&agent, mode);
        let generation = session.take_over(mode);
        let inbound = req.into_inner();
        let (out_tx, out_rx) = mpsc::channel::<WireEvent>(256);
        // Ends the response with the reason when the agent's side of the stream failed (e.g. a
        // message over the size limit), so the agent sees why instead of a silent end.
        let (end_tx, end_rx) = oneshot::channel::<Status>();
        let hub = self.hub.clone();
        let metrics = self.metrics.clone();
        let live = self.live.clone();
        let cluster_info = self.cluster_info.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            metrics.connections.inc();
            metrics.connected_agents.inc();
            metrics.agent_connection(agent.as_str(), mode.as_str(), true);
            tracing::info!(
                agent = agent.as_str(),
                mode = mode.as_str(),
                "agent connected"
            );
            {
                let (hub, session) = (hub.clone(), session.clone());
                tokio::spawn(async move { hub.on_connect(&session).await });
            }
            live.agent_connected(agent.as_str());
            let (ctl_tx, mut ctl_rx) = mpsc::channel(1024);
            let handler = Arc::new(
                Instrumented::new(
                    AgentInbound {
                        session: session.clone(),
                        hub: hub.clone(),
                        live: live.clone(),
                        cluster_info,
                        status_writes: Default::default(),
                    },
                    metrics.handling.for_peer("agent_name", agent.as_str()),
                )
                .counting_errors(metrics.event_errors.clone()),
            );
            let lanes = Lanes::start(handler, LANES, LANE_DEPTH, ctl_tx);
            let end = run_stream(
                inbound,
                out_tx,
                &session.outbox,
                &mut ctl_rx,
                &lanes,
                async {
                    tokio::select! {
                        () = session.superseded(generation) => {}
                        () = shutdown.cancelled() => {}
                    }
                },
                |ev| {
                    PrincipalMetrics::count_event(&metrics.events_received, &ev.event_type);
                    metrics.agent_event(agent.as_str());
                },
            )
            .await;
            drop(ctl_rx);
            live.agent_disconnected(agent.as_str());
            lanes.drain().await;
            metrics.connected_agents.dec();
            if session.is_live(generation) {
                metrics.agent_connection(agent.as_str(), mode.as_str(), false);
            }
            let pending = session.outbox.resources();
            match end {
                StreamEnd::PeerClosed => {
                    tracing::info!(agent = agent.as_str(), pending, "agent disconnected")
                }
                StreamEnd::Error(status) => {
                    tracing::info!(agent = agent.as_str(), pending, error = %status.message(), "agent stream failed");
                    let _ = end_tx.send(status);
                }
                StreamEnd::Shutdown => tracing::info!(
                    agent = agent.as_str(),
                    pending,
                    "agent stream closed (superseded or shutting down)"
                ),
            }
        });
        let failure = futures::stream::once(end_rx).filter_map(|r| async move { r.ok().map(Err) });
        let sent = self.metrics.clone();
        let identity = self.identity.clone();
        let out = ReceiverStream::new(out_rx)
            .map(move |mut ev| {
                if let Some(uid) = identity.get() {
                    stamp_principal_uid(&mut ev, uid);
                }
                ev
            })
            .inspect(move |ev| {
                // An event without its CloudEvent envelope is not counted.
                if ev.event.is_some() {
                    let (event_type, _) = stream_event_labels(ev);
                    PrincipalMetrics::count_event(&sent.events_sent, &event_type);
                }
            })
            .map(Ok::<_, Status>)
            .chain(failure);
        Ok(Response::new(Box::pin(out)))
    }

    async fn push(
        &self,
        req: Request<Streaming<WireEvent>>,
    ) -> Result<Response<PushSummary>, Status> {
        authorize_stream(&req, &self.issuer, &self.metrics)?;
        Err(Status::unimplemented(
            "Push is not used by agents; use Subscribe",
        ))
    }

    async fn ping(&self, _req: Request<PingRequest>) -> Result<Response<PongReply>, Status> {
        Ok(Response::new(PongReply {}))
    }
}

/// The event stream service with its unary `Ping` answered by a copy of it held to the small
/// pre-authentication message limit ([`crate::auth::AUTH_MAX_MESSAGE_SIZE`]): Ping carries no
/// token, so without this anyone with a certificate could make the principal buffer a message
/// of the stream's size per call.
#[derive(Clone)]
pub struct PingLimited<S> {
    /// Subscribe and Push, with the stream's limit.
    pub stream: S,
    /// Ping, with the small limit.
    pub ping: S,
}

/// Path of the `Ping` method.
pub const PING_PATH: &str = "/eventstreamapi.EventStream/Ping";

impl<S, B> tonic::codegen::Service<http::Request<B>> for PingLimited<S>
where
    S: tonic::codegen::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        match self.stream.poll_ready(cx) {
            std::task::Poll::Ready(Ok(())) => self.ping.poll_ready(cx),
            other => other,
        }
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() == PING_PATH {
            self.ping.call(req)
        } else {
            self.stream.call(req)
        }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for PingLimited<S> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_proto::pb::eventstreamapi::event_stream_server::EventStreamServer;
    use tonic::server::NamedService;

    #[test]
    fn the_ping_path_is_the_generated_services_ping() {
        let name = <EventStreamServer<EventStreamService> as NamedService>::NAME;
        assert_eq!(PING_PATH, format!("/{name}/Ping"));
    }
}
