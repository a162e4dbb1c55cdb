#!/usr/bin/env bash
# Issue 20: start-up's parallel kernel builds (radixlm/runtime/layers/kernel_builds.py) on one GPU, in calls of
# under ten minutes (carry [".whl"]; send them back to back: the machine stays warm 30 s). Logs and JSON land in $OUT
# (through tee: kept even if a call is cut short).
#   bash benchmarks/startup_builds_lease.sh tests  # their GPU tests, then the CUDA engine tests (greedy against
#                                                  # transformers, graphs and overlap against eager, no kernel built
#                                                  # after start-up for dense and MoE engines, EAGLE tree drafts);
#                                                  # ~5-6 min on a fresh machine
#   bash benchmarks/startup_builds_lease.sh ab     # cold Engine() with both builds, the skinny GEMM's prebuild alone
#                                                  # and neither (benchmarks/cold_engine_ab.py: fresh processes, empty
#                                                  # kernel caches); RUNS rounds (default 2), ~4 min
set -uo pipefail
part=${1:?usage: startup_builds_lease.sh tests|ab}
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
bash benchmarks/tree_id.sh
case "$part" in
  tests)
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/runtime/layers/test_kernel_builds.py \
      tests/runtime/layers/test_fused_kernels.py -k "skinny or discovery or build or pool" 2>&1 \
      | tee "$OUT/tests_builds.log" | tail -3
    timeout 420 python3 -m pytest -q -p no:cacheprovider tests/runtime/engine/test_cuda.py -rA 2>&1 \
      | tee "$OUT/tests_engine_cuda.log" | grep -E "^(PASSED|FAILED|ERROR)|passed|failed" | tail -16 ;;
  ab)
    timeout 540 python3 benchmarks/cold_engine_ab.py --runs "${RUNS:-2}" --out "$OUT/cold_engine_ab.json" 2>&1 \
      | tee "$OUT/cold_engine_ab.log" | tail -8 ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
