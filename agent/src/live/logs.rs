//! Container logs tunnelled to the hub: where they come from ([`LogSource`]; the default is the
//! spoke apiserver's `pods/<pod>/log`, which reaches the kubelet; `--log-endpoint` names any other
//! Kubernetes-shaped HTTP(S) endpoint serving that path) and how they reach the principal: as
//! upstream v0.9.0's agent sends them, over one `logstreamapi.LogStreamService/StreamLogs` call
//! per request opened over the agent's current connection ([`PrincipalLink`]), so the same agent
//! serves logs to our principal and to upstream's. Only pods Argo CD manages (tracked themselves
//! or through their owners) are served.
//!
//! Owns the call's contract. A request that is refused (malformed names, an untracked pod, the
//! source's refusal) is answered by a call whose only message carries the refusal as `error`:
//! the Kubernetes `Status` JSON, from which our principal takes the HTTP status (upstream's shows
//! the text). Otherwise the first message is an empty probe, then the log in complete lines
//! ([`LineFramer`]; a line longer than [`MAX_LINE`] goes in pieces), then `eof`, or `error` when
//! the source fails. The kubelet is always asked for timestamps, as upstream's agent does (the
//! principal removes them unless its caller asked). The principal ending the call (its caller
//! left: `CANCELLED`; nobody waits: `NOT_FOUND`) stops the request and closes the source's
//! stream. A follow stream whose call broke with the connection is resumed with a new call for
//! the same request once the agent is connected again, from the last line sent
//! (`sinceTime`), skipping the lines already sent ([`Progress`]): nothing twice, nothing lost
//! that the kubelet still has. Each call holds at most [`BUFFER`] messages in memory.

use std::sync::Arc;
use std::time::Duration;

use argocd_agent_proto::payload::ContainerLogRequest;
use argocd_agent_proto::pb::logstreamapi::LogStreamData;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::StreamExt;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tracing::{debug, info, warn};

use super::resource::{self, status_body};
use super::{encode_query_component, LiveService};
use crate::connection::{LinkState, PrincipalLink};

/// Messages waiting for the principal on one call.
pub const BUFFER: usize = 16;
/// Longest line sent whole; a longer one is sent in pieces of this size.
pub const MAX_LINE: usize = 64 << 10;
/// How long a broken follow stream waits for the agent to be connected again.
const RECONNECT_WAIT: Duration = Duration::from_secs(30);
/// Resumes of one follow stream before it is given up.
const MAX_RESUMES: u32 = 10;
/// How long the principal may take to end the call after our last message.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// An opened log: either a byte stream, or the source's refusal (HTTP status and body).
pub enum LogOpen {
    /// Log bytes as they come.
    Stream(BoxStream<'static, Result<Bytes, String>>),
    /// The source refused (e.g. 400 from the apiserver: the pod has no node).
    Refused {
        /// HTTP status.
        status: u16,
        /// Kubernetes `Status` JSON.
        body: Vec<u8>,
    },
}

/// Where container logs come from.
pub trait LogSource: Send + Sync + 'static {
    /// Opens the logs `req` asks for (follow, tail, since, ...).
    fn open<'a>(&'a self, req: &'a ContainerLogRequest) -> BoxFuture<'a, LogOpen>;
}

/// Logs from `GET /api/v1/namespaces/{ns}/pods/{pod}/log` of a Kubernetes-shaped endpoint: the
/// spoke apiserver, or the `--log-endpoint`.
pub struct ApiserverLogSource {
    /// The client of the endpoint.
    pub client: kube::Client,
}

impl ApiserverLogSource {
    /// Logs from the HTTP(S) endpoint at `url` (no credentials; HTTPS verified against the
    /// platform's roots).
    pub fn endpoint(url: http::Uri) -> Result<Self, kube::Error> {
        let mut config = kube::Config::new(url);
        // A followed log stays open for as long as the hub reads it.
        config.read_timeout = None;
        Ok(ApiserverLogSource {
            client: kube::Client::try_from(config)?,
        })
    }
}

/// A log source that refuses every request with the reason it cannot serve (a misconfigured
/// `--log-endpoint`; better than silently reading logs from elsewhere).
pub struct UnusableLogSource {
    /// Why, shown to the hub's client.
    pub reason: String,
}

