#!/usr/bin/env bash
# Builds the real Kubernetes control plane the e2e suite runs against, from source, from
# the Go module proxy: kube-apiserver, kube-controller-manager, kube-scheduler and
# kubectl (k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3) and helm
# (helm.sh/helm/v4), as pinned by e2e/controlplane/go.mod, a module that only names tools.
#
# Prints the directory that holds the binaries. Cached by the module's content under
# $PT_CACHE/control-plane/<kubernetes version>-<hash>/bin, so a version change rebuilds
# and a re-run is instant. The Go module and build caches live under $PT_CACHE/go*.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
module=e2e/controlplane
version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$module/go.mod")"
if [ -z "$version" ]; then
  echo "$module/go.mod: no k8s.io/kubernetes version in its require lines" >&2
  exit 1
fi
hash="$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-12)"
bin="$PT_CACHE/control-plane/$version-$hash/bin"
tools=(etcd helm kube-apiserver kube-controller-manager kube-scheduler kubectl)
complete=1
for tool in "${tools[@]}"; do
  [ -x "$bin/$tool" ] || complete=0
done
if [ "$complete" = 1 ]; then
  echo "$bin"
  exit 0
fi
if ! command -v go > /dev/null; then
  echo "setup-control-plane: no 'go' on PATH (Go 1.26 or newer builds $module)" >&2
  exit 1
fi
export GOPATH="$PT_CACHE/go" GOCACHE="$PT_CACHE/go-build" GOFLAGS="-mod=mod"
minor="$(echo "$version" | cut -d. -f2)"
# What `kubectl version` and the API server's /version report, as a release build sets it.
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
echo "building the control plane $version into $bin (minutes on 2 cores, once per version)" >&2
staging="$bin.partial"
rm -rf "$staging"
mkdir -p "$staging"
(
  cd "$module"
  start=$SECONDS
  go build -trimpath -ldflags "-s -w$stamp" -o "$staging/" \
    go.etcd.io/etcd/server/v3 \
    helm.sh/helm/v4/cmd/helm \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl >&2
  echo "built in $((SECONDS - start)) s" >&2
)
# `go build` names a main package after its import path without the major version:
# etcd's is "server".
mv "$staging/server" "$staging/etcd"
for tool in "${tools[@]}"; do
  if [ ! -x "$staging/$tool" ]; then
    echo "setup-control-plane: $tool was not built (in $staging)" >&2
    exit 1
  fi
done
rm -rf "$bin"
mv "$staging" "$bin"
echo "$bin"
