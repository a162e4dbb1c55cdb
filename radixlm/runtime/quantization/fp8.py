"""FP8 (e4m3) weights: SGLang's / vLLM's `fp8` checkpoints (per-tensor `weight_scale`, one per merged shard, or
`weight_block_size` blocks with `weight_scale_inv`), `w8a8_fp8` (per-channel `weight_scale` (N, 1)), and online FP8
(`--quantization fp8` or `w8a8_fp8` on a float checkpoint: each linear and expert quantized at load, per output
channel, as it is read: the float model is never held whole).

Static activation scales (`activation_scheme: static`, `input_scale` per shard) are loaded and kept as the layer's
`input_scale` (the maximum over merged shards, as vLLM); on CPU activations are not quantized (kernels.quant).

After loading every FP8 layer holds the kernels.quant layout: `weight` (N, K) float8_e4m3fn, `weight_scale`
float32 of shape () (per tensor), (N,) (per channel; merged shards with different per-tensor scales are expanded to
it, exactly) or (ceil(N / bn), ceil(K / bk)) with `layer.weight_block` = (bn, bk); FusedMoE the same per expert
(w13_weight, w13_weight_scale, w2_...; the expert dim first)."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixlm.runtime.kernels.gemm import Prologue, RotaryStore
from radixlm.runtime.kernels.quant import FP8_DTYPE, dequant_fp8, fp8_linear, quant_fp8
from radixlm.runtime.layers.moe import FusedMoE
from radixlm.runtime.quantization.base import (DequantizingMoEMethod, LinearMethod, MoEMethod, QuantParam,
                                               linear_layout, moe_layouts, replace_param)
from radixlm.runtime.quantization.config import QuantConfig, QuantizationMethod, is_ignored, register_quant_config


class Fp8Granularity(str, enum.Enum):
    TENSOR = "tensor"
    CHANNEL = "channel"
    BLOCK = "block"


class ActivationScheme(str, enum.Enum):
    DYNAMIC = "dynamic"
    STATIC = "static"


@dataclass(frozen=True)
class Fp8Scheme:
    """One FP8 weight format. serialized False: online (the checkpoint is float; quantized per channel at load)."""

    granularity: Fp8Granularity
    activation: ActivationScheme = ActivationScheme.DYNAMIC
    block: tuple[int, int] | None = None
    serialized: bool = True
    scale_name: str = "weight_scale"  # the fp8 format's blocks: weight_scale_inv

    def __post_init__(self) -> None:
        if (self.granularity is Fp8Granularity.BLOCK) != (self.block is not None):
            raise ValueError(f"FP8 scheme {self.granularity.value}: a block size goes with block scales only")
        if self.block is not None and (len(self.block) != 2 or min(self.block) < 1):
            raise ValueError(f"FP8 block size {self.block} must be two positive integers")
        if self.activation is ActivationScheme.STATIC and self.granularity is Fp8Granularity.BLOCK:
            raise ValueError("block FP8 takes dynamic activation scales only")
        if not self.serialized and self.granularity is not Fp8Granularity.CHANNEL:
            raise ValueError("online FP8 quantizes per output channel")

    def weight_params(self) -> list[QuantParam]:
        out = [QuantParam("weight", FP8_DTYPE, exact_dtype=True)]
        if self.granularity is Fp8Granularity.TENSOR:
            out.append(QuantParam(self.scale_name, torch.float32, out_dim=None, in_dim=None, per_shard=True))
        elif self.granularity is Fp8Granularity.CHANNEL:
            out.append(QuantParam(self.scale_name, torch.float32, out_dim=0, in_dim=None))
        else:
            bn, bk = self.block
            out.append(QuantParam(self.scale_name, torch.float32, out_unit=bn, in_unit=bk))
        if self.activation is ActivationScheme.STATIC:
            out.append(QuantParam("input_scale", torch.float32, out_dim=None, in_dim=None, per_shard=True))
        return out

    def quantize(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """A float weight's checkpoint tensors in this format (online: the float weight itself)."""
        if not self.serialized:
            return {"weight": w}
        q, scale = quant_fp8(w, self.block, self.granularity is Fp8Granularity.CHANNEL)
        out = {"weight": q, self.scale_name: scale}
        if self.activation is ActivationScheme.STATIC:
            out["input_scale"] = torch.tensor(1.0 / 64)
        return out


