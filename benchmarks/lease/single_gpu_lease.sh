#!/usr/bin/env bash
# The single-GPU runs that issues 19, 21 and 23 wait on, one part per device call (each part's steps run under
# `timeout`s that sum to < 570 s, kill grace included; every step writes its JSON and its whole log under $OUT first, then prints a
# filtered tail). Every part is self-contained (a fresh machine may come between two calls): carry .whl in each.
#
#   bash benchmarks/lease/single_gpu_lease.sh prepare   # HERE, once before the lease: .stage/spec/{t8b,d1b} (Llama-3.1-8B
#                                                 # target and Llama-3.2-1B draft shapes with SmolLM2's tokenizer,
#                                                 # config only: 7 MB) and .stage/spec/qt8b (the target with
#                                                 # Qwen2.5-Coder's tokenizer and vocabulary: 11 MB) for part spec
#   bash benchmarks/lease/single_gpu_lease.sh p1        # issue 19: LM programs, variants full, no_frontend_parallelism,
#                                                 # no_frontend_hint, no_radix_cache (2 server starts); mmlu 512
#                                                 # and hellaswag 128 programs (P19_COUNTS), the others 16; every
#                                                 # variant warms each workload up first (4 programs, unmeasured);
#                                                 # a variant's workload whose first run took < 5 s runs 3 times
#                                                 # (medians reported; P19_REPEAT, P19_REPEAT_MAX_S)
#   bash benchmarks/lease/single_gpu_lease.sh p2        # issue 19: fcfs, random, all_off (3 server starts); merges with
#                                                 # p1's JSON when the machine is still the same one (else merge here:
#                                                 # python -m radixlm.bench.programs --merge P1 P2 --output-file ...)
#   bash benchmarks/lease/single_gpu_lease.sh p19vlm    # issue 19: the llava_bench workload of radixlm.bench.programs on
#                                                 # Qwen2.5-VL-7B shapes (dummy bf16), all 7 variants (5 server
#                                                 # starts), 16 programs at scale 0.5 (estimate ~400 s, not measured)
#   bash benchmarks/lease/single_gpu_lease.sh spec      # issue 21: speculative decoding GPU table (off, NGRAM, RADIX,
#                                                 # STANDALONE x batch 1/8/64/256, replaying SmolLM2's outputs) and
#                                                 # the batch-1 bandwidth floor measured in the same run; then
#                                                 # spec_qwen: quote and edit replaying Qwen2.5-Coder-0.5B's outputs
#                                                 # (it does the edit's rename), off/NGRAM/RADIX x batch 1/8
#   bash benchmarks/lease/single_gpu_lease.sh specpair  # issue 21: NGRAM x batch 1/64/256 x the 4 workloads, each run
#                                                 # followed by drafting-off on the same engine (--paired-off: fresh
#                                                 # engines differ by up to +-10% at batch 64-256), 2 rounds
#                                                 # (222 s measured; SPEC_BATCHES="64 256" SPEC_REPEAT=6: the
#                                                 # large batches alone, 12 runs a cell)
#   bash benchmarks/lease/single_gpu_lease.sh vlm       # issue 23: LLaVA-bench with Qwen2.5-VL-7B shapes (radix / no_radix /
#                                                 # no_cache), then LLaVA-OneVision-7B shapes (12 images, 2 repeats)
#   bash benchmarks/lease/single_gpu_lease.sh determ    # issue 55: --enable-deterministic-inference on Llama-3.1-8B
#                                                 # shapes: the batch-invariant GEMM's and the attention's
#                                                 # sweeps (tables installed for the later steps), decode (64/256) and 4k-prefill
#                                                 # profiles off vs on, one prompt alone and in batches of 8/64/256
#                                                 # with and without a prefix hit (tokens and logprobs exact),
#                                                 # ShareGPT-like throughput off vs on, then item 2's release/resume
#                                                 # memory (6 engine starts; steps' limits sum to 530 s; not measured)
#   bash benchmarks/lease/single_gpu_lease.sh deepseek  # issue 51: DeepSeek-V2-Lite shapes (dummy bf16), one engine
#                                                 # per part: decode step at batch 1/32/256 beside its bytes floor,
#                                                 # ShareGPT-like (500) and shared-prefix (32 x 32) throughput, KV
#                                                 # tokens per GiB beside Llama-3.1-8B's, the 671B memory plan
#                                                 # (benchmarks/offline/gpu_deepseek.py; estimate 5-8 min, not
#                                                 # measured: two engine starts with cold Triton caches)
#   bash benchmarks/lease/single_gpu_lease.sh hicache   # issue 54: hicache CUDA tests, host work per round (null
#                                                 # runner), copies, multi-turn off/on (~3 min)
#   bash benchmarks/lease/single_gpu_lease.sh hicache_sgl # the same off/on on SGLang's bench_multiturn turn shape
#   SKIP="determ_profile determ_memory" bash ... determ # any part, leaving out the steps named
#   bash benchmarks/lease/single_gpu_lease.sh lora      # issue 53: LoRA CUDA tests, decode-kernel sweep, offline and served runs
#   bash benchmarks/lease/single_gpu_lease.sh mla [bench] # issue 51: MLA kernels' tests, decode sweep, extend
#   DRY=1 bash benchmarks/lease/single_gpu_lease.sh prepare|p1|p2|spec|vlm|deepseek|all   # HERE, on the CPU: the same scripts
#                                                 # and arguments with tiny random-weight shapes (see "Dry run")
#
# Results land in $OUT (JSON, markdown, PNG and each step's whole log). The first sessions' call plan, the
# estimates and the dry-run record: benchmarks/lease/README.md.
set -uo pipefail
part=${1:?usage: single_gpu_lease.sh prepare|p1|p2|p19vlm|spec|specpair|vlm|determ|deepseek|lora|mla|hicache|hicache_sgl (DRY=1 ...: the CPU dry run; DRY=1 ... all)}
DRY=${DRY:-0}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "$DRY" = 1 ]; then
  TREE=$(cd "$HERE/../.." && pwd)
  cd "$TREE" || exit 1
  OUT=${OUT:-/tmp/lease_dry/out}
  LEASE=/tmp/lease_dry
  PY=${PY:-$TREE/.venv/bin/python}
  export PYTHONPATH=$TREE${DRY_PYTHONPATH:+:$DRY_PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  X=${DRY_TIMEOUT_X:-4}
  SPEC=$LEASE/spec
  mkdir -p "$OUT" "$LEASE"
else
  [ "$part" = prepare ] || . "$HERE/../lib/env.sh"  # the wheels, multicast off, the GPU and versions printed
  TREE=${TREE:-$(cd "$HERE/../.." && pwd)}
  cd "$TREE" || exit 1
  OUT=${OUT:-/tmp/out}
  LEASE=/tmp/lease  # kept between calls while the machine stays warm
  PY=${PY:-python3}
  [ "$part" = prepare ] && PY=$TREE/.venv/bin/python  # here: the venv with SmolLM2 (its tokenizer)
  X=1
  SPEC=.stage/spec
  mkdir -p "$OUT" "$LEASE"
fi
quiet() { grep -v "safetensors\|Warn\|warn\|fix_mistral\|clean_up\| INFO \|it/s\]\|s/it\]" ; }

# step NAME SECONDS CMD...: CMD under a timeout (SIGTERM to its process group, KILL 15 s later), its whole output in
# $OUT/NAME.log; prints rc and wall time, then the log's filtered tail.
step() {  # SKIP (env): step names not to run
  local name=$1 secs=$(( $2 * X )); shift 2
  case " ${SKIP:-} " in *" $name "*) echo "== $name skipped (SKIP)"; return 0 ;; esac
  local t0=$SECONDS
  echo "== $name (timeout ${secs}s): $*" | tee -a "$OUT/$name.log"
  timeout -k 15 "$secs" "$@" >> "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/$name.log"
  [ $rc -eq 0 ] || sleep 5  # a killed step's servers (they die with it) give the GPU memory back first
  grep -v "^== " "$OUT/$name.log" | quiet | tail -"${TAIL:-40}"
  return 0
}

