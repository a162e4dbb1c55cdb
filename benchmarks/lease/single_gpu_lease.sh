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
#                                                 # shapes: the batch-invariant GEMM's sweep (table to $OUT and
#                                                 # installed for the later steps), decode (64/256) and 4k-prefill
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
#   bash benchmarks/lease/single_gpu_lease.sh mla [bench] # issue 51: MLA kernels' tests, decode sweep, extend
#   DRY=1 bash benchmarks/lease/single_gpu_lease.sh prepare|p1|p2|spec|vlm|deepseek|all   # HERE, on the CPU: the same scripts
#                                                 # and arguments with tiny random-weight shapes (see "Dry run")
#
# Recommended order for one 30-minute session (a one-GPU machine may count 50% of its held time: about 55 minutes of
# calls over two machines, each given back after 30 minutes held; send the calls back to back, the machine stays warm
# only 30 s). Before the lease, here: `bash benchmarks/lease/single_gpu_lease.sh prepare` and, for the issue 18 A/B,
# `bash benchmarks/ab/ab_trees.sh prepare bcf4a2f`. Estimates (see "Estimates" below) include engine/server starts.
#   call  command (run from the repo root on the device)                      carry                         est.
#   1     bash benchmarks/lease/single_gpu_lease.sh p1                              [".whl"]                      7.5-8 min
#   2     bash benchmarks/lease/single_gpu_lease.sh p2                              [".whl"]                      6.5-7 min
#   3     bash benchmarks/lease/single_gpu_lease.sh spec                            [".whl", ".stage/spec"]       6-6.5 min
#   4     bash benchmarks/lease/single_gpu_lease.sh vlm                             [".whl"]                      7-8 min
#         (about 27 minutes held: the first machine goes back; the next call starts a fresh one, 1-2 min)
#   5     bash benchmarks/lease/startup_lease.sh b                            [".whl"]                      5-9.5 min
#         (issue 20 deliverable 1: Llama-8B cold start-up and compile counts, default and page 16; each engine gets
#         an empty Triton cache from that script, so the order does not matter)
#   6     bash benchmarks/lease/startup_lease.sh a                            [".whl"]                      <= 9.5 min
#   --- a 30-minute budget is spent about here (status's budget_left_s decides); next session, or instead of 5/6:
#   7     bash benchmarks/lease/startup_lease.sh c                            [".whl"]                      <= 9.5 min
#   8     bash benchmarks/lease/startup_lease.sh d                            [".whl", ".stage/base20"]     5-9.5 min
#         (prepare here first: see startup_lease.sh's header)
#   9     AB_BUDGET_S=540 bash benchmarks/ab/ab_trees.sh llama8b 3               [".whl", "ab",                10 min
#                                                                              ".stage/smol.part0",
#                                                                              ".stage/smol.sha256"]
#         (62 of the 64 MiB a call may carry: the tree 6, .whl 14, ab 3.3, part0 38)
#   10    AB_MODES=off,fast AB_BUDGET_S=540 bash benchmarks/ab/ab_trees.sh json 4 [".stage/smol.part1"]        10 min
#         (issue 18, stop 27's "next": 9 and 10 back to back on the SAME machine: 10 reads /tmp/stage and /tmp/site
#         that 9 left; ab/ holds bcf4a2f's tree, the base the issue starts from)
# Knobs (env): P19_PROGRAMS (16), P19_COUNTS (mmlu=512,hellaswag=128: --num-programs-per-workload), P19_SCALE (0.5),
# P19_REPEAT (3: --repeat), P19_REPEAT_MAX_S (5: --repeat-max-seconds),
# P1_VARIANTS, P2_VARIANTS (comma lists of radixlm.bench.programs variants), SPEC_ROUNDS (2), SPEC_REPEAT (3),
# SPEC_QWEN_ROUNDS (1),
# VLM_IMAGES (16: 24 ran past its 240 s step on an H200, three server starts and 4 runs a mode), OV_IMAGES (12).
# After the lease, here: copy what came back into benchmarks/results/ (programs_gpu.{json,md,png} -- or
# `python -m radixlm.bench.programs --merge programs_gpu_p1.json programs_gpu_p2.json --output-file benchmarks/results/
# programs_gpu.json --note "..."` when p1 and p2 ran on different machines --, speculative_gpu.json,
# speculative_gpu_qwen_coder.json,
# llava_bench_qwen2_5_vl_7b_gpu.json, llava_bench_llava_onevision_7b_gpu.json), with the card that ran them.
#
# Estimates, from earlier GPU results in benchmarks/results (H100, Llama-3.1-8B dummy bf16):
#   - a server/engine start: 39 s to ready on a fresh machine (online_llama8b_gpu.json ready_seconds 39.4), less once
#     Triton's cache holds the kernels; counted as 40 s each.
#   - decode step 5.97 ms at batch 1, 6.6 ms at 8, 8.5 ms at 64, 16.7 ms at 256 (ab_planner_llama8b_gpu.json).
#   - issue 19 at --scale 0.5, 16 programs: a sequential variant (no_frontend_parallelism, all_off) decodes every
#     program's output one request at a time: the workloads' budgets (workloads.py) sum to about 3,460 tokens per
#     program at scale 1 (chat_long 1,536, tree_of_thought 720, skeleton 432, judge 323, react 176, ...; dummy weights
#     never hit the stop strings), so about 1,730 x 6 ms + request overheads ~ 11.5 s per program, ~185 s per
#     sequential variant; a parallel variant (16 programs at once) ~20-30 s. p1: 2 starts + 185 + 3 x 25 ~ 340 s;
#     p2: 3 starts + 185 + 2 x 25 ~ 355 s. At --scale 1.0 a sequential variant takes ~370 s: then run p1 without
#     no_frontend_parallelism (P1_VARIANTS) and that variant in a call of its own.
#     Measured on an H200 (benchmarks/results/programs/programs_gpu.json, 16 programs everywhere, no warm-up): p1 300 s wall
#     (variants' runs 14 + 136 + 13 + 19 s), p2 317 s (14 + 15 + 139 s); the rest is server starts, tokenizing and
#     the optimal hit rate. Added since: (a) a warm-up of min(4, n) programs per variant and workload, in parallel
#     even for sequential variants: decode-bound like a 16-program parallel run, so <= that variant's parallel
#     time, ~14 s (no_radix_cache and all_off's server ~19 s): p1 +60 s, p2 +48 s; (b) mmlu and hellaswag at 128
#     programs: +112 programs x the per-program times measured (sequential 12-16 ms + 46-77 ms, parallel 3-9 ms +
#     9-72 ms) plus ~2 s a variant of tokenizing: p1 +28 s, p2 +23 s. So p1 ~390 s of its 530 s, p2 ~390 s of 510 s.
#     Measured with (a) and (b) on an H200 (benchmarks/results/programs/programs_gpu.json): p1 347 s, p2 332 s; mmlu's full
#     and no_frontend_hint (the same configuration for mmlu) gave 240 and 396 programs/s on 0.3-0.5 s runs. Added
#     since: (c) --repeat 3 --repeat-max-seconds 5: a variant's workload whose first run took under 5 s runs twice
#     more (the cache flushed before each, the same programs), medians reported; at that run's durations every
#     workload but chat_long (6-7 s) in the parallel variants (and no_radix_cache's hellaswag, 7.4 s), and mmlu,
#     hellaswag (not all_off's, 9.6 s), generative_agents, chat_short and rag in the sequential ones (the others
#     take 6.7-59 s there: one run). Repeated runs' sum: full 7.1 s, no_frontend_parallelism 13.2, no_frontend_hint
#     7.1, no_radix_cache 10.3, fcfs 7.0, random 7.4, all_off 9.6; twice more plus ~1.5 s a variant of tokenizing and
#     the optimal per run: p1 +90 s, p2 +57 s. So p1 ~440 s of its 530 s, p2 ~390 s of 510 s.
#     (d) mmlu 512 programs instead of 128 (its 128-program runs lasted 0.3-2 s: full and no_frontend_hint, the same
#     configuration for mmlu, gave 240 and 396 programs/s): at those rates ~2 s a parallel run (3 runs), ~8 s
#     all_off's (1 run): p1 ~+25 s, p2 ~+15 s (estimates).
#   - issue 21: 2 rounds (engines interleaved: off, NGRAM, RADIX, STANDALONE, then again) x 4 workloads x 4 batches x
#     (warm-up + 3 runs); each key's row is the median of its 6 runs (--stat median; the best too). Measured on an
#     H200 with 1 round x (warm-up + 2 runs): 126 s in all, the 64 keys' runs 0.2-1.2 s (sum of the fastest 31 s),
#     so ~1.1 s a key and ~14 s an engine start (Triton's cache warm after the first). Now: 8 starts ~115 s + 128
#     key-rounds x (warm-up + 3 runs) ~1.6 s ~205 s: ~320 s. Measured so on an H100 (benchmarks/results/
#     speculative_gpu_log.txt): 257 s; its timeout is now 390 s. spec_qwen (140 s): 1 round (SPEC_QWEN_ROUNDS) x 3
#     engines ~45 s + 12 keys x (warm-up + 3 runs) of quote and edit at batch 1 and 8 (the SmolLM2 step's runs of
#     those keys took ~1-1.5 s a key-round; Qwen's answers are as long) ~20 s, the floor ~5 s: ~75 s.
#     The replayed outputs are SmolLM2's greedy answers recorded on the CPU (benchmarks/results/
#     speculative_smol_ids_cpu.json: quote 42, edit 96, restate 43, story 96 tokens; speculative.py --model default
#     --device cpu --batches 1 --algorithms --repeat 1 --save-ids ...); the target has SmolLM2's vocabulary (49,152),
#     so its floor (weights read per token / copy bandwidth, speculative.py --floor) is that of the replay model.
#     SmolLM2 does not perform `edit`'s rename (it copies the class unchanged: all 96 tokens lie in runs of >= 4
#     tokens found in the prompt), so spec_qwen replays Qwen2.5-Coder-0.5B-Instruct's answers, which rename (91 of
#     96 in such runs; benchmarks/results/speculative/speculative_qwen_coder_ids_cpu.json: quote 45, edit 96, restate 45, story
#     96 tokens; the same record command with --model qwen2.5-coder-0.5b-instruct) on Llama-3.1-8B shapes with
#     Qwen's vocabulary (151,936: the lm_head is 1.2 GB, Llama-3.1's 128,256 is 1.05 GB).
#   - issue 23: per mode a start + a warm-up + 3 runs of 24 images x 3 questions x 256 tokens (256 steps at batch 72,
#     ~2.5 s, plus the prompts); Qwen2.5-VL-7B: 999-1,564 tokens an image at llava_bench's sizes (read by the dry
#     run's llava_bench.py --check-shapes), ~30k prompt tokens a run (x3 without the radix cache): ~3 min; OneVision-7B's
#     any-resolution tiles give 4,725-7,309 tokens an image, so 12 images and 2 repeats (no_radix / no_cache prefill
#     every question's image again, ~200k tokens a run): ~4 min.
#   - issue 20 (startup_lease.sh a-d): never run on a GPU yet, so only its timeouts bound it (570 s a part).
#     Issue 18 (ab_trees.sh): ab_trees llama8b 3 was killed at 600 s after 5 of 6 runs before AB_BUDGET_S existed
#     (ab_planner_llama8b_gpu.json: ~100 s a run), json 2 took ~330 s (stop 27), so each is a full call.
#
# Dry run (DRY=1, here on the CPU; also `DRY=1 ... all`): the same commands with a tiny random-weight Llama (the
# Llama-3.1 tokenizer: benchmarks/lib/models.py's directory, config shrunk), the tiny target/draft shapes with SmolLM2's
# tokenizer (speculative_replay.py --tiny), llava_bench.py --tiny plus both 7B VLM checkpoints written and read back;
# 2 programs per workload (mmlu and hellaswag 3) at scale 0.05, batches 1 and 2, float32, --device cpu; timeouts x
# DRY_TIMEOUT_X (4).
# Proven here on 81abbc0 (`DRY=1 DRY_PYTHONPATH=/tmp/mpl bash benchmarks/lease/single_gpu_lease.sh all`, matplotlib from
# `pip install --target /tmp/mpl matplotlib`; the device image has it): every step rc=0 (p1 52 s, p2 57 s, spec 11 s,
# vlm 42 s on 2 shared cores), all 7 variants x 11 workloads with no failed program, the merged table and PNGs, the
# speculative JSON with its floor fields, LLaVA-bench's three modes, the 7B VLM checkpoints read back.
# With the warm-ups and per-workload counts (p1 and p2 again): rc=0, p1 160 s (beside a pytest run), p2 72 s,
# every warm-up and measured run with no failed program, p1 and p2 merged into 7 variants x 11 workloads.
# With --repeat 3 --repeat-max-seconds 1 (p1 again, beside a pytest run): rc=0 in 141 s, 37 of the 44 cells
# measured 3 times and 7 once (their first run took 1 s or more), no failed program, the spread table written.
# With spec_qwen (prepare and spec again): rc=0, spec 16 s, spec_qwen 18 s, every output identical to off's.
# Results land in $OUT (JSON, markdown, PNG and each step's whole log).
set -uo pipefail
part=${1:?usage: single_gpu_lease.sh prepare|p1|p2|p19vlm|spec|specpair|vlm|determ|deepseek (DRY=1 ...: the CPU dry run; DRY=1 ... all)}
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
step() {
  local name=$1 secs=$(( $2 * X )); shift 2
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
  # issue 55 items 5 and 2, one call of at most 9 minutes: the batch-invariant GEMM's sweep (its table installed in this
  # tree's kernels/gemm/tuned/ for the steps after it, and copied to $OUT), the decode/prefill profile flag off vs on,
  # the invariance check (flag on), the ShareGPT-like throughput off vs on, then release/resume memory.
  banner
  if [ "$DRY" = 1 ]; then
    tune=(env TRITON_INTERPRET=1 $PY -m radixlm.runtime.kernels.gemm.batch_invariant_tune --budget-s 20)
    prof=(--tiny --batches 2 4 --steps 2 --prefill 200)
    check=(--model tiny --device cpu --batches 4 8 --max-new-tokens 4 --chunked-prefill-size 64 --lengths 150 100 200)
    tput=(--model tiny --device cpu --sharegpt-n 16); mem=(--model tiny --device cpu)
  else
    tune=($PY -m radixlm.runtime.kernels.gemm.batch_invariant_tune --budget-s "${DETERM_TUNE_S:-70}" --install)
    prof=(--batches 64 256 --steps 16 --prefill 4000)
    check=(--batches 8 64 256); tput=(--sharegpt-n "${DETERM_SHAREGPT_N:-1000}"); mem=()
  fi
  # A device call returns at most 8 files: six JSON files, and each finished step's log moved into determ_logs.tar.
  logs() { (cd "$OUT" && tar -rf determ_logs.tar determ_*.log && rm -f determ_*.log); }
  step determ_tune 100 "${tune[@]}" --out "$OUT"; logs
  step determ_profile 150 $PY benchmarks/profiling/profile_gpu_step.py "${prof[@]}" --deterministic both --top 15 \
    --out "$OUT/determinism_profile.json"; logs
  step determ_check 90 $PY benchmarks/quality/deterministic_check.py --parts check "${check[@]}" \
    --out "$OUT/determinism_check.json"; logs
  step determ_throughput 120 $PY benchmarks/quality/deterministic_check.py --parts throughput "${tput[@]}" \
    --out "$OUT/determinism_throughput.json"; logs
  step determ_memory 70 $PY benchmarks/quality/deterministic_check.py --parts memory "${mem[@]}" \
    --out "$OUT/release_memory.json"; logs ;;
deepseek)
  # issue 51 item 5: one step, each part's JSON written as it is measured (a killed step keeps the parts done).
  banner
  step deepseek 520 $PY benchmarks/offline/gpu_deepseek.py $([ "$DRY" = 1 ] && echo --tiny) \
    --parts kv plan decode offline --out "$OUT/deepseek_v2_lite_gpu.json" ;;
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
*) echo "unknown part $part" >&2; exit 2 ;;
esac
[ "$part" = prepare ] || ls -la "$OUT"
