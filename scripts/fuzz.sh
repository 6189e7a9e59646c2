#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang in a build directory of their own and
# runs each for SECONDS, starting from the seed corpora committed under tests/fuzz/corpus/ (and
# the dictionary tests/fuzz/TARGET.dict when there is one).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      default: 60 s each, all five targets
#   FUZZ_BUILD_DIR=DIR (default build-fuzz)    FUZZ_JOBS=N (default 2)
#
# New interesting inputs go to FUZZ_BUILD_DIR/corpus/TARGET (the committed seeds are never
# written to); a crash, leak or timeout stops that target, leaves its input in
# FUZZ_BUILD_DIR/artifacts/ and makes the script exit 1 after the other targets ran.
# Reproduce one with: FUZZ_BUILD_DIR/bin/TARGET FUZZ_BUILD_DIR/artifacts/crash-...
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(safetensors tokenizer openai_request control_codec grammar)
build="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
jobs="${FUZZ_JOBS:-2}"

for tool in clang clang++ cmake ninja; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool is not installed (scripts/setup.sh installs it)" >&2; exit 2; }
done
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DPDSERVE_FUZZ=ON -DPDSERVE_WERROR=OFF -DCMAKE_BUILD_TYPE=Fuzz \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" >/dev/null
fi
names=()
for t in "${targets[@]}"; do names+=("fuzz_$t"); done
cmake --build "$build" -j "$jobs" --target "${names[@]}" >"$build/build.log" 2>&1 || {
  tail -n 40 "$build/build.log" >&2
  echo "fuzz.sh: the fuzz build failed (log: $build/build.log)" >&2
  exit 2
}

mkdir -p "$build/artifacts"
failed=()
for t in "${targets[@]}"; do
  seeds="$root/tests/fuzz/corpus/$t"
  work="$build/corpus/$t"
  mkdir -p "$work"
  log="$build/fuzz_$t.log"
  echo "fuzz.sh: fuzz_$t for ${seconds}s (log $log)"
  dict=()
  [[ -f "$root/tests/fuzz/$t.dict" ]] && dict=(-dict="$root/tests/fuzz/$t.dict")
  if ! "$build/bin/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      "${dict[@]}" -artifact_prefix="$build/artifacts/${t}-" "$work" "$seeds" >"$log" 2>&1; then
    failed+=("$t")
    grep -E "ERROR|SUMMARY|Test unit written" "$log" | head -n 20 >&2 || true
  fi
  grep -E "^stat::number_of_executed_units|^Done" "$log" | sed "s/^/  /" || true
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz.sh: FAILED: ${failed[*]} (inputs under $build/artifacts/)" >&2
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} fuzzers ran ${seconds}s each without a finding"