banner() {
  [ "$DRY" = 1 ] && { echo "DRY RUN on the CPU: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"; return; }
  git -C "$TREE" rev-parse --short HEAD 2>/dev/null || true
}

# The Llama-3.1-8B directory (config + the Llama-3.1 tokenizer; dummy weights); DRY: the same, shapes shrunk.
llama_dir() {
  local dst=$LEASE/llama8b
  [ "$DRY" = 1 ] && dst=$LEASE/llama8b_tiny
  $PY - "$dst" "$DRY" <<'EOF' >&2
import json, sys
from benchmarks.lib.models import model_dir
from benchmarks.lib.speculative_replay import ModelShape
d = model_dir(sys.argv[1])
if sys.argv[2] == "1":
    p = f"{d}/config.json"
    c = json.load(open(p))
    c.update(ModelShape.TINY.overrides)
    json.dump(c, open(p, "w"), indent=2)
EOF
  echo "$dst"
}

# python -m radixlm.bench.programs with the paper's ablations (issue 19), one subset of the variants.
programs() {  # programs NAME VARIANTS SECONDS [MODEL_DIR WORKLOADS]
  local name=$1 variants=$2 secs=$3 model=${4:-} workloads=${5:-all} nprog scale counts sargs repeat maxs
  [ -n "$model" ] || model=$(llama_dir) || return 1
  if [ "$DRY" = 1 ]; then
    nprog=2; scale=0.05; counts=mmlu=3,hellaswag=3; repeat=3; maxs=1  # some runs here take over 1 s: both cases
    sargs="--load-format dummy --dtype float32 --device cpu --context-length 4096 --max-total-tokens 16384 --random-seed 0 --log-level warning"
  else
    nprog=${P19_PROGRAMS:-16}; scale=${P19_SCALE:-0.5}; counts=${P19_COUNTS:-mmlu=512,hellaswag=128}
    repeat=${P19_REPEAT:-3}; maxs=${P19_REPEAT_MAX_S:-5}
    sargs="--load-format dummy --dtype bfloat16 --context-length 8192 --random-seed 0 --log-level warning"
  fi
  step "$name" "$secs" $PY -m radixlm.bench.programs --launch-server --model-path "$model" \
    --server-args "$sargs" --ablations --variants "$variants" --workloads "$workloads" --num-programs "$nprog" \
    --num-programs-per-workload "$counts" --scale "$scale" --repeat "$repeat" --repeat-max-seconds "$maxs" \
    --num-threads 64 --output-file "$OUT/programs_gpu_$name.json"
  [ -f "$OUT/programs_gpu_$name.json" ] && cp "$OUT/programs_gpu_$name.json" "$LEASE/"
}

