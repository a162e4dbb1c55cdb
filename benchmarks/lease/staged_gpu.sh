#!/usr/bin/env bash
# The first GPU runs (2026-11-22), from before the wheels travelled with each call (.whl and env.sh): an earlier call
# staged in $STAGE the wheels the machine lacks (wheels/) and SmolLM2-135M-Instruct's GGUF in two parts
# (smol.gguf.part00/01, smol.sha256), because one call carries at most 64 MiB. Results land in $OUT.
#   STAGE=/tmp/stage bash benchmarks/lease/staged_gpu.sh json [regex] [json_schema] [float32] [always]
#       The JSON-decoding benchmark (grammar/json_decoding.py; default: regex json_schema float32). Modes: jump-forward
#       off / fast / exact with grammar masks on demand (the default); five rounds each for regex and json_schema (a
#       fresh engine per mode and round, modes alternating; each mode's fastest round is reported, and the ratio of
#       medians). `always`: every mask filled (no on demand).
#   STAGE=/tmp/stage bash benchmarks/lease/staged_gpu.sh json_scripted record|json_schema|regex
#       The JSON-decoding workload with an 8B model's passes and SmolLM2's outputs. `record`: SmolLM2's greedy outputs
#       (off, bf16) for both constraints; then a model with Llama-3.1-8B's shapes, dummy weights and SmolLM2's
#       tokenizer runs the same prompts, its logits replaced by the recorded tokens (--script-ids): off and exact
#       produce SmolLM2's outputs, and pay 8B passes (fast is left out: its canonical tokens leave the recording, so a
#       replay of it measures nothing).
#   STAGE=/tmp/stage bash benchmarks/lease/staged_gpu.sh online
#       GPU issue items (e) and 7: offline/gpu_correctness.py (SmolLM2 against transformers) and
#       serving/online_llama8b.py.
#   STAGE=/tmp/stage bash benchmarks/lease/staged_gpu.sh router_dp [rounds|shuffled ...]
#       serving/router_dp.py: two Llama-3.1-8B workers (bf16, dummy weights) share one GPU, each with a 70,000-token
#       KV pool: the 32 groups' 4096-token prefixes fit in the two pools together but not in one. cache_aware vs
#       round_robin, with the prompts arriving in rounds (every group one prompt per round: interleaved sessions)
#       and shuffled.
set -euo pipefail
part=${1:?usage: staged_gpu.sh json|json_scripted|online|router_dp [ARGS...]}
shift
cd "$(dirname "$0")/../.."
STAGE=${STAGE:-/tmp/stage}
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$STAGE"/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
GGUF=$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf
cat "$STAGE"/smol.gguf.part00 "$STAGE"/smol.gguf.part01 > "$GGUF"
echo "$(cat "$STAGE"/smol.sha256)  $GGUF" | sha256sum -c -
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
quiet() { grep -v "safetensors\|Warn\|dequantiz\|clean_up\|transformers\]" || true; }
case $part in
json)
  declare -A RUNS=(
    [regex]="bfloat16 regex off,fast,exact 5 json_decoding_gpu_regex_bfloat16"
    [json_schema]="bfloat16 json_schema off,fast,exact 5 json_decoding_gpu_json_schema_bfloat16"
    [float32]="float32 json_schema off,exact 2 json_decoding_gpu_json_schema_float32"
    [always]="bfloat16 regex off:always,exact:always 1 json_decoding_gpu_regex_bfloat16_always"
  )
  for name in "${@:-regex json_schema float32}"; do
    for n in $name; do
      set -- ${RUNS[$n]}
      python3 benchmarks/grammar/json_decoding.py --model "$GGUF" --device cuda --dtype $1 \
        --num-prompts 512 --max-running 32 --max-total-tokens 131072 --constraint $2 --modes $3 --repeat $4 \
        --out "$OUT"/$5.json 2>&1 | quiet
    done
  done ;;
json_scripted)
  COMMON="--device cuda --dtype bfloat16 --num-prompts 512 --max-running 32 --max-total-tokens 131072 --repeat 1"
  MODE=${1:?usage: staged_gpu.sh json_scripted record|json_schema|regex}
  if [ "$MODE" = record ]; then
    for c in json_schema regex; do
      python3 benchmarks/grammar/json_decoding.py --model "$GGUF" $COMMON --constraint $c --modes off \
        --save-ids /tmp/smol_ids_$c.json --out /tmp/smol_record_$c.json 2>&1 | quiet | grep -v '^{\|^ "\|^}' || true
    done
    python3 -c "from benchmarks.lib.models import shaped_like_8b; shaped_like_8b('$GGUF', '/tmp/smol8b')"
    exit 0
  fi
  python3 benchmarks/grammar/json_decoding.py --model /tmp/smol8b --load-format dummy $COMMON --constraint $MODE \
    --modes off,exact --script-ids /tmp/smol_ids_$MODE.json --out "$OUT"/json_decoding_gpu_scripted8b_$MODE.json 2>&1 \
    | quiet | grep -v '^{\|^ "\|^}' || true ;;
online)
  python3 benchmarks/offline/gpu_correctness.py --gguf "$GGUF" --out "$OUT"/gpu_correctness.json 2>&1 | quiet
  python3 benchmarks/serving/online_llama8b.py --out "$OUT"/online_llama8b.json 2>&1 | quiet ;;
router_dp)
  for order in "${@:-rounds}"; do
    python3 benchmarks/serving/router_dp.py --model llama-3.1-8b --load-format dummy --device cuda --dtype bfloat16 \
      --max-total-tokens 70000 --num-groups 32 --prompts-per-group 8 --system-prompt-len 4096 --question-len 64 \
      --output-len 16 --max-concurrency 16 --order "$order" --out "$OUT"/router_dp_gpu_llama8b_$order.json 2>&1 | quiet
  done ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
