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
        let mut guard = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if guard.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}