case $part in
prepare)
  if [ "$DRY" = 1 ]; then
    $PY -m benchmarks.lib.speculative_replay default "$SPEC/t8b" "$SPEC/d1b" --tiny
    $PY -m benchmarks.lib.speculative_replay qwen2.5-coder-0.5b-instruct "$SPEC/qt8b" --tiny
  else
    for d in .stage; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
    $PY -m benchmarks.lib.speculative_replay default "$SPEC/t8b" "$SPEC/d1b"
    $PY -m benchmarks.lib.speculative_replay qwen2.5-coder-0.5b-instruct "$SPEC/qt8b"
    du -sh "$SPEC" .whl
  fi ;;
p1)
  banner
  programs p1 "${P1_VARIANTS:-full,no_frontend_parallelism,no_frontend_hint,no_radix_cache}" 530 ;;
p2)
  banner
  programs p2 "${P2_VARIANTS:-fcfs,random,all_off}" 510
  if [ -f "$LEASE/programs_gpu_p1.json" ]; then  # p1 ran on this machine: the whole table now
    timeout 20 $PY -m radixlm.bench.programs --merge "$LEASE/programs_gpu_p1.json" "$OUT/programs_gpu_p2.json" \
      --output-file "$OUT/programs_gpu.json" 2>&1 | tee -a "$OUT/p2.log"  # (7 files back: the limit is 8)
  else
    echo "p1's JSON is not on this machine: merge here (python -m radixlm.bench.programs --merge P1 P2 --output-file ...)"
  fi ;;
