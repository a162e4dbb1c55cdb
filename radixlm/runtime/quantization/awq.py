"""AWQ checkpoints (AutoAWQ's GEMM layout, `quant_method: awq`): 4-bit weights with zero points, any group size."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from radixlm.runtime.layers.moe import FusedMoE
from radixlm.runtime.quantization.config import QuantConfig, QuantizationMethod, register_quant_config
from radixlm.runtime.quantization.int4 import check_bits
from radixlm.runtime.quantization.int4_formats import AWQFormat
from radixlm.runtime.quantization.int4_method import Int4LinearMethod, Int4MoEMethod, module_skipped

SUPPORTED_VERSIONS = ("gemm",)


def int4_group_size(config: dict[str, Any], keys: tuple[str, ...], default: int | None) -> int:
    value = next((config[k] for k in keys if config.get(k) is not None), default)
    if value is None:
        raise ValueError(f"quantization_config has no group size ({' / '.join(keys)})")
    value = int(value)
    if value != -1 and value <= 0:
        raise ValueError(f"quantization_config.{keys[0]} must be positive or -1, got {value}")
    return value


def int4_bits(config: dict[str, Any], keys: tuple[str, ...]) -> None:
    value = next((config[k] for k in keys if config.get(k) is not None), None)
    if value is None:
        raise ValueError(f"quantization_config has no bit width ({' / '.join(keys)})")
    check_bits(int(value), f"quantization_config.{keys[0]}")


@register_quant_config(QuantizationMethod.AWQ)
@dataclass(frozen=True)
class AWQConfig(QuantConfig):
    method: ClassVar[QuantizationMethod] = QuantizationMethod.AWQ

    group_size: int
    modules_to_not_convert: tuple[str, ...] = ()

    @classmethod
    def from_checkpoint(cls, config: dict[str, Any], requested: QuantizationMethod | None) -> "AWQConfig":
        int4_bits(config, ("bits", "w_bit"))
        if not config.get("zero_point", True):
            raise ValueError("quantization_config.zero_point false: AWQ without zero points is not supported")
        version = str(config.get("version", "gemm")).lower()
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"quantization_config.version {version!r}: radixlm reads AWQ's GEMM layout only "
                             f"({', '.join(SUPPORTED_VERSIONS)})")
        return cls(int4_group_size(config, ("group_size", "q_group_size"), 128),
                   tuple(config.get("modules_to_not_convert") or ()))

    def method_for(self, prefix: str, layer: nn.Module):
        if module_skipped(prefix, self.modules_to_not_convert):
            return None
        if isinstance(layer, FusedMoE):
            return Int4MoEMethod(AWQFormat(), self.group_size)
        return Int4LinearMethod(AWQFormat(), self.group_size)

    def describe(self) -> str:
        return f"awq (4-bit, group {self.group_size})"
