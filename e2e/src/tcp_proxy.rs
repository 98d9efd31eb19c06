//! A small in-test TCP proxy between an agent and its principal, to inject link faults: forward
//! (normal), cut (every connection closed, new ones closed at once), blackhole (connections stay
//! open but every byte is dropped, no RST: a half-open link), and a per-chunk delay. Listens on
//! 127.0.0.1 only, on a free port or one the caller chose and bound (a node port, where the
//! discovery test plays kube-proxy). The upstream can be changed (a restarted principal on another
//! port); it counts the connections it accepted.
//! [`TcpBalancer`] spreads connections over several upstreams, as a Service over replicas.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkMode {
    /// Bytes flow both ways.
    Forward,
    /// Connections are closed; new ones are closed as soon as accepted.
    Cut,
    /// Connections stay open; bytes are swallowed in both directions.
    Blackhole,
}

/// A running proxy; stops when dropped.
pub struct TcpProxy {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    mode: watch::Sender<LinkMode>,
    delay_ms: Arc<AtomicU64>,
    upstream: Arc<Mutex<SocketAddr>>,
    accepted: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Starts forwarding 127.0.0.1:<port> to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<TcpProxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        TcpProxy::start_on(listener, upstream)
    }

    /// Starts forwarding what `listener` (bound by the caller: a port chosen beforehand)
    /// accepts to `upstream`.
    pub fn start_on(
        listener: std::net::TcpListener,
        upstream: SocketAddr,
    ) -> anyhow::Result<TcpProxy> {
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let port = listener.local_addr()?.port();
        let (mode, _) = watch::channel(LinkMode::Forward);
        let delay_ms = Arc::new(AtomicU64::new(0));
        let upstream = Arc::new(Mutex::new(upstream));
        let accepted = Arc::new(AtomicU64::new(0));
        let accept = {
            let (mode, delay_ms, upstream) = (mode.clone(), delay_ms.clone(), upstream.clone());
            let accepted = accepted.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    if *mode.borrow() == LinkMode::Cut {
                        drop(client);
                        continue;
                    }
                    let target = *upstream.lock().unwrap_or_else(|e| e.into_inner());
                    let (mode, delay_ms) = (mode.subscribe(), delay_ms.clone());
                    tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect(target).await else {
                            return;
                        };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        let up = pump(cr, sw, mode.clone(), delay_ms.clone());
                        let down = pump(sr, cw, mode, delay_ms);
                        // Either direction ending ends the connection (both halves dropped).
                        tokio::select! {
                            _ = up => {}
                            _ = down => {}
                        }
                    });
                }
            })
        };
        Ok(TcpProxy {
            port,
            mode,
            delay_ms,
            upstream,
            accepted,
            accept,
        })
    }

    /// How many connections it accepted so far.
    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Lets traffic flow.
    pub fn forward(&self) {
        self.mode.send_replace(LinkMode::Forward);
    }

    /// Closes every connection and refuses new ones until [`forward`](Self::forward).
    pub fn cut(&self) {
        self.mode.send_replace(LinkMode::Cut);
    }

    /// Keeps connections open but drops every byte (a half-open link: no FIN, no RST).
    pub fn blackhole(&self) {
        self.mode.send_replace(LinkMode::Blackhole);
    }

    /// Delays every forwarded chunk by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// Sends new connections to `upstream`.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap_or_else(|e| e.into_inner()) = upstream;
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.mode.send_replace(LinkMode::Cut);
        self.accept.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<LinkMode>,
    delay_ms: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if *mode.borrow() == LinkMode::Cut {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        match *mode.borrow() {
            LinkMode::Cut => return,
            LinkMode::Blackhole => continue,
            LinkMode::Forward => {}
        }
        let delay = delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A TCP load balancer in front of several upstreams (replicas behind one Service): each new
/// connection goes to the next upstream in turn that accepts it; connections to an upstream that
/// dies end with it. Listens on 127.0.0.1 only; stops when dropped.
pub struct TcpBalancer {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    accept: tokio::task::JoinHandle<()>,
}

impl TcpBalancer {
    /// Starts balancing 127.0.0.1:<port> over `upstreams` (round robin, skipping refusals).
    pub async fn start(upstreams: Vec<SocketAddr>) -> anyhow::Result<TcpBalancer> {
        anyhow::ensure!(
            !upstreams.is_empty(),
            "a balancer needs at least one upstream"
        );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let accept = tokio::spawn(async move {
            // Always forwarding: the pumps of the plain proxy with a mode that never changes.
            let (mode, _) = watch::channel(LinkMode::Forward);
            let no_delay = Arc::new(AtomicU64::new(0));
            let mut next = 0usize;
            while let Ok((client, _)) = listener.accept().await {
                let order: Vec<SocketAddr> = (0..upstreams.len())
                    .map(|i| upstreams[(next + i) % upstreams.len()])
                    .collect();
                next = next.wrapping_add(1);
                let (mode, delay) = (mode.subscribe(), no_delay.clone());
                tokio::spawn(async move {
                    let mut server = None;
                    for target in order {
                        if let Ok(s) = TcpStream::connect(target).await {
                            server = Some(s);
                            break;
                        }
                    }
                    let Some(server) = server else { return };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::select! {
                        _ = pump(cr, sw, mode.clone(), delay.clone()) => {}
                        _ = pump(sr, cw, mode, delay) => {}
                    }
                });
            }
        });
        Ok(TcpBalancer { port, accept })
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for TcpBalancer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
