#!/usr/bin/env bash
# planner_validate_local: `pdserve plan` with this machine's profile (planner/profiles/local.yaml)
# against pdserve-loadgen runs on a real local cluster of the `small` preset (docs/planner.md
# "Validation"): router + 1 prefill + 1 decode worker, and router + 2 colocated workers, every
# worker on one compute thread. For each topology and request rate the predicted TTFT and TPOT
# p50 must be within TOLERANCE (25%) of the measured ones. The profile's figures come from the
# kernel / comm / transfer benchmarks, never from these runs.
#
# Usage: validate_local_test.sh BIN_DIR MODEL_DIR [RESULTS_MD]
#   MODEL_DIR: the `small` preset, made there (pdserve make-model) when absent and kept.
# Knobs (environment): RATES_PD ("2 4"), RATES_COLOCATED ("2 4"), NUM_REQUESTS (24),
#   INPUT_LEN (32), OUTPUT_LEN (8), TOLERANCE (0.25).
set -uo pipefail
bin=$(cd "$1" && pwd)
model=$2
results_md=${3:-}
rates_pd=${RATES_PD:-"2 4"}
rates_col=${RATES_COLOCATED:-"2 4"}
num=${NUM_REQUESTS:-24}
in_len=${INPUT_LEN:-32}
out_len=${OUTPUT_LEN:-8}
tol=${TOLERANCE:-0.25}
work=$(mktemp -d /tmp/pdserve-plan-validate.XXXXXX)
launch_pid=""

cleanup() {
  if [ -n "$launch_pid" ] && kill -0 "$launch_pid" 2>/dev/null; then
    kill -TERM "$launch_pid" 2>/dev/null
    wait "$launch_pid" 2>/dev/null
  fi
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
  "$bin/pdserve" make-model --preset small --seed 1 --out "$tmp_model" >"$work/make-model.log" 2>&1 ||
    fail "make-model failed"
  mv "$tmp_model" "$model" 2>/dev/null || rm -rf "$tmp_model"  # a concurrent run may have won
fi
model=$(cd "$model" && pwd)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# write_config NAME WORKERS_YAML
write_config() {
  cat >"$work/$1.yaml" <<EOF
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
routing:
workers:
$2
EOF
  sed -i '/^routing:$/d' "$work/$1.yaml"
}
worker_env='env: {UCX_TLS: tcp, UCX_NET_DEVICES: lo, PDSERVE_NUM_THREADS: "1"}'
worker_args='args: ["--threads", "1", "--kv-gib", "0.5"]'
write_config pd "  - {name: prefill, role: prefill, type: engine, $worker_args, $worker_env}
  - {name: decode, role: decode, type: engine, $worker_args, $worker_env}"
write_config colocated "  - {name: colocated, role: colocated, type: engine, count: 2, $worker_args, $worker_env}"

# measure NAME RATES: starts the cluster, runs the load generator, stops the cluster.
measure() {
  local name=$1 rates=$2
  local ready="$work/$name.ready"
  "$bin/pdserve-launch" "$work/$name.yaml" --ready-file "$ready" >"$work/launch-$name.log" 2>&1 &
  launch_pid=$!
  for _ in $(seq 1 240); do
    [ -s "$ready" ] && break
    kill -0 "$launch_pid" 2>/dev/null || fail "the $name cluster exited before it was ready"
    sleep 0.25
  done
  [ -s "$ready" ] || fail "the $name cluster was not ready within 60 s"
  (cd "$work" && "$bin/pdserve-loadgen" --ready-file "$ready" --model pdserve --dataset random \
    --input-len "$in_len" --output-len "$out_len" --range-ratio 0 --num-requests "$num" \
    --request-rates "${rates// /,}" --warmup 4 --seed 1 --slo-ttft-ms 60000 --slo-tpot-ms 60000 \
    --name "measured-$name" --label "$name" >"$work/loadgen-$name.log" 2>&1) || fail "pdserve-loadgen failed ($name)"
  kill -TERM "$launch_pid" 2>/dev/null
  wait "$launch_pid" 2>/dev/null
  launch_pid=""
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
measure pd "$rates_pd"
measure colocated "$rates_col"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# predict NAME RATE ARGS...: the planner's JSON for one point.
predict() {
  local name=$1 rate=$2
  shift 2
  "$bin/pdserve" plan --model "$model" --hardware local --input-len "$in_len" --output-len "$out_len" \
    --range-ratio 0 --rate "$rate" --num-requests 2000 --warmup 20 --no-search --json "$@" \
    >"$work/predicted-$name-$rate.json" 2>"$work/plan-$name-$rate.log" || fail "pdserve plan failed ($name, $rate)"
}
for r in $rates_pd; do
  predict pd "$r" --prefill-plan cp=1 --decode-plan dp=1 --prefill-instances 1 --decode-instances 1
done
for r in $rates_col; do
  predict colocated "$r" --mode colocated --colocated-plan dp=1 --colocated-instances 2
done

python3 - "$work" "$tol" "$load_before" "$load_after" "$results_md" <<'EOF'
import json, os, sys
work, tol, load_before, load_after, results_md = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
rows, ok = [], True
for name in ("pd", "colocated"):
    measured = json.load(open(os.path.join(work, "results", "measured-%s.json" % name)))
    for run in measured["runs"]:
        rate = run["request_rate"]
        m = run["all"] if "all" in run else run
        pred = json.load(open(os.path.join(work, "predicted-%s-%g.json" % (name, rate))))
        for metric, key in (("TTFT", "ttft"), ("TPOT", "tpot")):
            mv = m[key]["p50"] if isinstance(m[key], dict) else m[key + "_p50"]
            pv = pred[key + "_p50_s"]
            err = (pv - mv) / mv if mv > 0 else float("inf")
            good = abs(err) <= tol and m.get("failed", 0) == 0
            ok = ok and good
            rows.append("| %s | %g | %s | %.1f | %.1f | %+.0f%% | %s |" % (
                "P/D 1+1" if name == "pd" else "colocated x2", rate, metric, pv * 1e3, mv * 1e3, err * 100,
                "ok" if good else "**off**"))
table = ("| topology | req/s | metric | predicted p50 ms | measured p50 ms | error | within %.0f%% |\n"
         "|---|---|---|---|---|---|---|\n" % (tol * 100)) + "\n".join(rows)
text = "%s\n\nload average %s before the runs, %s after.\n" % (table, load_before, load_after)
print(text)
if results_md:
    with open(results_md, "w") as f:
        f.write(text)
sys.exit(0 if ok else 1)
EOF
