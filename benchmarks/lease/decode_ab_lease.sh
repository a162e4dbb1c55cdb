#!/usr/bin/env bash
# Issue 20: the decode step of this tree against a base tree, on one GPU, in one call (carry [".whl", "ab_base"]):
# after this tree's GPU tests (TESTS, one or more of: kernels = the layers' GEMM and fused kernel tests, attention =
# the attention kernels' tests, engine = the CUDA engine tests; or none), a
# probe (PROBE: profile = benchmarks/profiling/profile_gpu_step.py, device time per kernel under the profiler; gaps =
# benchmarks/profiling/decode_gaps_gpu.py, CUDA events around each pass) on Llama-3.1-8B shapes with dummy bf16 weights, for
# each tree in turn, ROUNDS times. JSON and one log (probe.log) land in $OUT (through tee: kept if the call is cut short).
# Make the base tree first, here:
#   rm -rf ab_base && mkdir ab_base && git archive REV radixlm benchmarks | tar -x -C ab_base
#   bash benchmarks/lease/decode_ab_lease.sh    # on the device; BATCHES (default "1 256"), ROUNDS (default 2)
set -uo pipefail
. "$(dirname "$0")/env.sh"
bash benchmarks/lease/tree_id.sh
for tests in ${TESTS:-kernels}; do
  case "$tests" in
    kernels) timeout 300 python3 -m pytest -q -p no:cacheprovider tests/runtime/kernels/elementwise/test_fused_kernels.py \
               tests/runtime/kernels/gemm/test_skinny_epilogue.py tests/runtime/kernels/gemm/test_skinny_mma.py 2>&1 \
               | tee "$OUT/tests_fused_kernels.log" | tail -4 ;;
    attention) timeout 400 python3 -m pytest -q -p no:cacheprovider tests/runtime/kernels/attention/test_triton_attn.py \
                 tests/runtime/kernels/attention/test_decode_attn_variants.py tests/runtime/kernels/attention/test_shared_prefix_attn.py 2>&1 \
                 | tee "$OUT/tests_attention.log" | tail -4 ;;
    engine) timeout 420 python3 -m pytest -q -p no:cacheprovider tests/runtime/engine/test_cuda.py -rA 2>&1 \
              | tee "$OUT/tests_engine_cuda.log" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -16 ;;
  esac
done
for round in $(seq 1 "${ROUNDS:-2}"); do
  for tree in ab_base .; do
    name=$([ "$tree" = . ] && echo new || echo base)
    if [ "${PROBE:-profile}" = gaps ]; then
      script=profiling/decode_gaps_gpu.py args=()
    else
      script=profiling/profile_gpu_step.py args=(--steps 32)
    fi
    # A base tree from before benchmarks/ had topic folders holds the script at benchmarks/ itself.
    [ -f "$tree/benchmarks/$script" ] || script=$(basename "$script")
    # shellcheck disable=SC2086  # BATCHES: several words
    (cd "$tree" && PYTHONPATH=/tmp/site:$PWD timeout 300 python3 "benchmarks/$script" "${args[@]}" \
      --batches ${BATCHES:-1 256} --out "$OUT/${PROBE:-profile}_${name}_r$round.json" 2>&1 | tee -a "$OUT/probe.log" \
      | grep -E "^batch|step|^few-row" | tail -5)
  done
done
