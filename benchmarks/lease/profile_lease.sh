#!/usr/bin/env bash
# Issue 20, deliverable 2 (where the time goes on the workloads radixlm loses to SGLang) on one GPU, in calls of
# under ten minutes each (send them back to back: the machine stays warm 30 s). Carry [".whl"] (env.sh
# installs the wheels the image lacks). benchmarks/profiling/profile_workloads.py: one engine (defaults, Llama-3.1-8B shapes,
# dummy bf16 weights) per part; each workload measured (wall, tok/s, passes by kind, host phases) then run again with
# torch.profiler over two 40-pass windows (start, steady): device time per kernel per pass kind, GPU idle share.
#   bash benchmarks/lease/profile_lease.sh a   # generated-shared-prefix 32x32 + the decode step at batch 256
#                                        # -> $OUT/profile_a.json; estimate ~150 s (start ~40 s, 2 x ~15 s runs,
#                                        # decode ~30 s), 540 s limit
#   bash benchmarks/lease/profile_lease.sh b   # ShareGPT-like (1000) + random 1024/512 (500) -> $OUT/profile_b.json;
#                                        # estimate ~250 s (start ~40 s, 2 x ~20 s + 2 x ~45 s runs), 540 s limit
#   DRY=1 bash benchmarks/lease/profile_lease.sh a|b|all   # here, on the CPU: the same with --tiny (tiny random Llama)
#   ENGINE_ARGS='{"mixed_chunk": "off"}' NAME=nomix bash benchmarks/lease/profile_lease.sh b   # a variant (A/B)
# Results land in $OUT (one JSON per part, its log with the printed tables).
set -uo pipefail
part=${1:?usage: profile_lease.sh a|b (DRY=1 ...: the CPU dry run; DRY=1 ... all)}
HERE=$(cd "$(dirname "$0")" && pwd)
DRY_OUT=/tmp/profile_dry/out
. "$HERE/env.sh"
run() {  # run NAME PARTS...
  local name=$1${NAME:+_$NAME} t0=$SECONDS; shift
  timeout -k 15 540 $PY benchmarks/profiling/profile_workloads.py $TINY --parts "$@" --engine-args "${ENGINE_ARGS:-{\}}" \
    --out "$OUT/profile_$name.json" \
    > "$OUT/profile_$name.log" 2>&1
  echo "== profile $name rc=$? in $((SECONDS - t0)) s"
  grep -v "safetensors\|Warn\|warn\| INFO \|USDT" "$OUT/profile_$name.log" | tail -"${TAIL:-150}"
}
case "$part" in
  a) run a shared_prefix decode256 ;;
  b) run b sharegpt random ;;
  all) [ "${DRY:-0}" = 1 ] || { echo "'all' is the CPU dry run only (DRY=1)" >&2; exit 2; }
       run a shared_prefix decode256; run b sharegpt random ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
