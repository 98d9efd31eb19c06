#!/usr/bin/env bash
# Fuzzes the parsers that read untrusted bytes (cargo-fuzz targets in principal/fuzz/): each target
# runs SECONDS (default 60) from its committed seed corpus, then its figures are printed (runs,
# execs/s, peak RSS, corpus size). Exits non-zero on the first crash, naming the input file that
# reproduces it (`cargo +nightly fuzz run --fuzz-dir principal/fuzz -s none TARGET FILE`).
#
# Usage: hack/fuzz.sh [--dev] [SECONDS] [TARGET...]   (targets: cloudevent_decode resp_parser proxy_path
#                                                      journal_reader; default all, one per core at a time)
#   --dev  build the targets unoptimised (cargo fuzz --dev): a fraction of the release build's time, fewer
#          execs/s; what the smoke in hack/test.sh uses (a cold release build of every dependency with
#          coverage instrumentation took 696 s of a cold CI run on 2 cores). Longer runs: leave it off.
# Env:   CARGO_TARGET_DIR  build cache (default: ~/.cache/argocd-agent-rs/target, outside the clone);
#                          the corpus each run grows is kept beside it in fuzz-corpus/<target>/
# Installs what it needs when missing (nightly via rustup, cargo-fuzz via cargo install, g++ via
# apt-get) and fails with a message naming what could not be installed.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/argocd-agent-rs/target}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
profile=(--release)
profile_name="release, debug assertions and overflow checks on"
if [ "${1:-}" = "--dev" ]; then
  profile=(--dev)
  profile_name="dev: unoptimised, debug assertions and overflow checks on"
  shift
fi
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(cloudevent_decode resp_parser proxy_path journal_reader)
fail() { echo "hack/fuzz.sh: FAILED: $*" >&2; exit 1; }
[[ $seconds =~ ^[0-9]+$ ]] && [ "$seconds" -gt 0 ] || fail "SECONDS must be a positive integer, got '$seconds'"
start=$(date +%s)
step() { echo "==> [$(( $(date +%s) - start ))s] $*"; }

step "checking the nightly toolchain and cargo-fuzz"
command -v rustup >/dev/null || fail "rustup not found: install Rust with rustup (https://rustup.rs) and retry"
rustup run nightly rustc --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal \
  || fail "could not install the nightly toolchain"
if ! command -v c++ >/dev/null 2>&1; then
  # libfuzzer-sys compiles libFuzzer's C++ sources.
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null; } 2>/dev/null \
    || fail "libFuzzer needs a C++ compiler and g++ could not be installed: install g++ (or clang) and retry"
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  # Its own temporary build directory, so it does not hold the project's build lock.
  env -u CARGO_TARGET_DIR cargo install cargo-fuzz --locked || fail "could not install cargo-fuzz"
fi

fuzz=(cargo +nightly fuzz)
opts=(--fuzz-dir principal/fuzz --sanitizer none "${profile[@]}")
step "building the fuzz targets ($profile_name)"
"${fuzz[@]}" build "${opts[@]}" || fail "the fuzz targets do not build"

work=$CARGO_TARGET_DIR/../fuzz-corpus
logs=$CARGO_TARGET_DIR/../fuzz-logs
mkdir -p "$logs"
rm -f "$logs"/*.status
# One target per core at a time (each fuzzer is single-threaded), so the smoke costs
# ceil(targets / cores) x SECONDS of wall time.
jobs=$(nproc 2>/dev/null || echo 1)
for t in "${targets[@]}"; do
  [ -d "principal/fuzz/corpus/$t" ] || fail "unknown target '$t' (no principal/fuzz/corpus/$t)"
done
fuzz_one() {  # runs target $1; its exit status goes to $logs/$1.status
  local t=$1 status=0
  mkdir -p "$work/$t"
  # The grown corpus goes to $work (first directory); the committed seeds are only read.
  "${fuzz[@]}" run "${opts[@]}" "$t" "$work/$t" "principal/fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 >"$logs/$t.log" 2>&1 || status=$?
  echo "$status" >"$logs/$t.status"
}
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  batch=("${targets[@]:i:jobs}")
  step "fuzzing ${batch[*]} for ${seconds}s (logs: $logs/<target>.log)"
  for t in "${batch[@]}"; do fuzz_one "$t" & done
  wait
done
for t in "${targets[@]}"; do
  log=$logs/$t.log
  status=$(cat "$logs/$t.status")
  stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  runs=$(stat number_of_executed_units)
  rate=$(stat average_exec_per_sec)
  rss=$(stat peak_rss_mb)
  units=$(find "$work/$t" -type f | wc -l)
  echo "$t: ${runs:-?} runs in ${seconds}s, ${rate:-?} execs/s, peak RSS ${rss:-?} MB, corpus $units inputs"
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$log" >&2
    crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    fail "$t crashed (exit $status); reproducing input: ${crash:-see $log}"
  fi
done
step "all ${#targets[@]} targets ran ${seconds}s each without a crash"
