#!/usr/bin/env bash
# Builds Prometheus (github.com/prometheus/prometheus/cmd/prometheus, the version
# e2e/prometheus/go.mod pins; v0.316.0 is Prometheus 3.16) from the Go module proxy, for
# the alert drills on the real control plane. Prints the directory that holds
# `prometheus`. Cached under $PT_CACHE/prometheus/<version>-<hash>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
. scripts/go-tool.sh
module=e2e/prometheus
version="$(go_tool_version "$module" github.com/prometheus/prometheus)"
dir="$PT_CACHE/prometheus/$version-$(go_tool_hash "$module/go.mod" "$module/go.sum")"
if [ -x "$dir/prometheus" ]; then
  echo "$dir"
  exit 0
fi
go_tool_env setup-prometheus 1.26.7
echo "building Prometheus $version into $dir (minutes on 2 cores, once per version)" >&2
go_tool_stage "$dir"
(
  cd "$module"
  start=$SECONDS
  # Without the `builtinassets` tag the web UI's files are not embedded: the drills use
  # the HTTP API only. Of the service discoveries, Kubernetes' alone (Prometheus' own
  # build tags), which leaves out the cloud providers' SDKs.
  go build -trimpath -tags remove_all_sd,enable_kubernetes_sd -ldflags "-s -w -X github.com/prometheus/common/version.Version=$version" \
    -o "$dir.partial/prometheus" github.com/prometheus/prometheus/cmd/prometheus >&2
  echo "built in $((SECONDS - start)) s" >&2
)
go_tool_publish "$dir"
echo "$dir"
