#!/usr/bin/env bash
# Issue 50 on one GPU. Carry [".whl"]. Each step has its own time limit and log (<step>.log); they and the JSONs land
# in $OUT/quant_lease.tar.
#   bash benchmarks/lease/quant_lease.sh kernels   # quantized GEMMs vs bf16 (kernels/quant_gemm.py, ~3 min), their CUDA
#                                                  # tests, the GEMM dispatch tests (~2 min), the grouped MoE kernels
#                                                  # (kernels/quant_moe.py, ~3 min)
#   bash benchmarks/lease/quant_lease.sh moe       # the grouped quantized MoE kernels vs bf16 on Qwen3-30B-A3B's layer
#                                                  # (kernels/quant_moe.py, ~3 min) and their CUDA tests (~2 min): one
#                                                  # device call of its own (kernels runs the benchmark too)
#   bash benchmarks/lease/quant_lease.sh model [FMT...]   # Llama-3.1-8B shapes (dummy weights) per format: decode steps
#                                                  # at batch 1..256 and ShareGPT-like 400 (offline/gpu_llama8b.py
#                                                  # --parts ab); FMT: bf16 fp8 fp8_block w4a16 fp8kv fp8_fp8kv
#                                                  # (default: all but fp8_fp8kv, FP8 weights and KV together)
#   BUDGET_S=560 bash benchmarks/lease/quant_lease.sh check   # one call after kernel changes: the GEMM, KV and MoE
#                                                  # benchmarks in short budgets, the CUDA tests, then the 8B model
#                                                  # per format at batch 1/8/64 while time is left
#   BUDGET_S=240 bash benchmarks/lease/quant_lease.sh check model   # only the 8B model part (CHECK_FORMATS: which)
#   bash benchmarks/lease/quant_lease.sh gemv      # tunes the few-row kernels (kernels/quant/fp8_gemv.py, int4_skinny.py):
#                                                  # kernels/quant_gemv_sweep.py (--kind gemv, ~5-7 min), then their CUDA
#                                                  # tests; $OUT/quant_gemv_<GPU>.json is the committed table with the
#                                                  # swept entries replaced: commit it as kernels/gemm/tuned/
#   bash benchmarks/lease/quant_lease.sh mma       # the same for the W4A16 tensor-core kernel (int4_mma.py, --kind mma,
#                                                  # ~4-5 min) and its CUDA test. Both take SWEEP_ARGS (a narrower
#                                                  # sweep, e.g. "--rows 8 64 --shapes o_proj") and DRY=1 DRY_OUT=...
#   bash benchmarks/lease/quant_lease.sh fp8mma    # the same for the FP8 W8A8 tensor-core kernel (fp8_mma.py, --kind
#                                                  # fp8mma: per-channel and 128x128 blocks, ~5-6 min) and its CUDA test;
#                                                  # one call under 8 min
#   bash benchmarks/lease/quant_lease.sh fp8lt     # tunes cuBLASLt's FP8 row-scaled GEMMs at every CUDA-graph size
#                                                  # past 32 rows (kernels/cublaslt_tune.py --fp8, ~5 min; ROWS, CELL_S),
#                                                  # then test_cublaslt.py; $OUT/cublaslt_fp8_<GPU>.json is the table
#                                                  # to commit under kernels/gemm/tuned/
#   bash benchmarks/lease/quant_lease.sh fused     # which steps the FP8 few-row kernel fuses at one row, and at which
#                                                  # launch (kernels/fp8_gemv_fused_sweep.py, ~3-4 min):
#                                                  # $OUT/quant_gemv_<GPU>.json is the table to commit
#   bash benchmarks/lease/quant_lease.sh kv        # decode attention and the 8B decode step at batch 64, 8k-token
#                                                  # contexts, bf16 vs fp8 KV (kernels/fp8_kv_decode_gpu.py, ~5-7 min):
#                                                  # every DECODE_VARIANTS config timed, the dict to set printed;
#                                                  # then the decode kernel's CUDA tests (widening, transposed walk,
#                                                  # launch configs and float8 pools against the reference)
#   DRY=1 DRY_OUT=/tmp/kv bash benchmarks/lease/quant_lease.sh kv   # that sweep's logic on the CPU (interpreter)
#   bash benchmarks/lease/quant_lease.sh w4big     # W4A16 at many rows, one call under 8 min (BUDGET_S, default 420):
#                                                  # the dequantize-then-GEMM path's CUDA tests, quant_gemm.py
#                                                  # --w4a16-dequant (128..8192 rows; its table entries written to
#                                                  # $OUT and installed over the tree's quant_gemv_<GPU>.json), then
#                                                  # the 8B model bf16 and w4a16 with that table (as `model`)
#   DRY=1 DRY_OUT=/tmp/w4big bash benchmarks/lease/quant_lease.sh w4big   # its logic on the CPU (interpreter)
#   ROUNDS=3 bash benchmarks/lease/quant_lease.sh model bf16 fp8   # the formats in turn, three times (llama8b_<FMT>_r<N>);
#                                                  # SHAREGPT=0: the decode steps only; SHAREGPT_REPEATS=N: N
#                                                  # ShareGPT-like runs an engine (the first is the figure); SMI=1:
#                                                  # nvidia-smi sampled through each run (smi_<tag>.csv, summarized
#                                                  # in power_<tag>.json: lib/power_log.py); AB_PDL=1: each also with
#                                                  # RADIXLM_PDL=0 (llama8b_<FMT>_nopdl, kernels/pdl.py) right after;
#                                                  # AB_ENV="VAR=V ...": each also under that env (llama8b_<FMT>_off)
#   bash benchmarks/lease/quant_lease.sh big       # Llama-3.1-70B shapes in online FP8 on the one GPU (the float model
#                                                  # does not fit): start-up, decode steps at 1 / 32, ShareGPT-like 200
#                                                  # (multi_gpu/gpu_multi.py --parts big_fp8, ~5-7 min)
#   bash benchmarks/lease/quant_lease.sh deepseek  # DeepSeek-V3's shapes in FP8 blocks, 5 layers (dummy weights):
#                                                  # decode steps at 1 / 32 / 256 beside their floor, ShareGPT-like and
#                                                  # shared prefix (gpu_deepseek.py --model v3-fp8; DRY=1: tiny, CPU)
#   bash benchmarks/lease/quant_lease.sh tests [PATH...]   # the CUDA tests under PATH (default tests/runtime/kernels/quant),
#                                                  # the interpreted tier left out (TESTS_LIMIT_S, default 300)
#   BUDGET_S=300 bash benchmarks/lease/quant_lease.sh profile [FMT...]   # the decode step's kernels per format at
#                                                  # PROFILE_BATCHES (default 1): profiling/profile_gpu_step.py --quant
#                                                  # (default formats: fp8 w4a16; ~90-150 s each with a cold cache;
#                                                  # PDL off unless PROFILE_PDL=on: kernel times that add up)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib/env.sh"
bash benchmarks/lib/tree_id.sh
# A call returns at most 8 files: the steps write under a folder of their own, packed into $OUT after each step.
FINAL_OUT=$OUT
OUT=/tmp/quant_lease_out
rm -rf "$OUT" && mkdir -p "$OUT"
deadline=$((SECONDS + ${BUDGET_S:-100000}))  # BUDGET_S: no step past it (each step's limit is cut to it)
PACK=$FINAL_OUT/quant_lease.tar
step() { budget_step "$@"; }  # env.sh
case ${1:?usage: quant_lease.sh kernels | moe | model [FMT...] | big | deepseek | kv | check | w4big | gemv | mma | fp8mma | fp8lt | profile [FMT...] | tests [PATH...]} in
profile)
  shift
  for f in ${@:-fp8 w4a16}; do
    TAIL=45 step "profile_$f" 400 $PY benchmarks/profiling/profile_gpu_step.py --quant "$f" \
      --batches ${PROFILE_BATCHES:-1} --steps 32 --top 40 --pdl "${PROFILE_PDL:-off}" --out "$OUT/profile_$f.json"
  done
  ;;
