//! The fake kubelet's exec endpoint (`/exec/{namespace}/{pod}/{container}`), reached by the real
//! kube-apiserver's `pods/{pod}/exec`: a kubelet 1.36 that declares `ExtendWebSocketsToKubelet`
//! on its Node is handed the client's WebSocket (`v5.channel.k8s.io`) as it is, so the exec a
//! client started through the apiserver — our agent's kube-rs, upstream's Go agent's client-go,
//! `kubectl exec` — arrives here unchanged.
//!
//! A stand-in only for the container runtime: the command runs as a process of this test on the
//! host (no container, no PTY; with `tty=1` stderr goes out on stdout, as a terminal merges them,
//! and Ctrl-D typed on an empty line ends the input, as a terminal's line editing makes it:
//! [`TtyInput`]).
//! Stdin, resizes (recorded), close-stdin and the exit status (`Success`, or `Failure` with the
//! exit code, as the kubelet reports it) follow the channel protocol
//! (`argocd_agent_kube::exec_channels`). When the client goes away the process is killed and
//! counted, which is what the tests use to see that a session's end reached the spoke.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use argocd_agent_kube::exec_channels::{self, ClientFrame};
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::kubelet::{full, response, KubeletStats, LogBody};

/// One exec as the kubelet saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecSeen {
    /// `namespace/pod/container`.
    pub target: String,
    /// The command.
    pub command: Vec<String>,
    /// Whether a TTY was asked for.
    pub tty: bool,
}

/// Answers `/exec/...`: switches to the WebSocket and runs the command in a task of its own.
pub fn upgrade<B>(stats: &Arc<KubeletStats>, req: &mut http::Request<B>) -> http::Response<LogBody>
where
    B: hyper::body::Body + Send + 'static,
{
    let segs: Vec<String> = req.uri().path().split('/').map(str::to_string).collect();
    let [_, _, namespace, pod, container] = segs.as_slice() else {
        return response(404, full("not an exec path".into()));
    };
    let query = req.uri().query().unwrap_or_default().to_string();
    let mut params: HashMap<String, String> = HashMap::new();
    let mut command = Vec::new();
    for (k, v) in query.split('&').filter_map(|p| p.split_once('=')) {
        let v = percent_decode(v);
        if k == "command" {
            command.push(v);
        } else {
            params.insert(k.to_string(), v);
        }
    }
    let tty = params.get("tty").is_some_and(|v| v == "1" || v == "true");
    let headers = req.headers();
    let protocol = exec_channels::pick_subprotocol(
        headers
            .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok()),
    );
    let (Some(key), Some(protocol), false) = (
        headers.get(http::header::SEC_WEBSOCKET_KEY).cloned(),
        protocol,
        command.is_empty(),
    ) else {
        return response(
            400,
            full("exec needs a v5/v4 channel WebSocket and a command".into()),
        );
    };
    stats.execs.lock().unwrap().push(ExecSeen {
        target: format!("{namespace}/{pod}/{container}"),
        command: command.clone(),
        tty,
    });
    let upgraded = hyper::upgrade::on(req);
    let stats = stats.clone();
    tokio::spawn(async move {
        let Ok(io) = upgraded.await else { return };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Server, None).await;
        stats.execs_open.fetch_add(1, Ordering::SeqCst);
        let client_left = run(ws, &command, tty, &stats).await;
        stats.execs_open.fetch_sub(1, Ordering::SeqCst);
        stats.execs_ended.fetch_add(1, Ordering::SeqCst);
        if client_left {
            stats.execs_killed.fetch_add(1, Ordering::SeqCst);
        }
    });
    http::Response::builder()
        .status(101)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(
            http::header::SEC_WEBSOCKET_ACCEPT,
            derive_accept_key(key.as_bytes()),
        )
        .header(http::header::SEC_WEBSOCKET_PROTOCOL, protocol)
        .body(full(String::new()))
        .expect("valid response")
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// Runs `command` for the session on `ws`; true when the client left before the process ended
/// (the process was killed).
async fn run<S>(ws: WebSocketStream<S>, command: &[String], tty: bool, stats: &KubeletStats) -> bool
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut tx, mut rx) = ws.split();
    let child = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            // As a container runtime reports a missing executable.
            let message = format!(
                "failed to exec in container: exec: \"{}\": executable file not found in $PATH: {e}",
                command[0]
            );
            let _ = tx
                .send(Message::binary(exec_channels::encode_failure(
                    "InternalError",
                    &message,
                )))
                .await;
            let _ = tx.send(normal_close()).await;
            return false;
        }
    };
    let mut stdin = child.stdin.take();
    let mut typed = TtyInput::default();
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(8);
    let pump = |mut r: Box<dyn tokio::io::AsyncRead + Unpin + Send>, is_stderr: bool| {
        let out_tx = out_tx.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 16 << 10];
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let frame = exec_channels::encode_output(is_stderr && !tty, &buf[..n]);
                if out_tx.send(frame).await.is_err() {
                    break;
                }
            }
        })
    };
    let out_task = pump(Box::new(stdout), false);
    let err_task = pump(Box::new(stderr), true);
    drop(out_tx);
    let mut output_done = false;
    loop {
        tokio::select! {
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(data))) => match exec_channels::decode_client(&data) {
                    Ok(ClientFrame::Stdin(bytes)) => {
                        let (bytes, end) = match tty {
                            true => typed.feed(bytes),
                            false => (bytes.to_vec(), false),
                        };
                        if let Some(w) = stdin.as_mut() {
                            if w.write_all(&bytes).await.is_err() || end {
                                stdin = None;
                            }
                        }
                    }
                    Ok(ClientFrame::Resize { width, height }) => {
                        stats.resizes.lock().unwrap().push((width, height));
                    }
                    Ok(ClientFrame::CloseStdin) => {
                        stats.stdin_closed.fetch_add(1, Ordering::SeqCst);
                        stdin = None;
                    }
                    Ok(ClientFrame::Ignore) => {}
                    Err(_) => {}
                },
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    // The client went away: the process is killed (kill_on_drop).
                    out_task.abort();
                    err_task.abort();
                    return true;
                }
                Some(Ok(_)) => {}
            },
            frame = out_rx.recv(), if !output_done => match frame {
                Some(frame) => {
                    if tx.send(Message::binary(frame)).await.is_err() {
                        return true;
                    }
                }
                None => output_done = true,
            },
            status = child.wait(), if output_done => {
                let last = match status.ok().and_then(|s| s.code()) {
                    Some(0) => exec_channels::encode_success(),
                    code => exit_failure(code.unwrap_or(-1)),
                };
                let _ = tx.send(Message::binary(last)).await;
                let _ = tx.send(normal_close()).await;
                return false;
            }
        }
    }
}

