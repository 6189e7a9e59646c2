#!/usr/bin/env bash
# Runs every benchmark driver (build/bin/bench_*); each writes bench/results/<name>.{json,md}.
set -uo pipefail
build_dir=${1:-build}
status=0
for b in "$build_dir"/bin/bench_*; do
  [ -x "$b" ] || continue
  echo "== $(basename "$b")"
  "$b" || { echo "$(basename "$b") failed"; status=1; }
done
exit $status
