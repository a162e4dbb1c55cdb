"""The GPU VLM shapes of llava_bench.py (Qwen2.5-VL-7B, LLaVA-OneVision-7B), checked on the CPU without a model: each
checkpoint directory (config, tokenizer, processor; dummy weights) is written and read back as the server reads it,
and an image of each of llava_bench's GPU sizes is preprocessed (tokens per image: the prompt sizes the GPU run
meets). Used by `DRY=1 bash benchmarks/single_gpu_lease.sh vlm`.

    python benchmarks/vlm_shapes_check.py /tmp/vlm
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PIL import Image  # noqa: E402

from benchmarks.vlm_checkpoints import VlmShape, write_checkpoint  # noqa: E402
from radixlm.runtime.model_loader.config import ModelConfig  # noqa: E402
from radixlm.runtime.model_loader.tokenizer import get_tokenizer  # noqa: E402
from radixlm.runtime.multimodal.media import MediaLoader, MediaPolicy  # noqa: E402
from radixlm.runtime.multimodal.processor import MultimodalProcessor  # noqa: E402

SIZES = ((1024, 768), (1280, 960), (768, 1024))  # llava_bench.py's GPU image sizes


def main(root: str) -> None:
    for shape in (VlmShape.QWEN2_5_VL_7B, VlmShape.LLAVA_ONEVISION_7B):
        ck = write_checkpoint(shape, Path(root) / shape.value)
        cfg = ModelConfig.from_path(str(ck.path), dtype="bfloat16", load_format="dummy")
        proc = MultimodalProcessor.for_model(str(ck.path), get_tokenizer(str(ck.path)), MediaLoader(MediaPolicy()))
        tokens = [proc.preprocess([Image.new("RGB", size)])[0].num_tokens for size in SIZES]
        print(f"{shape.value}: {cfg.architecture}, {cfg.num_layers} layers, context {cfg.context_len}, vocab "
              f"{cfg.vocab_size}, dummy weights {not ck.has_weights}; tokens per image at {SIZES}: {tokens}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/vlm_shapes")
