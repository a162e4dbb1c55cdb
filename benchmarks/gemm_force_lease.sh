#!/usr/bin/env bash
# Issue 20: does start-up's few-row GEMM choice move the larger batches' decode steps? (Batch 4 ran 6.34 ms in the
# engines whose o_proj took cuBLAS at 1 and 2 rows in every layer, 6.49-6.51 ms in the others:
# benchmarks/results/kernels_h100/gemm_choice_ab/README.md.) One device call, carry [".whl"]: for each setting of
# FORCES (";"-separated; "none" measures as start-up does), benchmarks/decode_gaps_gpu.py at BATCHES, ROUNDS times
# with the settings alternating; PROFILE=1 then profiles each setting once at PROFILE_BATCHES (profile_gpu_step.py).
#   bash benchmarks/gemm_force_lease.sh      # ~6 min: 3 settings x 2 rounds of an engine start and 3 batch sizes
#   FORCES="none;o_proj=cublas" BATCHES="4 8" ROUNDS=3 PROFILE=1 bash benchmarks/gemm_force_lease.sh
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
bash benchmarks/tree_id.sh
FORCES=${FORCES:-none;o_proj=cublas;o_proj=cublas down_proj=cublas}
IFS=';' read -ra settings <<< "$FORCES"
tag() { [ "$1" = none ] && echo none || echo "$1" | tr ' =' '_-'; }
force() { [ "$1" = none ] || echo "--force $1"; }
for round in $(seq 1 "${ROUNDS:-2}"); do
  for s in "${settings[@]}"; do
    echo "== $s (round $round)" | tee -a "$OUT/probe.log"
    # shellcheck disable=SC2046  # force's words are the arguments
    timeout 300 python3 benchmarks/decode_gaps_gpu.py --batches ${BATCHES:-4 8 256} $(force "$s") \
      --out "$OUT/gaps_$(tag "$s")_r$round.json" 2>&1 | tee -a "$OUT/probe.log" | grep -E "^batch|^few-row"
  done
done
if [ -n "${PROFILE:-}" ]; then
  for s in "${settings[@]}"; do
    echo "== profile $s" | tee -a "$OUT/probe.log"
    # shellcheck disable=SC2046
    timeout 300 python3 benchmarks/profile_gpu_step.py --steps 32 --batches ${PROFILE_BATCHES:-4} $(force "$s") \
      --out "$OUT/profile_$(tag "$s").json" 2>&1 | tee -a "$OUT/probe.log" | grep -E "^batch"
  done
fi
