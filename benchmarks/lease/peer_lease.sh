#!/usr/bin/env bash
# Issue 20, deliverable 4: benchmarks/peers/peer_side_by_side.py on one GPU, three runs per configuration in one
# lease (send the calls back to back: the machine stays warm 30 s and keeps the kernel cache of run 1). Carry [".whl"]
# (env.sh installs the wheels the image lacks). Run 1 starts with an empty Triton cache; each run's JSON and the
# call's merge land in $OUT. Estimates: a run ~150 s warm, ~180 s cold; the script skips a run that would not end
# inside 540 s (then send it in the next call).
#   bash benchmarks/lease/peer_lease.sh 1 2     # call 1: cold run + warm run (~330 s)
#   bash benchmarks/lease/peer_lease.sh 3       # call 2: warm run (~150 s)
#   NAME=nospd ENGINE_ARGS='{"disable_shared_prefix_decode": true}' bash benchmarks/lease/peer_lease.sh 1 2   # another
#                                         # configuration (its run 1 wipes the cache again: cold)
# Then here, all runs of one configuration:
#   python benchmarks/peers/peer_side_by_side.py merge FILES_AT/*/peer_NAME_r*.json \
#     --out benchmarks/results/peers/peer_side_by_side_NAME.json
#   DRY=1 bash benchmarks/lease/peer_lease.sh 1 2 3   # here, on the CPU: the same with --tiny (OUT default /tmp/peer_dry)
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: peer_lease.sh RUN_INDEX... (DRY=1 ...: the CPU dry run)" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
DRY_OUT=/tmp/peer_dry
. "$HERE/../lib/env.sh"
bash benchmarks/lib/tree_id.sh
$PY benchmarks/peers/peer_side_by_side.py run "$@" $TINY --out-dir "$OUT" --name "${NAME:-default}" \
  --engine-args "${ENGINE_ARGS:-{\}}" --budget-s "${BUDGET_S:-540}" 2>&1 \
  | awk '/larger graphs|captured CUDA graphs/ || !/safetensors|Warn|warn| INFO |USDT/'
