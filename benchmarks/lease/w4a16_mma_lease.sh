#!/usr/bin/env bash
# Tunes the W4A16 tensor-core kernel (kernels/quant/int4_mma.py) on one GPU, in one device call (< 6 min):
# benchmarks/kernels/quant_gemv_sweep.py --kind mma. Carry [".whl"]. Writes under $OUT: w4a16_mma_sweep.json (every
# candidate per shape and row count beside bf16, the default W4A16 path and the int4 bytes floor; the layer's sums),
# quant_gemv_<GPU>.json (the committed tuned table with the w4a16_mma entries replaced: commit it as
# radixlm/runtime/kernels/gemm/tuned/quant_gemv_<GPU>.json), each step's log.
#   bash benchmarks/lease/w4a16_mma_lease.sh                 # the sweep (~4-5 min), then the kernel's CUDA tests
#   SWEEP_ARGS="--rows 8 64 --shapes o_proj" bash benchmarks/lease/w4a16_mma_lease.sh   # a narrower sweep
#   DRY=1 DRY_OUT=/tmp/wm bash benchmarks/lease/w4a16_mma_lease.sh   # the script's logic on the CPU (interpreter)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/env.sh"
bash benchmarks/lease/tree_id.sh
deadline=$((SECONDS + ${BUDGET_S:-350}))
step() { budget_step "$@"; }  # env.sh
if [ "${DRY:-0}" = 1 ]; then
  export TRITON_INTERPRET=1
  TAIL=12 step w4a16_mma_sweep 300 $PY benchmarks/kernels/quant_gemv_sweep.py --kind mma --dry --rows 8 --shapes o_proj \
    --out "$OUT"
  exit 0
fi
# The sweep stops starting shapes at --budget-s; a shape takes ~40-70 s (builds, then timings).
TAIL=40 step w4a16_mma_sweep 320 $PY benchmarks/kernels/quant_gemv_sweep.py --kind mma --budget-s 230 ${SWEEP_ARGS:-} \
  --out "$OUT"
TAIL=8 step w4a16_mma_cuda_tests 60 $PY -m pytest -q -p no:cacheprovider tests/runtime/kernels/quant/test_int4_mma.py
