# Sourced by the lease scripts that have a CPU dry run (profile_lease.sh, peer_lease.sh), from the repo root or any
# directory: DRY=1 runs here on the CPU (the tree's .venv, --tiny shapes, OUT defaults to $DRY_OUT); otherwise on
# the device machine (device_env.sh: the carried wheels, multicast off) with a banner of the GPU and versions.
# Sets TREE, OUT, PY and TINY (the flag the Python scripts take for tiny shapes); the caller is left in $TREE.
if [ "${DRY:-0}" = 1 ]; then
  TREE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  cd "$TREE" || exit 1
  OUT=${OUT:-$DRY_OUT}
  PY=${PY:-$TREE/.venv/bin/python}
  export PYTHONPATH=$TREE PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  TINY=--tiny
  mkdir -p "$OUT"
  echo "DRY RUN on the CPU: $(nproc) cores"
else
  . "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
  PY=python3
  TINY=
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
fi
