"""GPTQ checkpoints (`quant_method: gptq`, AutoGPTQ / GPTQModel): 4-bit weights, symmetric or not, with or without
act-order (desc_act), in the v1 checkpoint format (zeros stored minus one) or gptq_v2."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from radixlm.runtime.layers.moe import FusedMoE
from radixlm.runtime.quantization.awq import int4_bits, int4_group_size
from radixlm.runtime.quantization.config import QuantConfig, QuantizationMethod, register_quant_config
from radixlm.runtime.quantization.int4_formats import GPTQFormat
from radixlm.runtime.quantization.int4_method import Int4LinearMethod, Int4MoEMethod, module_skipped

CHECKPOINT_FORMATS = {"gptq": True, "gptq_v1": True, "gptq_v2": False}  # -> v1 (zeros stored minus one)


@register_quant_config(QuantizationMethod.GPTQ)
@dataclass(frozen=True)
class GPTQConfig(QuantConfig):
    method: ClassVar[QuantizationMethod] = QuantizationMethod.GPTQ

    group_size: int
    desc_act: bool
    sym: bool
    v1: bool
    modules_to_not_convert: tuple[str, ...] = ()

    @classmethod
    def from_checkpoint(cls, config: dict[str, Any], requested: QuantizationMethod | None) -> "GPTQConfig":
        int4_bits(config, ("bits", "w_bit"))
        fmt = str(config.get("checkpoint_format") or config.get("format") or "gptq").lower()
        if fmt not in CHECKPOINT_FORMATS:
            raise ValueError(f"quantization_config.checkpoint_format {fmt!r} is not supported; radixlm reads "
                             f"{', '.join(CHECKPOINT_FORMATS)}")
        if config.get("dynamic"):
            raise ValueError("quantization_config.dynamic (per-module GPTQ overrides) is not supported")
        if config.get("lm_head"):
            raise ValueError("quantization_config.lm_head true: a quantized lm_head is not supported")
        return cls(int4_group_size(config, ("group_size",), 128), bool(config.get("desc_act", False)),
                   bool(config.get("sym", True)), CHECKPOINT_FORMATS[fmt],
                   tuple(config.get("modules_to_not_convert") or ()))

    def format(self) -> GPTQFormat:
        return GPTQFormat(v1=self.v1, act_order=self.desc_act, symmetric=self.sym)

    def method_for(self, prefix: str, layer: nn.Module):
        if module_skipped(prefix, self.modules_to_not_convert):
            return None
        if isinstance(layer, FusedMoE):
            return Int4MoEMethod(self.format(), self.group_size)
        return Int4LinearMethod(self.format(), self.group_size)

    def describe(self) -> str:
        return (f"gptq (4-bit, group {self.group_size}, {'act-order, ' if self.desc_act else ''}"
                f"{'sym' if self.sym else 'asym'}, {'v1' if self.v1 else 'v2'})")
