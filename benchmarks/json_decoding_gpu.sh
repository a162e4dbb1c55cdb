#!/usr/bin/env bash
# The JSON-decoding benchmark on the GPU machine (see gpu_stage.sh for what an earlier call staged).
#   STAGE=/tmp/stage bash benchmarks/json_decoding_gpu.sh
set -euo pipefail
source "$(dirname "$0")/gpu_stage.sh"
for run in "bfloat16 json_schema" "bfloat16 regex" "float32 json_schema"; do
  set -- $run
  python3 benchmarks/json_decoding.py --model "$GGUF" --device cuda --dtype $1 \
    --num-prompts 128 --max-running 32 --max-total-tokens 131072 --constraint $2 --repeat 2 \
    --out "$OUT"/json_decoding_gpu_$2_$1.json 2>&1 | grep -v "safetensors\|Warn"
done
