#!/usr/bin/env bash
# The JSON-decoding benchmark on the GPU machine (see gpu_stage.sh for what an earlier call staged).
#   STAGE=/tmp/stage bash benchmarks/json_decoding_gpu.sh
# Modes: jump-forward off / fast / exact with grammar masks on demand (the default), and ":always" (every mask
# filled, as before masks on demand) for the regex workload.
set -euo pipefail
source "$(dirname "$0")/gpu_stage.sh"
for run in "bfloat16 regex off,fast,exact,off:always,exact:always" "bfloat16 json_schema off,fast,exact" \
           "float32 json_schema off,exact"; do
  set -- $run
  python3 benchmarks/json_decoding.py --model "$GGUF" --device cuda --dtype $1 \
    --num-prompts 128 --max-running 32 --max-total-tokens 131072 --constraint $2 --modes $3 --repeat 2 \
    --out "$OUT"/json_decoding_gpu_$2_$1.json 2>&1 | grep -v "safetensors\|Warn"
done
