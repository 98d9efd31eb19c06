#!/usr/bin/env bash
# Builds the real programs the end-to-end suite meets, from the Go modules under e2e/peers/ (pinned in
# their go.mod/go.sum), and caches the binaries outside the clone, keyed by each module's pins: a second
# run with nothing changed is a no-op in about a second.
#
#   kube    etcd 3.6 + kube-apiserver, kube-controller-manager, kubectl 1.36 (no scheduler: no test runs one)
#   argocd  Argo CD's multi-call binary (server, application-controller, repo-server, argocd CLI) + its
#           CRDs and install manifests, taken from the module itself
#   agent   upstream argocd-agent (principal and agent) and argocd-agentctl
#   ocm     Open Cluster Management's hub controllers and klusterlet agents
#   helm    the helm CLI (the chart suite installs our charts with it)
#   wire    cewire: our CloudEvents checked with cloudevents/sdk-go, the library upstream uses
# and installs from Debian what the harness runs beside them: redis-server/redis-cli (Argo CD's cache,
# password-protected as Argo CD configures it), git (repo-server clones from a local `git daemon`),
# openssl, nginx (the HTTP/1.1-only proxy the --enable-websocket tests put between agent and principal).
#
# Usage: hack/peers.sh               build every peer that is missing (progress on stderr)
#        hack/peers.sh NAME...       build only these
#        hack/peers.sh --dir NAME    print NAME's cache directory (exit 1 if it is not built yet)
#
# Env: PEERS_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/argocd-agent-rs/peers)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/argocd-agent-rs/peers}
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export CGO_ENABLED=0
export GOFLAGS=${GOFLAGS:--trimpath}

say() { echo "[peers] $*" >&2; }
fail() { echo "[peers] ERROR: $*" >&2; exit 1; }

