"""compressed-tensors' W4A16 scheme (llm-compressor's `W4A16` / `W4A16_ASYM` presets, format `pack-quantized`):
4-bit integer weights with group or channel scales, symmetric (no zero point) or asymmetric (`weight_zero_point`),
optionally group act-order (`actorder: group`, `weight_g_idx`); activations stay in float. Registered with the
compressed-tensors config (compressed_tensors.py) for (`int`, 4, `pack-quantized`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixlm.runtime.quantization.compressed_tensors import register_ct_scheme
from radixlm.runtime.quantization.int4_formats import CompressedW4A16Format
from radixlm.runtime.quantization.int4_method import Int4LinearMethod, Int4MoEMethod

STRATEGIES = ("group", "channel")
# compressed-tensors' ActivationOrdering: group (alias dynamic) stores weight_g_idx; weight (alias static) reorders
# channels only while quantizing.
G_IDX_ORDERS = ("group", "dynamic")
ACT_ORDERS = (None, "weight", "static", *G_IDX_ORDERS)


def _value(v) -> Any:
    return getattr(v, "value", v)


@dataclass(frozen=True)
class W4A16Scheme:
    group_size: int  # -1: one group per output channel (strategy channel)
    symmetric: bool
    act_order: bool  # weight_g_idx stored

    @classmethod
    def from_args(cls, weights, input_activations=None) -> "W4A16Scheme":
        """weights / input_activations: a config group's compressed_tensors QuantizationArgs."""
        if input_activations is not None:
            raise ValueError(f"4-bit integer weights with {_value(input_activations.type)}"
                             f"{input_activations.num_bits} input activations are not supported (W4A16 only)")
        if weights.num_bits != 4:
            raise ValueError(f"{weights.num_bits}-bit weights are not supported; radixlm loads 4-bit INT4 only")
        if weights.dynamic:
            raise ValueError("dynamic weight quantization is not a checkpoint format")
        strategy = str(_value(weights.strategy) or "").lower()
        if strategy not in STRATEGIES:
            raise ValueError(f"W4A16 weight strategy {strategy!r} is not supported ({' or '.join(STRATEGIES)})")
        group = -1
        if strategy == "group":
            if weights.group_size is None or int(weights.group_size) <= 0:
                raise ValueError(f"W4A16 group strategy with group_size {weights.group_size}")
            group = int(weights.group_size)
        actorder = _value(weights.actorder)
        actorder = None if actorder in (None, False) else str(actorder).lower()
        if actorder not in ACT_ORDERS:
            raise ValueError(f"W4A16 actorder {actorder!r} is not known")
        return cls(group, bool(weights.symmetric), actorder in G_IDX_ORDERS)

    def format(self) -> CompressedW4A16Format:
        return CompressedW4A16Format(symmetric=self.symmetric, act_order=self.act_order)

    def method(self, is_moe: bool) -> Int4LinearMethod | Int4MoEMethod:
        return (Int4MoEMethod if is_moe else Int4LinearMethod)(self.format(), self.group_size)


@register_ct_scheme("int", 4, "pack-quantized")
def w4a16_scheme_method(scheme, is_moe: bool) -> Int4LinearMethod | Int4MoEMethod:
    return W4A16Scheme.from_args(scheme.weights, scheme.input_activations).method(is_moe)
