#!/usr/bin/env bash
# Issue 20: the attention kernels on one GPU in one call (carry [".whl"]): their CUDA tests, the decode kernel against
# its launch variants at large batch, the extend kernel against its variants, and where a decode step's time goes
# (batch 1 and 256). JSON and logs in $OUT.
#   bash benchmarks/attention_probe_lease.sh           # ~8 min
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
bash benchmarks/tree_id.sh
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/runtime/layers/test_decode_attn_variants.py \
  tests/runtime/layers/test_triton_attn.py tests/runtime/layers/test_shared_prefix_attn.py -k "not interpreted" \
  > "$OUT"/tests.log 2>&1; echo "pytest rc=$?"; tail -3 "$OUT"/tests.log
timeout 100 python3 benchmarks/decode_attention_sweep.py --quick --batches 128 256 --ctx 640 1280 --budget-s 80 \
  --out "$OUT"/decode_attention_sweep.json 2>&1 | grep -v Warn
timeout 280 python3 benchmarks/extend_attention_sweep.py --budget-s 230 --out "$OUT"/extend_attention_sweep.json 2>&1 \
  | grep -v Warn
timeout 150 python3 benchmarks/profile_gpu_step.py --batches 1 256 --steps 32 --out "$OUT"/profile_gpu_step.json \
  > "$OUT"/step.log 2>&1; echo "profile_gpu_step rc=$?"; grep -v "safetensors\|Warn\|warn\| INFO " "$OUT"/step.log | tail -40
