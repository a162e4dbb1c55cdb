#!/usr/bin/env bash
# Issue 54's hierarchical cache on one H200, one device call (carry [".whl"]; at most 9.5 min): the host pool's copy
# tests on CUDA (tests/runtime/cache/hicache/test_host_pool.py: the CUDA cases, values and copy counts), the copy
# bandwidth of the real load/store paths for Llama-3.1-8B shapes against the copy engine's
# (benchmarks/kernels/hicache_copy.py, with the pre-fix copies as `legacy_*`), then the multi-turn serving benchmark
# with the cache off and on (benchmarks/serving/hicache_multiturn.py; its target: >= 2x throughput on). Logs and
# JSONs land in $OUT/hicache_lease.tar, packed after each step.
#   bash benchmarks/lease/hicache_lease.sh            # all three
#   bash benchmarks/lease/hicache_lease.sh copy       # tests + copy benchmark only (~2 min)
#   DRY=1 DRY_OUT=/tmp/hicache_dry PY=/work/main/.venv/bin/python bash benchmarks/lease/hicache_lease.sh
#                                                     # here, on the CPU: the tests and both scripts' tiny runs
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib/env.sh"
bash benchmarks/lib/tree_id.sh
FINAL_OUT=$OUT
OUT=/tmp/hicache_lease_out
rm -rf "$OUT" && mkdir -p "$OUT"
deadline=$((SECONDS + ${BUDGET_S:-570}))  # one device call: every step's limit is cut to what is left
PACK=$FINAL_OUT/hicache_lease.tar
step() { budget_step "$@"; }  # env.sh
TAIL=6 step host_pool_tests 120 $PY -m pytest -q -p no:cacheprovider -rfEs tests/runtime/cache/hicache/test_host_pool.py
if [ "${DRY:-0}" = 1 ]; then
  TAIL=8 step hicache_copy 120 $PY benchmarks/kernels/hicache_copy.py --dry --out "$OUT/hicache_copy.json"
  TAIL=8 step hicache_multiturn 240 $PY benchmarks/serving/hicache_multiturn.py --tiny --clients 6 --turns 3 \
    --first-len 64 --user-len 16 --output-len 4 --max-total-tokens 512 --max-parallel 2 \
    --out "$OUT/hicache_multiturn.json"
  exit 0
fi
TAIL=60 step hicache_copy 150 $PY benchmarks/kernels/hicache_copy.py --out "$OUT/hicache_copy.json"
if [ "${1:-all}" != copy ]; then
  TAIL=12 step hicache_multiturn 330 $PY benchmarks/serving/hicache_multiturn.py --out "$OUT/hicache_multiturn.json"
fi