spec)
  banner
  if [ "$DRY" = 1 ]; then
    dev=(--device cpu --dtype float32); batches=(1 2); extra=(--max-new-tokens 24 --rounds 2 --repeat 1)
  else
    dev=(--device cuda --dtype bfloat16); batches=(1 8 64 256)
    extra=(--rounds "${SPEC_ROUNDS:-2}" --repeat "${SPEC_REPEAT:-3}")
  fi
  step spec 390 $PY benchmarks/speculative/speculative.py --model "$SPEC/t8b" --draft-model "$SPEC/d1b" --load-format dummy \
    "${dev[@]}" --algorithms NGRAM RADIX STANDALONE --batches "${batches[@]}" \
    --workloads quote edit restate story --script-ids benchmarks/results/speculative/speculative_smol_ids_cpu.json \
    --draft-acceptance 0.8 --floor --stat median "${extra[@]}" --out "$OUT/speculative_gpu.json"
  [ "$DRY" = 1 ] || extra=(--rounds "${SPEC_QWEN_ROUNDS:-1}" --repeat "${SPEC_REPEAT:-3}")
  step spec_qwen 140 $PY benchmarks/speculative/speculative.py --model "$SPEC/qt8b" --load-format dummy "${dev[@]}" \
    --algorithms NGRAM RADIX --batches "${batches[0]}" "${batches[1]}" --workloads quote edit \
    --script-ids benchmarks/results/speculative/speculative_qwen_coder_ids_cpu.json --floor --stat median "${extra[@]}" \
    --out "$OUT/speculative_gpu_qwen_coder.json" ;;
specpair)
  banner
  if [ "$DRY" = 1 ]; then
    dev=(--device cpu --dtype float32); batches=(1 2); extra=(--max-new-tokens 24 --rounds 1 --repeat 2)
  else
    dev=(--device cuda --dtype bfloat16); read -ra batches <<< "${SPEC_BATCHES:-1 64 256}"
    extra=(--rounds 2 --repeat "${SPEC_REPEAT:-3}")
  fi
  step specpair 420 $PY benchmarks/speculative/speculative.py --model "$SPEC/t8b" --load-format dummy "${dev[@]}" \
    --algorithms NGRAM --batches "${batches[@]}" --workloads quote edit restate story \
    --script-ids benchmarks/results/speculative/speculative_smol_ids_cpu.json --stat median --paired-off "${extra[@]}" \
    --out "$OUT/speculative_gpu_paired.json" ;;
p19vlm)
  banner
  shape=qwen2.5-vl-7b; [ "$DRY" = 1 ] && shape=tiny-qwen2-vl
  $PY - "$LEASE/p19vlm" "$shape" <<'EOF' >&2
import sys
from pathlib import Path
from benchmarks.lib.vlm_checkpoints import VlmShape, write_checkpoint
write_checkpoint(VlmShape(sys.argv[2]), Path(sys.argv[1]))
EOF
  programs p19vlm "${P19V_VARIANTS:-full,no_frontend_parallelism,no_frontend_hint,no_radix_cache,fcfs,random,all_off}" \
    540 "$LEASE/p19vlm" llava_bench ;;
vlm)
  banner
  if [ "$DRY" = 1 ]; then
    step vlm_qwen 230 $PY benchmarks/programs/llava_bench.py --tiny --images 2 --repeat 1 --max-new-tokens 4 \
      --out "$OUT/llava_bench_qwen2_5_vl_7b.json"
    # The 7B shapes the GPU runs: their checkpoints (config, tokenizer, processor) written and read back.
    step vlm_ckpt 150 $PY benchmarks/programs/llava_bench.py --check-shapes "$LEASE/vlm"  # the 7B shapes read back
  else
    step vlm_qwen 240 $PY benchmarks/programs/llava_bench.py --model qwen2.5-vl-7b --images "${VLM_IMAGES:-16}" \
      --out "$OUT/llava_bench_qwen2_5_vl_7b.json"
    step vlm_onevision 290 $PY benchmarks/programs/llava_bench.py --model llava-onevision-7b --images "${OV_IMAGES:-12}" \
      --repeat 2 --out "$OUT/llava_bench_llava_onevision_7b.json"
  fi ;;
