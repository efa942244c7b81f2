#!/usr/bin/env bash
# Installs the Debian packages the build needs, when they are missing:
#   libgloo-dev  the Gloo headers c10d's ProcessGroupGloo.hpp includes (the torch
#                wheel ships none; every Gloo symbol resolves from libtorch_cpu).
# With --test also what the tests need:
#   prometheus   promtool, for the alert rules' unit tests.
#   iproute2     ip, which gives the real-cluster suite's pods their network namespaces.
#   libseccomp-dev  seccomp.h and libseccomp.so, which runc's `-tags seccomp` build links
#                (scripts/setup-node.sh).
#   pkg-config   how runc's seccomp binding finds libseccomp.
#   iptables     iptables, iptables-save and iptables-restore, which kube-proxy's iptables
#                mode runs.
#   nftables     nft, which kube-proxy's nftables mode runs, and to inspect the node's rules.
#   ipset        ipset, which kube-router (the nodes' NetworkPolicy enforcer) runs.
#   conntrack    conntrack, to inspect the node's connection tracking (kube-proxy itself
#                flushes entries over netlink).
# With --image what scripts/check-image.sh needs:
#   debootstrap  builds the image's Debian root file system without Docker.
#   iproute2     ip, which brings up the loopback of its network namespace.
# Idempotent and quiet when everything is there.
set -euo pipefail
missing=()
[ -f /usr/include/gloo/config.h ] || [ -n "${GLOO_INCLUDE_DIR:-}" ] || missing+=(libgloo-dev)
if [ "${1:-}" = --test ]; then
  command -v promtool >/dev/null || missing+=(prometheus)
  command -v ip >/dev/null || missing+=(iproute2)
  [ -f /usr/include/seccomp.h ] || missing+=(libseccomp-dev)
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  command -v iptables-restore >/dev/null || [ -x /usr/sbin/iptables-restore ] || missing+=(iptables)
  command -v nft >/dev/null || [ -x /usr/sbin/nft ] || missing+=(nftables)
  command -v conntrack >/dev/null || [ -x /usr/sbin/conntrack ] || missing+=(conntrack)
  command -v ipset >/dev/null || [ -x /usr/sbin/ipset ] || missing+=(ipset)
fi
if [ "${1:-}" = --image ]; then
  command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
  command -v ip >/dev/null || missing+=(iproute2)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! $sudo apt-get install -y -q "${missing[@]}" >&2; then
  $sudo apt-get update -q >&2
  $sudo apt-get install -y -q "${missing[@]}" >&2
fi
