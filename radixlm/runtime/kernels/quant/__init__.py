"""Quantized GEMMs (FP8 with per-tensor, per-channel or block scales; INT4 weight-only; INT8 per channel) and the
formats' arithmetic.
reference.py defines the layouts and is the CPU path; CUDA kernels live beside it and are checked against it."""
from radixlm.runtime.kernels.quant.reference import (
    FP8_DTYPE, FP8_MAX, INT8_MAX, dequant_fp8, dequant_int4, dequant_int8, fp8_linear, fp8_scale_shape, int4_linear,
    int8_linear, pack_int4, quant_fp8, quant_int4, quant_int8, unpack_int4)

__all__ = ["FP8_DTYPE", "FP8_MAX", "INT8_MAX", "dequant_fp8", "dequant_int4", "dequant_int8", "fp8_linear",
           "fp8_scale_shape", "int4_linear", "int8_linear", "pack_int4", "quant_fp8", "quant_int4", "quant_int8",
           "unpack_int4"]