fused)
  TAIL=40 step fused_sweep "${SWEEP_LIMIT_S:-330}" $PY benchmarks/kernels/fp8_gemv_fused_sweep.py --out "$OUT" \
    --budget-s "${SWEEP_BUDGET_S:-280}"
  ;;
fp8lt)
  gpu=$($PY -c "import torch, re; print(re.sub(r'[^A-Za-z0-9]+', '_', torch.cuda.get_device_name()).strip('_'))")
  rows=(--graph-sizes)
  [ -n "${ROWS:-}" ] && rows=(--rows $ROWS)
  TAIL=80 step fp8lt_tune "${TUNE_LIMIT_S:-470}" $PY benchmarks/kernels/cublaslt_tune.py --fp8 --workspace-mib 16 \
    "${rows[@]}" --cell-budget-s "${CELL_S:-2}" \
    --budget-s "${TUNE_BUDGET_S:-400}" --table "$OUT/cublaslt_fp8_$gpu.json" --log "$OUT/cublaslt_fp8_tune.json"
  TAIL=12 step fp8lt_cuda_tests 90 $PY -m pytest -q -p no:cacheprovider tests/runtime/kernels/gemm/test_cublaslt.py
  ;;
gemv|mma|fp8mma)
  kind=$1 test=test_quant_gemv.py sweep_s=330 limit=420
  [ "$kind" = mma ] && test=test_int4_mma.py sweep_s=230 limit=320
  [ "$kind" = fp8mma ] && test=test_fp8_mma.py sweep_s=250 limit=390
  deadline=$((SECONDS + ${BUDGET_S:-$((limit + 60))}))
  if [ "${DRY:-0}" = 1 ]; then
    TRITON_INTERPRET=1 TAIL=30 step "${kind}_sweep" 900 $PY benchmarks/kernels/quant_gemv_sweep.py --kind "$kind" --dry \
      --rows $([ "$kind" = gemv ] && echo 1 4 || echo 8 64) --shapes o_proj --out "$OUT"
    exit 0
  fi
  # The sweep stops starting shapes at --budget-s; a shape takes ~20-70 s (builds, then timings).
  TAIL=60 step "${kind}_sweep" "$limit" $PY benchmarks/kernels/quant_gemv_sweep.py --kind "$kind" --budget-s "$sweep_s" \
    ${SWEEP_ARGS:-} --out "$OUT"
  TAIL=8 step "${kind}_cuda_tests" 60 $PY -m pytest -q -p no:cacheprovider "tests/runtime/kernels/quant/$test"
  ;;
