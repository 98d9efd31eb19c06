//! The `principal.apis.logstreamapi.LogStreamService` service: container logs that agents (ours
//! and upstream's Go agents alike) push to the principal, relayed to the resource-proxy caller
//! waiting for them.
//!
//! Upstream's contract (v0.9.0): the principal sends a `containerlog` request event; the agent
//! opens one client-streaming `StreamLogs` call per request, whose messages carry the request's
//! UUID: first an empty probe, then the log bytes in chunks, then `eof` (or `error`). A follow
//! stream that broke is resumed by the agent with a new call for the same UUID. The principal ends
//! the call with `CANCELLED` when its HTTP client went away and `NOT_FOUND` for a request nobody
//! waits for; the agent stops on both.
//!
//! Owns the relay from such a call to the caller ([`crate::live::LiveRequests::attach_log_stream`]
//! finds it and checks that the call's agent is the one asked): the probe is held back briefly so
//! that an agent's error right after it still becomes an HTTP error status instead of an empty
//! 200; an error after data aborts the HTTP body (a truncated log never looks complete); and,
//! because upstream agents always ask the kubelet for timestamps, each line's leading timestamp
//! is removed when the caller did not ask for timestamps ([`StampStripper`]); ours does the same.
//! An agent's error that is a Kubernetes `Status` (our agent's refusals, e.g. 403 for a pod Argo
//! CD does not manage) is answered with its own code; any other error is a 500.

use std::sync::Arc;
use std::time::Duration;

use argocd_agent_proto::pb::logstreamapi::log_stream_service_server::LogStreamService;
use argocd_agent_proto::pb::logstreamapi::{LogStreamData, LogStreamResponse};
use futures::{Stream, StreamExt};
use http::StatusCode;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::authorize_stream;
use crate::live::{AttachRefused, LiveReply, LiveRequests};
use crate::metrics::PrincipalMetrics;
use crate::resource_proxy::status_body;
use crate::tokens::TokenIssuer;

/// How long the agent's empty probe is held back waiting for its next message: an error then
/// (e.g. the pod or container does not exist) is answered with an error status.
const PROBE_HOLD: Duration = Duration::from_secs(1);
/// Longest leading token of a line that is still taken for a timestamp (RFC 3339 with
/// nanoseconds and an offset is 35 bytes).
const MAX_STAMP: usize = 40;

/// Implements `LogStreamService` (see the module docs).
pub struct LogStreamRelay {
    /// Token validation (the call carries the agent's access token, as Subscribe does).
    pub issuer: Arc<TokenIssuer>,
    /// Metrics (authentication failures).
    pub metrics: Arc<PrincipalMetrics>,
    /// The callers waiting for logs.
    pub live: Arc<LiveRequests>,
}

#[tonic::async_trait]
impl LogStreamService for LogStreamRelay {
    async fn stream_logs(
        &self,
        req: Request<Streaming<LogStreamData>>,
    ) -> Result<Response<LogStreamResponse>, Status> {
        let (agent, _) = authorize_stream(&req, &self.issuer, &self.metrics)?;
        let mut inbound = req.into_inner();
        let first = inbound.message().await?.ok_or_else(|| {
            Status::invalid_argument("the log stream ended before its first message")
        })?;
        let uuid = first.request_uuid.clone();
        let (tx, timestamps) = self
            .live
            .attach_log_stream(agent.as_str(), &uuid)
            .map_err(|e| match e {
                AttachRefused::Unknown => Status::not_found(e.to_string()),
                AttachRefused::NotYours => Status::permission_denied(e.to_string()),
            })?;
        tracing::debug!(
            agent = agent.as_str(),
            request = %uuid,
            "log stream attached"
        );
        let mut sink = LogSink::new(tx, !timestamps);
        let lines = relay(&uuid, first, inbound, &mut sink).await?;
        Ok(Response::new(LogStreamResponse {
            request_uuid: uuid,
            status: 200,
            error: String::new(),
            lines_received: i32::try_from(lines).unwrap_or(i32::MAX),
        }))
    }
}

/// The status that makes an upstream agent stop streaming for good.
fn detached() -> Status {
    Status::cancelled("client detached")
}

/// The caller's end of one `StreamLogs` call.
struct LogSink {
    tx: mpsc::Sender<LiveReply>,
    stamps: Option<StampStripper>,
    started: bool,
}

