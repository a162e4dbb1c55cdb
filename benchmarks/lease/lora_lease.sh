#!/usr/bin/env bash
# Issue 53 (multi-LoRA) on one GPU, in ONE call of under nine minutes. Carry [".whl"]. Each step has its own time limit
# and log (<step>.log, packed into $OUT/lora_lease.tar); the JSONs land in $OUT.
#   bash benchmarks/lease/lora_lease.sh
# 1. the LoRA CUDA tests: the kernels (graph form: blocks of 16 rows, K split; eager form: blocks of 64) against the
#    torch path at Llama-3.1-8B's shapes (ranks 16 and 64, bf16, mixed slots with base rows), a captured graph
#    replayed with new mixes equal to eager, and a tiny engine's graph decode with adapters equal to eager passes;
# 2. benchmarks/serving/lora_llama8b.py --mode offline profile: the Engine in-process, the same ShareGPT-like requests,
#    the base model (no LoRA) then LoRA on with 0, 1, 8 and 32 adapters -> $OUT/lora_offline.json; torch.profiler's
#    top 15 kernels of a decode step at batch 8, 64 and 256 and of one 8192-token prefill, base vs 32 adapters
#    -> $OUT/lora_profile.json;
# 3. the same through `radixlm serve` (32 adapters first: issue 53's bar, >= 0.8x the base's throughput)
#    -> $OUT/lora_llama8b.json;
# 4. with time left (COMPILE=1 forces it): no Triton kernel built after start-up with adapters in use
#    (compile_count_gpu.py --configs lora) -> $OUT/compile_count_lora.json.
#   DRY=1 bash benchmarks/lease/lora_lease.sh   # here, on the CPU: the tests skip, the rest at tiny shapes
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DRY_OUT=/tmp/lora_lease_dry
. "$HERE/../lib/env.sh"
bash benchmarks/lib/tree_id.sh
FINAL_OUT=$OUT
OUT=/tmp/lora_lease_out
rm -rf "$OUT" && mkdir -p "$OUT"
deadline=$((SECONDS + ${BUDGET_S:-510}))  # no step past it (each step's limit is cut to it)
PACK=$FINAL_OUT/lora_lease.tar
step() { budget_step "$@"; }  # env.sh
NUM_PROMPTS=${NUM_PROMPTS:-400}
[ "${DRY:-0}" = 1 ] && NUM_PROMPTS=8
TAIL=30 step lora_cuda_tests 75 $PY -m pytest -q -p no:cacheprovider -rs --durations=8 tests/runtime/kernels/lora \
  tests/runtime/lora/test_lora_cuda.py -k "not compile"
TAIL=40 step lora_offline 240 $PY benchmarks/serving/lora_llama8b.py $TINY --mode offline profile --adapters 1 8 32 \
  --num-prompts "$NUM_PROMPTS" --out "$FINAL_OUT/lora_offline.json" --profile-out "$FINAL_OUT/lora_profile.json"
TAIL=60 step lora_served 200 $PY benchmarks/serving/lora_llama8b.py $TINY --adapters 32 1 8 \
  --num-prompts "$NUM_PROMPTS" --out "$FINAL_OUT/lora_llama8b.json"
if [ "${COMPILE:-0}" = 1 ] || [ $((deadline - SECONDS)) -ge 100 ]; then
  DEVICE=cuda DTYPE=bfloat16
  [ "${DRY:-0}" = 1 ] && DEVICE=cpu DTYPE=float32  # the plumbing only: no Triton kernel runs on the CPU
  TAIL=12 step compile_count_lora 110 $PY benchmarks/startup/compile_count_gpu.py --model tiny --scale tiny \
    --configs lora --device $DEVICE --dtype $DTYPE --engine-args '{"cuda_graph_max_bs": 64}' \
    --out "$FINAL_OUT/compile_count_lora.json"
else
  echo "== compile_count_lora skipped (its result is committed: benchmarks/results/serving/)"
fi
ls -la "$FINAL_OUT"
