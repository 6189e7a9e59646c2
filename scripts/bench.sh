#!/usr/bin/env bash
# Runs every benchmark driver (build/bin/bench_*); each writes bench/results/<name>.{json,md}.
# Then the serving benchmarks (bench/loadgen/bench_serving.sh: disaggregated vs colocated under
# a mixed workload with pdserve-loadgen, plots). PDSERVE_BENCH_SERVING=compare|soak|all|none
# (default compare; soak = 1000 streams for 5 minutes, see docs/benchmarks.md).
set -uo pipefail
build_dir=${1:-build}
status=0
for b in "$build_dir"/bin/bench_*; do
  [ -x "$b" ] || continue
  echo "== $(basename "$b")"
  "$b" || { echo "$(basename "$b") failed"; status=1; }
done
serving=${PDSERVE_BENCH_SERVING:-compare}
if [ "$serving" != none ]; then
  bench/loadgen/bench_serving.sh "$build_dir" "$serving" || { echo "bench_serving failed"; status=1; }
fi
exit $status
