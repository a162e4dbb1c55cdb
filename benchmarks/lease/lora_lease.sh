#!/usr/bin/env bash
# Issue 53 (multi-LoRA) on one GPU, in ONE call of under nine minutes. Carry [".whl"]. Each step has its own time limit
# and log (<step>.log, packed into $OUT/lora_lease.tar); the JSONs land in $OUT.
#   bash benchmarks/lease/lora_lease.sh
# 1. the LoRA CUDA tests: the segment and gather kernels against the torch path at Llama-3.1-8B's shapes (ranks 16 and
#    64, bf16, mixed slots with base rows), a captured graph of the gather kernels replayed with new mixes equal to
#    eager, and a tiny engine's graph decode with adapters equal to eager passes and the PEFT-merged models;
# 2. no Triton kernel built after start-up with adapters in use (compile_count_gpu.py --configs lora, a tiny model,
#    a cold Triton cache) -> $OUT/compile_count_lora.json;
# 3. benchmarks/serving/lora_llama8b.py: Llama-3.1-8B shapes (dummy bf16), ShareGPT-like requests, the base model
#    without LoRA, then 1, 8 and 32 distinct rank-16 adapters: throughput and decode step (ITL) vs the base
#    -> $OUT/lora_llama8b.json (issue 53's bar: 32 adapters >= 0.8x the base's throughput).
#   DRY=1 bash benchmarks/lease/lora_lease.sh   # here, on the CPU: the tests skip, the rest at tiny shapes
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DRY_OUT=/tmp/lora_lease_dry
. "$HERE/env.sh"
bash benchmarks/lease/tree_id.sh
FINAL_OUT=$OUT
OUT=/tmp/lora_lease_out
rm -rf "$OUT" && mkdir -p "$OUT"
deadline=$((SECONDS + ${BUDGET_S:-500}))  # no step past it (each step's limit is cut to it)
PACK=$FINAL_OUT/lora_lease.tar
step() { budget_step "$@"; }  # env.sh
TAIL=30 step lora_cuda_tests 150 $PY -m pytest -q -p no:cacheprovider -rs --durations=8 tests/runtime/kernels/lora \
  tests/runtime/lora/test_lora_cuda.py -k "not compile"
DEVICE=cuda DTYPE=bfloat16
[ "${DRY:-0}" = 1 ] && DEVICE=cpu DTYPE=float32  # the plumbing only: no Triton kernel runs on the CPU
TAIL=12 step compile_count_lora 110 $PY benchmarks/startup/compile_count_gpu.py --model tiny --scale tiny \
  --configs lora --device $DEVICE --dtype $DTYPE --engine-args '{"cuda_graph_max_bs": 64}' \
  --out "$FINAL_OUT/compile_count_lora.json"
if [ "${DRY:-0}" = 1 ]; then
  TAIL=60 step lora_llama8b 600 $PY benchmarks/serving/lora_llama8b.py $TINY --adapters 1 8 32 --num-prompts 16 \
    --out "$FINAL_OUT/lora_llama8b.json"
else
  # 32 adapters first: issue 53's bar, measured before the step's limit could cut the run short
  TAIL=60 step lora_llama8b 330 $PY benchmarks/serving/lora_llama8b.py --adapters 32 1 8 \
    --num-prompts "${NUM_PROMPTS:-400}" --out "$FINAL_OUT/lora_llama8b.json"
fi
ls -la "$FINAL_OUT"
