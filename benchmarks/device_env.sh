# Sourced by the lease scripts (benchmarks/*_lease.sh) at the root of the tree under test on the device machine:
# installs the carried wheels (.whl) once per machine, keeps NVLink multicast off, and puts the tree on PYTHONPATH.
# Sets TREE and OUT; the caller is left in $TREE.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
if [ ! -f /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.installed || exit 1
fi
TREE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH=/tmp/site:$TREE PYTHONUNBUFFERED=1
cd "$TREE" || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
