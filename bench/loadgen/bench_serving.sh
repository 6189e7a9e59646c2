#!/usr/bin/env bash
# Serving benchmarks with pdserve-loadgen against clusters started by pdserve-launch
# (docs/benchmarks.md). Run from the repository root:
#
#   bench/loadgen/bench_serving.sh [build-dir] [compare|soak|all]
#
# compare: router + 1 prefill + 1 decode vs router + 2 colocated workers (the same two compute
#   threads; bench/loadgen/topologies/) under the mixed workload (long prompts arriving while
#   short requests decode), a request-rate sweep; writes bench/results/serving_{disaggregated,
#   colocated}.{json,md}, serving_compare.md and PNG plots (python3-matplotlib).
# soak: SOAK_STREAMS (1000) concurrent streams for SOAK_SECONDS (300) through the
#   SOAK_TOPOLOGY (disaggregated; soak-relaxed: the same with a 10 s heartbeat timeout), sampling
#   every process's RSS; writes bench/results/serving_soak_<topology>.* and exits 1 unless
#   every stream completed and memory stayed flat.
#
# Knobs (environment): RATES (request rates, default "1,2,3,4"), NUM_REQUESTS (120),
# INPUT_LEN / OUTPUT_LEN (64 / 128, +-50%), LONG_LEN (1024), LONG_FRACTION (0.2),
# SLO_TTFT_MS (2000), SLO_TPOT_MS (10).
set -uo pipefail
build_dir=${1:-build}
what=${2:-compare}
bin=$build_dir/bin
topo=bench/loadgen/topologies
results=bench/results
mkdir -p "$results"
run_dir=$(mktemp -d /tmp/pdserve-bench-serving.XXXXXX)
launch_pid=""

for b in pdserve-launch pdserve-loadgen pdserve-router pdserve-prefill pdserve-decode pdserve-colocated pdserve; do
  [ -x "$bin/$b" ] || { echo "bench_serving: $bin/$b is missing (build it first)"; exit 2; }
done

stop_cluster() {
  if [ -n "$launch_pid" ]; then
    kill -TERM "$launch_pid" 2>/dev/null
    wait "$launch_pid" 2>/dev/null
    launch_pid=""
  fi
}
trap stop_cluster EXIT

# start_cluster NAME: starts pdserve-launch on $topo/NAME.yaml and waits for its ready file.
start_cluster() {
  local ready=$run_dir/$1.ready
  rm -f "$ready"
  "$bin/pdserve-launch" "$topo/$1.yaml" --ready-file "$ready" >"$run_dir/$1.log" 2>&1 &
  launch_pid=$!
  for _ in $(seq 1 360); do
    [ -s "$ready" ] && return 0
    kill -0 "$launch_pid" 2>/dev/null || break
    sleep 0.5
  done
  echo "bench_serving: cluster $1 did not become ready (log $run_dir/$1.log):"
  tail -20 "$run_dir/$1.log"
  return 1
}

loadgen_common=(--model pdserve-bench --token-lo 100 --token-hi 1000)
status=0

if [ "$what" = compare ] || [ "$what" = all ]; then
  for t in disaggregated colocated; do
    echo "== serving: $t"
    start_cluster "$t" || { status=1; continue; }
    "$bin/pdserve-loadgen" --ready-file "$run_dir/$t.ready" "${loadgen_common[@]}" --dataset mixed \
      --num-requests "${NUM_REQUESTS:-120}" --input-len "${INPUT_LEN:-64}" --output-len "${OUTPUT_LEN:-128}" \
      --long-input-len "${LONG_LEN:-1024}" --long-output-len 8 --long-fraction "${LONG_FRACTION:-0.2}" \
      --request-rates "${RATES:-1,2,3,4}" --slo-ttft-ms "${SLO_TTFT_MS:-2000}" --slo-tpot-ms "${SLO_TPOT_MS:-10}" \
      --warmup 4 --seed 1 --label "$t" --name "serving_$t" >"$run_dir/loadgen-$t.log" 2>&1 || status=1
    tail -n +1 "$results/serving_$t.md" 2>/dev/null | grep '^|' || tail -5 "$run_dir/loadgen-$t.log"
    stop_cluster
  done
  if [ -x /usr/bin/python3 ]; then
    /usr/bin/python3 bench/loadgen/plot_serving.py "$results/serving_disaggregated.json" \
      "$results/serving_colocated.json" "$results" || status=1
  fi
fi

if [ "$what" = soak ] || [ "$what" = all ]; then
  echo "== serving soak: ${SOAK_STREAMS:-1000} streams for ${SOAK_SECONDS:-300} s"
  soak_topology=${SOAK_TOPOLOGY:-disaggregated}
  if start_cluster "$soak_topology"; then
    "$bin/pdserve-loadgen" --ready-file "$run_dir/$soak_topology.ready" "${loadgen_common[@]}" --mode soak \
      --streams "${SOAK_STREAMS:-1000}" --seconds "${SOAK_SECONDS:-300}" --dataset random --num-requests 4096 \
      --input-len 32 --output-len 32 --timeout-s 600 --rss-growth-limit-mib "${SOAK_RSS_LIMIT_MIB:-64}" \
      --name "serving_soak_$soak_topology" --label "$soak_topology, ${SOAK_STREAMS:-1000} streams" >"$run_dir/soak.log" 2>&1 || status=1
    grep -E '^\||PASS|FAIL|Soak' "$results/serving_soak_$soak_topology.md" 2>/dev/null || tail -5 "$run_dir/soak.log"
    stop_cluster
  else
    status=1
  fi
fi
echo "bench_serving: logs in $run_dir"
exit $status
