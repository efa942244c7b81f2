#!/usr/bin/env bash
# No import cycles between modules: in every library of the workspace, no module
# imports (directly or through others) a module that imports it back, parent and
# child included. cargo-modules draws each crate's module "uses" graph (rust-analyzer's
# name resolution: `use` items and paths in signatures and bodies); Graphviz's sccmap
# prints its strongly connected components, and any component of two or more modules is
# a cycle, printed with its edges.
#
# Why not `cargo modules dependencies --acyclic`: it checks the item graph before the
# filters apply, where every method that names its own type (`Error::reason` → `Error`)
# is a cycle.
#
# Installs cargo-modules (pinned) and graphviz when missing. `--install-cargo-modules`
# only installs cargo-modules, the slow part (.ci/run does it in the background while the
# tests run; apt stays in the foreground, where nothing else holds its lock).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
version=0.27.0
if ! cargo modules --version 2>/dev/null | grep -q "$version"; then
  echo "installing cargo-modules $version (the module cycle check)" >&2
  cargo install --quiet --locked "cargo-modules@$version" >&2
fi
if [ "${1:-}" = "--install-cargo-modules" ]; then
  exit 0
fi
scripts/setup-debian.sh --lint
LIBTORCH="$(scripts/setup-libtorch.sh cpu)"
export LIBTORCH
status=0
for crate in crds operator trainer e2e; do
  graph="$(cargo modules dependencies --package "$crate" --lib --no-fns --no-types --no-traits \
    --no-externs --no-sysroot --no-owns --layout dot)"
  cycles="$(printf '%s\n' "$graph" | sccmap 2>/dev/null | grep -E '^\s*"[^"]+" -> "[^"]+"' | sed -E 's/\s*\[.*//; s/^\s*/  /' || true)"
  if [ -n "$cycles" ]; then
    echo "$crate: modules that import each other (each cycle's edges):" >&2
    printf '%s\n' "$cycles" >&2
    status=1
  else
    echo "$crate: no import cycles between modules"
  fi
done
exit $status
