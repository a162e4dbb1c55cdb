#!/usr/bin/env bash
# Issue 20's start-up runs on one GPU, one part per call of under ten minutes (send them back to back: the machine
# stays warm 30 s). Carry [".whl"] (env.sh installs the wheels the image lacks). Results land in $OUT (JSON, logs).
#   bash benchmarks/lease/startup_lease.sh profile # start-up <= 45 s: benchmarks/startup/startup_profile.py, a cold
#                                                  # start (an empty Triton cache of its own) then a warm one (the same
#                                                  # cache), each in a fresh interpreter and followed by decode steps
#                                                  # at batch 1-64 (KINDS=cold: the cold start only)
#   DRY=1 bash benchmarks/lease/startup_lease.sh profile   # here, on the CPU (tiny shapes; OUT default /tmp/startup_dry)
#   bash benchmarks/lease/startup_lease.sh libs    # cold Engine() start-ups with the image's packages and with those
#                                                  # in .whl_tf ahead of them, ABBA (startup_profile.py --libs; ~3 min).
#                                                  # Carry [".whl", ".whl_tf"]; fill .whl_tf here first, e.g. with what
#                                                  # a fresh install resolves (the versions of this machine's .venv):
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl_tf \
#       transformers==5.24.0 huggingface-hub==2.4.0 tokenizers==0.23.3 hf-xet==1.8.0 typer==0.29.2 click==8.5.1 \
#       safetensors==0.8.0 regex==2026.11.19 shellingham==1.5.4 rich==15.0.0 annotated-doc==0.0.7 \
#       markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 fsspec==2026.9.0 filelock==4.3.1
# Deliverable 1, no Triton kernel compiles after start-up; every part starts from an empty Triton cache (a fresh
# TRITON_CACHE_DIR per engine process):
#   bash benchmarks/lease/startup_lease.sh a   # GPU test: tiny bf16 dense (7 configurations) and MoE (3) engines,
#                                              # a varied workload after start-up, no compile (JIT cache-miss hook)
#   bash benchmarks/lease/startup_lease.sh b   # Llama-3.1-8B shapes (dummy bf16): cold start-up time and compile
#                                              # counts, default and page size 16 -> $OUT/compile_count_llama8b.json
#   bash benchmarks/lease/startup_lease.sh c   # the kernels against their references, the engine against
#                                              # transformers (the decode kernel's split count is a runtime argument)
#   bash benchmarks/lease/startup_lease.sh d   # b under the tree before the change (the start-up cost it adds, the
#                                              # compiles it removes); prepare here first, then carry .stage/base20 too:
#                                              #   mkdir -p .stage/base20 && git archive c263624 radixlm benchmarks \
#                                              #     ':!benchmarks/results' | tar -x -C .stage/base20
set -uo pipefail
part=${1:?usage: startup_lease.sh profile|libs|a|b|c|d (DRY=1 ... profile: the CPU dry run)}
HERE=$(cd "$(dirname "$0")" && pwd)
DRY_OUT=/tmp/startup_dry
. "$HERE/../lib/env.sh"
quiet() { grep -v "safetensors\|Warn\|warn\| INFO " ; }
case "$part" in
  profile)
    export TRITON_CACHE_DIR=/tmp/startup_triton_cache
    rm -rf "$TRITON_CACHE_DIR" && mkdir -p "$TRITON_CACHE_DIR"
    for kind in ${KINDS:-cold warm}; do
      timeout 280 $PY benchmarks/startup/startup_profile.py $TINY --out "$OUT/startup_profile_$kind.json" \
        > "$OUT/startup_profile_$kind.log" 2>&1
      echo "== $kind rc=$?"
      quiet < "$OUT/startup_profile_$kind.log" | head -40
    done ;;
  libs)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_libs .whl_tf/*.whl \
      || exit 1
    timeout 570 $PY benchmarks/startup/startup_profile.py --libs /tmp/site_libs --runs ${RUNS:-2} --cache cold \
      --out "$OUT/startup_libs_ab.json" > "$OUT/startup_libs_ab.log" 2>&1
    echo "== libs rc=$?"; quiet < "$OUT/startup_libs_ab.log" | tail -8 ;;
  a)
    timeout 570 $PY -m pytest -q -p no:cacheprovider tests/runtime/engine/test_cuda.py -k no_triton_compile \
      > "$OUT"/a.log 2>&1
    echo "pytest rc=$?"; tail -40 "$OUT"/a.log ;;
  b)
    timeout 570 $PY benchmarks/startup/compile_count_gpu.py --configs default page16 \
      --out "$OUT"/compile_count_llama8b.json > "$OUT"/b.log 2>&1
    echo "compile_count rc=$?"; quiet < "$OUT"/b.log | tail -30 ;;
  c)
    timeout 570 $PY -m pytest -q -p no:cacheprovider tests/runtime/kernels/attention/test_triton_attn.py \
      tests/runtime/kernels/elementwise/test_fused_kernels.py tests/runtime/kernels/moe/test_fused_moe.py \
      tests/runtime/kernels/startup/test_kernel_variants.py tests/runtime/engine/test_cuda.py -k "not no_triton_compile" \
      > "$OUT"/c.log 2>&1
    echo "pytest rc=$?"; tail -30 "$OUT"/c.log ;;
  d)
    RADIXLM_TREE=$TREE/.stage/base20 timeout 570 $PY benchmarks/startup/compile_count_gpu.py --configs default page16 \
      --out "$OUT"/compile_count_llama8b_base.json > "$OUT"/d.log 2>&1
    echo "compile_count (base tree) rc=$?"; quiet < "$OUT"/d.log | tail -30 ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
