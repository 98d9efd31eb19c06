//! gzip on the principal's gRPC services, decided per call as grpc-go's server (upstream's
//! principal) decides it: a gzip-compressed request is always accepted, and the answers of a call
//! are compressed only when the client compresses its own messages on it (upstream agents and ours
//! with `--enable-compression`).
//!
//! Owns [`like_request`], the interceptor that enforces it: tonic compresses answers for every
//! client that merely offers gzip (`grpc-accept-encoding`, which ours and grpc-go's clients send
//! whether or not they compress), so for a call without `grpc-encoding: gzip` the offer is
//! removed before the service sees it. Compressing what an uncompressing agent is sent cost more
//! than anything else the principal does per live-view request (a fresh deflate state per
//! message: about 1.1 million of 1.4 million instructions per proxied GET, callgrind).

use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};

/// What the client says it compresses its messages with.
const ENCODING: &str = "grpc-encoding";
/// What the client says it can read.
const ACCEPT_ENCODING: &str = "grpc-accept-encoding";

/// Removes the client's offer to read compressed answers unless it compresses its own messages.
pub fn answer_like_request(mut req: Request<()>) -> Request<()> {
    let compresses = req
        .metadata()
        .get(ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|e| !e.is_empty() && e != "identity");
    if !compresses {
        req.metadata_mut().remove(ACCEPT_ENCODING);
    }
    req
}

/// The interceptor type of [`like_request`].
pub type LikeRequest = fn(Request<()>) -> Result<Request<()>, Status>;

/// `service`, answering compressed only calls whose requests are (see the module docs).
pub fn like_request<S>(service: S) -> InterceptedService<S, LikeRequest> {
    InterceptedService::new(service, |req| Ok(answer_like_request(req)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_proto::pb::versionapi::version_client::VersionClient;
    use argocd_agent_proto::pb::versionapi::version_server::VersionServer;
    use argocd_agent_proto::pb::versionapi::VersionRequest;
    use tonic::codec::CompressionEncoding::Gzip;

    /// The encoding of the principal's `Version` answer to a client that offers gzip and, when
    /// `compresses`, sends gzip too.
    async fn answer_encoding(compresses: bool) -> Option<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(like_request(
                    VersionServer::new(crate::auth::VersionService)
                        .accept_compressed(Gzip)
                        .send_compressed(Gzip),
                ))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = VersionClient::new(channel).accept_compressed(Gzip);
        if compresses {
            client = client.send_compressed(Gzip);
        }
        let answer = client.version(VersionRequest::default()).await.unwrap();
        assert!(!answer.get_ref().version.is_empty());
        server.abort();
        answer
            .metadata()
            .get(ENCODING)
            .map(|v| v.to_str().unwrap().to_string())
    }

    #[tokio::test]
    async fn answers_are_gzip_only_for_clients_that_send_gzip() {
        assert_eq!(answer_encoding(false).await, None);
        assert_eq!(answer_encoding(true).await.as_deref(), Some("gzip"));
    }
}
