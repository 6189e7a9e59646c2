#!/usr/bin/env bash
# parallel_cli_test.sh PDSERVE EXPECT_EVERY_RANK_FAILS TIMEOUT MPIRUN
# `pdserve generate --plan` under mpirun on a fresh tiny model: the CP prefill plan (2 ranks) and
# the decode plan (4 ranks, two prompts on two DP units) print the same tokens as the
# single-process command, and a plan that does not fit the world fails on every rank.
set -euo pipefail
pdserve=$1 expect_fail=$2 timeout_exe=$3 mpirun=$4
dir=$(mktemp -d /tmp/pdserve_cli_par.XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$pdserve" make-model --preset tiny --seed 4 --out "$dir/m" 2>/dev/null
p1=$(seq 0 82 | awk '{printf "%s%d", (NR>1?",":""), ($1*37+11)%1024}')
p2=5,9,700,3,12,44,1000,8,1,77,300
single1=$("$pdserve" generate --model "$dir/m" --prompt-ids "$p1" --max-new-tokens 20)
single2=$("$pdserve" generate --model "$dir/m" --prompt-ids "$p2" --max-new-tokens 20)
cp2=$("$timeout_exe" 120 "$mpirun" -n 2 "$pdserve" generate --model "$dir/m" --prompt-ids "$p1" \
      --max-new-tokens 20 --plan cp=2,ep=2 2>/dev/null)
[ "$cp2" == "$single1" ] || { echo "FAIL: cp=2,ep=2 printed $cp2, single process $single1"; exit 1; }
dec=$("$timeout_exe" 120 "$mpirun" -n 4 "$pdserve" generate --model "$dir/m" --prompt-ids "$p1;$p2" \
      --max-new-tokens 20 --plan dp=2,tp=2,ep=4 2>/dev/null)
[ "$dec" == "$single1"$'\n'"$single2" ] || { echo "FAIL: dp=2,tp=2,ep=4 printed $dec"; exit 1; }
echo "PASS: cp=2,ep=2 and dp=2,tp=2,ep=4 print the single-process tokens"
"$expect_fail" 4 "ep=3 does not divide the world size 4" "$timeout_exe" --kill-after=10 60 \
  "$mpirun" -n 4 "$pdserve" generate --model "$dir/m" --prompt-ids 1,2,3 --plan dp=4,ep=3
