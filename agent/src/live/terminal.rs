//! Web terminal sessions the principal asks for with a `terminal-request` event, run as upstream
//! v0.9.0's agent runs them: one `terminalstreamapi.TerminalStreamService/StreamTerminal` call per
//! session, opened over the agent's current connection ([`PrincipalLink`]) with an access token
//! refreshed for it (the stream's may have run out), whose first message carries only the
//! session UUID; then the process's output goes up
//! (`stream_type` stdout/stderr) and stdin and resizes come down, until `eof` or `error`. The
//! principal's messages are read in a task of their own and the session never waits for the
//! call's response headers, which a grpc-go principal (upstream's) sends only with its first
//! message (as upstream's Go agent, whose grpc-go client does not wait for them either).
//!
//! Owns what a session may reach and how it ends. Only a container of a pod Argo CD manages
//! (tracked itself or through its owners: the rule [`resource`] applies to every live read, so a
//! terminal reaches exactly the pods the hub may read) — anything else is refused with the
//! reason as the session's `error`. The exec runs through the spoke apiserver's `pods/exec`
//! (WebSocket, `v5.channel.k8s.io`) as the agent's own ServiceAccount, which needs `create` on
//! `pods/exec` (the chart grants it). Bounds: output is read in [`READ_CHUNK`] pieces and at most
//! [`BUFFER`] messages wait for the principal; when the principal ends its side (its client left,
//! or the session was idle) the exec is aborted, which closes the apiserver's stream and so the
//! process on the spoke. When the process ended, the last message (`eof`, or `error` with the
//! failure) goes up and our side of the call stays open until the principal ends the call
//! (upstream's principal drops output it has not yet passed on once our side ends).

use std::sync::Arc;

use argocd_agent_proto::payload::ContainerTerminalRequest;
use argocd_agent_proto::pb::terminalstreamapi::TerminalStreamData;
use futures::SinkExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, AttachedProcess, TerminalSize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

use super::resource;
use super::LiveService;
use crate::connection::PrincipalLink;

/// Largest piece of output sent in one message.
pub const READ_CHUNK: usize = 32 << 10;
/// Messages waiting for the principal.
pub const BUFFER: usize = 16;
/// How long the principal may take to end its side after our last message; only then (or
/// when the principal ended the session itself) does our side of the call end.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the session `req` to its end (see the module docs).
pub async fn run(live: Arc<LiveService>, link: PrincipalLink, req: ContainerTerminalRequest) {
    let uuid = req.uuid.clone();
    let Some(state) = link.current() else {
        warn!(session = %uuid, "terminal requested while not connected; dropped");
        return;
    };
    let (up, up_rx) = mpsc::channel(BUFFER);
    let handshake = message(&uuid);
    if up.send(handshake).await.is_err() {
        return;
    }
    let mut client = state.terminal_client();
    let request = state.request(ReceiverStream::new(up_rx)).await;
    // The principal's messages are read in a task of their own, so the session does not wait for
    // the call's response headers: a grpc-go principal (upstream's) sends them only with its first
    // message, i.e. once the client typed or resized, and a refusal or an output-only command
    // would otherwise hang until then (our messages flow up regardless).
    let (down_tx, mut down) = mpsc::channel(BUFFER);
    let call = tokio::spawn({
        let uuid = uuid.clone();
        async move {
            let mut stream = match client.stream_terminal(request).await {
                Ok(resp) => resp.into_inner(),
                Err(status) => {
                    warn!(session = %uuid, error = %status.message(), "the principal refused the terminal stream");
                    return;
                }
            };
            while let Ok(Some(msg)) = stream.message().await {
                if down_tx.send(msg).await.is_err() {
                    return;
                }
            }
        }
    });
    let fail = |error: String| TerminalStreamData {
        error,
        ..message(&uuid)
    };
    let last = match start(&live, &req).await {
        Err(reason) => {
            info!(session = %uuid, pod = %req.pod_name, namespace = %req.namespace, %reason, "terminal refused");
            Some(fail(reason))
        }
        Ok(mut process) => {
            info!(session = %uuid, pod = %req.pod_name, namespace = %req.namespace, container = %req.container_name, "terminal session started");
            let end = bridge(&uuid, &mut process, &mut down, &up).await;
            // Aborts the exec if it still runs (the principal ended the session): the spoke
            // apiserver's stream closes, and with it the process.
            process.abort();
            // How kube-rs's side of the exec ended (cancelled if aborted just now; the reason
            // when its connection to the spoke failed, which it reports nowhere else).
            if let Err(error) = process.join().await {
                debug!(session = %uuid, %error, "the exec's connection to the spoke ended");
            }
            end.unwrap_or_else(|reason| Some(fail(reason)))
        }
    };
    if let Some(last) = last {
        // The last message goes out and our side of the call stays open until the principal has
        // ended its side (it does once it has passed everything before `eof`/`error` on to its
        // client). Upstream's v0.9.0 principal tears the session down, dropping output it has
        // not written to the client yet, as soon as it reads the end of our side, so ending
        // ours right after the last message lost the output (see PROTOCOL.md (9)).
        let _ = up.send(last).await;
        let _ =
            tokio::time::timeout(CLOSE_WAIT, async { while down.recv().await.is_some() {} }).await;
    }
    drop(up);
    call.abort();
    info!(session = %uuid, "terminal session ended");
}

