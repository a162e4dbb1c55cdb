"""Batched LoRA (Triton, CUDA): each row's `x @ A[slot]^T @ B[slot]^T * scaling[slot]` added to a layer's output, for
a pass whose rows mix adapters and the base model, in two launches per layer (gather.py): the shrink to the rank
space (K split over programs for decode's few rows), then the expand added in place, reading only each fused part's
rank block of B. Rows come grouped by slot in blocks (lora/blocks.py): exactly a pass's blocks for eager passes,
fixed grids read through an index for CUDA-graph decode."""
from radixlm.runtime.kernels.lazy import lazy_names
from radixlm.runtime.kernels.lora.shapes import EAGER_BLOCK_ROWS, GATHER_BLOCK_ROWS, check_lora_args, check_parts

__getattr__ = lazy_names(__name__, {"gather_lora_add": "gather", "split_k": "gather"})

__all__ = ["EAGER_BLOCK_ROWS", "GATHER_BLOCK_ROWS", "check_lora_args", "check_parts", "gather_lora_add", "split_k"]
