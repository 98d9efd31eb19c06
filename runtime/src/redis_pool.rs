//! Connections to one Redis kept open between request/reply commands (the agent's `GET`s for the
//! principal's Redis proxy and its cluster-info reads; the principal's cluster-info writes to the hub
//! Redis), so a command costs one round trip instead
//! of a TCP connect, a TLS handshake and `AUTH` each time.
//!
//! Owns [`RedisPool`]: the idle connections of a [`RedisTarget`] (at most `max_idle`). A command
//! takes an idle connection or opens one (as many as run at once), and gives it back only once its
//! reply arrived complete, so a connection never carries an unread reply into the next command. A
//! command that fails on a reused connection because the connection broke (Redis closed it while it
//! was idle: its `timeout` setting, a restart) is retried once on a fresh connection; that is safe
//! for the commands this serves: reads, and `SET key value EX ttl`, which writes the same whether it
//! runs once or twice. A reply that does not come in time is the command's
//! error, and its connection is closed. Subscriptions hold a connection of their own
//! ([`RedisTarget::connect`]), not one of these.

use std::sync::Mutex;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use redis_protocol::resp2::types::BytesFrame as Frame;

use crate::redis_client::{RedisConnection, RedisTarget};

/// Why one exchange on a connection failed.
enum Failed {
    /// The connection broke (closed, reset, unreadable): a fresh one may work.
    Broken(String),
    /// No reply in time: Redis is slow, another connection would not be faster.
    TimedOut(String),
}

/// Idle connections of one Redis (see the module docs). Share it as `Arc<RedisPool>`.
pub struct RedisPool {
    target: RedisTarget,
    idle: Mutex<Vec<RedisConnection>>,
    max_idle: usize,
    reply_timeout: Duration,
}

impl std::fmt::Debug for RedisPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPool")
            .field("target", &self.target)
            .field("idle", &self.idle_count())
            .field("max_idle", &self.max_idle)
            .finish()
    }
}

impl RedisPool {
    /// A pool of `target` keeping at most `max_idle` connections open between commands; a reply
    /// may take `reply_timeout`.
    pub fn new(target: RedisTarget, max_idle: usize, reply_timeout: Duration) -> Self {
        RedisPool {
            target,
            idle: Mutex::new(Vec::new()),
            max_idle,
            reply_timeout,
        }
    }

    /// How connections are opened (for callers that hold a connection of their own).
    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// Connections open and idle now.
    pub fn idle_count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RedisConnection>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `command` and returns Redis's reply (an error reply is a reply, not an `Err`).
    pub async fn command(&self, command: Frame) -> Result<Frame, String> {
        let reused = self.lock().pop();
        if let Some(conn) = reused {
            match self.exchange(conn, command.clone()).await {
                Ok(reply) => return Ok(reply),
                Err(Failed::TimedOut(e)) => return Err(e),
                Err(Failed::Broken(e)) => {
                    tracing::debug!(redis = self.target.role(), error = %e, "an idle redis connection broke; retrying on a new one");
                }
            }
        }
        let conn = self.target.connect().await?;
        self.exchange(conn, command).await.map_err(|e| match e {
            Failed::Broken(e) | Failed::TimedOut(e) => e,
        })
    }

    /// One command and its reply on `conn`, which goes back to the idle ones after a reply.
    async fn exchange(&self, mut conn: RedisConnection, command: Frame) -> Result<Frame, Failed> {
        let (role, address) = (self.target.role(), &self.target.address);
        conn.send(command)
            .await
            .map_err(|e| Failed::Broken(format!("{role} {address}: {e}")))?;
        let reply = match tokio::time::timeout(self.reply_timeout, conn.next()).await {
            Ok(Some(Ok(reply))) => reply,
            Ok(Some(Err(e))) => return Err(Failed::Broken(format!("{role} {address}: {e}"))),
            Ok(None) => {
                return Err(Failed::Broken(format!(
                    "{role} {address} closed the connection"
                )))
            }
            Err(_) => {
                return Err(Failed::TimedOut(format!(
                    "{role} {address} did not answer within {:?}",
                    self.reply_timeout
                )))
            }
        };
        let mut idle = self.lock();
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A stand-in Redis on loopback answering every command `$2 ok`, closing each connection
    /// after `answers` replies; returns its address and the number of connections it accepted.
    async fn stand_in_redis(answers: usize) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 256];
                    for _ in 0..answers {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => s.write_all(b"$2\r\nok\r\n").await.unwrap(),
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    fn get() -> Frame {
        Frame::Array(vec![
            Frame::BulkString(Bytes::from_static(b"GET")),
            Frame::BulkString(Bytes::from_static(b"k")),
        ])
    }

    #[tokio::test]
    async fn commands_reuse_one_connection() {
        let (addr, accepted) = stand_in_redis(usize::MAX).await;
        let pool = RedisPool::new(
            RedisTarget::plain("local redis", addr, None),
            4,
            Duration::from_secs(5),
        );
        for _ in 0..5 {
            let reply = pool.command(get()).await.unwrap();
            assert_eq!(reply, Frame::BulkString(Bytes::from_static(b"ok")));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn an_idle_connection_the_server_closed_is_replaced_without_failing_the_command() {
        let (addr, accepted) = stand_in_redis(1).await;
        let pool = RedisPool::new(
            RedisTarget::plain("local redis", addr, None),
            4,
            Duration::from_secs(5),
        );
        for round in 1..=3 {
            let reply = pool.command(get()).await.unwrap();
            assert_eq!(reply, Frame::BulkString(Bytes::from_static(b"ok")));
            assert_eq!(accepted.load(Ordering::SeqCst), round);
        }
    }

    #[tokio::test]
    async fn a_reply_that_does_not_come_in_time_is_an_error_and_its_connection_is_dropped() {
        // Accepts and reads, never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let silent = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 256];
            while s.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        });
        let pool = RedisPool::new(
            RedisTarget::plain("local redis", addr, None),
            4,
            Duration::from_millis(200),
        );
        let err = pool.command(get()).await.unwrap_err();
        assert!(
            err.contains("local redis") && err.contains("did not answer"),
            "{err}"
        );
        assert_eq!(pool.idle_count(), 0);
        // The dropped connection is closed: the server's read ends.
        tokio::time::timeout(Duration::from_secs(5), silent)
            .await
            .expect("the timed-out connection was closed")
            .unwrap();
    }
}
