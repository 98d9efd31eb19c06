#!/usr/bin/env bash
# Renders a Helm chart the way `helm lint --strict` + `helm template --include-crds` would, with Helm's
# own Go engine (helm-python-sdk, installed by hack/install-helm.sh; see there why not the helm CLI).
#
# Usage: hack/render-charts.sh CHART_DIR [--release NAME] [--namespace NS] [--values FILE]...
#                              [--kubeconfig PATH]
#   --values      YAML or JSON values file (repeatable; later files win), validated against the
#                 chart's values.schema.json
#   --kube-version  render for that Kubernetes version (.Capabilities.KubeVersion), like
#                 `helm template --kube-version`
#   --kubeconfig  take --kube-version from that cluster's server version (kubectl version)
# Prints the manifests (CRDs first, then templates in file order) as one multi-document YAML on
# stdout. Exits 1 with Helm's message when lint, schema validation or rendering fails.
set -euo pipefail
TOOLS=${CHART_TOOLS_DIR:-$HOME/.cache/argocd-agent-rs/chart-tools}
if [ ! -x "$TOOLS/bin/python" ]; then
  echo "hack/render-charts.sh: chart tools not installed in $TOOLS: run hack/install-helm.sh" >&2
  exit 1
fi
exec "$TOOLS/bin/python" - "$@" <<'PY'
import argparse, json, subprocess, sys
import helm_python as helm

p = argparse.ArgumentParser(prog="hack/render-charts.sh")
p.add_argument("chart")
p.add_argument("--release", default="argocd-agent")
p.add_argument("--namespace", default="argocd")
p.add_argument("--values", action="append", default=[])
p.add_argument("--kubeconfig")
p.add_argument("--kube-version")
a = p.parse_args()

def die(msg):
    print(f"hack/render-charts.sh: {a.chart}: {msg}", file=sys.stderr)
    sys.exit(1)

values = {}
def merge(dst, src):
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], v)
        else:
            dst[k] = v
for f in a.values:
    try:
        with open(f) as fh:
            merge(values, helm.values_from_yaml(fh.read()) or {})
    except (OSError, helm.HelmError) as e:
        die(f"cannot read values file {f}: {e}")

try:
    report = helm.lint(a.chart, values, strict=True, namespace=a.namespace)
except helm.HelmError as e:
    die(f"helm lint: {e}")
problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2] 
if problems or report.get("errors"):
    lines = [f"[{ {2: 'WARNING', 3: 'ERROR'}.get(m['severity'], m['severity']) }] {m.get('path')}: {m.get('error')}" for m in problems]
    die("helm lint --strict failed:\n" + "\n".join(lines + list(report.get("errors") or [])))

kube_version = a.kube_version
if a.kubeconfig and not kube_version:
    try:
        out = subprocess.run(["kubectl", f"--kubeconfig={a.kubeconfig}", "version", "-o", "json"],
                             capture_output=True, text=True, timeout=60)
        kube_version = json.loads(out.stdout)["serverVersion"]["gitVersion"]
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        die(f"cannot read the server version through {a.kubeconfig}: {e}")

try:
    chart = helm.Chart.load(a.chart)
    chart.validate_schema(values)
    opts = {"name": a.release, "namespace": a.namespace, "is_install": True}
    if kube_version:
        opts["kube_version"] = kube_version
    # Chart.render() does not expose kube_version; the library's render call (pinned version) does.
    from helm_python import _native
    manifests = json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts)))
except helm.HelmError as e:
    die(str(e))

out = []
for crd in sorted(chart.crds, key=lambda c: c.get("filename") or c["name"]):
    out.append(f"# Source: {crd.get('filename') or crd['name']}\n{crd['data'].strip()}\n")
for path in sorted(manifests):
    body = manifests[path].strip()
    if path.endswith("NOTES.txt") or not body or all(not l.strip() or l.lstrip().startswith("#") for l in body.splitlines()):
        continue
    out.append(f"# Source: {path}\n{body}\n")
sys.stdout.write("---\n".join(out))
PY
