#!/usr/bin/env bash
# Configures the CMake build once; later runs are no-ops unless the cache is missing.
set -euo pipefail
build_dir=${1:-build}
build_type=${2:-Release}
if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" >"$build_dir.configure.log" 2>&1 \
    || { cat "$build_dir.configure.log"; exit 1; }
fi