w4big)
  deadline=$((SECONDS + ${BUDGET_S:-420}))
  if [ "${DRY:-0}" = 1 ]; then
    TAIL=4 step w4big_tests 120 $PY -m pytest -q -p no:cacheprovider tests/runtime/kernels/quant/test_int4_dequant.py
    TRITON_INTERPRET=1 TAIL=12 step w4big_gemm 120 $PY benchmarks/kernels/quant_gemm.py --w4a16-dequant --dry \
      --rows 8 16 --shapes o_proj down_proj --install-table --out "$OUT"
    echo "(dry: the 8B model runs skipped: gpu_llama8b.py --parts ab --quant bf16 / w4a16)"
    exit 0
  fi
  TAIL=8 step w4big_cuda_tests 80 $PY -m pytest -q -p no:cacheprovider \
    tests/runtime/kernels/quant/test_int4_dequant.py tests/runtime/kernels/quant/test_quant_kernels_cuda.py \
    -k "int4 or dequant or cuda_graph or no_build"
  TAIL=30 step w4big_gemm 150 $PY benchmarks/kernels/quant_gemm.py --w4a16-dequant --budget-s 100 --install-table \
    --out "$OUT"
  for f in bf16 w4a16; do
    limit=140; [ "$f" = bf16 ] && limit=90
    TAIL=12 step "llama8b_$f" "$limit" $PY benchmarks/offline/gpu_llama8b.py --parts ab --quant "$f" \
      --batches ${BATCHES:-1 8 64 256} --decode-steps 128 --sharegpt-requests 400 --random-requests 0 \
      --prefix-groups 0 --out "$OUT/llama8b_$f.json"
  done
  ;;
kv)
  if [ "${DRY:-0}" = 1 ]; then  # the sweep and its dict at tiny shapes under the interpreter, a few variants (~1 min)
    TRITON_INTERPRET=1 TAIL=30 step fp8_kv_decode 300 $PY benchmarks/kernels/fp8_kv_decode_gpu.py --dry --parts kernel \
      --kv-dtypes fp8_e4m3 --variants old,s3,n128p1r128,n128p1r128h,n128p1t,n128s2t,p1h,n128p1r128b,p1m --variant-splits 2 \
      --out "$OUT"
    exit 0
  fi
  TAIL=60 step fp8_kv_decode 420 $PY benchmarks/kernels/fp8_kv_decode_gpu.py --variants all --variant-budget-s 200 \
    --budget-s 240 --out "$OUT"
  TAIL=8 step kv_widen_cuda_tests 150 $PY -m pytest -q -p no:cacheprovider -m "not interpreted_kernel" \
    tests/runtime/kernels/attention/test_decode_kv_widen.py tests/runtime/kernels/attention/test_decode_swapped.py \
    tests/runtime/kernels/attention/test_decode_attn_variants.py
  ;;
