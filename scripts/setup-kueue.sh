#!/usr/bin/env bash
# Builds Kueue's controller (sigs.k8s.io/kueue/cmd/kueue, the version e2e/kueue/go.mod
# pins) from the Go module proxy, and copies its CRDs and webhook manifests beside it
# from the module's own source, with the names of the CRDs its release converts through
# its webhook (conversion-webhooks.txt, from config/components/crd's patches). Prints
# that directory. Cached under $PT_CACHE/kueue/<version>-<hash>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
module=e2e/kueue
version="$(awk '$1 == "require" && $2 == "sigs.k8s.io/kueue" { print $3; exit }' "$module/go.mod")"
if [ -z "$version" ]; then
  echo "$module/go.mod: no sigs.k8s.io/kueue version in its require line" >&2
  exit 1
fi
hash="$({ cat "$module/go.mod" "${BASH_SOURCE[0]}"; cat "$module/go.sum" 2>/dev/null || true; } | sha256sum | cut -c1-12)"
dir="$PT_CACHE/kueue/$version-$hash"
if [ -x "$dir/kueue" ] && [ -d "$dir/crd" ] && [ -f "$dir/webhooks.yaml" ] && [ -f "$dir/conversion-webhooks.txt" ]; then
  echo "$dir"
  exit 0
fi
if ! command -v go > /dev/null; then
  echo "setup-kueue: no 'go' on PATH (Go 1.25 or newer builds $module)" >&2
  exit 1
fi
export GOPATH="$PT_CACHE/go" GOCACHE="$PT_CACHE/go-build" GOFLAGS="-mod=mod"
echo "building Kueue $version into $dir (minutes on 2 cores, once per version)" >&2
staging="$dir.partial"
rm -rf "$staging"
mkdir -p "$staging/crd"
(
  cd "$module"
  start=$SECONDS
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version" \
    -o "$staging/kueue" sigs.k8s.io/kueue/cmd/kueue >&2
  echo "built in $((SECONDS - start)) s" >&2
  source_dir="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
  cp "$source_dir"/config/components/crd/bases/*.yaml "$staging/crd/"
  cp "$source_dir/config/components/webhook/manifests.yaml" "$staging/webhooks.yaml"
  # "- path: patches/webhook_in_workloads.yaml" → workloads.kueue.x-k8s.io
  sed -n 's|^- path: patches/webhook_in_\([a-z]*\)\.yaml$|\1.kueue.x-k8s.io|p' \
    "$source_dir/config/components/crd/kustomization.yaml" > "$staging/conversion-webhooks.txt"
  if [ ! -s "$staging/conversion-webhooks.txt" ]; then
    echo "setup-kueue: no conversion webhook patches in config/components/crd/kustomization.yaml" >&2
    exit 1
  fi
)
rm -rf "$dir"
mv "$staging" "$dir"
echo "$dir"