def online_quantized(w, what: str, device: torch.device) -> dict[str, torch.Tensor]:
    """Online FP8 of a whole float checkpoint tensor, per output channel, on the layer's device: quantized whole on
    every rank (a row-parallel rank's slice alone would give other scales), then sliced like a checkpoint's."""
    dtype = getattr(w, "dtype", None)
    if dtype is not None and not (dtype.is_floating_point and dtype.itemsize > 1):
        raise ValueError(f"tensor {what} is stored as {dtype}: online FP8 (--quantization without a checkpoint "
                         f"quantization_config) quantizes float checkpoints only")
    q, scale = quant_fp8((w if isinstance(w, torch.Tensor) else w[...]).to(device), per_channel=True)
    return {"weight": q, "weight_scale": scale}


def _per_shard_scale(scale: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """(shards,) per-tensor scales of merged shards -> one value, or per channel where they differ (exact)."""
    if bool((scale == scale[0]).all()):
        return scale[0].clone()
    return scale.repeat_interleave(torch.tensor(sizes, device=scale.device))


class Fp8LinearMethod(LinearMethod):
    def __init__(self, scheme: Fp8Scheme):
        self.scheme = scheme

    def params(self, layer: nn.Module) -> list[QuantParam]:
        return self.scheme.weight_params()

    def weight_shards(self, layer: nn.Module, pname: str) -> list:
        if not self.scheme.serialized and pname == "weight_scale":
            return []  # made from the weight at load
        return super().weight_shards(layer, pname)

    def load_weight(self, layer: nn.Module, pname: str, param: nn.Parameter, w, shard_id) -> None:
        if self.scheme.serialized or pname != "weight":
            return super().load_weight(layer, pname, param, w, shard_id)
        for name, t in online_quantized(w, pname, param.device).items():
            super().load_weight(layer, name, getattr(layer, name), t, shard_id)

    def quantize_checkpoint(self, layer: nn.Module, w: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.scheme.quantize(w)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        s = self.scheme
        scale = getattr(layer, s.scale_name).data
        if s.granularity is Fp8Granularity.TENSOR:
            scale = _per_shard_scale(scale, [sh.local for sh in linear_layout(layer).shards])
        replace_param(layer, s.scale_name, None)
        replace_param(layer, "weight_scale", scale)
        if s.activation is ActivationScheme.STATIC:
            replace_param(layer, "input_scale", layer.input_scale.data.max())
        layer.weight_block = s.block

    def dequantized_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        return dequant_fp8(layer.weight, layer.weight_scale, layer.weight_block, dtype)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.apply_with_prologue(layer, x, bias, None)

    def apply_with_prologue(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                            prologue: Prologue | None, epilogue: RotaryStore | None = None) -> torch.Tensor:
        static = layer.input_scale if self.scheme.activation is ActivationScheme.STATIC else None
        return fp8_linear(x, layer.weight, layer.weight_scale, layer.weight_block, bias, static, prologue,
                          layer.gemm_choices, epilogue)


class Fp8MoEMethod(DequantizingMoEMethod):
    """FP8 experts. The CPU path dequantizes them (kernels.quant) and runs the float experts; CUDA passes run the
    grouped FP8 kernels (kernels.moe.quant_moe) on the loaded tensors (compute capability 8.9 and up)."""

    def __init__(self, scheme: Fp8Scheme):
        self.scheme = scheme

    def params(self, layer: nn.Module) -> list[QuantParam]:
        return self.scheme.weight_params()

    def weight_shards(self, layer: nn.Module, pname: str) -> list:
        if not self.scheme.serialized and pname.endswith("_weight_scale"):
            return []  # made from the weight at load
        return super().weight_shards(layer, pname)

    def load_weight(self, layer: nn.Module, pname: str, param: nn.Parameter, w, shard_id) -> None:
        prefix, _, name = pname.partition("_")
        if self.scheme.serialized or name != "weight":
            return super().load_weight(layer, pname, param, w, shard_id)
        for name, t in online_quantized(w, pname, param.device).items():
            super().load_weight(layer, f"{prefix}_{name}", getattr(layer, f"{prefix}_{name}"), t, shard_id)

    def quantize_checkpoint(self, layer: nn.Module, w: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.scheme.quantize(w)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        s = self.scheme
        for prefix, layout in moe_layouts(layer).items():
            scale = getattr(layer, f"{prefix}_{s.scale_name}").data
            if s.granularity is Fp8Granularity.TENSOR:
                sizes = [sh.local for sh in layout.shards]
                per = [_per_shard_scale(scale[e], sizes) for e in range(scale.shape[0])]
                if any(p.dim() for p in per):
                    n = sum(sizes)
                    per = [p.expand(n) if p.dim() == 0 else p for p in per]
                scale = torch.stack(per)
            replace_param(layer, f"{prefix}_{s.scale_name}", None)
            replace_param(layer, f"{prefix}_weight_scale", scale)
            if s.activation is ActivationScheme.STATIC:
                replace_param(layer, f"{prefix}_input_scale", getattr(layer, f"{prefix}_input_scale").data.max())
        layer.weight_block = s.block

    def dequantized(self, layer: nn.Module, prefix: str, dtype: torch.dtype) -> torch.Tensor:
        w, scale = getattr(layer, f"{prefix}_weight"), getattr(layer, f"{prefix}_weight_scale")
        return torch.stack([dequant_fp8(w[e], scale[e], layer.weight_block, dtype) for e in range(w.shape[0])])

    def grouped_experts(self, layer: nn.Module, dtype: torch.dtype, device: torch.device) -> tuple | None:
        """The loaded layout as is: weight (E, N, K) FP8, scale (E,) / (E, N) / (E, N / bn, K / bk); a static input
        scale serves the w8a8 launches (prefill)."""
        from radixlm.runtime.kernels.moe.quant_moe import ScaledExperts, grouped_supported

        static = self.scheme.activation is ActivationScheme.STATIC
        w13, w2 = (ScaledExperts(getattr(layer, f"{p}_weight"), getattr(layer, f"{p}_weight_scale"),
                                 layer.weight_block, getattr(layer, f"{p}_input_scale") if static else None)
                   for p in ("w13", "w2"))
        return (w13, w2) if grouped_supported(w13, w2, dtype, device) else None


def _block_size(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and v > 0
                                                                         for v in value)):
        raise ValueError(f"quantization_config.weight_block_size {value!r} must be two positive integers")
    return int(value[0]), int(value[1])


@register_quant_config(QuantizationMethod.FP8, QuantizationMethod.W8A8_FP8)
@dataclass(frozen=True)
class Fp8Config(QuantConfig):
    scheme: Fp8Scheme
    ignore: tuple[str, ...] = ()
    quant_method: QuantizationMethod = QuantizationMethod.FP8

    flag_aliases = frozenset({QuantizationMethod.FP8, QuantizationMethod.W8A8_FP8})

    @property
    def method(self) -> QuantizationMethod:  # type: ignore[override]
        return self.quant_method

    @classmethod
    def from_checkpoint(cls, config: dict[str, Any], requested: QuantizationMethod | None) -> "Fp8Config":
        ckpt = QuantizationMethod.parse(config["quant_method"], "quantization_config.quant_method")
        fmt = str(config.get("fmt", "e4m3")).lower()
        if fmt != "e4m3":
            raise ValueError(f"quantization_config.fmt {fmt!r}: radixlm reads e4m3 FP8 checkpoints only")
        act = str(config.get("activation_scheme", "dynamic")).lower()
        try:
            activation = ActivationScheme(act)
        except ValueError:
            raise ValueError(f"quantization_config.activation_scheme {act!r}: use dynamic or static") from None
        ignore = tuple(config.get("ignored_layers") or ()) + tuple(config.get("modules_to_not_convert") or ())
        if ckpt is QuantizationMethod.W8A8_FP8:
            scheme = Fp8Scheme(Fp8Granularity.CHANNEL)
        else:
            block = _block_size(config.get("weight_block_size"))
            if block is not None and activation is ActivationScheme.STATIC:
                raise ValueError("quantization_config: block-wise FP8 (weight_block_size) takes dynamic activation "
                                 "scales only (activation_scheme: static given)")
            scheme = (Fp8Scheme(Fp8Granularity.BLOCK, activation, block, scale_name="weight_scale_inv")
                      if block is not None else Fp8Scheme(Fp8Granularity.TENSOR, activation))
        return cls(scheme, ignore, ckpt)

    @classmethod
    def from_flag(cls, requested: QuantizationMethod) -> "Fp8Config":
        return cls(Fp8Scheme(Fp8Granularity.CHANNEL, serialized=False), (), requested)

    @property
    def online(self) -> bool:
        return not self.scheme.serialized

    def method_for(self, prefix: str, layer: nn.Module) -> LinearMethod | MoEMethod | None:
        if is_ignored(prefix, self.ignore):
            return None
        return Fp8MoEMethod(self.scheme) if isinstance(layer, FusedMoE) else Fp8LinearMethod(self.scheme)

    def describe(self) -> str:
        s = self.scheme
        kind = "online, per channel" if not s.serialized else s.granularity.value + (
            f" {s.block[0]}x{s.block[1]}" if s.block else "")
        return f"{self.quant_method.value} ({kind}, {s.activation.value} activations)"
