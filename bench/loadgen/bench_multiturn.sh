#!/usr/bin/env bash
# Multi-turn chat serving with and without the prefix cache (docs/prefix-cache.md "Benchmark"),
# in one run, on the P/D topology: router + 1 prefill + 1 decode engine worker, one compute
# thread each. pdserve-loadgen's multiturn dataset: CONVERSATIONS conversations x TURNS turns, a
# shared system prompt of SYSTEM_LEN tokens, user messages of USER_LEN tokens, replies of
# REPLY_LEN tokens; each turn is sent when the conversation's previous one ended and continues
# it by the token ids the router returned. Reports TTFT per turn, the cached / reusable prompt
# tokens and goodput, cache on vs off, and the TTFT ratio per turn.
#
#   bench/loadgen/bench_multiturn.sh [build-dir] [cache|routing|decode-local|pulls|all]
#
# cache (default): writes bench/results/multiturn_{cache_on,cache_off}.{json,md} and
#   multiturn.md.
# routing: two prefill workers + one decode worker, the cache on, decode-side hits off, the
#   router's prefill policy kv_aware (the default) vs least_outstanding_tokens and round_robin:
#   multiturn_routing_<policy>.{json,md}, multiturn_routing.md (vs least_outstanding_tokens) and
#   multiturn_routing_rr.md (vs round_robin): TTFT p50 / p99 per turn, cached / reusable.
# decode-local: P/D 1+1, the cache on, decode-side hits (routing.decode_local_prefill_tokens
#   256, the default) vs off (0): multiturn_decode_local_{on,off}.{json,md} and
#   multiturn_decode_local.md.
# pulls: two prefill workers + one decode worker, the cache on, decode-side hits off, prefill
#   policy round_robin (so a turn often lands on the prefill worker without its conversation),
#   pulls between workers on (routing.pull_min_tokens 128, the default) vs off (0):
#   multiturn_pulls_{on,off}.{json,md} and multiturn_pulls.md.
# Knobs
# (environment): MODEL_PRESET (small), CONVERSATIONS (4), TURNS (4), SYSTEM_LEN (2048),
# USER_LEN (64), REPLY_LEN (32), RATE (conversations/s, 0.2), CONCURRENCY (conversations in
# flight, 2), SLO_TTFT_MS (2000), SLO_TPOT_MS (200), DECODE_LOCAL (the cache runs' bound, 256).
# A benchmark: run it on a quiet machine.
set -uo pipefail
build_dir=${1:-build}
what=${2:-cache}
bin=$build_dir/bin
results=${PDSERVE_RESULTS_DIR:-bench/results}
mkdir -p "$results"
run_dir=$(mktemp -d /tmp/pdserve-bench-multiturn.XXXXXX)
launch_pid=""
preset=${MODEL_PRESET:-small}
model=models/bench-$preset-v128815

for b in pdserve-launch pdserve-loadgen pdserve-router pdserve-prefill pdserve-decode pdserve; do
  [ -x "$bin/$b" ] || { echo "bench_multiturn: $bin/$b is missing (build it first)"; exit 2; }
done

stop_cluster() {
  if [ -n "$launch_pid" ]; then
    kill -TERM "$launch_pid" 2>/dev/null
    wait "$launch_pid" 2>/dev/null
    launch_pid=""
  fi
}
trap 'stop_cluster; rm -rf "$run_dir"' EXIT

if [ ! -f "$model/config.json" ]; then
  echo "== making the $preset model (vocabulary 128815) in $model"
  "$bin/pdserve" make-model --preset "$preset" --vocab 128815 --seed 1 --out "$model" >"$run_dir/make-model.log" 2>&1 ||
    { tail -5 "$run_dir/make-model.log"; exit 1; }
fi

# start_cluster NAME PREFIX_CACHE [PREFILL_WORKERS PREFILL_POLICY DECODE_LOCAL PULL_MIN]: writes
# the topology and waits for pdserve-launch's ready file.
start_cluster() {
  local name=$1 cache=$2 prefills=${3:-1} policy=${4:-kv_aware} local_tokens=${5:-${DECODE_LOCAL:-256}}
  local pull_min=${6:-128}
  local ready=$run_dir/$1.ready
  local args="[\"--threads\", \"1\", \"--kv-gib\", \"2\", \"--prefix-cache\", \"$cache\"]"
  local env='{UCX_TLS: tcp, UCX_NET_DEVICES: lo, PDSERVE_NUM_THREADS: "1"}'
  cat >"$run_dir/$name.yaml" <<YAML
cluster:
  name: bench-multiturn-$name
  bin_dir: $(cd "$bin" && pwd)
  model_dir: $(cd "$model" && pwd)
  generate_model: {enabled: false}
  stop_grace_ms: 5000
  ready_timeout_ms: 180000
router:
  host: 127.0.0.1
  port: 8320
  control_endpoint: tcp://127.0.0.1:7320
  model_name: pdserve-bench
  request_timeout_ms: 1800000
  first_token_timeout_ms: 1800000
  routing: {mode: disaggregated, prefill_policy: $policy, decode_local_prefill_tokens: $local_tokens,
            pull_min_tokens: $pull_min}
workers:
  - {name: prefill, role: prefill, type: engine, count: $prefills, args: $args, env: $env}
  - {name: decode, role: decode, type: engine, args: $args, env: $env}
YAML
  rm -f "$ready"
  "$bin/pdserve-launch" "$run_dir/$name.yaml" --ready-file "$ready" >"$run_dir/$name.log" 2>&1 &
  launch_pid=$!
  for _ in $(seq 1 720); do
    [ -s "$ready" ] && return 0
    kill -0 "$launch_pid" 2>/dev/null || break
    sleep 0.25
  done
  echo "bench_multiturn: cluster $name did not become ready:"
  tail -20 "$run_dir/$name.log"
  return 1
}

