"""W8A8-INT8: symmetric per-output-channel INT8 weights (`weight` int8 (N, K), `weight_scale` (N, 1)) with
activations quantized per token at run time (dynamic) or by a static per-tensor `input_scale`. Read from SGLang's
`w8a8_int8` checkpoints and from compressed-tensors' `int-quantized` groups (8-bit int weights, strategy channel).

After loading: `weight` (N, K) int8 and `weight_scale` (N,) float32 (kernels.quant's INT8 layout); FusedMoE the
same per expert. On CPU activations are not quantized (kernels.quant.int8_linear)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixlm.runtime.kernels.quant import dequant_int8, int8_linear, quant_int8
from radixlm.runtime.layers.moe import FusedMoE
from radixlm.runtime.quantization.base import (DequantizingMoEMethod, LinearMethod, MoEMethod, QuantParam,
                                               moe_layouts, replace_param)
from radixlm.runtime.quantization.compressed_tensors import register_ct_scheme
from radixlm.runtime.quantization.config import QuantConfig, QuantizationMethod, is_ignored, register_quant_config


@dataclass(frozen=True)
class Int8Scheme:
    static_input: bool = False

    def params(self) -> list[QuantParam]:
        out = [QuantParam("weight", torch.int8, exact_dtype=True),
               QuantParam("weight_scale", torch.float32, out_dim=0, in_dim=None)]
        if self.static_input:
            out.append(QuantParam("input_scale", torch.float32, out_dim=None, in_dim=None, per_shard=True))
        return out

    def quantize(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scale = quant_int8(w)
        out = {"weight": q, "weight_scale": scale[:, None]}
        if self.static_input:
            out["input_scale"] = torch.tensor(1.0 / 64)
        return out


class Int8LinearMethod(LinearMethod):
    def __init__(self, scheme: Int8Scheme):
        self.scheme = scheme

    def params(self, layer: nn.Module) -> list[QuantParam]:
        return self.scheme.params()

    def quantize_checkpoint(self, layer: nn.Module, w: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.scheme.quantize(w)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.scheme.static_input:
            replace_param(layer, "input_scale", layer.input_scale.data.max())

    def dequantized_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        return dequant_int8(layer.weight, layer.weight_scale, dtype)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return int8_linear(x, layer.weight, layer.weight_scale, bias)


class Int8MoEMethod(DequantizingMoEMethod):
    def __init__(self, scheme: Int8Scheme):
        self.scheme = scheme

    def params(self, layer: nn.Module) -> list[QuantParam]:
        return self.scheme.params()

    def quantize_checkpoint(self, layer: nn.Module, w: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.scheme.quantize(w)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.scheme.static_input:
            for prefix in moe_layouts(layer):
                replace_param(layer, f"{prefix}_input_scale", getattr(layer, f"{prefix}_input_scale").data.max())

    def dequantized(self, layer: nn.Module, prefix: str, dtype: torch.dtype) -> torch.Tensor:
        w, scale = getattr(layer, f"{prefix}_weight"), getattr(layer, f"{prefix}_weight_scale")
        return torch.stack([dequant_int8(w[e], scale[e], dtype) for e in range(w.shape[0])])

    def grouped_experts(self, layer: nn.Module, dtype: torch.dtype, device: torch.device) -> tuple | None:
        """Weight-only on CUDA (the grouped kernels' 8-bit mode: int8 tiles converted in registers, per-channel
        scales), as the CPU path: activations are not quantized."""
        from radixlm.runtime.kernels.moe.quant_moe import ScaledExperts, grouped_supported

        w13, w2 = (ScaledExperts(getattr(layer, f"{p}_weight"), getattr(layer, f"{p}_weight_scale"))
                   for p in ("w13", "w2"))
        return (w13, w2) if grouped_supported(w13, w2, dtype, device) else None


def _method(scheme: Int8Scheme, is_moe: bool) -> LinearMethod | MoEMethod:
    return Int8MoEMethod(scheme) if is_moe else Int8LinearMethod(scheme)


@register_ct_scheme("int", 8, "int-quantized")
def int8_scheme_method(scheme, is_moe: bool) -> LinearMethod | MoEMethod:
    w, act = scheme.weights, scheme.input_activations
    strategy = getattr(w.strategy, "value", w.strategy)
    if strategy != "channel" or not w.symmetric or w.dynamic:
        raise ValueError(f"INT8 weights must be static, symmetric and per channel (got strategy {strategy!r}, "
                         f"symmetric {w.symmetric})")
    if act is not None:
        if getattr(act.type, "value", act.type) != "int" or act.num_bits != 8 or not act.symmetric:
            raise ValueError("INT8 weights take symmetric int8 input activations (or none)")
        act_strategy = getattr(act.strategy, "value", act.strategy)
        if not act.dynamic and act_strategy != "tensor":
            raise ValueError(f"static int8 input activation scales per {act_strategy!r} (per tensor only)")
    return _method(Int8Scheme(static_input=act is not None and not act.dynamic), is_moe)


@register_quant_config(QuantizationMethod.W8A8_INT8)
@dataclass(frozen=True)
class W8A8Int8Config(QuantConfig):
    """SGLang's `w8a8_int8` checkpoints (dynamic per-token activations)."""

    ignore: tuple[str, ...] = ()

    method = QuantizationMethod.W8A8_INT8

    @classmethod
    def from_checkpoint(cls, config: dict[str, Any], requested: QuantizationMethod | None) -> "W8A8Int8Config":
        return cls(tuple(config.get("ignored_layers") or ()) + tuple(config.get("modules_to_not_convert") or ()))

    def method_for(self, prefix: str, layer: nn.Module) -> LinearMethod | MoEMethod | None:
        if is_ignored(prefix, self.ignore):
            return None
        return _method(Int8Scheme(), isinstance(layer, FusedMoE))
