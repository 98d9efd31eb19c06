#!/usr/bin/env bash
# Benchmarks on real control planes with release builds; each figure is printed next to a baseline
# measured in the same run. Usage: hack/bench.sh [--count N]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/argocd-agent-rs/target}
echo "==> providing the control plane binaries" >&2
bash hack/control-plane.sh >/dev/null
echo "==> building release binaries" >&2
cargo build --release --locked --workspace --bins
exec "$CARGO_TARGET_DIR/release/bench-propagation" "$@"
