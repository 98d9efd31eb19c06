#!/usr/bin/env bash
# Quickstart: local hub and spoke control planes, argocd-principal and argocd-agent, and a demo
# Application that arrives on the spoke with its status visible on the hub. Installs what it needs.
#   hack/quickstart.sh          keep running until Ctrl-C
#   hack/quickstart.sh --once   stop after the demo
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/argocd-agent-rs/target}
say() { echo "==> $*" >&2; }
command -v cargo >/dev/null || { echo "quickstart: cargo not found: install Rust with rustup first" >&2; exit 1; }
say "providing the real peers (the first run builds Kubernetes, Argo CD and friends from Go modules)"
bash hack/peers.sh || { echo "quickstart: hack/peers.sh failed" >&2; exit 1; }
say "building argocd-principal, argocd-agent, argocd-agentctl and the quickstart driver"
cargo build --locked --workspace --bins || { echo "quickstart: build failed" >&2; exit 1; }
exec "$CARGO_TARGET_DIR/debug/quickstart" "$@"
