#!/usr/bin/env bash
# Issue 20 (start-up <= 45 s): benchmarks/startup_profile.py on the device, a cold start (an empty Triton cache of its
# own) then a warm one (the same cache), each in a fresh interpreter, each followed by decode steps at batch 1-64.
#   bash benchmarks/startup_lease.sh          # on the device; JSON and logs in $OUT (KINDS=cold: the cold start only)
#   DRY=1 bash benchmarks/startup_lease.sh    # here, on the CPU (tiny shapes; OUT defaults to /tmp/startup_dry)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DRY_OUT=/tmp/startup_dry
. "$HERE/lease_env.sh"
export TRITON_CACHE_DIR=/tmp/startup_triton_cache
rm -rf "$TRITON_CACHE_DIR" && mkdir -p "$TRITON_CACHE_DIR"
for kind in ${KINDS:-cold warm}; do
  timeout 280 $PY benchmarks/startup_profile.py $TINY --out "$OUT/startup_profile_$kind.json" \
    > "$OUT/startup_profile_$kind.log" 2>&1
  echo "== $kind rc=$?"
  grep -v " INFO \|safetensors\|Warn\|warn" "$OUT/startup_profile_$kind.log" | head -40
done
