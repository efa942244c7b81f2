#!/usr/bin/env bash
# Installs s3s-fs, the S3-compatible server the S3 tests start on 127.0.0.1 (one per
# test, with a fresh directory). Idempotent: skipped when the pinned version is there.
#
# Why s3s-fs and not Garage: both are real S3 servers (SigV4 auth, ranged GETs,
# multipart uploads, ListObjectsV2 paging) and both passed the client's checks here;
# s3s-fs installs in ~1.5 min on 2 cores against ~14 min for Garage, starts in
# milliseconds with no cluster layout to configure, and keeps CI on a fresh machine short.
set -euo pipefail
version=0.14.1
if command -v s3s-fs > /dev/null && s3s-fs --version 2>/dev/null | grep -q "$version"; then
  exit 0
fi
if [ -x "$HOME/.cargo/bin/s3s-fs" ] && "$HOME/.cargo/bin/s3s-fs" --version 2>/dev/null | grep -q "$version"; then
  exit 0
fi
echo "installing s3s-fs $version (the S3 server of the tests)" >&2
cargo install --quiet "s3s-fs@$version" --locked --features binary >&2
