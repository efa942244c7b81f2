#!/usr/bin/env bash
# Builds e2e/argocd-health (our program around Argo CD v3.6.1's own Lua health
# evaluation, github.com/argoproj/argo-cd/v3/util/lua) from the Go module proxy. Argo CD
# v3.6.1 needs Go 1.27: the go command fetches go1.27.3 from the proxy (GOTOOLCHAIN).
# Prints the directory that holds `argocd-health`. Cached under
# $PT_CACHE/argocd-health/<hash>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
. scripts/go-tool.sh
module=e2e/argocd-health
dir="$PT_CACHE/argocd-health/$(go_tool_hash "$module/go.mod" "$module/main.go" "$module/go.sum")"
if [ -x "$dir/argocd-health" ]; then
  echo "$dir"
  exit 0
fi
go_tool_env setup-argocd-health 1.21
export GOTOOLCHAIN=go1.27.3
echo "building argocd-health into $dir (minutes on 2 cores, once)" >&2
go_tool_stage "$dir"
(cd "$module" && go build -trimpath -o "$dir.partial/argocd-health" . >&2)
go_tool_publish "$dir"
echo "$dir"
