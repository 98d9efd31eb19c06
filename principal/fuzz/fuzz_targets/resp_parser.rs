//! Fuzzes the redis proxy's client side on arbitrary bytes: RESP2 frames read with the codec
//! the proxy reads clients with ([`ClientCodec`], fed in the pieces a socket might deliver),
//! then each frame through [`command_args`] and the live-view key classification
//! ([`agent_of_key`]) the proxy applies to `GET`/`SUBSCRIBE` arguments.
//! Oracle: nothing panics; a frame is either a command or refused with a protocol error.
#![no_main]

use argocd_agent_principal::redis_proxy::{agent_of_key, command_args, ClientCodec};
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    // The first byte chooses how the bytes arrive (a socket read may split a frame anywhere).
    let Some((&chunk, data)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut codec = ClientCodec::default();
    let mut buf = BytesMut::new();
    for piece in data.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => classify(&frame),
                Ok(None) => break,
                // The proxy answers a protocol error and closes the connection.
                Err(_) => return,
            }
        }
    }
    let _ = codec.decode_eof(&mut buf);
});

fn classify(frame: &redis_protocol::resp2::types::BytesFrame) {
    let Ok(args) = command_args(frame) else {
        return;
    };
    assert!(!args.is_empty(), "a command always has a name");
    let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
    if matches!(name.as_str(), "GET" | "SUBSCRIBE" | "UNSUBSCRIBE") {
        for key in &args[1..] {
            if let Ok(key) = std::str::from_utf8(key) {
                if let Some(agent) = agent_of_key(key) {
                    assert!(
                        !agent.is_empty() && !agent.contains('|'),
                        "{key:?} → {agent:?}"
                    );
                }
            }
        }
    }
}