status=0
# run_loadgen CLUSTER NAME LABEL: the multiturn dataset against a started cluster.
run_loadgen() {
  "$bin/pdserve-loadgen" --ready-file "$run_dir/$1.ready" --model pdserve-bench --dataset multiturn \
    --conversations "${CONVERSATIONS:-4}" --turns "${TURNS:-4}" --system-len "${SYSTEM_LEN:-2048}" \
    --user-len "${USER_LEN:-64}" --output-len "${REPLY_LEN:-32}" --request-rates "${RATE:-0.2}" \
    --concurrency "${CONCURRENCY:-2}" --slo-ttft-ms "${SLO_TTFT_MS:-2000}" --slo-tpot-ms "${SLO_TPOT_MS:-200}" \
    --warmup 2 --seed 1 --label "$3, load average before $(cut -d' ' -f1-3 /proc/loadavg)" \
    --out-dir "$results" --name "$2" >"$run_dir/loadgen-$2.log" 2>&1 || status=1
  grep '^|' "$results/$2.md" 2>/dev/null || tail -5 "$run_dir/loadgen-$2.log"
}

# compare OUT TITLE NAME_A LABEL_A NAME_B LABEL_B: per-turn TTFT p50 / p99 and cached / reusable
# of two runs (A the baseline, B the feature), written to $results/OUT.md.
compare() {
  /usr/bin/python3 - "$results" "$(cut -d' ' -f1-3 /proc/loadavg)" "$@" <<'PY' || status=1
import json, os, sys
results, load, out, title, name_a, label_a, name_b, label_b = sys.argv[1:9]
ra, rb = (json.load(open(os.path.join(results, n + ".json"))) for n in (name_a, name_b))
a_run, b_run = ra["runs"][0], rb["runs"][0]
turns = sorted(b_run["by_kind"], key=lambda k: int(k.split("-")[1]))
ds = rb["dataset"]
lines = ["# " + title, "",
         "%d conversations x %d turns, system prompt %d tokens, user messages %d, replies %d; commit %s; %s." % (
             ds["conversations"], ds["turns"], ds["system_len"], ds["user_len"], ds["output_len"], rb["commit"],
             rb["label"]), "",
         "| turn | TTFT p50 %s / %s ms | ratio | TTFT p99 %s / %s ms | cached / reusable %s / %s |" % (
             label_a, label_b, label_a, label_b, label_a, label_b),
         "|---|---|---|---|---|"]
def hit(s):
    h = s["prefix_cache"]["hit_rate_of_ideal"]
    return "%.0f%%" % (100 * h) if h >= 0 else "-"
for t in turns + ["all"]:
    a = a_run["by_kind"][t] if t != "all" else a_run["all"]
    b = b_run["by_kind"][t] if t != "all" else b_run["all"]
    lines.append("| %s | %.0f / %.0f | %.1fx | %.0f / %.0f | %s / %s |" % (
        t, a["ttft"]["p50_ms"], b["ttft"]["p50_ms"], a["ttft"]["p50_ms"] / max(b["ttft"]["p50_ms"], 1e-9),
        a["ttft"]["p99_ms"], b["ttft"]["p99_ms"], hit(a), hit(b)))
pa, pb = a_run["all"]["ttft"]["p99_ms"], b_run["all"]["ttft"]["p99_ms"]
lines += ["", "TTFT p99 over all requests: %s %.0f ms, %s %.0f ms (%.2fx). Goodput (req/s within the SLO): "
          "%s %.3f, %s %.3f. Load average after the runs: %s." % (
              label_a, pa, label_b, pb, pa / max(pb, 1e-9), label_a, a_run["all"]["goodput_rps"], label_b,
              b_run["all"]["goodput_rps"], load)]
open(os.path.join(results, out + ".md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
}

if [ "$what" = routing ] || [ "$what" = all ]; then
  for policy in kv_aware least_outstanding_tokens round_robin; do
    echo "== multiturn, 2 prefill workers, prefill policy $policy (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    start_cluster "routing_$policy" true 2 "$policy" 0 || { status=1; continue; }
    run_loadgen "routing_$policy" "multiturn_routing_$policy" "P/D 2+1, prefix cache on, prefill policy $policy"
    stop_cluster
  done
  compare multiturn_routing "Multi-turn chat, two prefill workers: least_outstanding_tokens (LOT) vs kv_aware routing" \
    multiturn_routing_least_outstanding_tokens LOT multiturn_routing_kv_aware kv_aware
  compare multiturn_routing_rr "Multi-turn chat, two prefill workers: round_robin (RR) vs kv_aware routing" \
    multiturn_routing_round_robin RR multiturn_routing_kv_aware kv_aware
fi
[ "$what" = routing ] && exit $status

if [ "$what" = decode-local ] || [ "$what" = all ]; then
  for mode in on off; do
    echo "== multiturn, P/D 1+1, cache on, decode-side hits $mode (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    start_cluster "decode_local_$mode" true 1 kv_aware "$([ $mode = on ] && echo 256 || echo 0)" || { status=1; continue; }
    run_loadgen "decode_local_$mode" "multiturn_decode_local_$mode" "P/D 1+1, prefix cache on, decode-side hits $mode"
    stop_cluster
  done
  compare multiturn_decode_local "Multi-turn chat, P/D 1+1, prefix cache on: decode-side hits off vs on" \
    multiturn_decode_local_off off multiturn_decode_local_on on
fi
[ "$what" = decode-local ] && exit $status

if [ "$what" = pulls ] || [ "$what" = all ]; then
  for mode in on off; do
    echo "== multiturn, 2 prefill workers, round robin, pulls $mode (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    start_cluster "pulls_$mode" true 2 round_robin 0 "$([ $mode = on ] && echo 128 || echo 0)" || { status=1; continue; }
    run_loadgen "pulls_$mode" "multiturn_pulls_$mode" "P/D 2+1, prefix cache on, prefill policy round_robin, pulls $mode"
    stop_cluster
  done
  compare multiturn_pulls "Multi-turn chat, two prefill workers (round robin): pulls between workers off vs on" \
    multiturn_pulls_off off multiturn_pulls_on on
fi
[ "$what" = pulls ] && exit $status

for cache in on off; do
  name=cache_$cache
  echo "== multiturn, prefix cache $cache (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  start_cluster "$name" "$([ $cache = on ] && echo true || echo false)" || { status=1; continue; }
  run_loadgen "$name" "multiturn_$name" "P/D 1+1, prefix cache $cache"
  stop_cluster
done

/usr/bin/python3 - "$results" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY' || status=1
import json, os, sys
results, load = sys.argv[1], sys.argv[2]
runs = {c: json.load(open(os.path.join(results, "multiturn_cache_%s.json" % c))) for c in ("on", "off")}
on, off = runs["on"]["runs"][0], runs["off"]["runs"][0]
turns = sorted(on["by_kind"], key=lambda k: int(k.split("-")[1]))
ds = runs["on"]["dataset"]
lines = ["# Multi-turn chat, prefix cache on vs off (P/D 1+1)", "",
         "%d conversations x %d turns, system prompt %d tokens, user messages %d, replies %d; commit %s; %s." % (
             ds["conversations"], ds["turns"], ds["system_len"], ds["user_len"], ds["output_len"],
             runs["on"]["commit"], runs["on"]["label"]), "",
         "| turn | TTFT p50 off ms | TTFT p50 on ms | off / on | TTFT p99 off / on ms | cached / reusable (on) | cached share of prompt (on) |",
         "|---|---|---|---|---|---|---|"]
for t in turns + ["all"]:
    a = on["by_kind"][t] if t != "all" else on["all"]
    b = off["by_kind"][t] if t != "all" else off["all"]
    pc = a["prefix_cache"]
    ratio = b["ttft"]["p50_ms"] / a["ttft"]["p50_ms"] if a["ttft"]["p50_ms"] > 0 else float("nan")
    hit = "%.0f%%" % (100 * pc["hit_rate_of_ideal"]) if pc["hit_rate_of_ideal"] >= 0 else "-"
    share = 100.0 * pc["cached_tokens"] / pc["prompt_tokens"] if pc["prompt_tokens"] else 0
    lines.append("| %s | %.0f | %.0f | %.1fx | %.0f / %.0f | %s | %.0f%% |" % (
        t, b["ttft"]["p50_ms"], a["ttft"]["p50_ms"], ratio, b["ttft"]["p99_ms"], a["ttft"]["p99_ms"], hit, share))
later = [t for t in turns if int(t.split("-")[1]) >= 3]
if later:
    import statistics
    r = statistics.median(off["by_kind"][t]["ttft"]["p50_ms"] / on["by_kind"][t]["ttft"]["p50_ms"] for t in later)
    lines += ["", "TTFT p50 at turns >= 3: %.1fx lower with the cache (median over those turns; goal >= 5x)." % r]
lines += ["", "Goodput (req/s within the SLO): off %.3f, on %.3f. Load average after the runs: %s." % (
    off["all"]["goodput_rps"], on["all"]["goodput_rps"], load)]
open(os.path.join(results, "multiturn.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
exit $status
