//! Free loopback ports for the processes a test starts. A port handed out once is never handed out
//! again by this process, so two components started in parallel cannot race for the same port.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;

static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// Returns a loopback TCP port that was free a moment ago and that this process has not handed out before.
pub fn free_port() -> u16 {
    loop {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to find a free port");
        let port = listener
            .local_addr()
            .expect("local addr of probe listener")
            .port();
        drop(listener);
        if hand_out(port) {
            return port;
        }
    }
}

/// A free port below 32768, for programs that refuse higher ones (upstream argocd-agent's health
/// and metrics flags accept 1..32767). Probed at random in 20000..32767, away from well-known ports
/// and below Linux's ephemeral range.
pub fn free_low_port() -> u16 {
    loop {
        let port = 20000 + (uuid::Uuid::new_v4().as_u128() % 12767) as u16;
        // Free on every interface: some of those programs bind 0.0.0.0.
        if TcpListener::bind(("0.0.0.0", port)).is_ok() && hand_out(port) {
            return port;
        }
    }
}

fn hand_out(port: u16) -> bool {
    let mut guard = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    guard.get_or_insert_with(HashSet::new).insert(port)
}
