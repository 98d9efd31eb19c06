//! Bounded concurrency for the principal's writes to the hub apiserver.
//!
//! Every agent stream handles events on several lanes at once, so a busy fleet can ask for hundreds
//! of hub writes (status patches, mirror writes, finalizer removals) at the same moment. The
//! Kubernetes client speaks HTTP/1.1, one connection per request in flight: hundreds of new TLS
//! connections cost the hub apiserver (and the principal) CPU, and past the apiserver's
//! `--max-mutating-requests-inflight` (200 by default) writes are refused with 429 and come back
//! only when the agent resends. [`limit_writes`] wraps a client so that at most a fixed number of
//! mutating requests (anything but GET, HEAD, OPTIONS) are in flight; the others wait in arrival
//! order. Reads and watches are never held back.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use kube::client::Body;
use tokio::sync::Semaphore;
use tonic::codegen::Service;

/// Hub writes in flight at most (the rest queue in the principal).
pub const HUB_WRITE_CONCURRENCY: usize = 32;

/// A client whose mutating requests go through `client` at most `concurrency` at a time.
pub fn limit_writes(client: kube::Client, concurrency: usize) -> kube::Client {
    let default_ns = client.default_namespace().to_string();
    kube::Client::new(
        WriteLimit {
            client,
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
        },
        default_ns,
    )
}

fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The service behind [`limit_writes`].
#[derive(Clone)]
struct WriteLimit {
    client: kube::Client,
    permits: Arc<Semaphore>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Service<Request<Body>> for WriteLimit {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let (client, permits) = (self.client.clone(), self.permits.clone());
        Box::pin(async move {
            // The permit is held until the response headers arrive (writes answer in one piece).
            let _permit = if is_write(req.method()) {
                Some(
                    permits
                        .acquire_owned()
                        .await
                        .expect("the semaphore is never closed"),
                )
            } else {
                None
            };
            client.send(req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// A fake apiserver that answers every request after 200 ms and records how many writes and
    /// reads were in flight at most.
    #[derive(Clone, Default)]
    struct Recorder {
        writes: Arc<(AtomicUsize, AtomicUsize)>,
        reads: Arc<(AtomicUsize, AtomicUsize)>,
    }

    impl Service<Request<Body>> for Recorder {
        type Response = Response<Body>;
        type Error = std::convert::Infallible;
        type Future = BoxFuture<Result<Response<Body>, std::convert::Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Request<Body>) -> Self::Future {
            let counters = if is_write(req.method()) {
                self.writes.clone()
            } else {
                self.reads.clone()
            };
            Box::pin(async move {
                let now = counters.0.fetch_add(1, Ordering::SeqCst) + 1;
                counters.1.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
                counters.0.fetch_sub(1, Ordering::SeqCst);
                Ok(Response::new(Body::from(b"{}".to_vec())))
            })
        }
    }

    #[tokio::test]
    async fn writes_are_bounded_and_reads_are_not() {
        let apiserver = Recorder::default();
        let client = limit_writes(kube::Client::new(apiserver.clone(), "default"), 3);
        let mut calls = Vec::new();
        for i in 0..12 {
            let method = if i % 2 == 0 {
                Method::PATCH
            } else {
                Method::GET
            };
            let req = Request::builder()
                .method(method)
                .uri("/apis/argoproj.io/v1alpha1/namespaces/a/applications/x")
                .body(Body::from(Vec::new()))
                .unwrap();
            let client = client.clone();
            calls.push(tokio::spawn(async move { client.send(req).await }));
        }
        for c in calls {
            c.await.unwrap().unwrap();
        }
        assert_eq!(
            apiserver.writes.1.load(Ordering::SeqCst),
            3,
            "6 writes, at most 3 at a time"
        );
        assert_eq!(
            apiserver.reads.1.load(Ordering::SeqCst),
            6,
            "the 6 reads all ran at once"
        );
    }
}