all_peers() {
  for d in e2e/peers/*/; do
    [[ -f "$d/go.mod" ]] && basename "$d"
  done
}

# The cache key: the module's name plus a hash of its pins, so a changed go.mod/go.sum builds anew.
peer_dir() {
  local name=$1 mod="e2e/peers/$1"
  [[ -f "$mod/go.mod" ]] || fail "no Go module for peer '$name' at $mod (known: $(all_peers | xargs))"
  local key
  key=$(cat "$mod/go.mod" "$mod/go.sum" 2>/dev/null | sha256sum | cut -c1-12)
  echo "$CACHE/$name-$key"
}

if [[ "${1:-}" == "--dir" ]]; then
  [[ -n "${2:-}" ]] || fail "--dir needs a peer name ($(all_peers | xargs))"
  dir=$(peer_dir "$2")
  [[ -f "$dir/.complete" ]] || exit 1
  echo "$dir"
  exit 0
fi

# Debian's packages: installed once, their own services stopped (tests start instances on free ports).
need_pkgs=()
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
command -v redis-cli >/dev/null || need_pkgs+=(redis-tools)
command -v git >/dev/null || need_pkgs+=(git)
command -v openssl >/dev/null || need_pkgs+=(openssl)
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || need_pkgs+=(nginx)
if [[ ${#need_pkgs[@]} -gt 0 ]]; then
  say "installing ${need_pkgs[*]} from Debian"
  apt-get update -qq >/dev/null || fail "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null \
    || fail "apt-get install ${need_pkgs[*]} failed"
  systemctl disable --now redis-server >/dev/null 2>&1 || true
  pkill -x redis-server 2>/dev/null || true
  # Debian starts nginx on port 80 with its default config; the tests start their own.
  systemctl disable --now nginx >/dev/null 2>&1 || true
  if [[ -f /run/nginx.pid ]]; then /usr/sbin/nginx -s quit 2>/dev/null || true; fi
fi

command -v go >/dev/null || fail "go not found: install Go 1.26 (the machine image ships it in /usr/local/go/bin)"

# Module directory of a dependency in the module cache (downloaded if needed).
module_dir() {
  (cd "$ROOT/$1" && go mod download -json "$2" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
}

# After-build steps per peer: names the tool binaries as their users know them and copies the data files
# the harness installs from the module itself.
finish_kube() {
  mv "$1/server" "$1/etcd"
}
finish_argocd() {
  local src
  src=$(module_dir e2e/peers/argocd github.com/argoproj/argo-cd/v3@"$(module_version e2e/peers/argocd github.com/argoproj/argo-cd/v3)")
  mv "$1/cmd" "$1/argocd"
  for n in argocd-server argocd-application-controller argocd-repo-server argocd-cmp-server; do
    ln -sf argocd "$1/$n"
  done
  mkdir -p "$1/manifests"
  cp -r "$src/manifests/crds" "$src/manifests/install.yaml" "$1/manifests/"
  chmod -R u+w "$1/manifests"
}
finish_agent() {
  mv "$1/ctl" "$1/argocd-agentctl"
}
# OCM's CRDs the harness installs beside the OCM peers, from the open-cluster-management.io/api module
# OCM is built against: crds/hub for the hub controllers (cluster registration, placement, work) and
# crds/spoke for the klusterlet agents (cluster claims, applied manifest works).
finish_ocm() {
  local api v
  v=$(module_version e2e/peers/ocm open-cluster-management.io/api)
  api=$(module_dir e2e/peers/ocm open-cluster-management.io/api@"$v")
  [[ -d "$api" ]] || fail "ocm: open-cluster-management.io/api@$v not found in the module cache"
  mkdir -p "$1/crds/hub" "$1/crds/spoke"
  local f
  for f in cluster/v1/0000_00_clusters.open-cluster-management.io_managedclusters.crd.yaml \
           cluster/v1beta2/0000_00_clusters.open-cluster-management.io_managedclustersets.crd.yaml \
           cluster/v1beta2/0000_01_clusters.open-cluster-management.io_managedclustersetbindings.crd.yaml \
           cluster/v1beta1/0000_02_clusters.open-cluster-management.io_placements.crd.yaml \
           cluster/v1beta1/0000_03_clusters.open-cluster-management.io_placementdecisions.crd.yaml \
           cluster/v1alpha1/0000_05_clusters.open-cluster-management.io_addonplacementscores.crd.yaml \
           work/v1/0000_00_work.open-cluster-management.io_manifestworks.crd.yaml \
           addon/v1alpha1/0000_01_addon.open-cluster-management.io_managedclusteraddons.crd.yaml; do
    cp "$api/$f" "$1/crds/hub/"
  done
  for f in cluster/v1alpha1/0000_02_clusters.open-cluster-management.io_clusterclaims.crd.yaml \
           work/v1/0000_01_work.open-cluster-management.io_appliedmanifestworks.crd.yaml; do
    cp "$api/$f" "$1/crds/spoke/"
  done
  chmod -R u+w "$1/crds"
}
finish_helm() { :; }
finish_wire() { :; }

# Version stamps the projects' own release builds set with -ldflags -X (a plain `go build` reports a
# placeholder version, which peers compare: kubectl's skew check, Argo CD's server version).
ldflags_kube() {
  local v; v=$(module_version e2e/peers/kube k8s.io/kubernetes)
  local minor; minor=$(echo "$v" | cut -d. -f2)
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    printf -- "-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean " \
      "$pkg" "$v" "$pkg" "$pkg" "$minor" "$pkg"
  done
}
ldflags_argocd() {
  local v; v=$(module_version e2e/peers/argocd github.com/argoproj/argo-cd/v3)
  echo "-X github.com/argoproj/argo-cd/v3/common.version=${v#v}"
}
ldflags_agent() {
  local v; v=$(module_version e2e/peers/agent github.com/argoproj-labs/argocd-agent)
  echo "-X github.com/argoproj-labs/argocd-agent/internal/version.version=${v#v}"
}
ldflags_ocm() { :; }
ldflags_helm() { :; }
ldflags_wire() { :; }

module_version() {
  (cd "$ROOT/$1" && go list -m -f '{{.Version}}' "$2")
}

build_peer() {
  local name=$1 dir mod="e2e/peers/$1"
  dir=$(peer_dir "$name")
  if [[ -f "$dir/.complete" ]]; then
    say "$name: cached at $dir"
    return
  fi
  local started=$SECONDS tmp="$dir.partial"
  rm -rf "$tmp" && mkdir -p "$tmp"
  say "$name: downloading modules"
  (cd "$mod" && go mod download) || fail "$name: go mod download failed (is the Go module proxy reachable?)"
  say "$name: building $(cd "$mod" && go list -f '{{.ImportPath}}' tool | xargs) (cold: several minutes on 2 cores)"
  local ldflags; ldflags="-s $("ldflags_$name")"
  (cd "$mod" && go build -ldflags="$ldflags" -o "$tmp/" tool) || fail "$name: go build failed"
  "finish_$name" "$tmp"
  rm -rf "$dir" && mv "$tmp" "$dir"
  touch "$dir/.complete"
  say "$name: built in $(( SECONDS - started ))s -> $dir"
}

peers=("$@")
[[ ${#peers[@]} -gt 0 ]] || mapfile -t peers < <(all_peers)
for p in "${peers[@]}"; do
  build_peer "$p"
done
