#!/usr/bin/env bash
# Builds the local control plane (etcd, kube-apiserver and, when asked,
# kube-controller-manager) from the Go module proxy into bin/k8s. Prebuilt
# envtest archives cannot be downloaded here, so each binary is built in a
# throwaway module. A second run is a no-op.
#   hack/build-control-plane.sh                          etcd and kube-apiserver
#   hack/build-control-plane.sh kube-controller-manager  just that one
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

# kube_module prepares, once per run, the throwaway module every Kubernetes
# binary is built in: k8s.io/kubernetes at KUBE_VERSION with its staging modules.
kube_module=""
prepare_kube_module() {
  [ -z "$kube_module" ] || return 0
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
  # Both commands, so one go mod tidy resolves what either needs.
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
GO
  go mod tidy >/dev/null 2>"$m/tidy.log" || { tail -20 "$m/tidy.log" >&2; die "go mod tidy for k8s.io/kubernetes $KUBE_VERSION failed"; }
  kube_module="$m"
}

# build_kube builds k8s.io/kubernetes/cmd/$1 into $out/$1, its version stamped
# as a release build stamps it.
build_kube() {
  local name="$1" minutes="$2"
  if fresh "$name" "$KUBE_VERSION"; then say "$name $KUBE_VERSION already built"; return; fi
  say "building $name $KUBE_VERSION ($minutes)"
  prepare_kube_module
  cd "$kube_module"
  say "compiling $name"
  CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)" \
    -o "$out/$name.tmp" "k8s.io/kubernetes/cmd/$name" || die "go build of $name failed (see above)"
  mv "$out/$name.tmp" "$out/$name"
  echo "$KUBE_VERSION" > "$out/.$name.version"
  say "$name ready: $out/$name"
}

# With no argument: etcd and kube-apiserver (what envtest needs). The local
# control plane of make dev/demo/test/chaos also runs kube-controller-manager
# (docs/local-control-plane.md): make controller-manager passes its name.
[ $# -gt 0 ] || set -- etcd kube-apiserver
start=$(date +%s)
for target in "$@"; do
  case "$target" in
    etcd) build_etcd ;;
    kube-apiserver) build_kube kube-apiserver "about 8 minutes the first time" ;;
    kube-controller-manager) build_kube kube-controller-manager "about 5 minutes more, sharing most packages with kube-apiserver" ;;
    *) die "unknown binary \"$target\": build etcd, kube-apiserver or kube-controller-manager" ;;
  esac
done
say "control plane in $out ($(( $(date +%s) - start ))s)"
