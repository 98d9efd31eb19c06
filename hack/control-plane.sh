#!/usr/bin/env bash
# Provides a real Kubernetes control plane for tests: etcd (Debian's etcd-server) and a kube-apiserver
# built from Debian's `kubernetes` source package with Debian's Go.
#
# Idempotent. The built binary is cached outside the repo, keyed by version, so only the first run pays
# the ~3-minute build. Prints the path of the kube-apiserver binary on its last line of stdout.
#
# Usage: hack/control-plane.sh            install what is missing, build if not cached, print the binary path
#        hack/control-plane.sh --path     print the cached binary path (exit 1 if it is not built yet)
#
# Env: KUBE_APISERVER_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/argocd-agent-rs)
set -euo pipefail

K8S_VERSION=1.20.2
CACHE_ROOT=${KUBE_APISERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/argocd-agent-rs}
CACHE_DIR="$CACHE_ROOT/kube-apiserver-$K8S_VERSION"
BIN="$CACHE_DIR/kube-apiserver"

say() { echo "[control-plane] $*" >&2; }
fail() { echo "[control-plane] ERROR: $*" >&2; exit 1; }

if [[ "${1:-}" == "--path" ]]; then
  [[ -x "$BIN" ]] || exit 1
  echo "$BIN"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || fail "not root and no sudo: run as root or install sudo"
  SUDO="sudo"
fi

apt_updated=0
apt_update_once() {
  if [[ $apt_updated -eq 0 ]]; then
    say "apt-get update"
    $SUDO apt-get update -qq >/dev/null || fail "apt-get update failed (is the Debian mirror reachable?)"
    apt_updated=1
  fi
}

# Runtime pieces: etcd and redis are needed by every test run.
need_pkgs=()
command -v etcd >/dev/null || need_pkgs+=(etcd-server)
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
command -v redis-cli >/dev/null || need_pkgs+=(redis-tools)
if [[ ${#need_pkgs[@]} -gt 0 ]]; then
  apt_update_once
  say "installing ${need_pkgs[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null \
    || fail "apt-get install ${need_pkgs[*]} failed"
  # Debian's packages start services on install; tests start their own instances on free ports.
  $SUDO systemctl disable --now etcd redis-server >/dev/null 2>&1 || true
  pkill -x etcd 2>/dev/null || true
  pkill -x redis-server 2>/dev/null || true
fi

if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
  say "kube-apiserver $K8S_VERSION cached at $BIN"
  echo "$BIN"
  exit 0
fi

say "kube-apiserver $K8S_VERSION not cached; building it from Debian's source package (~3 minutes on 2 cores)"

# 1. deb-src entry for Debian's main archive.
SRC_LIST=/etc/apt/sources.list.d/argocd-agent-rs-src.sources
if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
  say "adding deb-src entry $SRC_LIST"
  $SUDO tee "$SRC_LIST" >/dev/null <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt_updated=0
fi
apt_update_once

# 2. Build tools.
say "installing golang-go rsync make golang-github-modern-go-reflect2-dev dpkg-dev"
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq golang-go rsync make dpkg-dev \
  golang-github-modern-go-reflect2-dev >/dev/null || fail "apt-get install of the Go build tools failed"

# 3. Source.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kube-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
say "downloading Debian source package kubernetes into $WORK"
apt-get source --download-only kubernetes >/dev/null 2>&1 || fail "apt-get source kubernetes failed (deb-src entry missing?)"
ORIG=$(ls kubernetes_*.orig.tar.* 2>/dev/null | head -n1)
[[ -n "$ORIG" ]] || fail "no kubernetes orig tarball downloaded"
say "unpacking $ORIG"
tar xf "$ORIG"
SRC=$(find . -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
[[ -n "$SRC" ]] || fail "orig tarball did not unpack into kubernetes-*/"
cd "$SRC"

# 4. Go >= 1.18 crashes k8s 1.20 on custom resources through the vendored modern-go/reflect2 v1.0.1:
#    swap in Debian's v1.0.2.
R2=/usr/share/gocode/src/github.com/modern-go/reflect2
[[ -d "$R2" ]] || fail "$R2 missing (golang-github-modern-go-reflect2-dev not installed?)"
say "replacing vendored modern-go/reflect2 with Debian's $(basename "$R2") (v1.0.2)"
rm -rf vendor/github.com/modern-go/reflect2
mkdir -p vendor/github.com/modern-go/reflect2
rsync -a --exclude go.mod --exclude '*_test.go' "$R2/" vendor/github.com/modern-go/reflect2/

# 5. Build.
export GOPATH="$PWD/.go" CGO_ENABLED=0 GOFLAGS=-mod=vendor GO111MODULE=on
mkdir -p .go/src/k8s.io
ln -s ../../.. .go/src/k8s.io/kubernetes
say "building cmd/kube-apiserver with $(go version | awk '{print $3}') (logs: $WORK/build.log)"
if ! HOME="$WORK/home" make WHAT=cmd/kube-apiserver >"$WORK/build.log" 2>&1; then
  tail -n 40 "$WORK/build.log" >&2
  trap - EXIT
  fail "make WHAT=cmd/kube-apiserver failed; full log kept at $WORK/build.log"
fi
OUT=$(find _output -type f -name kube-apiserver -perm -u+x | head -n1)
[[ -n "$OUT" ]] || fail "build finished but no kube-apiserver binary found under _output/"
mkdir -p "$CACHE_DIR"
install -m 0755 "$OUT" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
say "cached $BIN ($("$BIN" --version 2>&1))"
echo "$BIN"
