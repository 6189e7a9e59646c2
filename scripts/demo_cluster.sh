#!/usr/bin/env bash
# The disaggregated cluster demo: pdserve-launch deploy/local/cluster.yaml (router + prefill +
# decode workers on this machine), one streamed chat request printed as it streams, where the
# metrics are, then a clean stop. Usage: scripts/demo_cluster.sh [BUILD_DIR] (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
BIN="$BUILD/bin"
CONFIG=deploy/local/cluster.yaml
MODEL=models/demo-tiny-v128k
API=http://127.0.0.1:8000
for b in pdserve pdserve-launch pdserve-router pdserve-prefill pdserve-decode; do
  [[ -x "$BIN/$b" ]] || { echo "demo_cluster: $BIN/$b is missing (build it first)" >&2; exit 1; }
done
if [[ ! -f "$MODEL/config.json" ]]; then
  echo "== making a tiny model with the DeepSeek vocabulary in $MODEL"
  "$BIN/pdserve" make-model --preset tiny --vocab 128815 --seed 1 --out "$MODEL" >/dev/null
fi

LOG=$(mktemp -t pdserve-demo-cluster.XXXXXX.log)
echo "== starting the cluster ($CONFIG), log: $LOG"
"$BIN/pdserve-launch" "$CONFIG" >"$LOG" 2>&1 &
LAUNCH=$!
stop() {
  if kill -0 "$LAUNCH" 2>/dev/null; then
    echo; echo "== stopping the cluster"
    kill -INT "$LAUNCH" 2>/dev/null || true
    wait "$LAUNCH" 2>/dev/null || true
  fi
}
trap stop EXIT

for _ in $(seq 1 240); do
  if curl -sf "$API/health" >/dev/null 2>&1; then break; fi
  kill -0 "$LAUNCH" 2>/dev/null || { echo "demo_cluster: the launcher exited:"; tail -30 "$LOG"; exit 1; }
  sleep 0.5
done
curl -sf "$API/health" >/dev/null || { echo "demo_cluster: not ready in time:"; tail -30 "$LOG"; exit 1; }
echo "== ready; workers:"
curl -s "$API/admin/workers" | python3 -c 'import json,sys; [print("  ", w.get("id", w.get("worker_id")), w.get("role"), w.get("state")) for w in json.load(sys.stdin)["workers"]]' || true

echo "== streamed chat request (a tiny random model: the words are noise, the path is real)"
printf '   '
curl -sN "$API/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"pdserve-demo-tiny","messages":[{"role":"user","content":"Tell me about disaggregated serving."}],"max_tokens":32,"temperature":0,"stream":true}' |
  python3 -u -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("data:") or line == "data: [DONE]":
        continue
    j = json.loads(line[5:])
    if "error" in j:
        print("\n   error:", j["error"]); continue
    for c in j.get("choices", []):
        sys.stdout.write(c.get("delta", {}).get("content", "") or ""); sys.stdout.flush()
print()'
echo "== the same over the ZeroMQ request API (build/bin/pdserve client, docs/request-api.md)"
"$BIN/pdserve" client --endpoint tcp://127.0.0.1:8001 --model pdserve-demo-tiny \
  --chat "Tell me about disaggregated serving." --max-tokens 16 --temperature 0 | sed 's/^/   /' || echo "   (request API unavailable)"
echo "== metrics: router $API/metrics, prefill http://127.0.0.1:9101/metrics, decode http://127.0.0.1:9201/metrics"
