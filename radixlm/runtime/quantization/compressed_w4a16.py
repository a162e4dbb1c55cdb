"""compressed-tensors' W4A16 scheme (llm-compressor's `W4A16` / `W4A16_ASYM` presets, format `pack-quantized`):
4-bit integer weights with group or channel scales, symmetric (no zero point) or asymmetric (`weight_zero_point`),
optionally group act-order (`actorder: group`, `weight_g_idx`); activations stay in float. The compressed-tensors
config (compressed_tensors.py) hands each config group's `weights` / `input_activations` arguments here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from radixlm.runtime.layers.moe import FusedMoE
from radixlm.runtime.quantization.int4 import check_bits
from radixlm.runtime.quantization.int4_formats import CompressedW4A16Format
from radixlm.runtime.quantization.int4_method import Int4LinearMethod, Int4MoEMethod

PACK_QUANTIZED = "pack-quantized"
STRATEGIES = ("group", "channel")
ACT_ORDERS = (None, "group", "weight", "static", "dynamic")  # weight / static: channels reordered only while quantizing


@dataclass(frozen=True)
class W4A16Scheme:
    group_size: int  # -1: one group per output channel (strategy channel)
    symmetric: bool
    act_order: bool  # weight_g_idx stored (actorder group)

    @staticmethod
    def matches(weights: dict[str, Any] | None, input_activations: dict[str, Any] | None) -> bool:
        """Integer weights and float activations: a WnA16 scheme (this class refuses n != 4)."""
        return bool(weights) and str(weights.get("type", "int")).lower() == "int" and not input_activations

    @classmethod
    def from_args(cls, weights: dict[str, Any], fmt: str | None, where: str) -> "W4A16Scheme":
        """weights: a config group's `weights` arguments; fmt: its format (or the config's); where: the config group,
        for messages."""
        check_bits(int(weights.get("num_bits", 8)), f"{where}.weights.num_bits")
        if fmt != PACK_QUANTIZED:
            raise ValueError(f"{where}: 4-bit weights in format {fmt!r} are not supported; radixlm reads "
                             f"{PACK_QUANTIZED}")
        if weights.get("dynamic"):
            raise ValueError(f"{where}.weights.dynamic: dynamic weight quantization is not a checkpoint format")
        strategy = str(weights.get("strategy") or "").lower()
        if strategy not in STRATEGIES:
            raise ValueError(f"{where}.weights.strategy {strategy!r}: radixlm reads W4A16 with "
                             f"{' or '.join(STRATEGIES)} scales")
        if strategy == "group":
            group = weights.get("group_size")
            if group is None or int(group) <= 0:
                raise ValueError(f"{where}.weights.group_size must be positive for strategy group, got {group}")
            group = int(group)
        else:
            group = -1
        actorder = weights.get("actorder")
        actorder = None if actorder in (None, False) else str(actorder).lower()
        if actorder not in ACT_ORDERS:
            raise ValueError(f"{where}.weights.actorder {actorder!r} is not known")
        return cls(group, bool(weights.get("symmetric", True)), actorder in ("group", "dynamic"))

    def format(self) -> CompressedW4A16Format:
        return CompressedW4A16Format(symmetric=self.symmetric, act_order=self.act_order)

    def method_for(self, prefix: str, layer: nn.Module) -> Int4LinearMethod | Int4MoEMethod:
        if isinstance(layer, FusedMoE):
            return Int4MoEMethod(self.format(), self.group_size, prefix)
        return Int4LinearMethod(self.format(), self.group_size, prefix)

    def describe(self) -> str:
        groups = "channel" if self.group_size == -1 else f"group {self.group_size}"
        return f"W4A16 ({groups}, {'sym' if self.symmetric else 'asym'}{', act-order' if self.act_order else ''})"
