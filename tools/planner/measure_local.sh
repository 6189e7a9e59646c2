#!/usr/bin/env bash
# The figures of planner/profiles/local.yaml, re-measured on this machine with pdserve's own
# drivers (docs/planner.md "The local profile"). Prints each run's relevant lines; copy the new
# figures into the profile (or a copy of it, for `pdserve plan --hardware FILE`). Run it on a
# quiet machine (it is a benchmark: nothing else CPU-heavy at the same time).
#
# Usage: tools/planner/measure_local.sh [BUILD_DIR]   (from the repository root)
set -uo pipefail
build=${1:-build}
bin=$build/bin
out=$(mktemp -d "${TMPDIR:-/tmp}/pdserve-measure-local.XXXXXX")
trap 'rm -rf "$out"' EXIT
model=$build/test-models/small-v129280-s1
[ -f "$model/config.json" ] || "$bin/pdserve" make-model --preset small --vocab 129280 --seed 1 --out "$model" >/dev/null
export PDSERVE_RESULTS_DIR=$out
say() { echo; echo "== $* (load average $(cut -d' ' -f1-3 /proc/loadavg))"; }

say "GEMM, 1 thread: matmul_tflops (m = 512 / 2048), matmul_tflops_by_rows (crossover, 2048 x 1024), gemv_tflops (m = 4..8), memory_bandwidth_gbs (read bw)"
"$bin/bench_gemm" --threads 1 --out "$out" >/dev/null 2>&1
grep -E "FMA peak|read bandwidth|^\| (F32|BF16) \| (512|2048|1|4|8|12|16|24|32|48|64|96|128) \|" "$out/gemm.md"
say "sparse attention + indexer, small shapes, 1 thread: attention_tflops, indexer_tflops"
"$bin/bench_sparse_attention" --threads 1 | grep -E "^\| [0-9]"
say "EP exchange, 2 ranks: node.intra"
"$bin/bench_comm" --out "$out" --ranks 2 --tokens 1,1024 2>&1 | grep -E "^\| 2 \| BF16"
say "KV transfer, UCX tcp: kv_transfer"
"$bin/bench_kvtransfer" --quick --configs tcp --out "$out" 2>&1 | grep -E "^\| (tcp|1 MB|16 MB)"
say "router: runtime.request_overhead_ms, token_delivery_us"
"$bin/bench_router" --reps 200 2>&1 | grep -E "overhead|direct: control"
say "engine decode: runtime.step_overhead_us, row_overhead_us (sched+sample share)"
"$bin/bench_engine" --model "$model" --threads 1 --batches 1,16 --contexts 256 --steps 8 --warmup 2 --out "$out" 2>&1 |
  grep -E "^\| 256"
if command -v perf >/dev/null; then
  say "prefill by kernel (perf): expanded_attention_tflops, row_layer_overhead_us"
  ids=$(seq -s, 100 7 1885)  # 256 token ids
  perf record -F 4000 -o "$out/perf.data" -- "$bin/pdserve" generate --model "$model" --prompt-ids "$ids" \
    --max-new-tokens 1 --threads 1 >/dev/null 2>&1
  /usr/bin/python3 "$(dirname "$0")/perf_categories.py" "$out/perf.data" 4000
fi