impl LogSource for UnusableLogSource {
    fn open<'a>(&'a self, _req: &'a ContainerLogRequest) -> BoxFuture<'a, LogOpen> {
        Box::pin(async move {
            LogOpen::Refused {
                status: 502,
                body: status_body(502, "InternalError", &self.reason),
            }
        })
    }
}

/// The `pods/log` query of a request.
pub fn log_query(req: &ContainerLogRequest) -> String {
    let mut q: Vec<String> = Vec::new();
    if !req.container.is_empty() {
        q.push(format!(
            "container={}",
            encode_query_component(&req.container)
        ));
    }
    for (k, on) in [
        ("follow", req.follow),
        ("timestamps", req.timestamps),
        ("previous", req.previous),
    ] {
        if on {
            q.push(format!("{k}=true"));
        }
    }
    for (k, v) in [
        ("tailLines", req.tail_lines),
        ("sinceSeconds", req.since_seconds),
        ("limitBytes", req.limit_bytes),
    ] {
        if let Some(v) = v {
            q.push(format!("{k}={v}"));
        }
    }
    if !req.since_time.is_empty() {
        q.push(format!(
            "sinceTime={}",
            encode_query_component(&req.since_time)
        ));
    }
    q.join("&")
}

impl LogSource for ApiserverLogSource {
    fn open<'a>(&'a self, req: &'a ContainerLogRequest) -> BoxFuture<'a, LogOpen> {
        Box::pin(async move {
            let mut uri = format!(
                "/api/v1/namespaces/{}/pods/{}/log",
                req.namespace, req.pod_name
            );
            let q = log_query(req);
            if !q.is_empty() {
                uri = format!("{uri}?{q}");
            }
            let request = match http::Request::get(&uri).body(kube::client::Body::from(Vec::new()))
            {
                Ok(r) => r,
                Err(e) => {
                    return LogOpen::Refused {
                        status: 400,
                        body: status_body(400, "BadRequest", &e.to_string()),
                    }
                }
            };
            match self.client.send(request).await {
                Ok(resp) if resp.status().is_success() => {
                    let stream = resp
                        .into_body()
                        .into_data_stream()
                        .map(|r| r.map_err(|e| e.to_string()));
                    LogOpen::Stream(stream.boxed())
                }
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let body = resp
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes().to_vec())
                        .unwrap_or_default();
                    LogOpen::Refused { status, body }
                }
                Err(e) => LogOpen::Refused {
                    status: 502,
                    body: status_body(
                        502,
                        "InternalError",
                        &format!("the spoke apiserver cannot be reached: {e}"),
                    ),
                },
            }
        })
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
}

/// The leading kubelet timestamp of a log line as an ordered key: the seconds part
/// (`YYYY-MM-DDTHH:MM:SS`) and the nanoseconds; `None` when the line has none (RFC 3339 in UTC,
/// as the kubelet writes them, with any number of fraction digits).
fn stamp_key(line: &[u8]) -> Option<(&[u8], u32)> {
    let token = line.split(|b| *b == b' ').next()?;
    let token = token.strip_suffix(b"Z")?;
    if token.len() < 19 || token[10] != b'T' {
        return None;
    }
    let (secs, fraction) = token.split_at(19);
    let nanos = match fraction {
        [] => 0,
        [b'.', digits @ ..] if !digits.is_empty() && digits.len() <= 9 => {
            let mut n: u32 = 0;
            for d in digits {
                if !d.is_ascii_digit() {
                    return None;
                }
                n = n * 10 + u32::from(d - b'0');
            }
            n * 10u32.pow(9 - digits.len() as u32)
        }
        _ => return None,
    };
    Some((secs, nanos))
}

/// The lines of a follow stream sent so far, so that a resumed stream starts after them: the
/// newest timestamp sent and how many lines carried exactly it.
#[derive(Debug, Default)]
pub struct Progress {
    last: Option<(Vec<u8>, u32)>,
    same: usize,
    /// Lines still to be skipped of a resumed stream: `Some(n)` while the stream is replaying
    /// what was sent, `n` lines with exactly the last timestamp already skipped.
    replaying: Option<usize>,
}

