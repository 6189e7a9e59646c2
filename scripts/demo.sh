#!/usr/bin/env bash
# The main job for now: make a small random DeepSeek-V3.2-architecture checkpoint (once) and run
# a greedy generation on it with the single-process engine.
set -euo pipefail
build_dir=${1:-build}
model_dir=${PDSERVE_DEMO_MODEL:-models/demo-tiny}
if [ ! -f "$model_dir/config.json" ]; then
  "$build_dir/bin/pdserve" make-model --preset tiny --out "$model_dir" --seed 1
fi
prompt_ids="0,1013,47,512,9,301,77,802,14,600,21,33,256,100,7,999"
echo "pdserve generate --model $model_dir --prompt-ids $prompt_ids --max-new-tokens 24"
"$build_dir/bin/pdserve" generate --model "$model_dir" --prompt-ids "$prompt_ids" --max-new-tokens 24 --timing
