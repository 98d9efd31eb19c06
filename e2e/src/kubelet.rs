//! A kubelet's container-log and exec endpoints for the test planes, which run no kubelet: a Node
//! object whose status points the real kube-apiserver at an HTTPS server of this process, which
//! answers `GET /containerLogs/{namespace}/{pod}/{container}` as a kubelet does, and
//! `/exec/{namespace}/{pod}/{container}` ([`crate::kubelet_exec`]; the Node declares
//! `ExtendWebSocketsToKubelet`, so the apiserver hands it the client's exec WebSocket). Pods bound to that node
//! (`spec.nodeName`) then have working `pods/{pod}/log` on the real apiserver, so any agent (ours,
//! or upstream's Go agent, which can only read logs through its apiserver) serves real logs.
//!
//! Each container has [`HISTORY`] numbered lines, `"{container} line {i:03}"`, line `i` written
//! `HISTORY - i` seconds before the request. `tailLines`, `timestamps` (kubelet's RFC 3339 with
//! nanoseconds) and `follow` (then `"{container} live {n}"` every 200 ms until the client goes
//! away, which is counted) are honoured. The apiserver dials kubelets without checking their
//! certificate when it has no `--kubelet-certificate-authority`, as on the test planes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use crate::control_plane::ControlPlane;
use crate::wait::wait_until;

/// Lines of history per container.
pub const HISTORY: u32 = 20;

/// What the endpoint saw.
#[derive(Default, Debug)]
pub struct KubeletStats {
    /// Query string of every `containerLogs` request, in order.
    pub queries: Mutex<Vec<String>>,
    /// Follow streams open now.
    pub follows_open: AtomicUsize,
    /// Follow streams whose client went away.
    pub follows_closed: AtomicUsize,
    /// Every exec, in order.
    pub execs: Mutex<Vec<crate::kubelet_exec::ExecSeen>>,
    /// Exec processes running now.
    pub execs_open: AtomicUsize,
    /// Exec processes that ended (exited or killed).
    pub execs_ended: AtomicUsize,
    /// Exec processes killed because their client went away.
    pub execs_killed: AtomicUsize,
    /// Execs whose client closed their stdin (v5 close signal).
    pub stdin_closed: AtomicUsize,
    /// Terminal resizes received, (width, height).
    pub resizes: Mutex<Vec<(u16, u16)>>,
}

/// The fake kubelet; its Node is deleted when dropped (best effort).
pub struct FakeKubelet {
    /// The Node's name (set it as a pod's `spec.nodeName`).
    pub node: String,
    /// What was asked of it.
    pub stats: Arc<KubeletStats>,
    nodes: Api<Node>,
}

/// Body of the fake log responses.
pub type LogBody = BoxBody<Bytes, std::convert::Infallible>;

impl FakeKubelet {
    /// Serves container logs on a free loopback port and registers Node `node` on `plane`.
    pub async fn start(plane: &ControlPlane, node: &str) -> anyhow::Result<FakeKubelet> {
        let key = rcgen::KeyPair::generate()?;
        let cert =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])?.self_signed(&key)?;
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let stats = Arc::new(KubeletStats::default());
        let served = stats.clone();
        // A runtime of its own: the test's may be blocked waiting for a kubectl that reads logs.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::spawn(move || runtime.block_on(accept(listener, acceptor, served)));
        let nodes: Api<Node> = Api::all(plane.client().await?);
        nodes
            .create(
                &PostParams::default(),
                // A Node's status may be set on create.
                &serde_json::from_value(json!({
                    "metadata": {"name": node},
                    "status": {
                        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
                        // The apiserver then passes exec WebSockets through (Kubernetes 1.36).
                        "declaredFeatures": ["ExtendWebSocketsToKubelet"],
                    },
                }))?,
            )
            .await?;
        Ok(FakeKubelet {
            node: node.to_string(),
            stats,
            nodes,
        })
    }

    /// Waits up to `wait` until `n` exec processes have ended in all and none runs: a session's
    /// shell ended on the spoke. The error says how often a client closed stdin.
    pub async fn wait_execs_ended(
        &self,
        n: usize,
        what: &str,
        wait: Duration,
    ) -> anyhow::Result<()> {
        let stats = &self.stats;
        wait_until(what, wait, || async {
            let ended = stats.execs_ended.load(Ordering::SeqCst) == n
                && stats.execs_open.load(Ordering::SeqCst) == 0;
            Ok::<_, anyhow::Error>(ended.then_some(()))
        })
        .await
        .map_err(|e| {
            let closed = stats.stdin_closed.load(Ordering::SeqCst);
            anyhow::anyhow!("{e} (stdin closed {closed} times)")
        })
    }

    /// Reports pod `namespace/name` (bound to this node) Running with every container started and
    /// ready, as a kubelet writes its status once the containers run (Argo CD's web terminal only
    /// opens into a running container).
    pub async fn report_running(
        &self,
        client: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<()> {
        use k8s_openapi::api::core::v1::Pod;
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let pod = pods.get(name).await?;
        let now = time::OffsetDateTime::now_utc();
        let started = kubelet_time(now);
        let statuses: Vec<serde_json::Value> = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .map(|c| {
                json!({"name": c.name, "image": c.image, "imageID": "", "ready": true,
                       "restartCount": 0, "started": true,
                       "state": {"running": {"startedAt": started}}})
            })
            .collect();
        let conditions = ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
            .map(|t| json!({"type": t, "status": "True"}));
        let status = json!({"status": {
            "phase": "Running", "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
            "conditions": conditions,
            "containerStatuses": statuses,
        }});
        pods.patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(status),
        )
        .await?;
        Ok(())
    }

    /// Number of `containerLogs` requests so far.
    pub fn requests(&self) -> usize {
        self.stats.queries.lock().unwrap().len()
    }

    /// The query string of the latest request.
    pub fn last_query(&self) -> Option<String> {
        self.stats.queries.lock().unwrap().last().cloned()
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        let (nodes, node) = (self.nodes.clone(), self.node.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = nodes.delete(&node, &DeleteParams::default()).await;
            });
        }
    }
}

