#!/usr/bin/env bash
# Builds the binaries of a real Kubernetes node from source, from the Go module proxy:
#   kubelet, kube-proxy       k8s.io/kubernetes, at the control plane's version: named by
#                             e2e/node-k8s, which is e2e/controlplane's go.mod (its
#                             requirements and staging replaces) with these two tools, so
#                             they mostly hit the control plane's build cache;
#   containerd, ctr, containerd-shim-runc-v2
#                             github.com/containerd/containerd/v2, cgo, without the btrfs,
#                             devmapper and zfs snapshotters;
#   runc                      github.com/opencontainers/runc, cgo with seccomp (Debian's
#                             libseccomp-dev and pkg-config: scripts/setup-debian.sh --test);
#   bridge, host-local, loopback, portmap
#                             the CNI plugins, github.com/containernetworking/plugins;
#   crictl                    sigs.k8s.io/cri-tools;
#   coredns                   github.com/coredns/coredns with only the plugins the test
#                             clusters' Corefile uses: e2e/node-dns, a main package of ours
#                             as CoreDNS documents for a build of chosen plugins;
#   kube-router               github.com/cloudnativelabs/kube-router/v2, the NetworkPolicy
#                             enforcer, run firewall-only (iptables and ipset; Debian's
#                             ipset: scripts/setup-debian.sh --test). Pinned by
#                             e2e/node-netpol/go.mod, whose note says why not
#                             kube-network-policies.
# The versions of the others are pinned by e2e/node/go.mod, a module that only names
# tools; every pinned version built as named.
#
# Prints the directory that holds the binaries. Cached by content under
# $PT_CACHE/node/<kubernetes version>-<hash>/bin, the hash over both modules and this script
# (its build flags), so a version change rebuilds and a re-run is instant. The Go module
# and build caches live under $PT_CACHE/go*, shared with scripts/setup-control-plane.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
. scripts/go-tool.sh
k8s=e2e/node-k8s
module=e2e/node
netpol=e2e/node-netpol
dns=e2e/node-dns
version="$(go_tool_version "$k8s" k8s.io/kubernetes)"
control_plane="$(go_tool_version e2e/controlplane k8s.io/kubernetes)"
if [ "$version" != "$control_plane" ]; then
  echo "setup-node: $k8s/go.mod has k8s.io/kubernetes $version, e2e/controlplane/go.mod" \
    "$control_plane: the node must run the control plane's version" >&2
  exit 1
fi
hash="$(go_tool_hash "$k8s/go.mod" "$k8s/go.sum" "$module/go.mod" "$module/go.sum" \
  "$netpol/go.mod" "$netpol/go.sum" "$dns/go.mod" "$dns/go.sum" "$dns/main.go" scripts/setup-node.sh)"
bin="$PT_CACHE/node/$version-$hash/bin"
tools=(kubelet kube-proxy containerd ctr containerd-shim-runc-v2 runc
  bridge host-local loopback portmap crictl coredns kube-router)
complete=1
for tool in "${tools[@]}"; do
  [ -x "$bin/$tool" ] || complete=0
done
if [ "$complete" = 1 ]; then
  echo "$bin"
  exit 0
fi
go_tool_env setup-node 1.26.8
if [ ! -f /usr/include/seccomp.h ] || ! command -v pkg-config > /dev/null; then
  echo "setup-node: runc's seccomp build needs libseccomp-dev and pkg-config" \
    "(scripts/setup-debian.sh --test installs them)" >&2
  exit 1
fi
minor="$(echo "$version" | cut -d. -f2)"
# What `kubelet --version` and the node's status report, as a release build sets it.
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
containerd="$(go_tool_version "$module" github.com/containerd/containerd/v2)"
cni="$(go_tool_version "$module" github.com/containernetworking/plugins)"
crictl="$(go_tool_version "$module" sigs.k8s.io/cri-tools)"
router="$(go_tool_version "$netpol" github.com/cloudnativelabs/kube-router/v2)"
coredns="$(go_tool_version "$dns" github.com/coredns/coredns)"
echo "building the node's binaries (Kubernetes $version) into $bin" \
  "(minutes on 2 cores, once per version)" >&2
go_tool_stage "$bin"
staging="$bin.partial"
# build WHAT GO_BUILD_ARGUMENTS...: one `go build`, timed.
build() {
  local what="$1" start=$SECONDS
  shift
  echo "building $what" >&2
  go build -trimpath "$@" >&2
  echo "$what: built in $((SECONDS - start)) s" >&2
}
(
  cd "$k8s"
  build "kubelet and kube-proxy" -ldflags "-s -w$stamp" -o "$staging/" \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy
)
(
  cd "$module"
  CGO_ENABLED=1 build "containerd $containerd" -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd" \
    -o "$staging/" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/ctr \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
  # runc reads its version from its embedded VERSION file.
  CGO_ENABLED=1 build runc -tags seccomp -ldflags "-s -w" -o "$staging/runc" \
    github.com/opencontainers/runc
  # The rest are static, as their releases are.
  CGO_ENABLED=0 build "the CNI plugins $cni" \
    -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$cni" \
    -o "$staging/" \
    github.com/containernetworking/plugins/plugins/main/bridge \
    github.com/containernetworking/plugins/plugins/ipam/host-local \
    github.com/containernetworking/plugins/plugins/main/loopback \
    github.com/containernetworking/plugins/plugins/meta/portmap
  CGO_ENABLED=0 build "crictl $crictl" \
    -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl" \
    -o "$staging/" sigs.k8s.io/cri-tools/cmd/crictl
)
(
  cd "$dns"
  # CoreDNS's version is a constant of its source.
  CGO_ENABLED=0 build "coredns $coredns" -ldflags "-s -w" \
    -o "$staging/coredns" .
)
(
  cd "$netpol"
  CGO_ENABLED=0 build "kube-router $router" \
    -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$router" \
    -o "$staging/" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
)
for tool in "${tools[@]}"; do
  if [ ! -x "$staging/$tool" ]; then
    echo "setup-node: $tool was not built (in $staging)" >&2
    exit 1
  fi
done
go_tool_publish "$bin"
echo "$bin"
