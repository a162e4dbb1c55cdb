#!/usr/bin/env bash
# The JSON-decoding benchmark on the GPU machine, SmolLM2-135M-Instruct (its GGUF travels in two parts, staged in
# $1 by an earlier call: wheels/ for what the machine lacks, smol.gguf.part00/01, smol.sha256).
#   bash benchmarks/json_decoding_gpu.sh /tmp/stage
set -euo pipefail
STAGE=${1:-/tmp/stage}
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$STAGE"/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
cat "$STAGE"/smol.gguf.part00 "$STAGE"/smol.gguf.part01 > "$STAGE"/SmolLM2-135M-Instruct.Q4_1.gguf
echo "$(cat "$STAGE"/smol.sha256)  $STAGE/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c -
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for run in "bfloat16 json_schema" "bfloat16 regex" "float32 json_schema"; do
  set -- $run
  python3 benchmarks/json_decoding.py --model "$STAGE"/SmolLM2-135M-Instruct.Q4_1.gguf --device cuda --dtype $1 \
    --num-prompts 128 --max-running 32 --max-total-tokens 131072 --constraint $2 \
    --out "$OUT"/json_decoding_gpu_$2_$1.json 2>&1 | grep -v "safetensors\|Warn"
done
