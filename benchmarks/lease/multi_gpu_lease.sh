#!/usr/bin/env bash
# Issue 24's runs on a two-GPU machine, in three calls of under ten minutes each (send them back to back: the machine
# stays warm 30 s). Run from a git archive of the commit under test (carry it with the wheels):
#   git archive HEAD | tar -x -C .stage/tree          # here, then on the device, carry [".whl", ".stage/tree"]:
#   bash .stage/tree/benchmarks/lease/multi_gpu_lease.sh a  # symmetric-memory all-reduce test, TP=1 vs TP=2 speed
#   bash .stage/tree/benchmarks/lease/multi_gpu_lease.sh b  # Llama-3.1-70B at TP=2, Mixtral-8x7B at TP=2 and EP=2
#   bash .stage/tree/benchmarks/lease/multi_gpu_lease.sh c  # TP correctness; two replicas behind the router vs round robin
#                                                     # vs one replica
#   bash benchmarks/lease/multi_gpu_lease.sh pd        # issue 54: 1 prefill + 1 decode GPU behind the PD router vs two
#                                                     # co-located replicas, 4k-8k prompts at a fixed rate (PD_ARGS)
#   bash benchmarks/lease/multi_gpu_lease.sh f1       # issue 56: the fused all-reduce + norm's 2-GPU tests, its table
#                                                     # against the unfused steps by rows, TP greedy identity (fused)
#   bash benchmarks/lease/multi_gpu_lease.sh f2       # the decode steps and ShareGPT-like with and without it, three
#                                                     # runs in one call (a JSON each: the medians come from them)
# The all-reduce latency table alone: benchmarks/multi_gpu/gpu_multi.py --parts allreduce.
# Results land in $OUT (JSON and logs).
set -uo pipefail
. "$(dirname "$0")/../lib/env.sh"
quiet() { grep -v "safetensors\|Warn\|warn\|fix_mistral\|clean_up\| INFO " ; }
case "${1:-a}" in
  a)
    timeout 60 python3 -m pytest -q -p no:cacheprovider tests/runtime/distributed/test_symm_all_reduce.py 2>&1 | tail -2
    timeout 470 python3 benchmarks/multi_gpu/gpu_multi.py --parts tp --decode-steps 64 --sharegpt-requests 300 \
      --out "$OUT"/multi_tp.json > "$OUT"/a.log 2>&1
    echo "gpu_multi rc=$?"; quiet < "$OUT"/a.log | tail -60 ;;
  b)
    timeout 560 python3 benchmarks/multi_gpu/gpu_multi.py --parts big moe --sharegpt-requests 300 --big-sharegpt-requests 200 \
      --out "$OUT"/multi_big_moe.json > "$OUT"/b.log 2>&1
    echo "gpu_multi rc=$?"; quiet < "$OUT"/b.log | tail -40 ;;
  c)
    timeout 230 python3 benchmarks/multi_gpu/gpu_multi.py --parts correctness --out "$OUT"/multi_correctness.json \
      > "$OUT"/c1.log 2>&1
    echo "gpu_multi rc=$?"; quiet < "$OUT"/c1.log | tail -14
    timeout 330 python3 benchmarks/serving/router.py --kind dp --model llama-3.1-8b --load-format dummy --device cuda \
      --dtype bfloat16 --max-total-tokens 70000 --num-groups 32 --prompts-per-group 8 --system-prompt-len 4096 \
      --question-len 64 --output-len 16 --max-concurrency 32 --order rounds --worker-gpus 0 1 --single-replica \
      --out "$OUT"/router_dp_2gpu.json > "$OUT"/c2.log 2>&1
    echo "router dp rc=$?"; quiet < "$OUT"/c2.log | tail -20 ;;
  d)  # Mixtral alone (decode and offline, each engine in its own process); its `radixlm serve --dp-size 2` smoke
      # (dp_serve_smoke.py) is retired: benchmarks/RETIRED.md
    timeout 420 python3 benchmarks/multi_gpu/gpu_multi.py --parts moe --sharegpt-requests 300 --out "$OUT"/multi_moe.json \
      > "$OUT"/d1.log 2>&1
    echo "gpu_multi rc=$?"; quiet < "$OUT"/d1.log | grep -v "^\s*symm_mem" | tail -16 ;;
  f1)  # stops (status 1) when a 2-GPU test fails: the runs after it would hang on a broken collective
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/runtime/distributed/test_symm_all_reduce.py \
      tests/runtime/disaggregation/test_cuda_ipc.py > "$OUT"/f1t.log 2>&1
    rc=$?; grep -E "Error|assert|passed|failed" "$OUT"/f1t.log | tail -8; [ $rc = 0 ] || exit 1
    timeout 150 python3 benchmarks/multi_gpu/gpu_multi.py --parts allreduce --out "$OUT"/allreduce.json \
      > "$OUT"/f1a.log 2>&1
    echo "allreduce rc=$?"; quiet < "$OUT"/f1a.log | tail -22
    timeout 240 python3 benchmarks/multi_gpu/gpu_multi.py --parts correctness --out "$OUT"/multi_correctness.json \
      > "$OUT"/f1c.log 2>&1
    echo "correctness rc=$?"; quiet < "$OUT"/f1c.log | grep -E "^correctness|wrote" ;;
  f2)  # F2_CONFIGS: gpu_multi.py's TP configs to run (default: TP=1, TP=2 unfused, TP=2)
    for run in 1 2 3; do
      timeout 175 python3 benchmarks/multi_gpu/gpu_multi.py --parts tp --tp-configs ${F2_CONFIGS:-tp1 tp2_unfused tp2} \
        --batches 1 8 16 32 256 --profile-batches --decode-steps 64 --sharegpt-requests 300 \
        --out "$OUT"/multi_tp_r$run.json > "$OUT"/f2_r$run.log 2>&1
      echo "gpu_multi run $run rc=$?"; quiet < "$OUT"/f2_r$run.log | grep -E "decode batch|out tok|/ tp1" | tail -20
    done
    python3 benchmarks/multi_gpu/tp_medians.py "$OUT"/f2_r[123].log --out "$OUT"/multi_tp_medians.json ;;
  pd)
    timeout "${PD_LIMIT_S:-540}" python3 benchmarks/serving/router.py --kind pd ${PD_ARGS:---num-prompts 160 --request-rate 2 3} \
      --out "$OUT"/pd_vs_colocated.json > "$OUT"/pd.log 2>&1
    echo "router pd rc=$?"; quiet < "$OUT"/pd.log | grep -v "^\s*$" | tail -80 ;;
esac
