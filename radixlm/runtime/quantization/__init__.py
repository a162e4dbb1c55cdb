"""Quantized checkpoints and online quantization (issue 50): the `--quantization` flag and the checkpoint's
`quantization_config` become one QuantConfig (config.py) whose methods (base.py: LinearMethod, MoEMethod) own the
quantized layers' weights and GEMMs; modules.py holds the loader's hooks. Every format's module is imported here,
which registers it (config.register_quant_config)."""
from radixlm.runtime.quantization.base import (
    DequantizingMoEMethod, DrawFn, LinearKind, LinearLayout, LinearMethod, MoEMethod, QuantParam, checkpoint_shape,
    linear_layout, load_sliced, local_shape, moe_layouts, replace_param)
from radixlm.runtime.quantization.config import (
    QuantConfig, QuantizationMethod, checkpoint_quantization_config, is_ignored, name_matches, quant_config_from,
    register_quant_config, registered_methods)
from radixlm.runtime.quantization.modules import (
    deferred_float_weights, dummy_draw, process_weights_after_loading, quantize_modules, quantized_modules)
# The formats (each registers its QuantConfig on import).
from radixlm.runtime.quantization import fp8  # noqa: E402,F401  isort: skip
from radixlm.runtime.quantization import modelopt  # noqa: E402,F401  isort: skip
from radixlm.runtime.quantization import compressed_tensors  # noqa: E402,F401  isort: skip
from radixlm.runtime.quantization import int8  # noqa: E402,F401  isort: skip
from radixlm.runtime.quantization import awq, compressed_w4a16, gptq  # noqa: E402,F401  isort: skip

__all__ = ["DequantizingMoEMethod", "DrawFn", "LinearKind", "LinearLayout", "LinearMethod", "MoEMethod", "QuantConfig",
           "QuantParam", "QuantizationMethod", "checkpoint_quantization_config", "checkpoint_shape",
           "deferred_float_weights", "dummy_draw", "is_ignored", "linear_layout", "load_sliced", "local_shape",
           "moe_layouts", "name_matches", "process_weights_after_loading", "quant_config_from", "quantize_modules",
           "quantized_modules", "register_quant_config", "registered_methods", "replace_param"]