fn message(uuid: &str) -> TerminalStreamData {
    TerminalStreamData {
        request_uuid: uuid.to_string(),
        ..Default::default()
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// Checks the request against the tracking rule and starts the exec.
async fn start(
    live: &LiveService,
    req: &ContainerTerminalRequest,
) -> Result<AttachedProcess, String> {
    if !valid_name(&req.namespace) || !valid_name(&req.pod_name) {
        return Err("malformed namespace or pod name".into());
    }
    if req.command.is_empty() {
        return Err("no command to run".into());
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
        return Err(status_message(status, &body));
    }
    let mut params = AttachParams::default()
        .stdin(req.stdin)
        .stdout(req.stdout)
        // With a TTY, the terminal merges stderr into stdout.
        .stderr(req.stderr && !req.tty)
        .tty(req.tty)
        .max_stdin_buf_size(READ_CHUNK)
        .max_stdout_buf_size(READ_CHUNK)
        .max_stderr_buf_size(READ_CHUNK);
    if !req.container_name.is_empty() {
        params = params.container(req.container_name.clone());
    }
    Api::<Pod>::namespaced(live.client.clone(), &req.namespace)
        .exec(&req.pod_name, req.command.clone(), &params)
        .await
        .map_err(|e| format!("exec into {}/{}: {e}", req.namespace, req.pod_name))
}

/// The `message` of a Kubernetes `Status` body, or the status code.
fn status_message(status: u16, body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("the spoke answered {status}"))
}

/// Output from `reader` as messages of `stream_type` into `up`, until it ends, or until nothing
/// is left to read once `ended` (the exec's status resolved, see [`bridge`]).
async fn pump(
    uuid: &str,
    stream_type: &'static str,
    reader: Option<impl AsyncRead + Unpin>,
    up: &mpsc::Sender<TerminalStreamData>,
    mut ended: watch::Receiver<bool>,
) {
    let Some(mut reader) = reader else {
        return;
    };
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        // Reading first: once the exec ended, what kube-rs wrote is all buffered, so a read that
        // is not ready at once means there is no more.
        let read = tokio::select! {
            biased;
            read = reader.read(&mut buf) => read,
            _ = ended.wait_for(|ended| *ended) => return,
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let msg = TerminalStreamData {
                    data: buf[..n].to_vec(),
                    stream_type: stream_type.into(),
                    ..message(uuid)
                };
                if up.send(msg).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Runs the session: output up, stdin and resizes down. Returns the last message for the
/// principal (`eof`), `None` when the principal ended the session, or an error.
async fn bridge(
    uuid: &str,
    process: &mut AttachedProcess,
    down: &mut mpsc::Receiver<TerminalStreamData>,
    up: &mpsc::Sender<TerminalStreamData>,
) -> Result<Option<TerminalStreamData>, String> {
    let mut stdin = process.stdin();
    let mut resize = process.terminal_size();
    let stdout = process.stdout();
    let stderr = process.stderr();
    let status = process
        .take_status()
        .ok_or_else(|| "the exec has no status".to_string())?;
    // The status resolves when kube-rs's message loop for the exec ended: with the kubelet's
    // status (everything before it is written to the readers by then), or with none when the
    // loop failed (e.g. stdin sent as the spoke closed the exec). On failure kube-rs neither
    // closes the output readers nor sends a status, so the output is read only while there is
    // some left once the status resolved; waiting for the readers' end hung the session.
    let (ended_tx, ended) = watch::channel(false);
    let status = async {
        let status = status.await;
        let _ = ended_tx.send(true);
        status
    };
    let output = async {
        tokio::join!(
            pump(uuid, "stdout", stdout, up, ended.clone()),
            pump(uuid, "stderr", stderr, up, ended)
        );
    };
    let from_principal = async {
        loop {
            let Some(msg) = down.recv().await else {
                return;
            };
            if !msg.error.is_empty() || (msg.eof && msg.stream_type != "stdin") {
                return;
            }
            if msg.eof {
                // The client closed its stdin (v5): so does the process's.
                debug!(session = uuid, "the terminal's client closed its stdin");
                if let Some(mut w) = stdin.take() {
                    let _ = w.shutdown().await;
                }
            } else if msg.resize {
                if let Some(r) = resize.as_mut() {
                    let size = TerminalSize {
                        width: u16::try_from(msg.cols).unwrap_or(u16::MAX),
                        height: u16::try_from(msg.rows).unwrap_or(u16::MAX),
                    };
                    let _ = r.send(size).await;
                }
            } else if !msg.data.is_empty() {
                if let Some(w) = stdin.as_mut() {
                    if w.write_all(&msg.data).await.is_err() {
                        stdin = None;
                    }
                }
            }
        }
    };
    // The process's end: its status, and its output drained.
    let finished = async { tokio::join!(status, output).0 };
    tokio::select! {
        () = from_principal => {
            debug!(session = uuid, "the principal ended the terminal session");
            Ok(None)
        }
        status = finished => match status {
            Some(s) if s.status.as_deref() == Some("Failure") => Err(s
                .message
                .unwrap_or_else(|| "the command failed".into())),
            Some(_) => Ok(Some(TerminalStreamData { eof: true, ..message(uuid) })),
            // A kubelet always ends a v4/v5 exec with a status.
            None => Err("the exec's connection to the spoke ended without an exit status".into()),
        },
    }
}
