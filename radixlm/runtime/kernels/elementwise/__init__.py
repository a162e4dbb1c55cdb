"""Per-row Triton kernels (CUDA): RMSNorm with the residual add, SiLU-and-mul, the rotary embedding with the KV
store, the KV store alone, and their rotation and store steps for other kernels (rotate_halves, kv_cache_value: a
float8 pool's quantization) (fused_kernels.py); the sampler's row argmax (argmax.py); rows of many buffers into
another GPU's (row_copy.py); the all-reduce with the residual add and RMSNorm after it (allreduce_rmsnorm.py).
inline_builds: those a start-up discovery run must not skip."""
from radixlm.runtime.kernels.lazy import lazy_names

__getattr__ = lazy_names(__name__, {
    "rmsnorm": "fused_kernels", "silu_and_mul": "fused_kernels", "rotary_": "fused_kernels",
    "store_kv": "fused_kernels", "rotate_halves": "fused_kernels",
    "kv_cache_value": "fused_kernels", "silu_mul": "fused_kernels", "argmax_rows": "argmax", "copy_rows": "row_copy",
    "allreduce_add_rmsnorm": "allreduce_rmsnorm", "inline_builds": "allreduce_rmsnorm"})

__all__ = ["allreduce_add_rmsnorm", "argmax_rows", "copy_rows", "inline_builds", "kv_cache_value", "rmsnorm", "rotary_",
           "rotate_halves", "silu_and_mul", "silu_mul", "store_kv"]