impl Progress {
    /// Records a line sent.
    fn sent(&mut self, line: &[u8]) {
        let Some((secs, nanos)) = stamp_key(line) else {
            return;
        };
        let newer = match &self.last {
            Some((s, n)) => (secs, nanos).cmp(&(s.as_slice(), *n)),
            None => std::cmp::Ordering::Greater,
        };
        match newer {
            std::cmp::Ordering::Equal => self.same += 1,
            std::cmp::Ordering::Greater => {
                self.last = Some((secs.to_vec(), nanos));
                self.same = 1;
            }
            // An older timestamp (a line written late): resuming stays after the newest.
            std::cmp::Ordering::Less => {}
        }
    }

    /// The `sinceTime` a resumed stream asks for (the kubelet answers from that second on), or
    /// `None` when no timestamped line was sent.
    fn resume_from(&mut self) -> Option<String> {
        let (secs, _) = self.last.as_ref()?;
        self.replaying = Some(0);
        Some(format!("{}Z", String::from_utf8_lossy(secs)))
    }

    /// Whether `line` of a resumed stream was sent before (then it is skipped).
    fn already_sent(&mut self, line: &[u8]) -> bool {
        let Some(skipped) = self.replaying else {
            return false;
        };
        let (Some((last_secs, last_nanos)), Some(key)) = (&self.last, stamp_key(line)) else {
            self.replaying = None;
            return false;
        };
        let last = (last_secs.as_slice(), *last_nanos);
        if key < last || (key == last && skipped < self.same) {
            if key == last {
                self.replaying = Some(skipped + 1);
            }
            return true;
        }
        self.replaying = None;
        false
    }
}

/// Splits a byte stream into complete lines (a line longer than [`MAX_LINE`] in pieces), so that
/// what was sent ends at a line's end.
#[derive(Debug, Default)]
pub struct LineFramer {
    pending: Vec<u8>,
}

impl LineFramer {
    /// The complete lines `chunk` ends (with their newline), in order.
    fn feed(&mut self, chunk: &[u8]) -> Vec<Vec<u8>> {
        self.pending.extend_from_slice(chunk);
        let mut lines = Vec::new();
        let mut start = 0;
        while let Some(i) = self.pending[start..].iter().position(|b| *b == b'\n') {
            lines.push(self.pending[start..start + i + 1].to_vec());
            start += i + 1;
        }
        self.pending.drain(..start);
        while self.pending.len() >= MAX_LINE {
            lines.push(self.pending.drain(..MAX_LINE).collect());
        }
        lines
    }

    /// What is left after the source ended (a last line without newline).
    fn finish(&mut self) -> Option<Vec<u8>> {
        (!self.pending.is_empty()).then(|| std::mem::take(&mut self.pending))
    }
}

/// How one call ended.
enum CallEnd {
    /// The request is over (answered, refused, or the principal stopped it).
    Done,
    /// The call broke with the connection: a follow stream is resumed.
    Broken(String),
}

/// Checks `req` (names, tracked pod) and opens its source; a refusal is the Kubernetes `Status`
/// JSON to send as the call's error.
async fn open(
    live: &LiveService,
    req: &ContainerLogRequest,
) -> Result<BoxStream<'static, Result<Bytes, String>>, String> {
    if !valid_name(&req.namespace) || !valid_name(&req.pod_name) {
        let body = status_body(400, "BadRequest", "malformed namespace or pod name");
        return Err(String::from_utf8_lossy(&body).into_owned());
    }
    // The pod must be Argo CD's (through its owners).
    let (status, body) = resource::read_tracked_pod(
        &live.client,
        &live.tracking,
        &req.uuid,
        &req.namespace,
        &req.pod_name,
    )
    .await;
    if status != 200 {
        return Err(String::from_utf8_lossy(&body).into_owned());
    }
    match live.logs.open(req).await {
        LogOpen::Stream(s) => Ok(s),
        LogOpen::Refused { status, body } => {
            let text = String::from_utf8_lossy(&body).into_owned();
            // A Kubernetes-shaped refusal passes as it is; anything else becomes one.
            if serde_json::from_str::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>(&text)
                .is_ok_and(|s| s.code.is_some())
            {
                Err(text)
            } else {
                let body = status_body(status, "InternalError", text.trim());
                Err(String::from_utf8_lossy(&body).into_owned())
            }
        }
    }
}

