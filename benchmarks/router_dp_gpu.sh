#!/usr/bin/env bash
# The router benchmark on the GPU machine: two Llama-3.1-8B workers (bf16, dummy weights) share one GPU, each with a
# 70,000-token KV pool: the 32 groups' 4096-token prefixes fit in the two pools together but not in one.
# cache_aware vs round_robin, with the prompts arriving in rounds (every group one prompt per round: interleaved
# sessions) and shuffled. After the staging calls (see gpu_stage.sh):
#   STAGE=/tmp/stage bash benchmarks/router_dp_gpu.sh [rounds|shuffled ...]
set -euo pipefail
source "$(dirname "$0")/gpu_stage.sh"
for order in "${@:-rounds}"; do
  python3 benchmarks/router_dp.py --model llama-3.1-8b --load-format dummy --device cuda --dtype bfloat16 \
    --max-total-tokens 70000 --num-groups 32 --prompts-per-group 8 --system-prompt-len 4096 --question-len 64 \
    --output-len 16 --max-concurrency 16 --order "$order" --out "$OUT"/router_dp_gpu_llama8b_$order.json 2>&1 \
    | grep -v "safetensors\|Warn\|transformers\]"
done
