"""Batched LoRA (Triton, CUDA): each row's `x @ A[slot]^T @ B[slot]^T * scaling[slot]` added to a layer's output, for
a pass whose rows mix adapters and the base model, in two launches per layer: the shrink to the rank space, then the
expand added in place (segment.py). Segments are runs of rows of one slot: a prefill's requests, or with a segment
per row the gather form of decode.
gather.py: CUDA-graph decode's form, blocks of rows grouped by slot read through an index, on fixed grids."""
from radixlm.runtime.kernels.lazy import lazy_names
from radixlm.runtime.kernels.lora.shapes import GATHER_BLOCK_ROWS, check_lora_args

__getattr__ = lazy_names(__name__, {"segment_lora_add": "segment", "gather_lora_add": "gather"})

__all__ = ["GATHER_BLOCK_ROWS", "check_lora_args", "gather_lora_add", "segment_lora_add"]