determ)
  # issue 55 items 5 and 2, one call of at most 9 minutes (step limits sum to 530 s): the batch-invariant GEMM's sweep
  # (its table installed in this tree's kernels/gemm/tuned/ for the steps after it, and copied to $OUT), the
  # attention's launch sweep (installed in kernels/attention/tuned/), the decode/prefill profile flag off vs on,
  # the invariance check (flag on), the ShareGPT-like throughput off vs on, then release/resume memory.
  banner
  if [ "$DRY" = 1 ]; then
    tune=(env TRITON_INTERPRET=1 $PY -m radixlm.runtime.kernels.gemm.batch_invariant_tune --budget-s 20)
    attn_tune=(env TRITON_INTERPRET=1 $PY -m radixlm.runtime.kernels.attention.fixed_split_tune --budget-s 20)
    prof=(--tiny --batches 2 4 --steps 2 --prefill 200)
    check=(--model tiny --device cpu --batches 4 8 --max-new-tokens 4 --chunked-prefill-size 64 --lengths 150 100 200)
    tput=(--model tiny --device cpu --sharegpt-n 16); mem=(--model tiny --device cpu)
  else
    tune=($PY -m radixlm.runtime.kernels.gemm.batch_invariant_tune --budget-s "${DETERM_TUNE_S:-80}" --install)
    attn_tune=($PY -m radixlm.runtime.kernels.attention.fixed_split_tune --budget-s "${DETERM_ATTN_TUNE_S:-35}" --install)
    prof=(--batches 64 256 --steps 16 --prefill 4000)
    check=(--batches 8 64 256); tput=(--sharegpt-n "${DETERM_SHAREGPT_N:-1000}"); mem=()
  fi
  # A device call returns at most 8 files: seven JSON files (the attention's table goes into the tar: its sweep's JSON
  # holds the same entries), and each finished step's log moved into determ_logs.tar.
  logs() { (cd "$OUT" && tar -rf determ_logs.tar determ_*.log && rm -f determ_*.log); }
  step determ_tune 100 "${tune[@]}" --out "$OUT"; logs
  # The attention's launch sweep (sub-tiles and stages: bits checked against the default's, then timed on a 4k
  # prefill and decode at 64/256 rows), its table installed for the steps after it.
  step determ_attn_tune 50 "${attn_tune[@]}" --out "$OUT"; logs
  (cd "$OUT" && for f in fixed_split_*.json; do [ "$f" = fixed_split_sweep.json ] || [ ! -e "$f" ] ||
    { tar -rf determ_logs.tar "$f" && rm -f "$f"; }; done)
  step determ_profile 120 $PY benchmarks/profiling/profile_gpu_step.py "${prof[@]}" --deterministic both --top 15 \
    --out "$OUT/determinism_profile.json"; logs
  step determ_check 80 $PY benchmarks/quality/deterministic_check.py --parts check "${check[@]}" \
    --out "$OUT/determinism_check.json"; logs
  step determ_throughput 110 $PY benchmarks/quality/deterministic_check.py --parts throughput "${tput[@]}" \
    --out "$OUT/determinism_throughput.json"; logs
  step determ_memory 70 $PY benchmarks/quality/deterministic_check.py --parts memory "${mem[@]}" \
    --out "$OUT/release_memory.json"; logs ;;
deepseek)
  # issue 51 item 5: one step, each part's JSON written as it is measured (a killed step keeps the parts done).
  banner
  step deepseek 520 $PY benchmarks/offline/gpu_deepseek.py $([ "$DRY" = 1 ] && echo --tiny) \
    --parts kv plan decode offline --out "$OUT/deepseek_v2_lite_gpu.json" ;;
