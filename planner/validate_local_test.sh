#!/usr/bin/env bash
# planner_validate_local: `pdserve plan` with this machine's profile (planner/profiles/local.yaml)
# against pdserve-loadgen runs on a real local cluster of the `small` preset (docs/planner.md
# "Validation"): router + 1 prefill + 1 decode worker, and router + 2 colocated workers, every
# worker on one compute thread. For each topology and request rate the predicted TTFT and TPOT
# p50 must be within TOLERANCE (25%) of the measured ones. The profile's figures come from the
# kernel / comm / transfer benchmarks, never from these runs.
#
# This VM's speed drifts by +-25% within a minute, so each cluster is probed with no load in it
# (one request per worker at a time) right before each rate's load and after the last, and the
# profile's compute rates and memory bandwidth are scaled by the two probes around each rate
# against the built-in profile's prediction of the same probe (printed). The loaded runs, which
# the predictions are compared with, never feed the model; the predictions replay their arrival
# schedule (`pdserve plan --seed`, drawn as pdserve-loadgen draws it). docs/planner.md
# "Validation against the local cluster".
#
# Usage: validate_local_test.sh BIN_DIR MODEL_DIR [RESULTS_MD]
#   MODEL_DIR: the `small` preset, made there (pdserve make-model) when absent and kept (CTest
#   passes <build>/test-models/small-v128815-s1, the cache of services/testing
#   CachedTestModel). The router refuses models with a vocabulary smaller than its tokenizer
#   and stops streams at ids past it, so the preset gets exactly the tokenizer's 128815 ids.
# Knobs (environment): RATES_PD ("1.25 2.5"), RATES_COLOCATED ("1.25 2.5"), NUM_REQUESTS (12),
#   PROBE_REQUESTS (6),
#   INPUT_LEN (32), OUTPUT_LEN (8), TOLERANCE (0.25), ATTEMPTS (5), KEEP_WORK (unset: the work
#   directory is removed).
#
# A noisy moment can push one point past the tolerance: the whole measurement is repeated (up to
# ATTEMPTS times) and the test passes when one attempt has every point within it. Every
# attempt's table is printed; a model error fails them all.
set -uo pipefail
bin=$(cd "$1" && pwd)
src_dir=$(cd "$(dirname "$0")" && pwd)
model=$2
results_md=${3:-}
rates_pd=${RATES_PD:-"1.25 2.5"}
rates_col=${RATES_COLOCATED:-"1.25 2.5"}
num=${NUM_REQUESTS:-12}
probe_num=${PROBE_REQUESTS:-6}
in_len=${INPUT_LEN:-32}
out_len=${OUTPUT_LEN:-8}
tol=${TOLERANCE:-0.25}
py=/usr/bin/python3  # Debian's, with python3-yaml (scripts/setup.sh)
[ -x "$py" ] || py=python3
attempts=${ATTEMPTS:-5}
base=$(mktemp -d "${TMPDIR:-/tmp}/pdserve-plan-validate.XXXXXX")
work=$base
launch_pid=""

