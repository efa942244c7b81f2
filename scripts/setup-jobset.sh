#!/usr/bin/env bash
# Builds JobSet's controller (sigs.k8s.io/jobset, the version e2e/jobset/go.mod pins)
# from the Go module proxy, for `make bench-recovery`, and copies its CRD beside it from
# the module's own source. Prints the directory that holds `jobset` and
# `jobset.x-k8s.io_jobsets.yaml`. Cached under $PT_CACHE/jobset/<version>-<hash>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
module=e2e/jobset
version="$(awk '$1 == "require" && $2 == "sigs.k8s.io/jobset" { print $3; exit }' "$module/go.mod")"
if [ -z "$version" ]; then
  echo "$module/go.mod: no sigs.k8s.io/jobset version in its require line" >&2
  exit 1
fi
hash="$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-12)"
dir="$PT_CACHE/jobset/$version-$hash"
crd=jobset.x-k8s.io_jobsets.yaml
if [ -x "$dir/jobset" ] && [ -f "$dir/$crd" ]; then
  echo "$dir"
  exit 0
fi
if ! command -v go > /dev/null; then
  echo "setup-jobset: no 'go' on PATH (Go 1.25 or newer builds $module)" >&2
  exit 1
fi
export GOPATH="$PT_CACHE/go" GOCACHE="$PT_CACHE/go-build" GOFLAGS="-mod=mod"
echo "building JobSet $version into $dir (minutes on 2 cores, once per version)" >&2
staging="$dir.partial"
rm -rf "$staging"
mkdir -p "$staging"
(
  cd "$module"
  start=$SECONDS
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$version" \
    -o "$staging/jobset" sigs.k8s.io/jobset >&2
  echo "built in $((SECONDS - start)) s" >&2
  source_dir="$(go list -m -f '{{.Dir}}' sigs.k8s.io/jobset)"
  cp "$source_dir/config/components/crd/bases/$crd" "$staging/$crd"
)
rm -rf "$dir"
mv "$staging" "$dir"
echo "$dir"
