#!/usr/bin/env bash
# The JSON-decoding benchmark on the GPU machine (see gpu_stage.sh for what an earlier call staged).
#   STAGE=/tmp/stage bash benchmarks/json_decoding_gpu.sh [regex] [json_schema] [float32]   (default: all three)
# Modes: jump-forward off / fast / exact with grammar masks on demand (the default); five rounds each for regex and
# json_schema (a fresh engine per mode and round, modes alternating; each mode's fastest round is reported, and the
# ratio of medians). `always`: every mask filled (no on demand).
set -euo pipefail
source "$(dirname "$0")/gpu_stage.sh"
declare -A RUNS=(
  [regex]="bfloat16 regex off,fast,exact 5 json_decoding_gpu_regex_bfloat16"
  [json_schema]="bfloat16 json_schema off,fast,exact 5 json_decoding_gpu_json_schema_bfloat16"
  [float32]="float32 json_schema off,exact 2 json_decoding_gpu_json_schema_float32"
  [always]="bfloat16 regex off:always,exact:always 1 json_decoding_gpu_regex_bfloat16_always"
)
for name in "${@:-regex json_schema float32}"; do
  for n in $name; do
    set -- ${RUNS[$n]}
    python3 benchmarks/json_decoding.py --model "$GGUF" --device cuda --dtype $1 \
      --num-prompts 512 --max-running 32 --max-total-tokens 131072 --constraint $2 --modes $3 --repeat $4 \
      --out "$OUT"/$5.json 2>&1 | grep -v "safetensors\|Warn\|dequantiz\|clean_up"
  done
done
