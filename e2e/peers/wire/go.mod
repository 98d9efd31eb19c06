// cewire: checks our CloudEvents wire format with the library upstream argocd-agent uses,
// cloudevents/sdk-go's protobuf format at the version upstream v0.9.0 pins. `cewire encode` prints
// events built the way upstream builds them; `cewire decode` reads ours and prints what a Go peer
// sees (e2e/tests/wire_go_sdk.rs drives both).
module github.com/argocd-agent-rs/e2e/peers/wire

go 1.24

require (
	github.com/cloudevents/sdk-go/binding/format/protobuf/v2 v2.16.2
	github.com/cloudevents/sdk-go/v2 v2.16.2
	google.golang.org/protobuf v1.36.8
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.27.0 // indirect
)

tool github.com/argocd-agent-rs/e2e/peers/wire/cmd/cewire
