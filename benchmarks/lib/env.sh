# Sourced by the lease scripts (benchmarks/lease/*.sh: `. "$HERE/../lib/env.sh"`), from the repo root or any
# directory. Sets TREE (the tree holding this file), OUT, PY and TINY (the flag the Python scripts take for tiny
# shapes); the caller is left in $TREE.
#   on the device machine: installs the carried wheels (.whl, from the caller's directory) once per machine, keeps
#     NVLink multicast off, puts the tree on PYTHONPATH and prints the GPU and the torch/triton versions;
#   DRY=1 (the scripts with a CPU dry run; the caller sets DRY_OUT): here on the CPU, the tree's .venv, --tiny shapes,
#     OUT defaults to $DRY_OUT.
TREE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ "${DRY:-0}" = 1 ]; then
  cd "$TREE" || exit 1
  OUT=${OUT:-$DRY_OUT}
  PY=${PY:-$TREE/.venv/bin/python}
  export PYTHONPATH=$TREE PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  TINY=--tiny
  mkdir -p "$OUT"
  echo "DRY RUN on the CPU: $(nproc) cores"
else
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
  if [ ! -f /tmp/site/.installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && touch /tmp/site/.installed || exit 1
  fi
  export PYTHONPATH=/tmp/site:$TREE PYTHONUNBUFFERED=1
  cd "$TREE" || exit 1
  OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  PY=python3
  TINY=
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
fi

# budget_step NAME LIMIT_S CMD...: CMD under the lesser of LIMIT_S and what is left before the caller's `deadline`
# (skipped when under 20 s are left), its output less the libraries' noise to $OUT/NAME.log and its tail (TAIL lines)
# here; with PACK set, $OUT is packed into the file $PACK after each step (a device call returns at most 8 files).
budget_step() {
  local name=$1 limit=$2; shift 2
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 20 ]; then echo "== $name skipped (budget)"; return 0; fi
  [ "$limit" -le "$left" ] || limit=$left
  echo "== $name (limit ${limit}s)"
  timeout "$limit" "$@" 2>&1 | grep -v "safetensors\|Warn\|warn_once\|fix_mistral_regex\|USDT\|clean_up_tokenization" \
    > "$OUT/$name.log"
  echo "rc ${PIPESTATUS[0]}"; tail -n "${TAIL:-40}" "$OUT/$name.log"
  pack_out
}

# pack_out: with PACK set, $OUT packed into the file $PACK (after each step, and after a step's own extra files).
pack_out() {
  if [ -n "${PACK:-}" ]; then tar -cf "$PACK" -C "$OUT" .; fi
}
