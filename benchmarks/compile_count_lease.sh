#!/usr/bin/env bash
# Issue 20, deliverable 1 (no Triton kernel compiles after start-up) on one GPU, in calls of under ten minutes each
# (send them back to back: the machine stays warm 30 s). Carry [".whl"] (the wheels the image lacks, as for
# multi_gpu_lease.sh); every part starts from an empty Triton cache (fresh TRITON_CACHE_DIR per engine process).
#   bash benchmarks/compile_count_lease.sh a   # GPU test: tiny bf16 dense (7 configurations) and MoE (3) engines,
#                                              # a varied workload after start-up, no compile (JIT cache-miss hook)
#   bash benchmarks/compile_count_lease.sh b   # Llama-3.1-8B shapes (dummy bf16): cold start-up time and compile
#                                              # counts, default and page size 16 -> $OUT/compile_count_llama8b.json
#   bash benchmarks/compile_count_lease.sh c   # the kernels against their references, the engine against
#                                              # transformers (the decode kernel's split count is a runtime argument)
#   bash benchmarks/compile_count_lease.sh d   # b under the tree before the change (the start-up cost it adds, the
#                                              # compiles it removes); prepare here first, then carry .stage/base20 too:
#                                              #   mkdir -p .stage/base20 && git archive c263624 radixlm benchmarks \
#                                              #     ':!benchmarks/results' | tar -x -C .stage/base20
# Results land in $OUT (JSON and logs).
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
case "${1:-a}" in
  a)
    timeout 570 python3 -m pytest -q -p no:cacheprovider tests/runtime/engine/test_cuda.py -k no_triton_compile \
      > "$OUT"/a.log 2>&1
    echo "pytest rc=$?"; tail -40 "$OUT"/a.log ;;
  b)
    timeout 570 python3 benchmarks/compile_count_gpu.py --configs default page16 \
      --out "$OUT"/compile_count_llama8b.json > "$OUT"/b.log 2>&1
    echo "compile_count rc=$?"; grep -v "safetensors\|Warn\|warn\| INFO " "$OUT"/b.log | tail -30 ;;
  c)
    timeout 570 python3 -m pytest -q -p no:cacheprovider tests/runtime/layers/test_triton_attn.py \
      tests/runtime/layers/test_fused_kernels.py tests/runtime/layers/test_fused_moe.py \
      tests/runtime/layers/test_kernel_variants.py tests/runtime/engine/test_cuda.py -k "not no_triton_compile" \
      > "$OUT"/c.log 2>&1
    echo "pytest rc=$?"; tail -30 "$OUT"/c.log ;;
  d)
    RADIXLM_TREE=$TREE/.stage/base20 timeout 570 python3 benchmarks/compile_count_gpu.py --configs default page16 \
      --out "$OUT"/compile_count_llama8b_base.json > "$OUT"/d.log 2>&1
    echo "compile_count (base tree) rc=$?"; grep -v "safetensors\|Warn\|warn\| INFO " "$OUT"/d.log | tail -30 ;;
esac
