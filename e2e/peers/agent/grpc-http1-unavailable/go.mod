// Stands in for golang.stackrox.io/grpc-http1, which upstream argocd-agent imports for its optional
// gRPC-over-HTTP/1 (WebSocket) transport and which the module proxy reachable here refuses (403). Written
// for this project against the four calls upstream makes; not a copy of that library. With it, the
// upstream principal serves gRPC over HTTP/2 only and an upstream agent started with --enable-websocket
// fails with an error that says why. Everything else of upstream argocd-agent is built unchanged.
module golang.stackrox.io/grpc-http1

go 1.24

require google.golang.org/grpc v1.72.0
