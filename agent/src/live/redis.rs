//! Redis-proxy requests answered from the agent's local Argo CD Redis (`--redis-address`).
//!
//! Owns [`RedisTarget`] (how every connection to the local Redis is opened: TCP, TLS when
//! `--redis-tls-enabled`, then `AUTH` with the configured credentials, as Argo CD's own
//! components do against its password-protected Redis; the password is never logged), the key mapping (the hub names an application `<agent>_<app>`; the local Argo CD, running
//! the app in its own namespace, names it `<app>`; under destination-based mapping an
//! Application keeps its namespace and its key too, see [`local_key`]), `GET` (one short connection per request),
//! and `SUBSCRIBE`: one local subscriber connection per hub redis connection, whose messages go
//! back as `pushFromSubscribe`. It ends as soon as the principal says the hub client's connection
//! ended (`closeConnection`, our extension, which our subscribe answers announce with
//! `supportsCloseConnection`), and otherwise (an upstream principal) when the hub connection stops
//! pinging for [`IDLE_LIMIT`] (upstream: 10 minutes). The RESP codec is `redis-protocol`'s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_agent_proto::payload::{
    RedisRequest, RedisResponse, RedisResponseBody, RedisResponseBodyGet, RedisResponseBodyPong,
    RedisResponseBodyPushFromSubscribe, RedisResponseBodySubscribeResponse,
};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use redis_protocol::codec::Resp2;
use redis_protocol::resp2::types::BytesFrame as Frame;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::rustls;
use tokio_util::codec::Framed;
use tracing::{debug, info};

use super::LiveService;
use crate::config::{AgentConfig, RedisCredentials, RedisTls};

/// A subscription whose hub connection has not pinged for this long is closed.
pub const IDLE_LIMIT: Duration = Duration::from_secs(600);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The local name of a hub live-view key. Namespace mapping (`destination_mapping` = `None`): the
/// `<namespace>_` prefix of the application segment is dropped (`app|resources-tree|agent-a_guestbook|1.8`
/// → `app|resources-tree|guestbook|1.8`), every Application being in the agent's namespace.
/// Destination-based mapping (`Some(agent namespace)`): Applications keep their hub namespace, so
/// the key is the local one as it is, except a prefix naming the agent's own namespace, which the
/// local Argo CD (running there) leaves out.
pub fn local_key(key: &str, destination_mapping: Option<&str>) -> String {
    let mut parts: Vec<&str> = key.split('|').collect();
    if parts.len() >= 3 {
        if let Some((namespace, app)) = parts[2].split_once('_') {
            if destination_mapping.is_none_or(|own| own == namespace) {
                parts[2] = app;
            }
        }
    }
    parts.join("|")
}

fn bulk(s: &str) -> Frame {
    Frame::BulkString(Bytes::copy_from_slice(s.as_bytes()))
}

/// A byte stream to the local Redis, plaintext or TLS.
trait RedisIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> RedisIo for T {}

/// One open, authenticated connection to the local Redis.
type Connection = Framed<Box<dyn RedisIo>, Resp2>;

/// How connections to the local Redis are opened (see the module docs).
#[derive(Clone)]
pub struct RedisTarget {
    /// `host:port`.
    pub address: String,
    /// Sent with `AUTH` right after connecting.
    pub credentials: Option<RedisCredentials>,
    /// TLS client config and the name the server certificate is checked against.
    tls: Option<(
        Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    )>,
    /// Why the TLS settings cannot be used (every request then fails with this).
    unusable: Option<String>,
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget")
            .field("address", &self.address)
            .field("credentials", &self.credentials)
            .field("tls", &self.tls.is_some())
            .field("unusable", &self.unusable)
            .finish()
    }
}

impl RedisTarget {
    /// A plaintext target at `address`.
    pub fn plain(address: impl Into<String>, credentials: Option<RedisCredentials>) -> Self {
        RedisTarget {
            address: address.into(),
            credentials,
            tls: None,
            unusable: None,
        }
    }

    /// The target of the agent's `--redis-*` flags; a TLS setting that cannot be used (an
    /// unreadable CA) is reported in every answer rather than stopping the agent.
    pub fn from_config(config: &AgentConfig) -> Self {
        let mut target = RedisTarget::plain(
            config.redis_address.to_string(),
            config.redis_credentials.clone(),
        );
        if let Some(tls) = &config.redis_tls {
            match tls_config(tls, &config.redis_address.host) {
                Ok(tls) => target.tls = Some(tls),
                Err(e) => {
                    tracing::error!(error = %e, "TLS to the local redis is unusable; redis requests will fail");
                    target.unusable = Some(format!("TLS to the local redis is unusable: {e}"));
                }
            }
        }
        target
    }

