#!/usr/bin/env bash
# The router benchmark on the GPU machine: two workers share one GPU (a KV pool each), cache_aware vs round_robin.
#   STAGE=/tmp/stage bash benchmarks/router_dp_gpu.sh
set -euo pipefail
source "$(dirname "$0")/gpu_stage.sh"
python3 benchmarks/router_dp.py --model "$GGUF" --device cuda --dtype bfloat16 --max-total-tokens 20000 \
  --num-groups 32 --prompts-per-group 8 --system-prompt-len 1024 --question-len 64 --output-len 32 \
  --max-concurrency 64 --out "$OUT"/router_dp_gpu.json 2>&1 | grep -v "safetensors\|Warn"