impl LogSink {
    fn new(tx: mpsc::Sender<LiveReply>, strip_stamps: bool) -> LogSink {
        LogSink {
            tx,
            stamps: strip_stamps.then(StampStripper::default),
            started: false,
        }
    }

    async fn send(&mut self, reply: LiveReply) -> Result<(), Status> {
        self.started = true;
        self.tx.send(reply).await.map_err(|_| detached())
    }

    /// Log bytes; an empty first call answers the caller's headers.
    async fn data(&mut self, bytes: &[u8]) -> Result<(), Status> {
        let body = match &mut self.stamps {
            Some(s) => s.feed(bytes),
            None => bytes.to_vec(),
        };
        if body.is_empty() && self.started {
            return Ok(());
        }
        self.send(LiveReply::Part {
            status: 200,
            body,
            end: false,
        })
        .await
    }

    /// The log is complete.
    async fn end(&mut self) -> Result<(), Status> {
        let body = self.stamps.as_mut().map(StampStripper::finish);
        self.send(LiveReply::Part {
            status: 200,
            body: body.unwrap_or_default(),
            end: true,
        })
        .await
    }

    /// The agent could not read the logs: an error status if nothing was answered yet, else an
    /// aborted body. Our agent sends its refusal as a Kubernetes `Status` (e.g. 403 for a pod Argo
    /// CD does not manage), which is answered as it is; upstream's sends a message (500).
    async fn fail(&mut self, message: &str) -> Result<(), Status> {
        let reply = if self.started {
            LiveReply::AgentGone
        } else {
            match kubernetes_refusal(message) {
                Some(status) => LiveReply::Part {
                    status,
                    body: message.as_bytes().to_vec(),
                    end: true,
                },
                None => {
                    let code = StatusCode::INTERNAL_SERVER_ERROR;
                    LiveReply::Part {
                        status: code.as_u16(),
                        body: status_body(
                            code,
                            "InternalError",
                            format!("the agent could not read the logs: {message}"),
                        ),
                        end: true,
                    }
                }
            }
        };
        self.send(reply).await
    }
}

/// The HTTP status of an agent's error that is a Kubernetes `Status` with an error code.
fn kubernetes_refusal(message: &str) -> Option<u16> {
    let status: k8s_openapi::apimachinery::pkg::apis::meta::v1::Status =
        serde_json::from_str(message).ok()?;
    let code = u16::try_from(status.code?).ok()?;
    (400..600).contains(&code).then_some(code)
}

/// What the relay waits for next.
enum Next {
    Message(LogStreamData),
    /// The probe was held long enough.
    HoldElapsed,
    /// The agent closed its side without `eof` (a follow stream may be resumed by a new call).
    Closed,
    Failed(Status),
    /// The caller went away.
    Detached,
}

/// Relays the call's messages (`first`, then `rest`) to `sink` until `eof`, an error, or the
/// caller leaving (`CANCELLED`); returns the number of log lines relayed.
async fn relay<S>(
    uuid: &str,
    first: LogStreamData,
    mut rest: S,
    sink: &mut LogSink,
) -> Result<usize, Status>
where
    S: Stream<Item = Result<LogStreamData, Status>> + Unpin,
{
    let mut lines = 0;
    let mut pending = Some(first);
    loop {
        let msg = match pending.take() {
            Some(m) => m,
            None => {
                let hold = !sink.started;
                let tx = sink.tx.clone();
                let next = tokio::select! {
                    () = tx.closed() => Next::Detached,
                    next = async {
                        if hold {
                            tokio::time::timeout(PROBE_HOLD, rest.next()).await.ok()
                        } else {
                            Some(rest.next().await)
                        }
                    } => match next {
                        None => Next::HoldElapsed,
                        Some(None) => Next::Closed,
                        Some(Some(Err(status))) => Next::Failed(status),
                        Some(Some(Ok(m))) => Next::Message(m),
                    },
                };
                match next {
                    Next::Message(m) => m,
                    Next::HoldElapsed => {
                        sink.data(&[]).await?;
                        continue;
                    }
                    Next::Closed => return Ok(lines),
                    Next::Failed(status) => return Err(status),
                    Next::Detached => return Err(detached()),
                }
            }
        };
        if !msg.request_uuid.is_empty() && msg.request_uuid != uuid {
            return Err(Status::invalid_argument(
                "a log stream carries the logs of one request only",
            ));
        }
        if !msg.error.is_empty() {
            tracing::info!(request = %uuid, error = %msg.error, "the agent could not read the logs");
            sink.fail(&msg.error).await?;
            return Err(Status::internal(msg.error));
        }
        if !msg.data.is_empty() {
            lines += msg.data.iter().filter(|b| **b == b'\n').count();
            sink.data(&msg.data).await?;
        }
        if msg.eof {
            sink.end().await?;
            return Ok(lines);
        }
    }
}

