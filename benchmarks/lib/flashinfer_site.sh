# FlashInfer for the device machine, which has no network and takes 64 MiB of carried files: its wheel (62 MB) holds
# sources for every kernel family; the decode and prefill JIT needs only the top-level csrc files, include/, cutlass's
# and cccl's headers. Not a dependency of radixlm (benchmarks/kernels/flashinfer_decode_ab.py is its only user).
#   bash benchmarks/lib/flashinfer_site.sh build     # here (network): .whl/flashinfer_site.tar.xz (~18 MB), carried
#                                                    # with .whl
#   . benchmarks/lib/flashinfer_site.sh install      # on the device: unpacked to /tmp/fisite, PYTHONPATH and PATH set,
#                                                    # the JIT built for sm_90 only
FLASHINFER_VERSION=0.7.2.post1
case ${1:?usage: flashinfer_site.sh build | install} in
build)
  set -euo pipefail
  top=$(git rev-parse --show-toplevel)
  work=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$work/dl" "flashinfer-python==$FLASHINFER_VERSION" nvidia-ml-py einops tabulate ninja cuda-python \
    cuda-bindings cuda-pathfinder 2> >(grep -v "is ignored" >&2)
  for w in "$work"/dl/*.whl; do unzip -q -o "$w" -d "$work/site"; done  # a wheel is its site-packages layout
  mkdir -p "$work/site/bin"
  cp "$work"/site/ninja-*.data/scripts/ninja "$work/site/bin/ninja" 2>/dev/null \
    || find "$work/site" -path "*ninja*" -name ninja -type f -perm -u+x -exec cp {} "$work/site/bin/ninja" \;
  chmod +x "$work/site/bin/ninja"
  data=$work/site/flashinfer/data
  rm -rf "$data"/csrc/*/ "$work"/site/*.data
  for d in "$data"/cutlass/*; do [ "$(basename "$d")" = include ] || rm -rf "$d"; done
  mkdir -p "$top/.whl"
  tar cf - -C "$work/site" . | xz -T0 -6 > "$top/.whl/flashinfer_site.tar.xz"
  rm -rf "$work"
  ls -la "$top/.whl/flashinfer_site.tar.xz"
  ;;
install)
  if [ ! -f /tmp/fisite/.installed ]; then
    mkdir -p /tmp/fisite && tar xJf .whl/flashinfer_site.tar.xz -C /tmp/fisite && touch /tmp/fisite/.installed
  fi
  export PYTHONPATH=/tmp/fisite:${PYTHONPATH:-} PATH=/tmp/fisite/bin:$PATH FLASHINFER_CUDA_ARCH_LIST=9.0
  [ -n "${CUDA_HOME:-}" ] || command -v nvcc >/dev/null || export CUDA_HOME=/usr/local/cuda
  ;;
esac
