//! A service-mesh sidecar stand-in for the `--insecure-plaintext` + `--auth=header:` tests: a
//! plain-HTTP/2 (h2c) reverse proxy in front of the principal that, as an Istio sidecar does after
//! terminating the agent's mTLS, sets the identity header on every request (overwriting any the
//! client sent) before forwarding it to the principal over plaintext. It does no TLS itself: which
//! agent it speaks for is fixed when it starts. Listens on 127.0.0.1 only; stops when dropped.

use std::net::SocketAddr;

use http::{HeaderName, HeaderValue, Request, Uri};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Istio's identity header (x-forwarded-client-cert).
pub const XFCC: &str = "x-forwarded-client-cert";

/// Upstream's documented extraction regex for [`XFCC`] (service account = agent name).
pub const XFCC_AGENT_REGEX: &str = r"^.*URI=spiffe://[^/]+/ns/[^/]+/sa/([^,;]+)";

/// The [`XFCC`] value a sidecar sets for service account `agent` in namespace `ns`.
pub fn xfcc_for(agent: &str, ns: &str) -> String {
    format!(
        "By=spiffe://cluster.local/ns/argocd/sa/argocd-agent-principal;Hash=0f1e2d3c;\
         Subject=\"\";URI=spiffe://cluster.local/ns/{ns}/sa/{agent}"
    )
}

/// A running sidecar stand-in.
pub struct MeshSidecar {
    /// Where agents connect (plaintext HTTP/2).
    pub address: SocketAddr,
    task: JoinHandle<()>,
}

impl MeshSidecar {
    /// Forwards to `principal` (`host:port`, plaintext), setting `header: value` on every request.
    pub async fn start(principal: &str, header: &str, value: &str) -> anyhow::Result<MeshSidecar> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let header = HeaderName::from_bytes(header.as_bytes())?;
        let value = HeaderValue::from_str(value)?;
        let principal = principal.to_string();
        let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http();
        let task = tokio::spawn(async move {
            // Connections end with the sidecar: dropping the set aborts them.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (client, header, value, principal) = (
                    client.clone(),
                    header.clone(),
                    value.clone(),
                    principal.clone(),
                );
                connections.spawn(async move {
                    let forward = service_fn(move |mut req: Request<Incoming>| {
                        let client = client.clone();
                        let path = req
                            .uri()
                            .path_and_query()
                            .map(|p| p.as_str().to_string())
                            .unwrap_or_else(|| "/".into());
                        let uri: Result<Uri, _> = format!("http://{principal}{path}").parse();
                        req.headers_mut().insert(header.clone(), value.clone());
                        async move {
                            *req.uri_mut() = uri?;
                            anyhow::Ok(client.request(req).await?)
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), forward)
                        .await;
                });
            }
        });
        Ok(MeshSidecar { address, task })
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        self.address.to_string()
    }
}

impl Drop for MeshSidecar {
    fn drop(&mut self) {
        self.task.abort();
    }
}
