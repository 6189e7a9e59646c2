#!/usr/bin/env bash
# expect_every_rank_fails.sh NP MESSAGE COMMAND...
# Runs COMMAND (an mpirun line bounded by `timeout`) and passes only if it failed (not timed
# out) and every rank 0..NP-1 printed a line "rank r/NP: ..." containing MESSAGE.
set -uo pipefail
np=$1
message=$2
shift 2
output=$("$@" 2>&1)
rc=$?
echo "$output"
if [ "$rc" -eq 0 ]; then
  echo "FAIL: the command succeeded; expected every rank to reject the plan"
  exit 1
fi
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "FAIL: the command timed out (exit $rc): a rank hung instead of failing"
  exit 1
fi
status=0
for ((r = 0; r < np; r++)); do
  if ! grep -F "rank $r/$np:" <<<"$output" | grep -qF -- "$message"; then
    echo "FAIL: rank $r did not report: $message"
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "PASS: every rank failed at start with: $message (exit $rc)"
exit $status