/// Removes the leading RFC 3339 timestamp (and the space after it) from every line of a byte
/// stream that arrives in arbitrary chunks; a line whose first word is not a timestamp is kept
/// as it is.
#[derive(Debug)]
pub struct StampStripper {
    /// The start of the current line, while it may still be a timestamp.
    token: Vec<u8>,
    /// Whether the current line's first word is still being read.
    at_line_start: bool,
}

impl Default for StampStripper {
    fn default() -> StampStripper {
        StampStripper {
            token: Vec::with_capacity(MAX_STAMP),
            at_line_start: true,
        }
    }
}

impl StampStripper {
    /// The next chunk without timestamps (the start of a line may be held until the next call).
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(chunk.len());
        for &b in chunk {
            if !self.at_line_start {
                out.push(b);
                self.at_line_start = b == b'\n';
                continue;
            }
            match b {
                b' ' if is_rfc3339(&self.token) => {
                    self.token.clear();
                    self.at_line_start = false;
                }
                b' ' | b'\n' => {
                    out.append(&mut self.token);
                    out.push(b);
                    self.at_line_start = b == b'\n';
                }
                _ if self.token.len() >= MAX_STAMP => {
                    out.append(&mut self.token);
                    out.push(b);
                    self.at_line_start = false;
                }
                _ => self.token.push(b),
            }
        }
        out
    }

    /// What is still held at the end of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        self.at_line_start = true;
        std::mem::take(&mut self.token)
    }
}

