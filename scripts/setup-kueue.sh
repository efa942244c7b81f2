#!/usr/bin/env bash
# Builds Kueue's controller (sigs.k8s.io/kueue/cmd/kueue, the version e2e/kueue/go.mod
# pins) from the Go module proxy, and copies its CRDs and webhook manifests beside it
# from the module's own source, with the names of the CRDs its release converts through
# its webhook (conversion-webhooks.txt, from config/components/crd's patches). Prints
# that directory. Cached under $PT_CACHE/kueue/<version>-<hash>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
. scripts/go-tool.sh
module=e2e/kueue
version="$(go_tool_version "$module" sigs.k8s.io/kueue)"
dir="$PT_CACHE/kueue/$version-$(go_tool_hash "$module/go.mod" scripts/setup-kueue.sh "$module/go.sum")"
if [ -x "$dir/kueue" ] && [ -d "$dir/crd" ] && [ -f "$dir/webhooks.yaml" ] && [ -f "$dir/conversion-webhooks.txt" ]; then
  echo "$dir"
  exit 0
fi
go_tool_env setup-kueue 1.25
echo "building Kueue $version into $dir (minutes on 2 cores, once per version)" >&2
go_tool_stage "$dir"
mkdir -p "$dir.partial/crd"
(
  cd "$module"
  start=$SECONDS
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version" \
    -o "$dir.partial/kueue" sigs.k8s.io/kueue/cmd/kueue >&2
  echo "built in $((SECONDS - start)) s" >&2
  source_dir="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
  cp "$source_dir"/config/components/crd/bases/*.yaml "$dir.partial/crd/"
  cp "$source_dir/config/components/webhook/manifests.yaml" "$dir.partial/webhooks.yaml"
  # "- path: patches/webhook_in_workloads.yaml" → workloads.kueue.x-k8s.io
  sed -n 's|^- path: patches/webhook_in_\([a-z]*\)\.yaml$|\1.kueue.x-k8s.io|p' \
    "$source_dir/config/components/crd/kustomization.yaml" > "$dir.partial/conversion-webhooks.txt"
  if [ ! -s "$dir.partial/conversion-webhooks.txt" ]; then
    echo "setup-kueue: no conversion webhook patches in config/components/crd/kustomization.yaml" >&2
    exit 1
  fi
)
go_tool_publish "$dir"
echo "$dir"