/// What a terminal makes of typed input, as far as the tests need it: Ctrl-D (EOT) on an empty
/// line is the end of input (the shell reading from a terminal exits); within a line it passes
/// the line so far on and is itself dropped. Argo CD's web terminal types Ctrl-D when the browser
/// goes away; without a PTY here, a shell would take it as a byte and wait on.
#[derive(Debug)]
struct TtyInput {
    /// Nothing typed since the last line was passed on.
    line_empty: bool,
}

impl Default for TtyInput {
    fn default() -> Self {
        TtyInput { line_empty: true }
    }
}

/// Ctrl-D, ASCII end of transmission.
const EOT: u8 = 0x04;

impl TtyInput {
    /// What the process reads of `typed`, and whether its input ends after that.
    fn feed(&mut self, typed: &[u8]) -> (Vec<u8>, bool) {
        let mut read = Vec::with_capacity(typed.len());
        for &b in typed {
            if b == EOT {
                if self.line_empty {
                    return (read, true);
                }
                self.line_empty = true;
                continue;
            }
            read.push(b);
            self.line_empty = matches!(b, b'\n' | b'\r');
        }
        (read, false)
    }
}

/// The kubelet's `Status` for a command that exited with `code` (client-go turns the `ExitCode`
/// cause into the exit code `kubectl exec` exits with).
fn exit_failure(code: i32) -> Vec<u8> {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "reason": "NonZeroExitCode",
        "message": format!("command terminated with non-zero exit code: exit status {code}"),
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    });
    let mut out = vec![3];
    out.extend_from_slice(status.to_string().as_bytes());
    out
}

/// A close frame with the normal closure code ([`exec_channels::NORMAL_CLOSURE`]).
fn normal_close() -> Message {
    use tokio_tungstenite::tungstenite::protocol::frame::{coding::CloseCode, CloseFrame};
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(exec_channels::NORMAL_CLOSURE),
        reason: "".into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctrl_d_on_an_empty_line_ends_a_terminals_input_and_elsewhere_is_dropped() {
        let fed = |typed: &mut TtyInput, bytes: &[u8]| {
            let (read, end) = typed.feed(bytes);
            (String::from_utf8(read).unwrap(), end)
        };
        let mut typed = TtyInput::default();
        assert_eq!(fed(&mut typed, b"\x04"), (String::new(), true));
        let mut typed = TtyInput::default();
        assert_eq!(fed(&mut typed, b"echo hi\n"), ("echo hi\n".into(), false));
        assert_eq!(fed(&mut typed, b"\x04rest"), (String::new(), true));
        let mut typed = TtyInput::default();
        assert_eq!(fed(&mut typed, b"ech\x04o\n"), ("echo\n".into(), false));
        assert_eq!(fed(&mut typed, b"ls\x04\x04"), ("ls".into(), true));
    }
}
