#!/usr/bin/env bash
# Builds e2e/argocd-health (our program around Argo CD v3.6.1's own Lua health
# evaluation, github.com/argoproj/argo-cd/v3/util/lua) from the Go module proxy. Argo CD
# v3.6.1 needs Go 1.27: the go command fetches go1.27.3 from the proxy (GOTOOLCHAIN).
# Prints the directory that holds `argocd-health`. Cached under
# $PT_CACHE/argocd-health/<hash>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
module=e2e/argocd-health
hash="$({ cat "$module/go.mod" "$module/main.go"; cat "$module/go.sum" 2>/dev/null || true; } | sha256sum | cut -c1-12)"
dir="$PT_CACHE/argocd-health/$hash"
if [ -x "$dir/argocd-health" ]; then
  echo "$dir"
  exit 0
fi
export GOPATH="$PT_CACHE/go" GOCACHE="$PT_CACHE/go-build" GOFLAGS="-mod=mod" GOTOOLCHAIN=go1.27.3
echo "building argocd-health into $dir (minutes on 2 cores, once)" >&2
mkdir -p "$dir.partial"
(cd "$module" && go build -trimpath -o "$dir.partial/argocd-health" . >&2)
rm -rf "$dir"
mv "$dir.partial" "$dir"
echo "$dir"
