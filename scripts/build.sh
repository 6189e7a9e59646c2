#!/usr/bin/env bash
# Builds quietly: shows only compiler diagnostics, fails loudly.
set -euo pipefail
build_dir=${1:-build}
jobs=${2:-2}
log="$build_dir.build.log"
if ! cmake --build "$build_dir" -j "$jobs" >"$log" 2>&1; then
  grep -vE '^\[[0-9]+/[0-9]+\] ' "$log" | tail -80
  echo "build failed (full log: $log)"
  exit 1
fi
