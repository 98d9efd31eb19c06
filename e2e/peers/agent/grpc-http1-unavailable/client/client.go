// Package client is this project's stand-in for grpc-http1's client side: connecting over HTTP/1
// fails with an error that says why.
package client

import (
	"context"
	"crypto/tls"
	"errors"

	"google.golang.org/grpc"
)

// ConnectOption configures a connection (accepted and ignored).
type ConnectOption func()

// UseWebSocket is accepted for signature compatibility.
func UseWebSocket(bool) ConnectOption { return func() {} }

// DialOpts is accepted for signature compatibility.
func DialOpts(...grpc.DialOption) ConnectOption { return func() {} }

// ConnectViaProxy always fails: this build has no gRPC-over-HTTP/1 transport.
func ConnectViaProxy(context.Context, string, *tls.Config, ...ConnectOption) (*grpc.ClientConn, error) {
	return nil, errors.New("gRPC over HTTP/1 (--enable-websocket) is not available in this build: golang.stackrox.io/grpc-http1 was not served by the module proxy")
}
