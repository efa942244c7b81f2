#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok/cmd/kwok, the version e2e/kwok/go.mod pins) from the Go
# module proxy: the simulated nodes of the real control plane's kwok clusters
# (e2e/src/kwok.rs), which hold Leases and play our own stages on the pods bound to
# them. Prints the directory that holds `kwok`. Cached under
# $PT_CACHE/kwok/<version>-<hash>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
. scripts/go-tool.sh
module=e2e/kwok
version="$(go_tool_version "$module" sigs.k8s.io/kwok)"
dir="$PT_CACHE/kwok/$version-$(go_tool_hash "$module/go.mod" "$module/go.sum")"
if [ -x "$dir/kwok" ]; then
  echo "$dir"
  exit 0
fi
# kwok v0.8.0's own go.mod asks for Go 1.26.
go_tool_env setup-kwok 1.26
# Measured cold on 2 cores: 116 s idle, 308 s beside the control plane's Go build and a
# cargo build.
echo "building kwok $version into $dir (2 to 5 minutes on 2 cores, once per version)" >&2
go_tool_stage "$dir"
(
  cd "$module"
  start=$SECONDS
  # No -X for its version: the module's pkg/consts already says it.
  go build -trimpath -ldflags "-s -w" -o "$dir.partial/kwok" sigs.k8s.io/kwok/cmd/kwok >&2
  echo "built kwok in $((SECONDS - start)) s" >&2
)
go_tool_publish "$dir"
echo "$dir"
