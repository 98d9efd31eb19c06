//! The server side of Kubernetes' exec stream over WebSocket (`v5.channel.k8s.io` and
//! `v4.channel.k8s.io`), as a kube-apiserver or kubelet speaks it to `kubectl exec` and to
//! client-go's WebSocket executor (which argocd-server's web terminal uses).
//!
//! Owns the framing only, no I/O: which subprotocol a server picks from the client's offer, what a
//! client's binary message means (stdin bytes on channel 0, a terminal resize on channel 4 as
//! `{"Width":..,"Height":..}`, and — v5 only — "close stdin" as `[255, 0]`), and the server's
//! messages (stdout on 1, stderr on 2, the final `Status` on 3). Used by the principal's web
//! terminal and the e2e fake kubelet.

/// The subprotocols a server accepts, best first.
pub const SUBPROTOCOLS: [&str; 2] = [V5, V4];
/// Kubernetes 1.30+: adds "close stdin".
pub const V5: &str = "v5.channel.k8s.io";
/// Kubernetes 1.4+: channels and a `Status` on the error channel.
pub const V4: &str = "v4.channel.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

/// The subprotocol to answer a `Sec-WebSocket-Protocol` offer with (comma-separated, possibly
/// several headers joined), or `None` when the client offers none this side speaks.
pub fn pick_subprotocol<'a>(offers: impl IntoIterator<Item = &'a str>) -> Option<&'static str> {
    let offered: Vec<&str> = offers
        .into_iter()
        .flat_map(|h| h.split(','))
        .map(str::trim)
        .collect();
    SUBPROTOCOLS.into_iter().find(|p| offered.contains(p))
}

/// What one binary message from the client means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientFrame<'a> {
    /// Bytes for the process's stdin.
    Stdin(&'a [u8]),
    /// The terminal's new size.
    Resize {
        /// Columns.
        width: u16,
        /// Rows.
        height: u16,
    },
    /// The client has no more stdin (v5).
    CloseStdin,
    /// Nothing to do (an empty message, or a close of a channel other than stdin).
    Ignore,
}

/// Why a client message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A channel a client may not write to.
    #[error("a client may not write to channel {0}")]
    Channel(u8),
    /// A resize whose body is not `{"Width":..,"Height":..}`.
    #[error("malformed terminal resize: {0}")]
    Resize(String),
}

#[derive(serde::Deserialize)]
struct Size {
    #[serde(rename = "Width")]
    width: u16,
    #[serde(rename = "Height")]
    height: u16,
}

/// Decodes one binary message from the client.
pub fn decode_client(message: &[u8]) -> Result<ClientFrame<'_>, FrameError> {
    let Some((&channel, body)) = message.split_first() else {
        return Ok(ClientFrame::Ignore);
    };
    match channel {
        STDIN => Ok(ClientFrame::Stdin(body)),
        RESIZE => {
            let size: Size =
                serde_json::from_slice(body).map_err(|e| FrameError::Resize(e.to_string()))?;
            Ok(ClientFrame::Resize {
                width: size.width,
                height: size.height,
            })
        }
        CLOSE if body.first() == Some(&STDIN) => Ok(ClientFrame::CloseStdin),
        CLOSE => Ok(ClientFrame::Ignore),
        other => Err(FrameError::Channel(other)),
    }
}

/// Encodes a resize message, as a client sends it.
pub fn encode_resize(width: u16, height: u16) -> Vec<u8> {
    let mut out = vec![RESIZE];
    out.extend_from_slice(format!(r#"{{"Width":{width},"Height":{height}}}"#).as_bytes());
    out
}

/// Encodes stdin bytes, as a client sends them.
pub fn encode_stdin(data: &[u8]) -> Vec<u8> {
    with_channel(STDIN, data)
}

/// Encodes process output for the client (`stderr` false: stdout).
pub fn encode_output(stderr: bool, data: &[u8]) -> Vec<u8> {
    with_channel(if stderr { STDERR } else { STDOUT }, data)
}

/// The final message of a session that succeeded.
pub fn encode_success() -> Vec<u8> {
    with_channel(
        ERROR,
        br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success"}"#,
    )
}

/// The final message of a session that failed with `message` (client-go reports it as the exec's
/// error).
pub fn encode_failure(reason: &str, message: &str) -> Vec<u8> {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "reason": reason, "message": message,
    });
    with_channel(ERROR, status.to_string().as_bytes())
}

/// The close code a server ends the session with: client-go's WebSocket executor reads only a
/// normal closure (1000) as the end of its streams; a close without a code (1005) is an error
/// ("error reading from error stream") even after a `Status`.
pub const NORMAL_CLOSURE: u16 = 1000;

fn with_channel(channel: u8, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 1);
    out.push(channel);
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v5_is_preferred_and_unknown_offers_are_refused() {
        assert_eq!(
            pick_subprotocol(["v4.channel.k8s.io, v5.channel.k8s.io"]),
            Some(V5)
        );
        assert_eq!(
            pick_subprotocol(["channel.k8s.io", "v4.channel.k8s.io"]),
            Some(V4)
        );
        assert_eq!(pick_subprotocol(["base64.channel.k8s.io"]), None);
        assert_eq!(pick_subprotocol([]), None);
    }

    #[test]
    fn client_frames_decode_by_channel() {
        assert_eq!(decode_client(b"\0ls\n"), Ok(ClientFrame::Stdin(b"ls\n")));
        assert_eq!(
            decode_client(&encode_resize(120, 40)),
            Ok(ClientFrame::Resize {
                width: 120,
                height: 40
            })
        );
        assert_eq!(decode_client(&[255, 0]), Ok(ClientFrame::CloseStdin));
        assert_eq!(decode_client(&[]), Ok(ClientFrame::Ignore));
        assert_eq!(decode_client(b"\x01out"), Err(FrameError::Channel(1)));
        assert!(matches!(
            decode_client(b"\x04{\"Width\":-1}"),
            Err(FrameError::Resize(_))
        ));
    }

    #[test]
    fn server_frames_carry_their_channel() {
        assert_eq!(encode_output(false, b"hi"), b"\x01hi");
        assert_eq!(encode_output(true, b"oops"), b"\x02oops");
        assert_eq!(encode_success()[0], 3);
        let failure = encode_failure("NotFound", "no pod");
        let status: serde_json::Value = serde_json::from_slice(&failure[1..]).unwrap();
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["message"], "no pod");
    }
}
