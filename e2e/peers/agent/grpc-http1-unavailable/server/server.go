// Package server is this project's stand-in for grpc-http1's server side: the downgrading handler
// serves gRPC over HTTP/2 and answers HTTP/1 requests with 501 Not Implemented.
package server

import (
	"net/http"
	"strings"

	"google.golang.org/grpc"
)

// Option configures the handler (accepted and ignored: there is no downgrading to configure).
type Option func()

// PreferGRPCWeb is accepted for signature compatibility.
func PreferGRPCWeb(bool) Option { return func() {} }

// CreateDowngradingHandler serves gRPC requests over HTTP/2 with grpcSrv, other requests with fallback,
// and refuses gRPC over HTTP/1.
func CreateDowngradingHandler(grpcSrv *grpc.Server, fallback http.Handler, _ ...Option) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		isGRPC := strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc")
		switch {
		case isGRPC && r.ProtoMajor == 2:
			grpcSrv.ServeHTTP(w, r)
		case isGRPC || r.Header.Get("Upgrade") != "":
			http.Error(w, "gRPC over HTTP/1 is not available in this build (golang.stackrox.io/grpc-http1 was not served)", http.StatusNotImplemented)
		default:
			fallback.ServeHTTP(w, r)
		}
	})
}
