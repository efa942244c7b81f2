#!/usr/bin/env bash
# Builds the operator as one statically linked executable (glibc's static libc with
# crt-static; rustls with ring, no OpenSSL), the binary of operator/Dockerfile, and
# checks that it is static and runs. Prints its path.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
target="$(rustc -vV | sed -n 's/^host: //p')"
# An explicit --target keeps build scripts and proc-macros dynamic; only the binary is static.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR%/}-static"
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked -p operator --target "$target" >&2
bin="$CARGO_TARGET_DIR/$target/release/operator"
if readelf -d "$bin" 2>/dev/null | grep -q NEEDED; then
  echo "error: $bin is dynamically linked:" >&2
  readelf -d "$bin" | grep NEEDED >&2
  exit 1
fi
"$bin" --help > /dev/null
echo "$bin"