lora)
  # issue 53, one call of at most 9 minutes (steps cut to LORA_BUDGET_S, 480 s by default, after the wheels): the
  # LoRA CUDA tests (the kernels against the torch path at Llama-3.1-8B's shapes, graph replays, a tiny engine's
  # graph decode with adapters equal to eager); the decode kernels' sweep (benchmarks/kernels/lora_decode_sweep.py:
  # one decode step's LoRA kernels at batch 8/64/256 x 32 rank-16 adapters, CUDA-graph replays, beside the old path;
  # the best installed in this tree for the steps after it); the offline comparison (Engine: base, LoRA on with 0,
  # 1, 8, 32 adapters) with the kernel profile; the served comparison (32 adapters first: the issue's 0.8x bar).
  # Logs packed into $OUT/lora_logs.tar after each step; four JSONs beside it.
  banner
  if [ "$DRY" = 1 ]; then
    tiny=--tiny; nprompts=8; sweep=(env TRITON_INTERPRET=1 $PY benchmarks/kernels/lora_decode_sweep.py)
  else
    tiny=; nprompts=${LORA_PROMPTS:-400}; sweep=($PY benchmarks/kernels/lora_decode_sweep.py --install)
  fi
  lora_end=$((SECONDS + ${LORA_BUDGET_S:-480} * X))
  lora_step() {  # lora_step NAME LIMIT CMD...: step with its limit cut to what is left (skipped under 20 s)
    local name=$1 limit=$2 left=$(((lora_end - SECONDS) / X)); shift 2
    [ "$left" -ge 20 ] || { echo "== $name skipped (budget)"; return 0; }
    [ "$limit" -le "$left" ] || limit=$left
    step "$name" "$limit" "$@"
    (cd "$OUT" && tar -rf lora_logs.tar "$name.log" && rm -f "$name.log")
  }
  TAIL=30 lora_step lora_cuda_tests 70 $PY -m pytest -q -p no:cacheprovider -rs --durations=8 tests/runtime/kernels/lora \
    tests/runtime/lora/test_lora_cuda.py -k "not compile"
  TAIL=20 lora_step lora_sweep 100 "${sweep[@]}" --budget-s "${LORA_SWEEP_S:-55}" --out "$OUT/lora_decode_sweep.json"
  TAIL=40 lora_step lora_offline 190 $PY benchmarks/serving/lora_llama8b.py $tiny --mode offline profile \
    --adapters 1 8 32 --num-prompts "$nprompts" --out "$OUT/lora_offline.json" --profile-out "$OUT/lora_profile.json"
  TAIL=60 lora_step lora_served 200 $PY benchmarks/serving/lora_llama8b.py $tiny --adapters 32 1 8 \
    --num-prompts "$nprompts" --out "$OUT/lora_llama8b.json" ;;
