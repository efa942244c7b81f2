#!/usr/bin/env bash
# Builds Prometheus (github.com/prometheus/prometheus/cmd/prometheus, the version
# e2e/prometheus/go.mod pins; v0.316.0 is Prometheus 3.16) from the Go module proxy, for
# the alert drills on the real control plane. Prints the directory that holds
# `prometheus`. Cached under $PT_CACHE/prometheus/<version>-<hash>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
module=e2e/prometheus
version="$(awk '$1 == "require" && $2 == "github.com/prometheus/prometheus" { print $3; exit }' "$module/go.mod")"
if [ -z "$version" ]; then
  echo "$module/go.mod: no github.com/prometheus/prometheus version in its require line" >&2
  exit 1
fi
hash="$(cat "$module/go.mod" "$module/go.sum" 2>/dev/null | sha256sum | cut -c1-12)"
dir="$PT_CACHE/prometheus/$version-$hash"
if [ -x "$dir/prometheus" ]; then
  echo "$dir"
  exit 0
fi
if ! command -v go > /dev/null; then
  echo "setup-prometheus: no 'go' on PATH (Go 1.26.7 or newer builds $module)" >&2
  exit 1
fi
export GOPATH="$PT_CACHE/go" GOCACHE="$PT_CACHE/go-build" GOFLAGS="-mod=mod"
echo "building Prometheus $version into $dir (minutes on 2 cores, once per version)" >&2
staging="$dir.partial"
rm -rf "$staging"
mkdir -p "$staging"
(
  cd "$module"
  start=$SECONDS
  # Without the `builtinassets` tag the web UI's files are not embedded: the drills use
  # the HTTP API only. Of the service discoveries, Kubernetes' alone (Prometheus' own
  # build tags), which leaves out the cloud providers' SDKs.
  go build -trimpath -tags remove_all_sd,enable_kubernetes_sd -ldflags "-s -w -X github.com/prometheus/common/version.Version=$version" \
    -o "$staging/prometheus" github.com/prometheus/prometheus/cmd/prometheus >&2
  echo "built in $((SECONDS - start)) s" >&2
)
rm -rf "$dir"
mv "$staging" "$dir"
echo "$dir"
