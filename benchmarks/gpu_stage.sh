# Sourced by the GPU benchmark scripts. The GPU machine has no network: an earlier call staged in $STAGE the
# wheels it lacks (wheels/) and SmolLM2-135M-Instruct's GGUF in two parts (smol.gguf.part00/01, smol.sha256),
# because one call carries at most 64 MiB. Sets GGUF and OUT.
STAGE=${STAGE:-/tmp/stage}
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$STAGE"/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
GGUF=$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf
cat "$STAGE"/smol.gguf.part00 "$STAGE"/smol.gguf.part01 > "$GGUF"
echo "$(cat "$STAGE"/smol.sha256)  $GGUF" | sha256sum -c -
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