fn message(uuid: &str) -> LogStreamData {
    LogStreamData {
        request_uuid: uuid.to_string(),
        ..Default::default()
    }
}

/// Whether the principal's answer to a call means the request is over (see the module docs);
/// anything else is a broken connection.
fn call_end(result: Result<(), tonic::Status>) -> CallEnd {
    match result {
        Ok(()) => CallEnd::Done,
        Err(s) => match s.code() {
            Code::Unavailable | Code::Unknown | Code::Unauthenticated | Code::DeadlineExceeded => {
                CallEnd::Broken(s.message().to_string())
            }
            _ => {
                debug!(code = ?s.code(), message = s.message(), "the principal ended the log stream");
                CallEnd::Done
            }
        },
    }
}

/// Streams the logs `req` asks for to the principal until they end or the principal stops the
/// request (see the module docs).
pub async fn run(live: Arc<LiveService>, link: PrincipalLink, mut req: ContainerLogRequest) {
    let uuid = req.uuid.clone();
    // Upstream's agent always asks for them; the principal removes them unless asked.
    req.timestamps = true;
    let mut progress = Progress::default();
    let mut resumes = 0;
    loop {
        let state = if resumes == 0 {
            link.current()
        } else {
            wait_for_link(&link).await
        };
        let Some(state) = state else {
            warn!(request = %uuid, "container logs requested while not connected; dropped");
            return;
        };
        match one_call(&live, &state, &req, &mut progress).await {
            CallEnd::Done => return,
            CallEnd::Broken(reason) if req.follow && resumes < MAX_RESUMES => {
                resumes += 1;
                // Without a timestamped line sent the stream starts over as asked.
                if let Some(since) = progress.resume_from() {
                    req.since_time = since;
                }
                info!(request = %uuid, %reason, resume = resumes, since = %req.since_time, "log stream broke; resuming once connected");
            }
            CallEnd::Broken(reason) => {
                info!(request = %uuid, %reason, "log stream broke");
                return;
            }
        }
    }
}