check)
  if [ "${2:-}" != model ]; then
  TAIL=45 step quant_gemm 130 $PY benchmarks/kernels/quant_gemm.py --budget-s 80 --out "$OUT"
  TAIL=45 step fp8_kv_decode 170 $PY benchmarks/kernels/fp8_kv_decode_gpu.py --variants all --variant-budget-s 70 \
    --budget-s 100 --out "$OUT"
  TAIL=25 step quant_moe 110 $PY benchmarks/kernels/quant_moe.py --budget-s 60 --out "$OUT"
  TAIL=6 step quant_cuda_tests 90 $PY -m pytest -q -p no:cacheprovider tests/runtime/kernels/quant/test_quant_kernels_cuda.py
  TAIL=6 step quant_moe_cuda_tests 90 $PY -m pytest -q -p no:cacheprovider tests/runtime/kernels/moe/test_quant_moe_cuda.py
  fi
  for f in ${CHECK_FORMATS:-fp8 fp8_block w4a16}; do
    TAIL=8 step "llama8b_$f" 60 $PY benchmarks/offline/gpu_llama8b.py --parts ab --quant "$f" --batches 1 8 64 \
      --decode-steps 128 --sharegpt-requests 400 --random-requests 0 --prefix-groups 0 --out "$OUT/llama8b_$f.json"
  done
  ;;
kernels)
  step quant_gemm 240 $PY benchmarks/kernels/quant_gemm.py --out "$OUT"
  TAIL=25 step quant_cuda_tests 150 $PY -m pytest -q -p no:cacheprovider tests/runtime/kernels/quant
  TAIL=25 step gemm_dispatch_tests 150 $PY -m pytest -q -p no:cacheprovider tests/runtime/kernels/gemm/test_gemm_dispatch.py
  TAIL=30 step quant_moe 240 $PY benchmarks/kernels/quant_moe.py --out "$OUT"
  ;;
moe)
  TAIL=30 step quant_moe 240 $PY benchmarks/kernels/quant_moe.py --out "$OUT"
  TAIL=25 step quant_moe_cuda_tests 300 $PY -m pytest -q -p no:cacheprovider tests/runtime/kernels/moe/test_quant_moe_cuda.py \
    tests/runtime/kernels/moe/test_fused_moe.py
  ;;
model)
  shift
  rounds=${ROUNDS:-1}
  ab_env=${AB_ENV:-} ab_tag=_off
  [ "${AB_PDL:-0}" = 1 ] && ab_env=RADIXLM_PDL=0 ab_tag=_nopdl
  [ "${SMI:-0}" = 1 ] && smi_fields=$($PY -c "from benchmarks.lib.power_log import FIELDS; print(FIELDS)")
  for r in $(seq 1 "$rounds"); do
    sfx=; [ "$rounds" -gt 1 ] && sfx=_r$r
    for fmt in "${@:-bf16 fp8 fp8_block w4a16 fp8kv}"; do
      for f in $fmt; do
        for ab in 0 $([ -n "$ab_env" ] && echo 1); do
          tag=$f$([ "$ab" = 1 ] && echo "$ab_tag")$sfx
          smi=
          if [ "${SMI:-0}" = 1 ]; then
            nvidia-smi --query-gpu="$smi_fields" --format=csv -lms 250 > "$OUT/smi_$tag.csv" & smi=$!
          fi
          TAIL=12 step "llama8b_$tag" "${MODEL_LIMIT_S:-200}" env $([ "$ab" = 1 ] && echo "$ab_env") \
            $PY benchmarks/offline/gpu_llama8b.py \
            --parts ab --quant "$f" --batches ${BATCHES:-1 8 32 64 256} --decode-steps 128 \
            --sharegpt-requests ${SHAREGPT:-400} --sharegpt-repeats ${SHAREGPT_REPEATS:-1} --random-requests 0 \
            --prefix-groups 0 --out "$OUT/llama8b_$tag.json"
          if [ -n "$smi" ]; then
            kill "$smi"; wait "$smi" 2>/dev/null
            $PY -m benchmarks.lib.power_log "$OUT/smi_$tag.csv" > "$OUT/power_$tag.json"
            pack_out
          fi
        done
      done
    done
  done
  ;;
deepseek)
  TAIL=30 step deepseek_v3_fp8 "${DS_LIMIT_S:-470}" $PY benchmarks/offline/gpu_deepseek.py --model v3-fp8 \
    $([ "${DRY:-0}" = 1 ] && echo --tiny) --parts decode offline --out "$OUT/deepseek_v3_fp8.json"
  ;;
big)
  TAIL=30 step llama70b_fp8 "${BIG_LIMIT_S:-470}" $PY benchmarks/multi_gpu/gpu_multi.py --parts big_fp8 \
    --big-sharegpt-requests ${SHAREGPT:-200} --out "$OUT/llama70b_fp8.json"
  ;;
tests)
  shift
  TAIL=25 step cuda_tests "${TESTS_LIMIT_S:-300}" $PY -m pytest -q -p no:cacheprovider -m "not interpreted_kernel" \
    ${@:-tests/runtime/kernels/quant}
  ;;
esac