    /// Opens a connection: TCP, TLS if configured, then `AUTH` if credentials are configured.
    async fn connect(&self) -> Result<Connection, String> {
        if let Some(reason) = &self.unusable {
            return Err(reason.clone());
        }
        let addr = &self.address;
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| format!("local redis {addr} did not accept a connection in time"))?
            .map_err(|e| format!("local redis {addr}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn RedisIo> = match &self.tls {
            None => Box::new(tcp),
            Some((config, name)) => {
                let tls = tokio_rustls::TlsConnector::from(config.clone());
                let stream = tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(name.clone(), tcp))
                    .await
                    .map_err(|_| format!("local redis {addr}: TLS handshake timed out"))?
                    .map_err(|e| format!("local redis {addr}: TLS handshake: {e}"))?;
                Box::new(stream)
            }
        };
        let mut conn = Framed::new(io, Resp2::default());
        if let Some(creds) = &self.credentials {
            conn.send(auth_command(creds))
                .await
                .map_err(|e| format!("local redis {addr}: {e}"))?;
            match next_reply(&mut conn).await? {
                Frame::SimpleString(ok) if ok.as_ref() == b"OK" => {}
                // Redis's own message (WRONGPASS, NOAUTH...) never repeats the password.
                Frame::Error(e) => {
                    return Err(format!(
                        "local redis {addr} refused the agent's credentials (--redis-password / --redis-creds-dir-path): {e}"
                    ))
                }
                other => return Err(format!("local redis {addr} answered AUTH with {other:?}")),
            }
        }
        Ok(conn)
    }
}

/// `AUTH [username] password`: the username only when one is configured, so Redis before 6
/// (single password) understands it too.
fn auth_command(creds: &RedisCredentials) -> Frame {
    let mut args = vec![bulk("AUTH")];
    if let Some(user) = &creds.username {
        args.push(bulk(user));
    }
    args.push(bulk(creds.password.expose()));
    Frame::Array(args)
}

/// The client config of `tls` for a server named `host`.
fn tls_config(
    tls: &RedisTls,
    host: &str,
) -> Result<
    (
        Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    ),
    String,
> {
    let provider = argocd_agent_runtime::tls::crypto_provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let config = match tls {
        RedisTls::Ca(path) => {
            let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let origin = path.display().to_string();
            let roots = argocd_agent_runtime::tls::parse_ca_bundle(
                argocd_agent_runtime::tls::PemInput::new(&origin, &pem),
            )
            .map_err(|e| e.to_string())?;
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        RedisTls::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServerCertificate(provider)))
            .with_no_client_auth(),
    };
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host:?} is not a TLS server name: {e}"))?;
    Ok((Arc::new(config), name))
}

/// `--redis-tls-insecure`: any certificate is accepted (the handshake signatures still are checked).
#[derive(Debug)]
struct AnyServerCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The next reply on `conn`, within [`REPLY_TIMEOUT`].
async fn next_reply(conn: &mut Connection) -> Result<Frame, String> {
    match tokio::time::timeout(REPLY_TIMEOUT, conn.next()).await {
        Ok(Some(Ok(f))) => Ok(f),
        Ok(Some(Err(e))) => Err(e.to_string()),
        Ok(None) => Err("local redis closed the connection".into()),
        Err(_) => Err("local redis did not answer in time".into()),
    }
}

/// `GET key` on the local Redis over one short connection; a miss is `cache_hit: false`.
pub(crate) async fn get(target: &RedisTarget, key: &str) -> RedisResponseBodyGet {
    let result = async {
        let mut conn = target.connect().await?;
        conn.send(Frame::Array(vec![bulk("GET"), bulk(key)]))
            .await
            .map_err(|e| e.to_string())?;
        next_reply(&mut conn).await
    }
    .await;
    match result {
        Ok(Frame::BulkString(b)) | Ok(Frame::SimpleString(b)) => RedisResponseBodyGet {
            bytes: b.to_vec(),
            cache_hit: true,
            error: String::new(),
        },
        Ok(Frame::Null) => RedisResponseBodyGet::default(),
        Ok(Frame::Error(e)) => RedisResponseBodyGet {
            error: e.to_string(),
            ..Default::default()
        },
        Ok(other) => RedisResponseBodyGet {
            error: format!("unexpected reply from local redis: {other:?}"),
            ..Default::default()
        },
        Err(e) => RedisResponseBodyGet {
            error: e,
            ..Default::default()
        },
    }
}

type SubscribeCommand = (String, String, oneshot::Sender<Result<(), String>>);