/// `YYYY-MM-DDTHH:MM:SS` followed by an optional fraction and a zone (`Z` or `±HH:MM`).
fn is_rfc3339(token: &[u8]) -> bool {
    let digit_at = |i: usize| token.get(i).is_some_and(u8::is_ascii_digit);
    let byte_at = |i: usize, c: u8| token.get(i) == Some(&c);
    token.len() >= 20
        && [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18]
            .into_iter()
            .all(digit_at)
        && byte_at(4, b'-')
        && byte_at(7, b'-')
        && (byte_at(10, b'T') || byte_at(10, b't'))
        && byte_at(13, b':')
        && byte_at(16, b':')
        && token[19..]
            .iter()
            .all(|b| b.is_ascii_digit() || b".Zz+-:".contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip_in_chunks(input: &str, size: usize) -> String {
        let mut s = StampStripper::default();
        let mut out = Vec::new();
        for chunk in input.as_bytes().chunks(size) {
            out.extend(s.feed(chunk));
        }
        out.extend(s.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn leading_timestamps_are_removed_wherever_the_chunks_split() {
        let input = "2026-01-02T03:04:05.123456789Z web line 1\n\
                     2026-01-02T03:04:06Z  two spaces\n\
                     2026-01-02T03:04:07+02:00 offset\n\
                     not-a-stamp keeps its first word\n\
                     \n\
                     2026-01-02T03:04:08Z last";
        let want = "web line 1\n two spaces\noffset\nnot-a-stamp keeps its first word\n\nlast";
        for size in [1, 2, 7, 31, 64 * 1024] {
            assert_eq!(strip_in_chunks(input, size), want, "chunks of {size}");
        }
    }

    #[test]
    fn lines_without_a_leading_timestamp_pass_unchanged() {
        let input =
            "a-very-long-first-word-that-is-longer-than-any-timestamp-could-be yes\nshort\n";
        assert_eq!(strip_in_chunks(input, 3), input);
        assert!(!is_rfc3339(b"2026-01-02 03:04:05Z"));
        assert!(is_rfc3339(b"2026-01-02T03:04:05Z"));
    }

    fn message(uuid: &str, body: &str, eof: bool, error: &str) -> LogStreamData {
        LogStreamData {
            request_uuid: uuid.into(),
            data: body.as_bytes().to_vec(),
            eof,
            error: error.into(),
        }
    }

    fn data(uuid: &str, body: &str) -> LogStreamData {
        message(uuid, body, false, "")
    }

    fn eof(uuid: &str) -> LogStreamData {
        message(uuid, "", true, "")
    }

    fn error(uuid: &str, error: &str) -> LogStreamData {
        message(uuid, "", true, error)
    }

    fn drain(rx: &mut mpsc::Receiver<LiveReply>) -> Vec<LiveReply> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    fn part(status: u16, body: &str, end: bool) -> LiveReply {
        LiveReply::Part {
            status,
            body: body.as_bytes().to_vec(),
            end,
        }
    }

    #[tokio::test]
    async fn a_probe_then_stamped_chunks_then_eof_reach_the_caller_without_stamps() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut sink = LogSink::new(tx, true);
        let rest = futures::stream::iter(vec![
            Ok(data("u", "2026-01-02T03:04:05Z one\n2026-01-02T03:")),
            Ok(data("u", "04:06Z two\n")),
            Ok(eof("u")),
        ]);
        let lines = relay("u", data("u", ""), rest, &mut sink).await.unwrap();
        assert_eq!(lines, 2);
        assert_eq!(
            drain(&mut rx),
            vec![
                part(200, "one\n", false),
                part(200, "two\n", false),
                part(200, "", true)
            ]
        );
    }

    #[tokio::test]
    async fn an_error_right_after_the_probe_is_an_error_status() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut sink = LogSink::new(tx, false);
        let rest = futures::stream::iter(vec![Ok(error("u", "pods \"x\" not found"))]);
        let err = relay("u", data("u", ""), rest, &mut sink)
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Internal);
        let got = drain(&mut rx);
        let [LiveReply::Part {
            status: 500,
            body,
            end: true,
        }] = got.as_slice()
        else {
            panic!("one error part, got {got:?}");
        };
        assert!(String::from_utf8_lossy(body).contains("pods \\\"x\\\" not found"));
    }

    #[tokio::test]
    async fn a_kubernetes_status_as_the_error_keeps_its_code() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut sink = LogSink::new(tx, false);
        let forbidden = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":"pod x is not managed by Argo CD"}"#;
        let msg = error("u1", forbidden);
        let _ = relay("u1", msg, futures::stream::empty(), &mut sink).await;
        assert_eq!(drain(&mut rx), vec![part(403, forbidden, true)]);
        // A Status with a success code or no code is a plain message.
        assert_eq!(kubernetes_refusal(r#"{"kind":"Status","code":200}"#), None);
        assert_eq!(kubernetes_refusal("pods \"x\" not found"), None);
    }

    #[tokio::test]
    async fn an_error_after_data_aborts_the_body() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut sink = LogSink::new(tx, false);
        let rest = futures::stream::iter(vec![Ok(error("u", "read failed"))]);
        relay("u", data("u", "x\n"), rest, &mut sink)
            .await
            .unwrap_err();
        assert_eq!(
            drain(&mut rx),
            vec![part(200, "x\n", false), LiveReply::AgentGone]
        );
    }

    #[tokio::test]
    async fn a_quiet_follow_stream_answers_headers_after_the_probe_hold() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut sink = LogSink::new(tx, false);
        let (agent, rest) = mpsc::channel(1);
        let relay = tokio::spawn(async move {
            relay(
                "u",
                data("u", ""),
                tokio_stream::wrappers::ReceiverStream::new(rest),
                &mut sink,
            )
            .await
        });
        let started = std::time::Instant::now();
        assert_eq!(rx.recv().await, Some(part(200, "", false)));
        assert!(started.elapsed() >= PROBE_HOLD / 2, "the probe was held");
        agent.send(Ok(data("u", "late\n"))).await.unwrap();
        assert_eq!(rx.recv().await, Some(part(200, "late\n", false)));
        // The caller leaves: the agent's call ends with CANCELLED, which makes it stop.
        drop(rx);
        let ended = relay.await.unwrap().unwrap_err();
        assert_eq!(ended.code(), tonic::Code::Cancelled);
        drop(agent);
    }

    #[tokio::test]
    async fn another_requests_uuid_on_the_same_call_is_refused() {
        let (tx, _rx) = mpsc::channel(8);
        let mut sink = LogSink::new(tx, false);
        let rest = futures::stream::iter(vec![Ok(data("other", "x"))]);
        let err = relay("u", data("u", "a"), rest, &mut sink)
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }
}
