"""Batched LoRA (Triton, CUDA): each row's `x @ A[slot]^T @ B[slot]^T * scaling[slot]` added to a layer's output, for
a pass whose rows mix adapters and the base model, in two launches per layer: the shrink to the rank space (K split
over programs), then the expand added in place, reading only each fused part's rank block of B. Eager passes
(gather.py): rows grouped by slot in blocks of 64 (lora/blocks.py). CUDA-graph decode (decode.py): padded blocks of
a few rows per slot, each expand program streaming a chunk of output tiles, its launch parameters a LoraDecodeConfig
(config.py; swept per GPU model)."""
from radixlm.runtime.kernels.lazy import lazy_names
from radixlm.runtime.kernels.lora.config import LoraDecodeConfig, config_for
from radixlm.runtime.kernels.lora.shapes import EAGER_BLOCK_ROWS, GATHER_BLOCK_ROWS, check_lora_args, check_parts

__getattr__ = lazy_names(__name__, {"gather_lora_add": "gather", "split_k": "gather", "decode_lora_add": "decode",
                                    "decode_shrink": "decode", "decode_expand": "decode",
                                    "decode_partials": "decode"})

__all__ = ["EAGER_BLOCK_ROWS", "GATHER_BLOCK_ROWS", "LoraDecodeConfig", "check_lora_args", "check_parts",
           "config_for", "decode_expand", "decode_lora_add", "decode_partials", "decode_shrink", "gather_lora_add",
           "split_k"]
