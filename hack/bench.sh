#!/usr/bin/env bash
# Benchmarks on real control planes with release builds; each figure is printed next to a baseline
# measured in the same run, then a summary of every bench.
#
# Usage: hack/bench.sh [--compare [--publish]] [--smoke] [--debug] [--out DIR] [-- BENCH-COMPARE FLAGS...]
#   --compare  instead of the benches below, bench-compare: the same scenarios against our principal
#              and agent and against upstream argocd-agent's, alternating on one pair of fresh planes,
#              each figure for both with the ours/upstream ratio (bench-compare.{json,tsv,png} in
#              --out), then the fleet figures (the same simulated agents against both principals:
#              events/s and CPU with 100, RSS per idle agent and a reconnect storm at 1,000); not
#              part of hack/test.sh or CI (minutes, not seconds)
#   --smoke    tiny sizes (what CI runs), e.g. a few agents instead of 10,000; with --compare, one
#              round of small sizes (about 2 minutes, the fleet part with 10 agents about 1 more)
#   --debug    use the debug binaries (what hack/test.sh already built) instead of a release build:
#              the figures then only show that every bench runs end to end, they are not comparable
#   --out DIR  where bench-fleet and bench-compare write their JSON and PNG (default results/, which
#              is not committed)
#   --publish  with --compare (release, not --smoke): after a successful run, copy its chart to
#              docs/bench-compare.png, the one the README shows beside its side-by-side table
#   -- ...     with --compare, the rest goes to bench-compare (e.g. -- --rounds 1)
# Without --compare runs bench-propagation, bench-proxy, bench-resync (when it exists) and bench-fleet
# in sequence. Charts are drawn with DejaVu Sans: Debian's fonts-dejavu-core is installed if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/argocd-agent-rs/target}

smoke=0
compare=0
profile=release
out=results
publish=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --compare) compare=1 ;;
    --publish) publish=1 ;;
    --) shift; extra=("$@"); break ;;
    --smoke) smoke=1 ;;
    --debug) profile=debug ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    *) echo "hack/bench.sh: unknown argument $1 (use --compare, --publish, --smoke, --debug, --out DIR, -- FLAGS)" >&2; exit 2 ;;
  esac
  shift
done
if [ ${#extra[@]} -gt 0 ] && [ "$compare" = 0 ]; then
  echo "hack/bench.sh: flags after -- go to bench-compare: use them with --compare" >&2
  exit 2
fi
if [ "$publish" = 1 ] && { [ "$compare" = 0 ] || [ "$smoke" = 1 ] || [ "$profile" = debug ]; }; then
  echo "hack/bench.sh: --publish needs --compare on a release build without --smoke" >&2
  exit 2
fi

if [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
  echo "==> installing fonts-dejavu-core (the font of bench-fleet's chart)" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-dejavu-core >/dev/null
fi
echo "==> providing the real peers" >&2
bash hack/peers.sh
echo "==> building $profile binaries" >&2
if [ "$profile" = release ]; then
  cargo build --release --locked --workspace --bins
else
  cargo build --locked --workspace --bins
fi

bin=$CARGO_TARGET_DIR/$profile
mkdir -p "$out"
summary=$(mktemp)
trap 'rm -f "$summary"' EXIT
failed=()

run() {
  local name=$1; shift
  if [ ! -x "$bin/$name" ]; then
    echo "==> $name: not built in this tree, skipped" >&2
    return
  fi
  echo "==> $name $*" >&2
  local log="$out/$name.txt" start=$SECONDS
  if "$bin/$name" "$@" | tee "$log"; then
    printf '%s (%ss)\n' "$name" "$((SECONDS - start))" >>"$summary"
  else
    printf '%s FAILED (%ss)\n' "$name" "$((SECONDS - start))" >>"$summary"
    failed+=("$name")
  fi
  sed 's/^/    /' "$log" >>"$summary"
}

if [ "$compare" = 1 ]; then
  if [ "$smoke" = 1 ]; then
    run bench-compare --smoke --out "$out" "${extra[@]}"
  else
    run bench-compare --out "$out" "${extra[@]}"
  fi
  if [ "$publish" = 1 ] && [ ${#failed[@]} -eq 0 ]; then
    mkdir -p docs
    cp "$out/bench-compare.png" docs/bench-compare.png
    echo "==> published $out/bench-compare.png as docs/bench-compare.png" >&2
  fi
elif [ "$smoke" = 1 ]; then
  run bench-propagation --count 20
  run bench-proxy --count 20
  run bench-resync --smoke
  run bench-fleet --smoke --out "$out"
else
  run bench-propagation --count 200
  run bench-proxy
  run bench-resync
  run bench-fleet --out "$out"
fi

echo
echo "==================== summary ($profile build, $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)) ===================="
cat "$summary"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