mla)
  # issue 51, one call <= 9.5 min: the MLA kernels' CUDA tests (test_mla_attn.py), kernels/mla_decode.py's decode sweep
  # (V2-Lite and V3 heads, batch 1/32/256 x context 1k/4k, beside the latent bytes floor), then --kind extend while
  # time is left; $OUT/mla_lease.tar packed after each step. `mla bench`: the benchmarks alone (MLA_BUDGET_S: the
  # decode cells'; MLA_KV=fp8_e4m3: a float8 pool). DRY=1: the interpreted tests and the benchmark's --dry logic.
  declare -F budget_step > /dev/null || . "$HERE/../lib/env.sh"  # DRY: budget_step (OUT and PY kept)
  bash benchmarks/lib/tree_id.sh
  PACK=$OUT/mla_lease.tar
  OUT=/tmp/mla_lease_out
  rm -rf "$OUT" && mkdir -p "$OUT"
  deadline=$((SECONDS + ${BUDGET_S:-570}))
  if [ "$DRY" = 1 ]; then
    export TRITON_INTERPRET=1
    TAIL=5 budget_step mla_tests 120 $PY -m pytest -q -p no:cacheprovider \
      tests/runtime/kernels/attention/test_mla_attn.py
    TAIL=12 budget_step mla_decode 120 $PY benchmarks/kernels/mla_decode.py --dry --sweep all \
      --out "$OUT/mla_decode.json"
    TAIL=8 budget_step mla_extend 120 $PY benchmarks/kernels/mla_decode.py --kind extend --dry \
      --out "$OUT/mla_extend.json"
  else
    if [ "${2:-all}" != bench ]; then
      TAIL=8 budget_step mla_cuda_tests 200 $PY -m pytest -q -p no:cacheprovider -rfEs --durations=5 \
        tests/runtime/kernels/attention/test_mla_attn.py
    fi
    TAIL=30 budget_step mla_decode 420 $PY benchmarks/kernels/mla_decode.py --sweep all \
      --budget-s "${MLA_BUDGET_S:-300}" --kv "${MLA_KV:-bf16}" --out "$OUT/mla_decode.json"
    TAIL=32 budget_step mla_extend 120 $PY benchmarks/kernels/mla_decode.py --kind extend --budget-s 80 \
      --out "$OUT/mla_extend.json"
  fi ;;
all)
  [ "$DRY" = 1 ] || { echo "'all' is the CPU dry run only (DRY=1): one part per device call" >&2; exit 2; }
  for p in prepare p1 p2 spec vlm; do echo "######## $p"; bash "$0" "$p"; done ;;
hicache)
  # issue 54 item 1, one call (timeouts 490 s, at most 550 s with kill grace; ~3 min expected): the host pool's CUDA tests (copies both ways, uva and DMA,
  # loads layer by layer) and, in the same step (8 files come back), the scheduler's host work per round on the
  # multi-turn stream without a model (--null-runner: off / write_through / write_back, the host tier's copies on
  # CUDA; seconds), the multi-turn benchmark off/on (with each pass's device time), then on with write_back.
  banner
  turns=()
  [ "$DRY" = 1 ] && { turns=(--tiny --clients 6 --turns 3 --first-len 64 --user-len 16 --output-len 4
                      --max-total-tokens 512 --max-parallel 2); }
  TAIL=45 step hicache_tests 90 bash -c "$PY -m pytest -q -p no:cacheprovider -rfEs \
    tests/runtime/cache/hicache/test_host_pool.py tests/runtime/cache/hicache/test_layer_loads.py; \
    $PY benchmarks/serving/hicache_multiturn.py --null-runner --out $OUT/hicache_null_runner.json"
  TAIL=24 step hicache_multiturn 220 $PY benchmarks/serving/hicache_multiturn.py "${turns[@]}" --pass-clock \
    --out "$OUT/hicache_multiturn.json"
  TAIL=8 step hicache_multiturn_wb 90 $PY benchmarks/serving/hicache_multiturn.py "${turns[@]}" --only on \
    --write-policy write_back --out "$OUT/hicache_multiturn_write_back.json" ;;
hicache_sgl)
  # issue 54 item 5 on the turn shape of SGLang's benchmark/hicache/bench_multiturn.py (512-token user turns, 64-token
  # answers, 5 rounds): 128 conversations, 32 in flight, a device pool of 110,592 tokens (working set 3.3x), host pool
  # 3.5x; off then on (~3 min).
  banner
  sgl=(--clients 128 --turns 5 --first-len 512 --user-len 512 --output-len 64 --max-parallel 32
       --max-total-tokens 110592 --hicache-ratio 3.5)
  [ "$DRY" = 1 ] && sgl=(--tiny --clients 6 --turns 3 --first-len 64 --user-len 64 --output-len 4 --max-parallel 2
                         --max-total-tokens 512 --hicache-ratio 3.5)
  TAIL=24 step hicache_sgl 260 $PY benchmarks/serving/hicache_multiturn.py "${sgl[@]}" --pass-clock \
    --out "$OUT/hicache_multiturn_sgl_shape.json" ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
[ "$part" = prepare ] || ls -la "$OUT"
