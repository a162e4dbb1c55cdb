#!/usr/bin/env bash
# Issue 51's MLA kernels on one GPU, one device call (carry [".whl"]; at most 9.5 min): the kernels' CUDA tests against
# the torch reference (tests/runtime/kernels/attention/test_mla_attn.py, DeepSeek widths), then the decode benchmark
# with its launch-config sweep (benchmarks/kernels/mla_decode.py: DeepSeek-V2-Lite and V3 heads, batch 1/32/256,
# context 1k/4k, against the latent bytes floor), then the extend kernel's (the same script, --kind extend) while
# time is left. Logs and JSONs land in $OUT/mla_lease.tar, packed after each step.
#   bash benchmarks/lease/mla_lease.sh              # tests + decode sweep + extend
#   bash benchmarks/lease/mla_lease.sh bench        # the benchmarks alone (MLA_BUDGET_S: the decode cells' budget)
#   MLA_KV=fp8_e4m3 bash benchmarks/lease/mla_lease.sh bench   # the decode sweep over a float8 pool
#   DRY=1 DRY_OUT=/tmp/mla_dry PY=/work/main/.venv/bin/python bash benchmarks/lease/mla_lease.sh   # here, on the CPU:
#                                                   # the interpreted tests and the benchmark's --dry logic
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib/env.sh"
bash benchmarks/lib/tree_id.sh
FINAL_OUT=$OUT
OUT=/tmp/mla_lease_out
rm -rf "$OUT" && mkdir -p "$OUT"
deadline=$((SECONDS + ${BUDGET_S:-570}))  # one device call: every step's limit is cut to what is left
PACK=$FINAL_OUT/mla_lease.tar
step() { budget_step "$@"; }  # env.sh
if [ "${DRY:-0}" = 1 ]; then
  export TRITON_INTERPRET=1
  TAIL=5 step mla_tests 120 $PY -m pytest -q -p no:cacheprovider tests/runtime/kernels/attention/test_mla_attn.py
  TAIL=12 step mla_decode 120 $PY benchmarks/kernels/mla_decode.py --dry --sweep all --out "$OUT/mla_decode.json"
  TAIL=8 step mla_extend 120 $PY benchmarks/kernels/mla_decode.py --kind extend --dry --out "$OUT/mla_extend.json"
  exit 0
fi
if [ "${1:-all}" != bench ]; then
  TAIL=8 step mla_cuda_tests 200 $PY -m pytest -q -p no:cacheprovider -rfEs --durations=5 \
    tests/runtime/kernels/attention/test_mla_attn.py
fi
TAIL=30 step mla_decode 420 $PY benchmarks/kernels/mla_decode.py --sweep all --budget-s "${MLA_BUDGET_S:-300}" \
  --kv "${MLA_KV:-bf16}" --out "$OUT/mla_decode.json"
TAIL=32 step mla_extend 120 $PY benchmarks/kernels/mla_decode.py --kind extend --budget-s 80 --out "$OUT/mla_extend.json"
