#!/usr/bin/env bash
# planner_cli: `pdserve plan` as users run it. Usage: plan_cli_test.sh PDSERVE TESTDATA_DIR
set -uo pipefail
pdserve=$1
data=$2
py=/usr/bin/python3
[ -x "$py" ] || py=python3
work=$(mktemp -d "${TMPDIR:-/tmp}/pdserve-plan-cli.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "planner_cli: $*" >&2; exit 1; }

# 1. Only --model: this machine's profile, one prefill + one decode node. The official 671B
#    config does not fit a 2-core VM: a clear error naming the memory, exit 1, no crash.
"$pdserve" plan --model "$data/deepseek-v3.2-exp" >"$work/out" 2>"$work/err"
[ $? -eq 1 ] || fail "the 671B config on this machine's profile should fail"
grep -q "ResourceExhausted" "$work/err" && grep -q "GiB" "$work/err" || fail "unclear error: $(cat "$work/err")"

# 2. The same config on the seeds' hardware (W8A8: 2-node prefill and decode instances): markdown,
#    then JSON with the documented fields.
seeds_plan="--prefill-plan cp=32,ep=32 --prefill-nodes 2 --decode-plan dp=32,ep=32 --decode-nodes 2"
"$pdserve" plan --model "$data/deepseek-v3.2-exp" --hardware ascend-a3 --weights w8a8 --kv-format int8 $seeds_plan \
  --input-len 8192 --output-len 256 --rate 2 --num-requests 100 --no-search >"$work/md" 2>"$work/err" ||
  fail "plan on ascend-a3 failed: $(cat "$work/err")"
grep -q "Predicted latency" "$work/md" || fail "no markdown report"
"$pdserve" plan --model "$data/deepseek-v3.2-exp" --hardware ascend-a3 --weights w8a8 --kv-format int8 $seeds_plan \
  --input-len 8192 --output-len 256 --rate 2 --num-requests 100 --search-instances 3 --json >"$work/json" 2>"$work/err" ||
  fail "plan --json failed: $(cat "$work/err")"
"$py" - "$work/json" <<'PY' || fail "JSON fields"
import json, sys
j = json.load(open(sys.argv[1]))
# C8 latent (512 + 4 + 128) + A8C8 indexer keys (128 + 4), 61 layers.
assert j["kv_bytes_per_token"] == (644 + 132) * 61, j["kv_bytes_per_token"]
for k in ("ttft_p50_s", "tpot_p50_s", "goodput_rps", "max_goodput_rps", "throughput_rps"):
    assert j[k] > 0, k
for role in ("prefill", "decode"):
    assert j["weight_bytes_per_rank"][role] > 1e9, role
    mem = j["pools"][role]["memory_per_rank"]
    for k in ("weights_bytes", "mla_cache_bytes", "indexer_cache_bytes", "activations_bytes", "headroom_bytes"):
        assert k in mem, k
assert j["pools"]["decode"]["max_decode_batch_per_rank"] > 0
step = j["pools"]["prefill"]["step"]
assert step["indexer_s"] > 0 and step["cp_comm_s"] > 0 and step["ep_comm_s"] > 0
assert len(j["ratio_sweep"]) == 2
PY

# 3. Bad inputs: a message naming the problem; exit 2 for what the command line parser refuses
#    (unknown options, missing values), 1 for everything else.
expect_error() {
  local want=$1 code=1
  shift
  if [ "$1" = "--exit" ]; then code=$2; shift 2; fi
  "$pdserve" plan "$@" >/dev/null 2>"$work/err"
  local rc=$?
  [ $rc -eq "$code" ] || fail "exit $rc for: $* (wanted $code)"
  grep -q "$want" "$work/err" || fail "no '$want' in: $(cat "$work/err")"
}
expect_error "missing --model" --hardware local
expect_error "no model config" --model /no/such/dir
expect_error "unknown KV latent format" --model "$data/deepseek-v3.2-exp" --kv-format fp4
expect_error "no hardware profile" --model "$data/deepseek-v3.2-exp" --hardware tpu9
expect_error "wants a number" --model "$data/deepseek-v3.2-exp" --rate fast
expect_error "colour" --exit 2 --model "$data/deepseek-v3.2-exp" --colour red
expect_error "ep=5" --model "$data/deepseek-v3.2-exp" --hardware h800 --prefill-plan cp=16,ep=16 --prefill-nodes 2 \
  --decode-plan dp=5,ep=5 --decode-instances 1
expect_error "no plan spec file" --spec "$work/absent.yaml"
printf 'model: x\nworkload: {rate: [1]}\n' >"$work/bad.yaml"
expect_error "workload.rate" --spec "$work/bad.yaml"

# 4. Built-in profiles are listed.
"$pdserve" plan --list-hardware | grep -q "^ascend-a3" || fail "--list-hardware"

# 5. The plot (when matplotlib is there): a PNG.
if "$py" -c "import matplotlib" 2>/dev/null; then
  # FP8 weights (~700 GB) need instances of 2 H800 nodes.
  "$pdserve" plan --model "$data/deepseek-v3.2-exp" --hardware h800 --prefill-plan cp=16,ep=16 --prefill-nodes 2 \
    --decode-plan dp=16,ep=16 --decode-nodes 2 --input-len 4096 --output-len 256 --rate 4 --num-requests 60 \
    --search-instances 4 --plot "$work/p.png" >/dev/null 2>"$work/err" || fail "--plot: $(cat "$work/err")"
  head -c 8 "$work/p.png" | od -An -c | grep -q "P   N   G" || fail "--plot wrote no PNG"
  expect_error "needs a disaggregated plan" --model "$data/deepseek-v3.2-exp" --hardware h800 --mode colocated \
    --colocated-plan dp=16,ep=16 --colocated-nodes 2 --num-requests 20 --plot "$work/q.png"
fi
echo "planner_cli: ok"
