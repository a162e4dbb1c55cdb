"""Quantized GEMMs (FP8 with per-tensor, per-channel or block scales; INT4 weight-only; INT8 per channel, CPU path
only) and the formats' arithmetic.
reference.py defines the layouts and is the CPU path; the CUDA kernels live beside it (fp8_act.py, fp8_gemm.py,
fp8_gemv.py, fp8_mma.py, int4_gemm.py, int4_gemv.py, int4_skinny.py, int4_mma.py, int4_dequant.py, splitk.py,
tiles.py: Triton, and cuBLASLt through torch._scaled_mm), checked against it.
fp8_linear and int4_linear (dispatch.py) take the CUDA kernels for CUDA tensors and the reference for CPU ones;
warm_up_linear (warmup.py) builds a layer's kernel variants at start-up."""
from radixlm.runtime.kernels.quant.dispatch import fp8_linear, int4_linear, int4_warmup_rows
from radixlm.runtime.kernels.quant.reference import (
    ACT_EPS, FP8_DTYPE, FP8_MAX, INT8_MAX, dequant_fp8, dequant_fp8_act, dequant_int4, dequant_int8, fp8_linear_w8a8,
    fp8_scale_shape, int8_linear, pack_int4, quant_fp8, quant_fp8_act, quant_int4, quant_int8, unpack_int4)
from radixlm.runtime.kernels.quant.warmup import warm_up_linear
from radixlm.runtime.kernels.lazy import lazy_names

# The CUDA paths by name (Triton modules: loaded on first use), for benchmarks and tests that pick a kernel.
__getattr__ = lazy_names(__name__, {
    "fp8_linear_cuda": "fp8_gemm", "fp8_scaled_linear": "fp8_gemm", "int4_linear_cuda": "int4_gemm",
    "w4a16_linear": "int4_gemm", "w4a16_dequant_linear": "int4_dequant"})

__all__ = ["ACT_EPS", "FP8_DTYPE", "FP8_MAX", "INT8_MAX", "dequant_fp8", "dequant_fp8_act", "dequant_int4",
           "dequant_int8", "fp8_linear", "fp8_linear_cuda", "fp8_linear_w8a8", "fp8_scale_shape", "fp8_scaled_linear",
           "int4_linear", "int4_linear_cuda", "int4_warmup_rows", "int8_linear", "pack_int4", "quant_fp8", "quant_fp8_act",
           "quant_int4",
           "quant_int8", "unpack_int4", "w4a16_dequant_linear", "w4a16_linear", "warm_up_linear"]
