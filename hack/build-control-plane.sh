#!/usr/bin/env bash
# Builds the envtest control plane (etcd and kube-apiserver) from the Go module
# proxy into bin/k8s. Prebuilt envtest archives cannot be downloaded here, so
# each binary is built in a throwaway module. A second run is a no-op.
set -euo pipefail

ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
STAGING_VERSION="v0${KUBE_VERSION#v1}"   # v1.37.2 -> v0.37.2

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${KUBEBUILDER_ASSETS:-$root/bin/k8s}"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

say() { printf '[control-plane] %s\n' "$*" >&2; }
die() { printf '[control-plane] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go is not on PATH; install Go 1.26 first"

# stamp files record the version a binary was built from, so a version bump rebuilds.
fresh() { [ -x "$out/$1" ] && [ "$(cat "$out/.$1.version" 2>/dev/null)" = "$2" ]; }

build_etcd() {
  if fresh etcd "$ETCD_VERSION"; then say "etcd $ETCD_VERSION already built"; return; fi
  say "building etcd $ETCD_VERSION (about 2 minutes on 2 cores)"
  local m="$work/etcd"; mkdir -p "$m"; cd "$m"
  go mod init fencekeeper.local/etcd-build >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>"$m/get.log" ||
    { cat "$m/get.log" >&2; die "cannot fetch go.etcd.io/etcd/server/v3@$ETCD_VERSION from the Go module proxy"; }
  CGO_ENABLED=0 go build -trimpath -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3 ||
    die "go build of etcd failed (see above)"
  mv "$out/etcd.tmp" "$out/etcd"
  echo "$ETCD_VERSION" > "$out/.etcd.version"
  say "etcd ready: $out/etcd"
}

build_apiserver() {
  if fresh kube-apiserver "$KUBE_VERSION"; then say "kube-apiserver $KUBE_VERSION already built"; return; fi
  say "building kube-apiserver $KUBE_VERSION (about 8 minutes the first time)"
  local m="$work/kube"; mkdir -p "$m"; cd "$m"
  go mod init fencekeeper.local/kube-build >/dev/null 2>&1
  # k8s.io/kubernetes requires its staging modules at v0.0.0 with ./staging
  # replaces; point each one at the published module of the same release.
  say "resolving k8s.io/kubernetes $KUBE_VERSION and its staging modules"
  local modfile
  modfile="$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" 2>"$m/dl.log" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')" ||
    true
  [ -n "$modfile" ] && [ -f "$modfile" ] ||
    { cat "$m/dl.log" >&2; die "cannot download k8s.io/kubernetes@$KUBE_VERSION from the Go module proxy"; }
  local staging
  staging="$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9.-]*\) => ./staging/.*#\1#p' "$modfile" | sort -u)"
  [ -n "$staging" ] || die "found no staging replaces in k8s.io/kubernetes@$KUBE_VERSION go.mod"
  local args=()
  for s in $staging; do args+=("-replace=$s=$s@$STAGING_VERSION"); done
  go mod edit "${args[@]}" -require="k8s.io/kubernetes@$KUBE_VERSION"
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
  go mod tidy >/dev/null 2>"$m/tidy.log" || { tail -20 "$m/tidy.log" >&2; die "go mod tidy for kube-apiserver failed"; }
  say "compiling kube-apiserver"
  CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)" \
    -o "$out/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver || die "go build of kube-apiserver failed (see above)"
  mv "$out/kube-apiserver.tmp" "$out/kube-apiserver"
  echo "$KUBE_VERSION" > "$out/.kube-apiserver.version"
  say "kube-apiserver ready: $out/kube-apiserver"
}

start=$(date +%s)
build_etcd
build_apiserver
say "control plane in $out ($(( $(date +%s) - start ))s)"
