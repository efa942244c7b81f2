#!/usr/bin/env bash
# The trainer's module layout (trainer/src/lib.rs's map): no import cycle between its
# modules, checked by cargo-modules (rust-analyzer's own name resolution and type
# inference), and `crate::cli` used only inside `cli/`. Installs the pinned
# cargo-modules under ~/.cache/puretransformer/tools on first use.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
version=0.27.0
tools="$PT_CACHE/tools"
bin="$tools/bin/cargo-modules"
if ! { [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$version"; }; then
  echo "installing cargo-modules $version (the layout check)" >&2
  cargo install --quiet --locked --root "$tools" "cargo-modules@$version" >&2
fi
LIBTORCH="${LIBTORCH:-$(scripts/setup-libtorch.sh cpu)}"
export LIBTORCH
"$bin" modules dependencies --package trainer --lib --acyclic --layout none --no-externs --no-sysroot
if grep -rn --include='*.rs' 'crate::cli\b' trainer/src | grep -v '^trainer/src/cli/'; then
  echo "error: crate::cli is used outside trainer/src/cli/ (only main.rs and cli/ may)" >&2
  exit 1
fi
echo "layout: no module cycle in trainer; cli used only by main.rs"
