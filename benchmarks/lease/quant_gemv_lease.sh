#!/usr/bin/env bash
# Tunes the quantized few-row GEMM kernels (kernels/quant/fp8_gemv.py, int4_skinny.py) on one GPU, in one device call
# (< 8 min): benchmarks/kernels/quant_gemv_sweep.py (--kind gemv). Carry [".whl"]. Writes under $OUT:
# quant_gemv_sweep.json (every candidate, the best per shape and row count beside the default path, bf16 and the
# bytes floor), quant_gemv_<GPU>.json (the committed tuned table with the swept entries replaced: commit it as
# radixlm/runtime/kernels/gemm/tuned/quant_gemv_<GPU>.json), and each step's log.
#   bash benchmarks/lease/quant_gemv_lease.sh            # the sweep (~5-7 min), then the kernels' CUDA tests (~1 min)
#   SWEEP_ARGS="--rows 1 2 --formats w4a16" bash benchmarks/lease/quant_gemv_lease.sh   # a narrower sweep
#   DRY=1 DRY_OUT=/tmp/qg bash benchmarks/lease/quant_gemv_lease.sh   # the script's logic on the CPU (interpreter)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/env.sh"
bash benchmarks/lease/tree_id.sh
deadline=$((SECONDS + ${BUDGET_S:-470}))
step() { budget_step "$@"; }  # env.sh
if [ "${DRY:-0}" = 1 ]; then
  export TRITON_INTERPRET=1
  TAIL=30 step quant_gemv_sweep 900 $PY benchmarks/kernels/quant_gemv_sweep.py --dry --rows 1 4 --shapes o_proj \
    --out "$OUT"
  exit 0
fi
# The sweep stops starting (format, shape) pairs at --budget-s; each pair takes ~20-40 s (builds, then timings).
TAIL=80 step quant_gemv_sweep 420 $PY benchmarks/kernels/quant_gemv_sweep.py --budget-s 330 ${SWEEP_ARGS:-} --out "$OUT"
TAIL=8 step quant_gemv_cuda_tests 60 $PY -m pytest -q -p no:cacheprovider tests/runtime/kernels/quant/test_quant_gemv.py
