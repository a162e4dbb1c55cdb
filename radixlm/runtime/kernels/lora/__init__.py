"""Batched LoRA (Triton, CUDA): each row's `x @ A[slot]^T @ B[slot]^T * scaling[slot]` added to a layer's output, for
a pass whose rows mix adapters and the base model, in two launches per layer: the shrink to the rank space, then the
expand added in place (segment.py). Segments are runs of rows of one slot: a prefill's requests, or with a segment
per row the gather form of decode."""
from radixlm.runtime.kernels.lazy import lazy_names

__getattr__ = lazy_names(__name__, {"segment_lora_add": "segment"})

__all__ = ["segment_lora_add"]
