# Sourced by the scripts that build a program from the Go module proxy
# (setup-control-plane.sh, setup-prometheus.sh, setup-jobset.sh, setup-kueue.sh,
# setup-argocd-health.sh). Each names its programs in a small Go module of ours under
# e2e/ and caches what it builds under $PT_CACHE/<tool>/, in a directory named by that
# module's content, built whole or not at all.

# go_tool_version MODULE_DIR MODULE_PATH: the version MODULE_DIR/go.mod requires of
# MODULE_PATH (a `require X v` line or a line of a require block).
go_tool_version() {
  local version
  version="$(awk -v m="$2" '$1 == "require" && $2 == m { print $3; exit } $1 == m && $2 ~ /^v/ { print $2; exit }' "$1/go.mod")"
  if [ -z "$version" ]; then
    echo "$1/go.mod: no $2 version in its require lines" >&2
    exit 1
  fi
  echo "$version"
}

# go_tool_hash FILE...: the first 12 hex digits of the files' SHA-256, together.
go_tool_hash() {
  cat "$@" | sha256sum | cut -c1-12
}

# go_tool_env SCRIPT MINIMUM_GO: fails unless `go` is on PATH; keeps Go's module and
# build caches under $PT_CACHE.
go_tool_env() {
  if ! command -v go > /dev/null; then
    echo "$1: no 'go' on PATH (Go $2 or newer builds it)" >&2
    exit 1
  fi
  export GOPATH="$PT_CACHE/go" GOCACHE="$PT_CACHE/go-build" GOFLAGS="-mod=mod"
}

# go_tool_stage DIR: an empty DIR.partial to build into.
go_tool_stage() {
  rm -rf "$1.partial"
  mkdir -p "$1.partial"
}

# go_tool_publish DIR: DIR.partial becomes DIR.
go_tool_publish() {
  rm -rf "$1"
  mv "$1.partial" "$1"
}
