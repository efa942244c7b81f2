#!/usr/bin/env bash
# Sizes the house rules set: no source file over 700 lines, and in the training loop
# (trainer/src/train), the operator's decision (operator/src/decide) and its reconciles
# (operator/src/controller.rs, reconcile/, dataset/) no function over 80 lines, and in
# the decision none with more than 5 arguments (a context struct instead). tools/modcycles' `fnsize` measures a function from its signature to its
# closing brace; test modules and tests.rs files are not counted.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
tool_target="$PT_CACHE/target-tools"
(cd tools/modcycles && CARGO_TARGET_DIR="$tool_target" cargo build --locked -q --release)
fnsize="$tool_target/release/fnsize"
status=0
long_files="$(git ls-files '*.rs' ':!:tools/modcycles/fixtures' | xargs wc -l | awk '$2 != "total" && $1 > 700 {print "  " $2 " (" $1 " lines)"}')"
if [ -n "$long_files" ]; then
  echo "source files over 700 lines (split them by concern):" >&2
  echo "$long_files" >&2
  status=1
fi
"$fnsize" --max-lines 80 trainer/src/train || { echo "functions over 80 lines in trainer/src/train" >&2; status=1; }
"$fnsize" --max-lines 80 --max-args 5 operator/src/decide ||
  { echo "functions over 80 lines or 5 arguments in operator/src/decide" >&2; status=1; }
"$fnsize" --max-lines 80 operator/src/controller.rs operator/src/reconcile operator/src/dataset ||
  { echo "functions over 80 lines in the operator's reconciles" >&2; status=1; }
[ "$status" -eq 0 ] && echo "sizes: no file over 700 lines; train/, decide/ and the reconciles' functions within bounds"
exit $status