/// The link once the agent is connected again, or `None` after [`RECONNECT_WAIT`].
async fn wait_for_link(link: &PrincipalLink) -> Option<LinkState> {
    let deadline = tokio::time::Instant::now() + RECONNECT_WAIT;
    // The broken link is usually still the current one for a moment: wait for it to go first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    loop {
        if let Some(state) = link.current() {
            return Some(state);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One `StreamLogs` call for `req`.
async fn one_call(
    live: &LiveService,
    state: &LinkState,
    req: &ContainerLogRequest,
    progress: &mut Progress,
) -> CallEnd {
    let uuid = req.uuid.as_str();
    let source = open(live, req).await;
    let (up, up_rx) = mpsc::channel(BUFFER);
    let first = match &source {
        Ok(_) => message(uuid),
        Err(refusal) => LogStreamData {
            error: refusal.clone(),
            ..message(uuid)
        },
    };
    let _ = up.send(first).await;
    let request = state.request(ReceiverStream::new(up_rx)).await;
    let mut client = state.log_client();
    // The call runs on its own task: it sends what is queued while the source is read.
    let mut call = tokio::spawn(async move { client.stream_logs(request).await.map(|_| ()) });
    let mut logs = match source {
        Ok(logs) => logs,
        Err(_) => {
            info!(request = uuid, pod = %req.pod_name, "container logs refused");
            drop(up);
            let _ = tokio::time::timeout(CLOSE_WAIT, call).await;
            return CallEnd::Done;
        }
    };
    info!(request = uuid, pod = %req.pod_name, follow = req.follow, since = %req.since_time, "streaming container logs to the hub");
    let mut framer = LineFramer::default();
    let end = loop {
        tokio::select! {
            result = &mut call => {
                return call_end(result.unwrap_or(Ok(())));
            }
            chunk = logs.next() => match chunk {
                Some(Ok(bytes)) => {
                    for line in framer.feed(&bytes) {
                        if progress.already_sent(&line) {
                            continue;
                        }
                        progress.sent(&line);
                        let msg = LogStreamData { data: line, ..message(uuid) };
                        if up.send(msg).await.is_err() {
                            return call_end(call.await.unwrap_or(Ok(())));
                        }
                    }
                }
                Some(Err(e)) => {
                    info!(request = uuid, error = %e, "container log source failed");
                    break LogStreamData { error: format!("log stream read failed: {e}"), ..message(uuid) };
                }
                None => {
                    if let Some(rest) = framer.finish() {
                        let _ = up.send(LogStreamData { data: rest, ..message(uuid) }).await;
                    }
                    break LogStreamData { eof: true, ..message(uuid) };
                }
            }
        }
    };
    // The last message goes out before our side of the call ends; then the principal answers.
    let _ = up.send(end).await;
    drop(up);
    drop(logs);
    match tokio::time::timeout(CLOSE_WAIT, call).await {
        Ok(result) => {
            call_end(result.unwrap_or(Ok(())));
        }
        Err(_) => debug!(
            request = uuid,
            "the principal did not end the log stream in time"
        ),
    }
    CallEnd::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_options_become_the_pods_log_query() {
        let req = ContainerLogRequest {
            container: "web".into(),
            follow: true,
            tail_lines: Some(10),
            since_time: "2026-01-01T00:00:00Z".into(),
            ..Default::default()
        };
        assert_eq!(
            log_query(&req),
            "container=web&follow=true&tailLines=10&sinceTime=2026-01-01T00%3A00%3A00Z"
        );
        assert_eq!(log_query(&ContainerLogRequest::default()), "");
    }

    #[test]
    fn lines_are_sent_whole_and_long_ones_in_pieces() {
        let mut f = LineFramer::default();
        assert!(f.feed(b"2026-01-01T00:00:00Z a").is_empty());
        assert_eq!(
            f.feed(b"b\nc\nd"),
            [b"2026-01-01T00:00:00Z ab\n".to_vec(), b"c\n".to_vec()]
        );
        assert_eq!(f.finish(), Some(b"d".to_vec()));
        assert_eq!(f.finish(), None);
        let long = vec![b'x'; MAX_LINE + 10];
        let pieces = f.feed(&long);
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces[0].len(), MAX_LINE);
        assert_eq!(f.finish().map(|r| r.len()), Some(10));
    }

    #[test]
    fn kubelet_timestamps_order_whatever_their_fraction_digits() {
        let key = |l: &str| stamp_key(l.as_bytes()).map(|(s, n)| (s.to_vec(), n));
        assert!(key("2026-01-01T00:00:00.1Z x") > key("2026-01-01T00:00:00.09Z x"));
        assert_eq!(
            key("2026-01-01T00:00:00.5Z x"),
            key("2026-01-01T00:00:00.500000000Z y")
        );
        assert!(key("2026-01-01T00:00:01Z x") > key("2026-01-01T00:00:00.999Z x"));
        assert_eq!(key("no stamp"), None);
        assert_eq!(key("2026-01-01T00:00:00+02:00 local"), None);
    }

    #[test]
    fn a_resumed_stream_skips_exactly_the_lines_already_sent() {
        let mut p = Progress::default();
        for l in [
            "2026-01-01T00:00:05.1Z a\n",
            "2026-01-01T00:00:05.2Z b\n",
            "2026-01-01T00:00:05.2Z c\n",
        ] {
            assert!(!p.already_sent(l.as_bytes()));
            p.sent(l.as_bytes());
        }
        // The kubelet answers from the second on: what was sent is skipped, the rest kept, even
        // a line with the same timestamp as the last one sent.
        assert_eq!(p.resume_from().as_deref(), Some("2026-01-01T00:00:05Z"));
        let replay = [
            ("2026-01-01T00:00:05.1Z a\n", true),
            ("2026-01-01T00:00:05.2Z b\n", true),
            ("2026-01-01T00:00:05.2Z c\n", true),
            ("2026-01-01T00:00:05.2Z d\n", false),
            ("2026-01-01T00:00:05.1Z late\n", false),
        ];
        for (line, skipped) in replay {
            assert_eq!(p.already_sent(line.as_bytes()), skipped, "{line}");
            if !skipped {
                p.sent(line.as_bytes());
            }
        }
        // Nothing timestamped sent: nothing to resume from.
        assert_eq!(Progress::default().resume_from(), None);
    }
}
