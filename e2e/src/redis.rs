//! A real `redis-server` (Debian's) on a free loopback port, for the Redis proxy tests and for the
//! agent's local Argo CD cache.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::binaries::system_binary;
use crate::ports::free_port;
use crate::process::{temp_dir, ManagedProcess, ProcessSpec};

/// A running redis-server.
pub struct Redis {
    /// Port on 127.0.0.1.
    pub port: u16,
    /// The server process.
    pub process: ManagedProcess,
}

impl Redis {
    /// Starts redis-server without persistence and waits until it answers PING.
    pub fn start(name: &str) -> anyhow::Result<Redis> {
        let bin = system_binary("redis-server", "redis-server")?;
        let dir = temp_dir(&format!("redis-{name}"))?;
        let port = free_port();
        let spec = ProcessSpec::new(format!("redis-{name}"), bin, dir.join("redis.log")).args([
            "--port".to_string(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--protected-mode".into(),
            "no".into(),
            "--dir".into(),
            dir.display().to_string(),
        ]);
        let process = ManagedProcess::spawn(spec)?;
        let redis = Redis { port, process };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !redis.ping() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "redis-server on port {port} did not answer PING within 10 s:\n{}",
                redis.process.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(redis)
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// True if the server answers `PING` with `+PONG`.
    pub fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }
}
