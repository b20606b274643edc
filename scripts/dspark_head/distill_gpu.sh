#!/usr/bin/env bash
# The GPU recipe of the default model's DSpark head in one command (docs/training.md, "On a
# GPU"): the target answers the prompt set, then a 1-layer and a 2-layer head train side by side
# on the same answers until MINUTES after the start. Extra arguments go to `distill.py generate`.
#
#   distill_gpu.sh MODEL_DIR PROMPTS.json RUN_DIR MINUTES [generate arguments...]
set -euo pipefail
model=$1 prompts=$2 run=$3 minutes=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
mkdir -p "$run"
python3 "$here/distill.py" --model "$model" generate "$prompts" "$run/generated.pt" \
  --batch 1024 "$@" 2>&1 | tee "$run/generate.log"
# What is left, less a minute for the last held-out evaluation and the export.
left=$(python3 -c "print(max(0.5, $minutes - ($(date +%s) - $start) / 60 - 1))")
echo "training for $left minutes"
# A run that overshoots its estimate is stopped a minute later: its last export stays.
hard=$(python3 -c "print(int($left * 60 + 60))")
for layers in 1 2; do
  timeout -k 10 "$hard" python3 "$here/distill.py" --model "$model" train "$run/generated.pt" \
    "$run/layers-$layers" --layers "$layers" --minutes "$left" >"$run/layers-$layers.log" 2>&1 &
done
wait
