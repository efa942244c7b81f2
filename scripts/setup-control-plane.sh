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
. scripts/go-tool.sh
version="$(go_tool_version "$module" k8s.io/kubernetes)"
bin="$PT_CACHE/control-plane/$version-$(go_tool_hash "$module/go.mod" "$module/go.sum")/bin"
tools=(etcd helm kube-apiserver kube-controller-manager kube-scheduler kubectl)
complete=1
for tool in "${tools[@]}"; do
  [ -x "$bin/$tool" ] || complete=0
done
if [ "$complete" = 1 ]; then
  echo "$bin"
  exit 0
fi
go_tool_env setup-control-plane 1.26
minor="$(echo "$version" | cut -d. -f2)"
# What `kubectl version` and the API server's /version report, as a release build sets it.
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
echo "building the control plane $version into $bin (minutes on 2 cores, once per version)" >&2
go_tool_stage "$bin"
staging="$bin.partial"
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
go_tool_publish "$bin"
echo "$bin"
