"""Quantized GEMMs (FP8 with per-tensor, per-channel or block scales; INT4 weight-only) and the formats' arithmetic.
reference.py defines the layouts and is the CPU path; CUDA kernels live beside it and are checked against it."""
from radixlm.runtime.kernels.quant.reference import (
    FP8_DTYPE, FP8_MAX, dequant_fp8, dequant_int4, fp8_linear, fp8_scale_shape, int4_linear, pack_int4, quant_fp8,
    quant_int4, unpack_int4)

__all__ = ["FP8_DTYPE", "FP8_MAX", "dequant_fp8", "dequant_int4", "fp8_linear", "fp8_scale_shape", "int4_linear",
           "pack_int4", "quant_fp8", "quant_int4", "unpack_int4"]