/// The handle of one [`run_subscriber`] task; dropping it (its `stop` sender) ends the task and
/// closes its local connection.
struct Subscriber {
    commands: mpsc::Sender<SubscribeCommand>,
    last_ping: Arc<Mutex<Instant>>,
    _stop: oneshot::Sender<()>,
}

/// Local subscriber connections by hub connection UUID.
#[derive(Default)]
pub struct Subscriptions {
    by_connection: Mutex<HashMap<String, Subscriber>>,
}

fn frame_text(f: &Frame) -> Option<String> {
    match f {
        Frame::BulkString(b) | Frame::SimpleString(b) => {
            Some(String::from_utf8_lossy(b).into_owned())
        }
        _ => None,
    }
}

/// Runs one local subscriber connection until the hub connection closes (`stop` resolves) or
/// goes idle.
async fn run_subscriber(
    live: Arc<LiveService>,
    connection: String,
    mut commands: mpsc::Receiver<SubscribeCommand>,
    last_ping: Arc<Mutex<Instant>>,
    mut stop: oneshot::Receiver<()>,
) {
    let target = live.settings.redis.clone();
    let mut conn: Option<Connection> = None;
    // local channel -> hub channel name, and subscriptions waiting for their confirmation
    let mut names: HashMap<String, String> = HashMap::new();
    let mut pending: HashMap<String, oneshot::Sender<Result<(), String>>> = HashMap::new();
    let mut idle_check = tokio::time::interval(Duration::from_secs(30));
    loop {
        let frame = async {
            match conn.as_mut() {
                Some(c) => c.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stop => {
                debug!(connection = %connection, "hub redis connection closed; closing its subscriptions");
                break;
            }
            cmd = commands.recv() => {
                let Some((local, hub, done)) = cmd else { break };
                if conn.is_none() {
                    match target.connect().await {
                        Ok(c) => conn = Some(c),
                        Err(e) => { let _ = done.send(Err(e)); continue; }
                    }
                }
                let c = conn.as_mut().expect("connected above");
                if let Err(e) = c.send(Frame::Array(vec![bulk("SUBSCRIBE"), bulk(&local)])).await {
                    let _ = done.send(Err(e.to_string()));
                    conn = None;
                    continue;
                }
                names.insert(local.clone(), hub);
                pending.insert(local, done);
            }
            f = frame => match f {
                Some(Ok(Frame::Array(items))) => {
                    let kind = items.first().and_then(frame_text).unwrap_or_default();
                    let channel = items.get(1).and_then(frame_text).unwrap_or_default();
                    match kind.as_str() {
                        "subscribe" => {
                            if let Some(done) = pending.remove(&channel) { let _ = done.send(Ok(())); }
                        }
                        "message" => {
                            if let Some(hub) = names.get(&channel) {
                                live.redis_answer(&RedisResponse {
                                    uuid: uuid::Uuid::new_v4().to_string(),
                                    connection_uuid: connection.clone(),
                                    body: RedisResponseBody {
                                        push_from_subscribe: Some(RedisResponseBodyPushFromSubscribe { channel_name: hub.clone() }),
                                        ..Default::default()
                                    },
                                });
                            }
                        }
                        _ => {}
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    info!(connection = %connection, "local redis subscription connection ended");
                    for (_, done) in pending.drain() { let _ = done.send(Err("local redis closed the connection".into())); }
                    break;
                }
            },
            _ = idle_check.tick() => {
                let idle = last_ping.lock().unwrap_or_else(|e| e.into_inner()).elapsed();
                if idle > IDLE_LIMIT {
                    info!(connection = %connection, "hub redis connection idle; closing its subscriptions");
                    break;
                }
            }
        }
    }
    // Only this task's entry: after a `closeConnection` it is gone already.
    let mut map = live
        .redis
        .by_connection
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if map
        .get(&connection)
        .is_some_and(|s| Arc::ptr_eq(&s.last_ping, &last_ping))
    {
        map.remove(&connection);
    }
}

impl Subscriptions {
    /// Answers one redis request; `closeConnection` gets no answer (nobody waits for one).
    pub async fn handle(
        &self,
        live: &Arc<LiveService>,
        req: &RedisRequest,
    ) -> Option<RedisResponse> {
        if req.body.close_connection.is_some() {
            self.close(&req.connection_uuid);
            return None;
        }
        let mut resp = RedisResponse {
            uuid: req.uuid.clone(),
            connection_uuid: req.connection_uuid.clone(),
            body: RedisResponseBody::default(),
        };
        if let Some(g) = &req.body.get {
            let key = local_key(&g.key, live.settings.key_namespace());
            resp.body.get = Some(get(&live.settings.redis, &key).await);
            debug!(request = %req.uuid, hit = resp.body.get.as_ref().is_some_and(|g| g.cache_hit), "redis GET answered");
        } else if let Some(s) = &req.body.subscribe {
            let error = match self
                .subscribe(live, &req.connection_uuid, &s.channel_name)
                .await
            {
                Ok(()) => String::new(),
                Err(e) => e,
            };
            resp.body.subscribe_response = Some(RedisResponseBodySubscribeResponse {
                error,
                supports_close_connection: true,
            });
        } else {
            if let Some(sub) = self
                .by_connection
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&req.connection_uuid)
            {
                *sub.last_ping.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            }
            resp.body.pong = Some(RedisResponseBodyPong {});
        }
        Some(resp)
    }

    /// Ends the subscriptions of hub connection `connection`: its subscriber task stops and
    /// closes the local connection.
    fn close(&self, connection: &str) {
        let removed = self
            .by_connection
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(connection);
        if removed.is_some() {
            debug!(
                connection,
                "hub redis connection closed; ending its local subscriptions"
            );
        }
    }

    async fn subscribe(
        &self,
        live: &Arc<LiveService>,
        connection: &str,
        channel: &str,
    ) -> Result<(), String> {
        let commands = {
            let mut map = self.by_connection.lock().unwrap_or_else(|e| e.into_inner());
            let sub = map.entry(connection.to_string()).or_insert_with(|| {
                let (tx, rx) = mpsc::channel(16);
                let (stop_tx, stop_rx) = oneshot::channel();
                let last_ping = Arc::new(Mutex::new(Instant::now()));
                tokio::spawn(run_subscriber(
                    live.clone(),
                    connection.to_string(),
                    rx,
                    last_ping.clone(),
                    stop_rx,
                ));
                Subscriber {
                    commands: tx,
                    last_ping,
                    _stop: stop_tx,
                }
            });
            *sub.last_ping.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            sub.commands.clone()
        };
        let (done, confirmed) = oneshot::channel();
        commands
            .send((
                local_key(channel, live.settings.key_namespace()),
                channel.to_string(),
                done,
            ))
            .await
            .map_err(|_| "the local subscription connection ended".to_string())?;
        match tokio::time::timeout(REPLY_TIMEOUT, confirmed).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err("the local subscription connection ended".into()),
            Err(_) => Err("local redis did not confirm the subscription in time".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_keys_map_to_local_keys() {
        assert_eq!(
            local_key("app|resources-tree|agent-a_guestbook|1.8.3", None),
            "app|resources-tree|guestbook|1.8.3"
        );
        assert_eq!(
            local_key("app|managed-resources|agent-a_my_app", None),
            "app|managed-resources|my_app"
        );
        assert_eq!(
            local_key("app|resources-tree|guestbook", None),
            "app|resources-tree|guestbook"
        );
    }

    #[test]
    fn under_destination_mapping_hub_keys_keep_their_namespace_but_the_agents_own() {
        let own = Some("argocd");
        assert_eq!(
            local_key("app|resources-tree|team-a_guestbook|1.8.3", own),
            "app|resources-tree|team-a_guestbook|1.8.3"
        );
        assert_eq!(
            local_key("app|managed-resources|argocd_guestbook", own),
            "app|managed-resources|guestbook"
        );
        // The principal's namespace (no prefix on the hub) is the agent's own on the spoke.
        assert_eq!(
            local_key("app|resources-tree|guestbook|1.8.3", own),
            "app|resources-tree|guestbook|1.8.3"
        );
    }

    /// A one-connection Redis stand-in: reads one command, answers `reply`, returns the command.
    async fn fake_redis(reply: &'static [u8]) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 256];
            let n = s.read(&mut buf).await.unwrap();
            s.write_all(reply).await.unwrap();
            buf.truncate(n);
            buf
        });
        (addr, task)
    }

    #[tokio::test]
    async fn connections_authenticate_with_the_configured_credentials() {
        let (addr, server) = fake_redis(b"+OK\r\n").await;
        let creds = RedisCredentials {
            username: Some("argo".into()),
            password: "pw".parse().unwrap(),
        };
        RedisTarget::plain(addr, Some(creds))
            .connect()
            .await
            .unwrap();
        assert_eq!(
            server.await.unwrap(),
            b"*3\r\n$4\r\nAUTH\r\n$4\r\nargo\r\n$2\r\npw\r\n"
        );

        let (addr, _server) = fake_redis(b"-WRONGPASS invalid username-password pair\r\n").await;
        let creds = RedisCredentials {
            username: None,
            password: "not-it".parse().unwrap(),
        };
        let err = RedisTarget::plain(addr, Some(creds))
            .connect()
            .await
            .err()
            .unwrap();
        assert!(err.contains("WRONGPASS"), "{err}");
        assert!(!err.contains("not-it"), "{err}");
    }
}
