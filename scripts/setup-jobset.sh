#!/usr/bin/env bash
# Builds JobSet's controller (sigs.k8s.io/jobset, the version e2e/jobset/go.mod pins)
# from the Go module proxy, for `make bench-recovery`, and copies its CRD beside it from
# the module's own source. Prints the directory that holds `jobset` and
# `jobset.x-k8s.io_jobsets.yaml`. Cached under $PT_CACHE/jobset/<version>-<hash>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
. scripts/go-tool.sh
module=e2e/jobset
version="$(go_tool_version "$module" sigs.k8s.io/jobset)"
dir="$PT_CACHE/jobset/$version-$(go_tool_hash "$module/go.mod" "$module/go.sum")"
crd=jobset.x-k8s.io_jobsets.yaml
if [ -x "$dir/jobset" ] && [ -f "$dir/$crd" ]; then
  echo "$dir"
  exit 0
fi
go_tool_env setup-jobset 1.25
echo "building JobSet $version into $dir (minutes on 2 cores, once per version)" >&2
go_tool_stage "$dir"
(
  cd "$module"
  start=$SECONDS
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$version" \
    -o "$dir.partial/jobset" sigs.k8s.io/jobset >&2
  echo "built in $((SECONDS - start)) s" >&2
  source_dir="$(go list -m -f '{{.Dir}}' sigs.k8s.io/jobset)"
  cp "$source_dir/config/components/crd/bases/$crd" "$dir.partial/$crd"
)
go_tool_publish "$dir"
echo "$dir"