async fn accept(
    listener: std::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    stats: Arc<KubeletStats>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    while let Ok((tcp, _)) = listener.accept().await {
        let (acceptor, stats) = (acceptor.clone(), stats.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(move |mut req| {
                let stats = stats.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(if req.uri().path().starts_with("/exec/") {
                        crate::kubelet_exec::upgrade(&stats, &mut req)
                    } else {
                        serve(&stats, &req)
                    })
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .with_upgrades()
                .await;
        });
    }
}

pub(crate) fn response(status: u16, body: LogBody) -> http::Response<LogBody> {
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "text/plain")
        .body(body)
        .expect("valid response")
}

pub(crate) fn full(text: String) -> LogBody {
    Full::new(Bytes::from(text)).boxed()
}

/// Kubelet's timestamp format (RFC 3339, nanoseconds, UTC).
fn kubelet_time(at: time::OffsetDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}Z",
        at.year(),
        at.month() as u8,
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.nanosecond()
    )
}

fn serve<B>(stats: &Arc<KubeletStats>, req: &http::Request<B>) -> http::Response<LogBody> {
    let segs: Vec<&str> = req.uri().path().split('/').collect();
    let ["", "containerLogs", _, _, container] = segs.as_slice() else {
        return response(404, full("not a containerLogs path".into()));
    };
    let container = container.to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    stats.queries.lock().unwrap().push(query.clone());
    let params: HashMap<&str, &str> = query.split('&').filter_map(|p| p.split_once('=')).collect();
    let stamps = params.get("timestamps") == Some(&"true");
    let line = move |text: String, at: time::OffsetDateTime| {
        if stamps {
            format!("{} {text}\n", kubelet_time(at))
        } else {
            format!("{text}\n")
        }
    };
    let now = time::OffsetDateTime::now_utc();
    let mut history: Vec<String> = (1..=HISTORY)
        .map(|i| {
            line(
                format!("{container} line {i:03}"),
                now - Duration::from_secs(u64::from(HISTORY - i)),
            )
        })
        .collect();
    if let Some(tail) = params
        .get("tailLines")
        .and_then(|v| v.parse::<usize>().ok())
    {
        history.drain(..history.len().saturating_sub(tail));
    }
    let text = history.concat();
    if params.get("follow") != Some(&"true") {
        return response(200, full(text));
    }
    let stats = stats.clone();
    let next = move |n: u32| {
        line(
            format!("{container} live {n}"),
            time::OffsetDateTime::now_utc(),
        )
    };
    response(200, follow_body(text, next, stats))
}

/// A followed log's body: `history`, then `next(n)` for n = 1, 2, … every 200 ms until the
/// client goes away; `stats` counts the stream as open meanwhile and as closed after.
pub fn follow_body(
    history: String,
    next: impl Fn(u32) -> String + Send + 'static,
    stats: Arc<KubeletStats>,
) -> LogBody {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        stats.follows_open.fetch_add(1, Ordering::SeqCst);
        let mut sent = tx.send(history.into()).await.is_ok();
        let mut n = 0;
        while sent {
            n += 1;
            let line = next(n);
            tokio::select! {
                () = tx.closed() => sent = false,
                () = tokio::time::sleep(Duration::from_millis(200)) => {
                    sent = tx.send(line.into()).await.is_ok();
                }
            }
        }
        stats.follows_open.fetch_sub(1, Ordering::SeqCst);
        stats.follows_closed.fetch_add(1, Ordering::SeqCst);
    });
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((
            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(chunk)),
            rx,
        ))
    });
    StreamBody::new(frames).boxed()
}
