#!/usr/bin/env bash
# GPU issue items (e) and 7 on the GPU machine, after the two staging calls (see gpu_stage.sh):
#   STAGE=/tmp/stage bash benchmarks/online_gpu.sh
set -euo pipefail
source "$(dirname "$0")/gpu_stage.sh"
python3 benchmarks/gpu_correctness.py --gguf "$GGUF" --out "$OUT"/gpu_correctness.json 2>&1 | grep -v "safetensors\|Warn\|transformers\]"
python3 benchmarks/online_llama8b.py --out "$OUT"/online_llama8b.json 2>&1 | grep -v "Warn\|transformers\]"
