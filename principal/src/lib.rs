//! The principal (hub) of argocd-agent: accepts agents over mutual-TLS gRPC, authenticates them,
//! streams Application/AppProject events to them and writes their status back on the hub.
