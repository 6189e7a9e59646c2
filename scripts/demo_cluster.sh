#!/usr/bin/env bash
# The disaggregated cluster demo: pdserve-launch deploy/local/cluster.yaml (router + prefill +
# decode workers on this machine; the launcher makes the model on first use), one streamed chat
# request printed as it streams, the same over the ZeroMQ request API, where the metrics are,
# then a clean stop. With PDSERVE_DEMO_KEEP=1 (make demo KEEP=1) the cluster stays up until
# Ctrl-C. Exits 1, with the reason, when the cluster does not come up or a request fails.
# Usage: scripts/demo_cluster.sh [BUILD_DIR] (default: build).
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
[[ -f "$MODEL/config.json" ]] || echo "== no model in $MODEL yet: the launcher makes it first (tiny preset, DeepSeek vocabulary)"

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
REPLY_FILE=$(mktemp -t pdserve-demo-reply.XXXXXX)
trap 'stop; rm -f "$REPLY_FILE"' EXIT
curl -sN "$API/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"pdserve-demo-tiny","messages":[{"role":"user","content":"Tell me about disaggregated serving."}],"max_tokens":32,"temperature":0,"stream":true}' |
  python3 -u -c '
import json, sys
text, finish, errors = "", None, []
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("data:") or line == "data: [DONE]":
        if line.startswith("{"):  # a non-streamed error body
            errors.append(line)
        continue
    j = json.loads(line[5:])
    if "error" in j:
        errors.append(json.dumps(j["error"])); continue
    for c in j.get("choices", []):
        piece = c.get("delta", {}).get("content", "") or ""
        text += piece
        sys.stdout.write(piece); sys.stdout.flush()
        finish = c.get("finish_reason") or finish
print()
ok = not errors and finish is not None and text != ""
print(json.dumps({"ok": ok, "finish": finish, "chars": len(text), "errors": errors}), file=open(sys.argv[1], "w"))
' "$REPLY_FILE"
if ! python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] else 1)' "$REPLY_FILE"; then
  echo "demo_cluster: the chat request failed: $(cat "$REPLY_FILE")" >&2
  echo "demo_cluster: last lines of the cluster log ($LOG):" >&2
  tail -20 "$LOG" >&2
  exit 1
fi
echo "== the same over the ZeroMQ request API (build/bin/pdserve client, docs/request-api.md)"
if ! "$BIN/pdserve" client --endpoint tcp://127.0.0.1:8001 \
  --chat "Tell me about disaggregated serving." --max-tokens 16 --temperature 0 | sed 's/^/   /'; then
  echo "demo_cluster: the request API call failed" >&2
  exit 1
fi
echo "== metrics: router $API/metrics, prefill http://127.0.0.1:9101/metrics, decode http://127.0.0.1:9201/metrics"
if [[ "${PDSERVE_DEMO_KEEP:-0}" == 1 ]]; then
  echo "== the cluster stays up (PDSERVE_DEMO_KEEP=1): try the API and the metrics above; Ctrl-C stops it"
  wait "$LAUNCH" || true
else
  echo "== done; the demo stops the cluster now (make demo KEEP=1 keeps it up until Ctrl-C)"
fi
