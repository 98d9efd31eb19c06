//! Container logs tunnelled to the hub: where they come from ([`LogSource`]; the default is the
//! spoke apiserver's `pods/<pod>/log`, which reaches the kubelet; `--log-endpoint` names any other
//! Kubernetes-shaped HTTP(S) endpoint serving that path) and how they are streamed back as ordered
//! answer parts until the source ends or the principal cancels (its client went away), which
//! closes the source's stream. Only pods Argo CD manages (tracked themselves or through their
//! owners) are served.

use std::sync::Arc;
use std::time::Duration;

use argocd_agent_proto::event::Target;
use argocd_agent_proto::payload::ContainerLogRequest;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::StreamExt;
use http_body_util::BodyExt;
use tokio::sync::oneshot;
use tracing::{debug, info};

use super::resource::{self, status_body};
use super::{encode_query_component, LiveService};

/// Outbox entries above which a log stream waits before queueing more (a slow principal).
const BACKLOG_LIMIT: usize = 2000;

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

/// The text of `pending` up to its last complete UTF-8 character (invalid bytes become U+FFFD);
/// an incomplete character at the end stays in `pending` for the next chunk.
fn take_complete_text(pending: &mut Vec<u8>) -> String {
    // The last character starts at the last byte that is not a continuation byte (10xxxxxx).
    let start = (pending.len().saturating_sub(4)..pending.len())
        .rev()
        .find(|&i| pending[i] & 0xC0 != 0x80);
    let keep = match start {
        Some(i) => {
            let needed = match pending[i] {
                b if b >= 0xF0 => 4,
                b if b >= 0xE0 => 3,
                b if b >= 0xC0 => 2,
                _ => 1,
            };
            if pending.len() - i < needed {
                pending.len() - i
            } else {
                0
            }
        }
        None => 0,
    };
    let rest = pending.split_off(pending.len() - keep);
    let text = String::from_utf8_lossy(pending).into_owned();
    *pending = rest;
    text
}

/// Streams the logs of `req` back to the principal until the source ends or `stop` fires.
pub async fn stream(
    live: &Arc<LiveService>,
    req: &ContainerLogRequest,
    mut stop: oneshot::Receiver<()>,
) {
    let uuid = req.uuid.as_str();
    if !valid_name(&req.namespace) || !valid_name(&req.pod_name) {
        live.answer(
            Target::ContainerLog,
            uuid,
            400,
            &status_body(400, "BadRequest", "malformed namespace or pod name"),
        );
        return;
    }
    // The pod must be Argo CD's (through its owners).
    let (status, body) = resource::read_tracked_pod(
        &live.client,
        &live.tracking,
        uuid,
        &req.namespace,
        &req.pod_name,
    )
    .await;
    if status != 200 {
        live.answer(Target::ContainerLog, uuid, status, &body);
        return;
    }
    let mut logs = match live.logs.open(req).await {
        LogOpen::Stream(s) => s,
        LogOpen::Refused { status, body } => {
            live.answer(Target::ContainerLog, uuid, status, &body);
            return;
        }
    };
    info!(request = uuid, pod = %req.pod_name, follow = req.follow, "streaming container logs to the hub");
    live.push_part(Target::ContainerLog, uuid, 0, false, 200, "");
    let mut seq = 1;
    // Bytes of a character split across two chunks wait for the rest of it.
    let mut pending = Vec::new();
    loop {
        while live.outbox().len() > BACKLOG_LIMIT {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = &mut stop => return,
            }
        }
        tokio::select! {
            _ = &mut stop => {
                debug!(request = uuid, "log stream stopped");
                return;
            }
            chunk = logs.next() => match chunk {
                Some(Ok(bytes)) => {
                    pending.extend_from_slice(&bytes);
                    let text = take_complete_text(&mut pending);
                    if text.is_empty() {
                        continue;
                    }
                    for part in super::split_parts(&text, super::PART_BYTES) {
                        live.push_part(Target::ContainerLog, uuid, seq, false, 200, part);
                        seq += 1;
                    }
                }
                Some(Err(e)) => {
                    info!(request = uuid, error = %e, "container log source failed");
                    break;
                }
                None => break,
            }
        }
    }
    live.push_part(Target::ContainerLog, uuid, seq, true, 200, "");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_across_chunks_arrives_whole() {
        let mut pending = "line é".as_bytes()[..6].to_vec();
        assert_eq!(take_complete_text(&mut pending), "line ");
        pending.extend_from_slice(&"é\n".as_bytes()[1..]);
        assert_eq!(take_complete_text(&mut pending), "é\n");
        assert!(pending.is_empty());
        let mut invalid = vec![b'a', 0xff, b'b'];
        assert_eq!(take_complete_text(&mut invalid), "a\u{fffd}b");
    }

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
}
