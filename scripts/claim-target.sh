#!/usr/bin/env bash
# Makes $CARGO_TARGET_DIR this checkout's. Cargo reuses a workspace crate's artifacts
# when the same sources are built from another directory, but `env!("CARGO_MANIFEST_DIR")`
# is compiled into them: tests built in one checkout then read (or fail to find) the
# other's files. When the target directory was last built from elsewhere, this
# workspace's own crates are cleaned so they rebuild here; their dependencies stay.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
here="$(pwd -P)"
owner="$CARGO_TARGET_DIR/.checkout"
if [ -f "$owner" ] && [ "$(cat "$owner")" != "$here" ]; then
  echo "claim-target: $CARGO_TARGET_DIR was built from $(cat "$owner"); rebuilding this workspace's crates for $here" >&2
  members="$(cargo metadata --no-deps --format-version 1 --locked \
    | python3 -c 'import json, sys; print(" ".join("-p " + p["name"] for p in json.load(sys.stdin)["packages"]))')"
  # shellcheck disable=SC2086
  cargo clean $members
fi
mkdir -p "$CARGO_TARGET_DIR"
echo "$here" > "$owner"
