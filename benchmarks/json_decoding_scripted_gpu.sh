#!/usr/bin/env bash
# The JSON-decoding workload with an 8B model's passes and SmolLM2's outputs (GPU machine; gpu_stage.sh staged the
# wheels and SmolLM2's GGUF in $STAGE). SmolLM2's greedy outputs are recorded first (off, bf16); then a model with
# Llama-3.1-8B's shapes, dummy weights and SmolLM2's tokenizer runs the same prompts, its logits replaced by the
# recorded tokens (json_decoding.py --script-ids): off and exact produce SmolLM2's outputs, and pay 8B passes (fast is
# left out: its canonical tokens leave the recording, so a replay of it measures nothing).
#   STAGE=/tmp/stage bash benchmarks/json_decoding_scripted_gpu.sh record            (both constraints)
#   STAGE=/tmp/stage bash benchmarks/json_decoding_scripted_gpu.sh json_schema|regex  (replay one)
set -euo pipefail
source "$(dirname "$0")/gpu_stage.sh"
COMMON="--device cuda --dtype bfloat16 --num-prompts 512 --max-running 32 --max-total-tokens 131072 --repeat 1"
quiet() { grep -v "safetensors\|Warn\|dequantiz\|clean_up\|^{\|^ \"\|^}" || true; }
MODE=${1:?usage: json_decoding_scripted_gpu.sh record|json_schema|regex}
if [ "$MODE" = record ]; then
  for c in json_schema regex; do
    python3 benchmarks/json_decoding.py --model "$GGUF" $COMMON --constraint $c --modes off \
      --save-ids /tmp/smol_ids_$c.json --out /tmp/smol_record_$c.json 2>&1 | quiet
  done
  python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import llama8b; llama8b.shaped_like_8b('$GGUF', '/tmp/smol8b')"
  exit 0
fi
python3 benchmarks/json_decoding.py --model /tmp/smol8b --load-format dummy $COMMON --constraint $MODE \
  --modes off,exact --script-ids /tmp/smol_ids_$MODE.json --out "$OUT"/json_decoding_gpu_scripted8b_$MODE.json 2>&1 | quiet
