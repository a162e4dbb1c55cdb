#!/usr/bin/env bash
# The suite's CUDA paths on the device: every test module with a CUDA branch (found by grep, so a new one is picked
# up), the quantization tests and the CUDA engine tests, in one pytest run (a skip on CPU is a run here).
#   bash benchmarks/lease/gpu_tests.sh          # carry [".whl"]; $OUT/gpu_tests.{log,xml}
#   bash benchmarks/lease/gpu_tests.sh PATH...  # those modules/tests only
# Excluded: modules that need SmolLM2/Qwen2.5 GGUF files (not on the device) and the multi-GPU ones (KINDS.md).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib/env.sh"
if [ $# -gt 0 ]; then mods=("$@"); else
mapfile -t mods < <(grep -rlE "cuda\.is_available|requires_cuda|HAS_CUDA" tests --include='test_*.py' \
  | grep -v -e test_symm_all_reduce -e test_real_model | sort)
mods+=(tests/runtime/quantization)
fi
printf '%s\n' "${mods[@]}"
timeout "${GPU_TESTS_LIMIT_S:-540}" $PY -m pytest -q -p no:cacheprovider -v -rfEs --durations=15 --continue-on-collection-errors -o faulthandler_timeout=150 \
  --ignore tests/runtime/quantization/test_real_model.py --junitxml "$OUT/gpu_tests.xml" "${mods[@]}" \
  2>&1 | grep --line-buffered -v "Warn\|USDT" > "$OUT/gpu_tests.log"
echo "pytest rc=${PIPESTATUS[0]}"
grep -E " (passed|failed|error)" "$OUT/gpu_tests.log" | tail -3
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -40
