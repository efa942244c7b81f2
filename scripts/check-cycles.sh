#!/usr/bin/env bash
# No import cycles between modules: in every library of the workspace, no module depends
# (directly or through others) on a module that depends on it back, parent and child
# included, and no two sibling modules depend on each other through their children.
# tools/modcycles reads the sources with syn and counts every path a module writes: `use`
# items, signatures, function bodies, constants, macro arguments, re-exports followed to
# the module that declares the item (cargo-modules, used before, missed paths in bodies
# and constants). Method calls name no path, so `impl T` blocks spread over modules are
# not seen.
#
# The tool must flag its fixtures (a call in a body, a type through a re-export, layers
# that meet through their children) before its verdict on the workspace counts.
# scripts/known-cycles.txt lists the cycles not yet removed, each exactly: a new cycle
# fails, and so does a listed one that is gone (take it off the list).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
tool_target="$PT_CACHE/target-tools"
(cd tools/modcycles && CARGO_TARGET_DIR="$tool_target" cargo test --locked -q >&2 &&
  CARGO_TARGET_DIR="$tool_target" cargo build --locked -q --release)
modcycles="$tool_target/release/modcycles"
for fixture in cyclic nested; do
  if "$modcycles" "tools/modcycles/fixtures/$fixture/lib.rs" >/dev/null 2>&1; then
    echo "error: modcycles found no cycle in its fixture tools/modcycles/fixtures/$fixture" >&2
    exit 1
  fi
done
found="$(mktemp)"
trap 'rm -f "$found"' EXIT
status=0
for crate in crds operator trainer e2e; do
  report="$("$modcycles" "$crate/src/lib.rs" 2>&1)" && rc=0 || rc=$?
  if [ "$rc" -gt 1 ]; then
    echo "$report" >&2
    exit 1
  fi
  sed -n "s|^cycle between \(.*\):$|$crate: \1|p" <<<"$report" >> "$found"
  while IFS= read -r cycle; do
    if ! grep -qxF "$cycle" <(grep -v '^#' scripts/known-cycles.txt); then
      echo "$crate: a new import cycle:" >&2
      awk -v want="cycle between ${cycle#"$crate: "}:" '$0 == want {p=1; print; next} /^cycle between / {p=0} p' <<<"$report" >&2
      status=1
    fi
  done < <(grep "^$crate: " "$found" || true)
  [ "$rc" -eq 0 ] && echo "$crate: no import cycles between modules"
done
while IFS= read -r known; do
  if ! grep -qxF "$known" "$found"; then
    echo "scripts/known-cycles.txt lists a cycle that is gone (remove the line): $known" >&2
    status=1
  fi
done < <(grep -v '^#' scripts/known-cycles.txt | grep -v '^$')
if [ "$status" -eq 0 ] && [ -s "$found" ]; then
  echo "known cycles, still to remove (scripts/known-cycles.txt):"
  sed 's/^/  /' "$found"
fi
exit $status