cleanup() {
  if [ -n "$launch_pid" ] && kill -0 "$launch_pid" 2>/dev/null; then
    kill -TERM "$launch_pid" 2>/dev/null
    wait "$launch_pid" 2>/dev/null
  fi
  # also after a failure: fail() printed the logs first; KEEP_WORK=1 keeps them for a look
  if [ -n "${KEEP_WORK:-}" ]; then echo "planner_validate_local: kept $base" >&2; else rm -rf "$base"; fi
}
trap cleanup EXIT
fail() {
  echo "planner_validate_local: $*" >&2
  for f in "$work"/*.log; do [ -f "$f" ] && { echo "== $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}

if [ ! -f "$model/config.json" ]; then
  mkdir -p "$(dirname "$model")"
  tmp_model="$model.tmp.$$"
  "$bin/pdserve" make-model --preset small --vocab 128815 --seed 1 --out "$tmp_model" >"$work/make-model.log" 2>&1 ||
    fail "make-model failed"
  mv "$tmp_model" "$model" 2>/dev/null || rm -rf "$tmp_model"  # a concurrent run may have won
fi
model=$(cd "$model" && pwd)

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# write_config NAME WORKERS_YAML
write_config() {
  cat >"$base/$1.yaml" <<EOF
cluster:
  name: planner-validate-$1
  bin_dir: $bin
  model_dir: $model
  generate_model: {enabled: false}
  stop_grace_ms: 5000
  ready_timeout_ms: 60000
router:
  host: 127.0.0.1
  port: 0
  control_endpoint: tcp://127.0.0.1:$(free_port)
  model_name: pdserve
workers:
$2
EOF
}
worker_env='env: {UCX_TLS: tcp, UCX_NET_DEVICES: lo, PDSERVE_NUM_THREADS: "1"}'
worker_args='args: ["--threads", "1", "--kv-gib", "0.5"]'
write_config pd "  - {name: prefill, role: prefill, type: engine, $worker_args, $worker_env}
  - {name: decode, role: decode, type: engine, $worker_args, $worker_env}"
write_config colocated "  - {name: colocated, role: colocated, type: engine, count: 2, $worker_args, $worker_env}"

# loadgen NAME READY ARGS...: one pdserve-loadgen run against the cluster -> results/NAME.json.
loadgen() {
  local name=$1 ready=$2
  shift 2
  (cd "$work" && "$bin/pdserve-loadgen" --ready-file "$ready" --out-dir "$work/results" --model pdserve --dataset random \
    --input-len "$in_len" --output-len "$out_len" --range-ratio 0 --slo-ttft-ms 60000 --slo-tpot-ms 60000 \
    --name "$name" --label "$name" "$@" >"$work/loadgen-$name.log" 2>&1) || fail "pdserve-loadgen failed ($name)"
}

# measure NAME RATES PROBE_CONCURRENCY: starts the cluster; then the speed probe (one request per
# worker at a time: no queueing, no batching) before each rate's load and after the last, so
# every rate is bracketed by two probes seconds away from it; stops the cluster.
measure() {
  local name=$1 rates=$2 probe_conc=$3
  local ready="$work/$name.ready"
  "$bin/pdserve-launch" "$base/$name.yaml" --ready-file "$ready" >"$work/launch-$name.log" 2>&1 &
  launch_pid=$!
  for _ in $(seq 1 240); do
    [ -s "$ready" ] && break
    kill -0 "$launch_pid" 2>/dev/null || fail "the $name cluster exited before it was ready"
    sleep 0.25
  done
  [ -s "$ready" ] || fail "the $name cluster was not ready within 60 s"
  local i=0 warm=4
  for r in $rates; do
    loadgen "probe-$name-$i" "$ready" --num-requests "$probe_num" --request-rates inf --concurrency "$probe_conc" \
      --warmup "$warm" --seed $((100 + i))
    loadgen "measured-$name-$r" "$ready" --num-requests "$num" --request-rates "$r" --warmup 0 --seed 1
    i=$((i + 1))
    warm=0
  done
  loadgen "probe-$name-$i" "$ready" --num-requests "$probe_num" --request-rates inf --concurrency "$probe_conc" \
    --warmup 0 --seed $((100 + i))
  kill -TERM "$launch_pid" 2>/dev/null
  wait "$launch_pid" 2>/dev/null
  launch_pid=""
}

# plan OUT HARDWARE RATE ARGS...: the planner's JSON for one point.
plan() {
  local out=$1 hw=$2 rate=$3
  shift 3
  "$bin/pdserve" plan --model "$model" --hardware "$hw" --input-len "$in_len" --output-len "$out_len" \
    --range-ratio 0 --rate "$rate" --no-search --json "$@" >"$work/$out.json" 2>"$work/plan-$out.log" ||
    fail "pdserve plan failed ($out)"
}
pd_args=(--prefill-plan cp=1 --decode-plan dp=1 --prefill-instances 1 --decode-instances 1)
col_args=(--mode colocated --colocated-plan dp=1 --colocated-instances 2)

# scale TAG I OUT: OUT.yaml, the built-in profile scaled by this cluster's speed factors around
# its I-th rate: the p50s of the probes right before and after it (geometric mean) against the
# built-in profile's
# prediction of the same probe (one request alone on the same topology), the fixed costs
# (router, control messages, transfer) taken out of TTFT so that only the steps scale.
scale() {
  "$py" - "$work" "$src_dir/profiles/local.yaml" "$1" "$2" "$3" <<'EOF2' || fail "cannot scale the local profile"
import json, math, os, sys, yaml
work, profile, tag, i, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
probes = [json.load(open(os.path.join(work, "results", "probe-%s-%d.json" % (tag, j))))["runs"][0]["all"]
          for j in (i, i + 1)]
for p in probes:
    if p["failed"] or p["completed"] == 0:
        sys.exit("the %s speed probe had failed requests" % tag)
ttft = math.sqrt(probes[0]["ttft"]["p50_ms"] * probes[1]["ttft"]["p50_ms"]) / 1e3
tpot = math.sqrt(probes[0]["tpot"]["p50_ms"] * probes[1]["tpot"]["p50_ms"]) / 1e3
alone = json.load(open(os.path.join(work, "alone-%s.json" % tag)))
steps = json.load(open(os.path.join(work, "alone-pd.json")))["pools"]
prefill_s, decode_s = steps["prefill"]["step"]["total_s"], steps["decode"]["step"]["total_s"]
fixed_s = alone["ttft_p50_s"] - prefill_s
f_c, f_m = (ttft - fixed_s) / prefill_s, tpot / decode_s
p = yaml.safe_load(open(profile))
d = p["device"]
for k in ("matmul_tflops", "gemv_tflops"):
    d[k] = {t: v / f_c for t, v in d[k].items()}
d["matmul_tflops_by_rows"] = {t: {m: v / f_c for m, v in pts.items()} for t, pts in d["matmul_tflops_by_rows"].items()}
for k in ("attention_tflops", "expanded_attention_tflops", "indexer_tflops"):
    d[k] /= f_c
p["runtime"]["row_layer_overhead_us"] *= f_c
d["memory_bandwidth_gbs"] /= f_m
p["name"] = "local-now"
yaml.safe_dump(p, open(os.path.join(work, out + ".yaml"), "w"))
json.dump({"compute": f_c, "memory": f_m, "ttft_ms": [x["ttft"]["p50_ms"] for x in probes],
           "tpot_ms": [x["tpot"]["p50_ms"] for x in probes], "pred_ttft_ms": alone["ttft_p50_s"] * 1e3,
           "pred_tpot_ms": alone["tpot_p50_s"] * 1e3},
          open(os.path.join(work, "speed-" + out + ".json"), "w"))
print("%s: one request at a time before / after: TTFT %.1f / %.1f ms (built-in profile: %.1f), TPOT %.2f / %.2f ms "
      "(%.2f): speed factors compute %.2f, memory %.2f" % (out, probes[0]["ttft"]["p50_ms"], probes[1]["ttft"]["p50_ms"],
      alone["ttft_p50_s"] * 1e3, probes[0]["tpot"]["p50_ms"], probes[1]["tpot"]["p50_ms"], alone["tpot_p50_s"] * 1e3, f_c, f_m))
EOF2
}

attempt() {
work=$base/attempt-$1
mkdir -p "$work"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
plan "alone-pd" local 0.01 --num-requests 10 "${pd_args[@]}"
plan "alone-colocated" local 0.01 --num-requests 10 "${col_args[@]}"
measure pd "$rates_pd" 1        # one prefill worker
measure colocated "$rates_col" 2  # one request per colocated worker
i=0; for r in $rates_pd; do scale pd $i "local-now-pd-$r"; i=$((i + 1)); done
i=0; for r in $rates_col; do scale colocated $i "local-now-colocated-$r"; i=$((i + 1)); done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# "now": the measured run's own schedule (the loadgen's requests and seed, replayed); "steady": the
# same rate over 2000 requests, what the planner predicts for the rate in general.
replay=(--num-requests "$num" --warmup 0 --seed 1)
steady=(--num-requests 2000 --warmup 20)
for r in $rates_pd; do
  plan "now-pd-$r" "$work/local-now-pd-$r.yaml" "$r" "${replay[@]}" "${pd_args[@]}"
  plan "steady-pd-$r" "$work/local-now-pd-$r.yaml" "$r" "${steady[@]}" "${pd_args[@]}"
  plan "static-pd-$r" local "$r" "${replay[@]}" "${pd_args[@]}"
done
for r in $rates_col; do
  plan "now-colocated-$r" "$work/local-now-colocated-$r.yaml" "$r" "${replay[@]}" "${col_args[@]}"
  plan "steady-colocated-$r" "$work/local-now-colocated-$r.yaml" "$r" "${steady[@]}" "${col_args[@]}"
  plan "static-colocated-$r" local "$r" "${replay[@]}" "${col_args[@]}"
done

"$py" - "$work" "$tol" "$load_before" "$load_after" "$results_md" "$rates_pd" "$rates_col" "$num" <<'EOF'
import json, os, sys
work, tol, load_before, load_after, results_md = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
rates_pd, rates_col, num = sys.argv[6], sys.argv[7], sys.argv[8]
rows, ok, notes = [], True, []
for name, rates in (("pd", rates_pd), ("colocated", rates_col)):
    for rate in rates.split():
        speed = json.load(open(os.path.join(work, "speed-local-now-%s-%s.json" % (name, rate))))
        notes.append("%s at %s req/s: compute %.2f (TTFT %.0f / %.0f ms before / after vs %.1f), memory %.2f (TPOT "
                     "%.1f / %.1f ms vs %.2f)" % ("P/D" if name == "pd" else "colocated", rate, speed["compute"],
                     speed["ttft_ms"][0], speed["ttft_ms"][1], speed["pred_ttft_ms"], speed["memory"],
                     speed["tpot_ms"][0], speed["tpot_ms"][1], speed["pred_tpot_ms"]))
        run = json.load(open(os.path.join(work, "results", "measured-%s-%s.json" % (name, rate))))["runs"][0]
        m = run["all"]
        now = json.load(open(os.path.join(work, "now-%s-%s.json" % (name, rate))))
        static = json.load(open(os.path.join(work, "static-%s-%s.json" % (name, rate))))
        steady = json.load(open(os.path.join(work, "steady-%s-%s.json" % (name, rate))))
        for metric, key in (("TTFT", "ttft"), ("TPOT", "tpot")):
            mv = m[key]["p50_ms"] / 1e3
            pv, sv, tv = now[key + "_p50_s"], static[key + "_p50_s"], steady[key + "_p50_s"]
            err, serr, terr = (pv - mv) / mv, (sv - mv) / mv, (tv - mv) / mv
            good = abs(err) <= tol and m["failed"] == 0 and m["completed"] == int(num)
            ok = ok and good
            rows.append("| %s | %s | %s | %.1f | %.1f | %+.0f%% | %.1f (%+.0f%%) | %.1f (%+.0f%%) | %s |" % (
                "P/D 1+1" if name == "pd" else "colocated x2", rate, metric, pv * 1e3, mv * 1e3, err * 100,
                tv * 1e3, terr * 100, sv * 1e3, serr * 100, "ok" if good else "**off**"))
table = ("| topology | req/s | metric | predicted p50 ms | measured p50 ms | error | steady state ms (error) | "
         "built-in profile ms (error) | within %.0f%% |\n|---|---|---|---|---|---|---|---|---|\n" % (tol * 100)) + "\n".join(rows)
text = ("%s\n\nSpeed factors of each cluster around each rate (one request per worker at a time right before and after "
        "the rate's load, measured / predicted with the built-in profile): %s. Load average %s before the runs, %s after.\n" % (
            table, "; ".join(notes), load_before, load_after))
print(text)
if results_md:
    with open(results_md, "w") as f:
        f.write(text)
sys.exit(0 if ok else 1)
EOF
}

for n in $(seq 1 "$attempts"); do
  echo "== attempt $n"
  if attempt "$n"; then exit 0; fi
done
echo "planner_validate_local: no attempt had every point within the tolerance" >&2
exit 1
