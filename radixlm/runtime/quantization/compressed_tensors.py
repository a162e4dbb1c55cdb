"""compressed-tensors checkpoints (llm-compressor's output): `quantization_config` with `quant_method:
compressed-tensors`, parsed by the compressed-tensors library (its QuantizationConfig validates the groups, expands
preset names and checks each QuantizationScheme); module names are matched with its `match_name` (exact names and
`re:` regexes), class targets `Linear` cover every radixlm projection and expert.

Each config group's scheme is mapped to a radixlm method by the weights' (type, num_bits) and the group's storage
format; formats register their mapping with `register_ct_scheme` (this module: FP8 `float-quantized`; the INT4
module: `int`, 4, `pack-quantized`; W8A8-INT8 would be `int`, 8, `int-quantized`). A scheme no mapping takes is
refused at start-up, naming the group."""
from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from radixlm.runtime.layers.moe import FusedMoE
from radixlm.runtime.quantization.base import LinearMethod, MoEMethod
from radixlm.runtime.quantization.config import (
    QuantConfig, QuantizationMethod, checkpoint_module_names, register_quant_config)
from radixlm.runtime.quantization.fp8 import ActivationScheme, Fp8Granularity, Fp8LinearMethod, Fp8MoEMethod, Fp8Scheme

logger = logging.getLogger(__name__)

# (scheme, is_moe) -> the layer's method; raises ValueError for arguments it cannot honour.
CTMethodFactory = Callable[[Any, bool], "LinearMethod | MoEMethod"]
_CT_SCHEMES: dict[tuple[str, int, str], CTMethodFactory] = {}

# An expert's checkpoint projections, for matching a FusedMoE against targets and ignore lists (expert 0 stands for
# all: compressed-tensors' schemes cover a layer's experts alike).
EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def register_ct_scheme(weight_type: str, num_bits: int, *formats: str) -> Callable[[CTMethodFactory], CTMethodFactory]:
    """A compressed-tensors weight scheme (QuantizationArgs.type, num_bits) stored in `formats` -> its methods."""

    def deco(factory: CTMethodFactory) -> CTMethodFactory:
        for fmt in formats:
            _CT_SCHEMES[(weight_type, num_bits, fmt)] = factory
        return factory

    return deco


def _enum_value(v) -> str:
    return getattr(v, "value", v)


@register_ct_scheme("float", 8, "float-quantized", "naive-quantized")
def fp8_scheme_method(scheme, is_moe: bool) -> LinearMethod | MoEMethod:
    w, act = scheme.weights, scheme.input_activations
    if not w.symmetric:
        raise ValueError("asymmetric FP8 weights are not supported")
    if w.dynamic:
        raise ValueError("dynamic weight quantization is not a checkpoint format")
    strategy = _enum_value(w.strategy)
    block = None
    if strategy == "tensor":
        gran = Fp8Granularity.TENSOR
    elif strategy == "channel":
        gran = Fp8Granularity.CHANNEL
    elif strategy == "block":
        if not w.block_structure or len(w.block_structure) != 2:
            raise ValueError(f"block FP8 needs a block_structure of two sizes, got {w.block_structure}")
        gran, block = Fp8Granularity.BLOCK, (int(w.block_structure[0]), int(w.block_structure[1]))
    else:
        raise ValueError(f"FP8 weight strategy {strategy!r} is not supported (tensor, channel or block)")
    if act is not None and (_enum_value(act.type) != "float" or act.num_bits != 8):
        raise ValueError(f"input activations {_enum_value(act.type)}{act.num_bits} with FP8 weights")
    static = act is not None and not act.dynamic
    if static and _enum_value(act.strategy) != "tensor":
        raise ValueError(f"static input activation scales per {_enum_value(act.strategy)} (per tensor only)")
    fp8 = Fp8Scheme(gran, ActivationScheme.STATIC if static else ActivationScheme.DYNAMIC, block)
    return Fp8MoEMethod(fp8) if is_moe else Fp8LinearMethod(fp8)


def _without_removed_actorder(config: dict[str, Any]) -> dict[str, Any]:
    """compressed-tensors 0.20 refuses `actorder: group` (alias `dynamic`), which older llm-compressor checkpoints
    carry; the INT4 methods read those checkpoints' `weight_g_idx` whenever present, so the key is dropped here."""
    removed = ("group", "dynamic")
    groups = config.get("config_groups") or {}
    if not any(isinstance(g, dict) and str((g.get("weights") or {}).get("actorder")).lower() in removed
               for g in groups.values()):
        return config
    config = copy.deepcopy(config)
    for g in config["config_groups"].values():
        weights = g.get("weights") if isinstance(g, dict) else None
        if weights and str(weights.get("actorder")).lower() in removed:
            weights["actorder"] = None
    return config


@dataclass(frozen=True)
class CTGroup:
    name: str
    scheme: Any  # compressed_tensors.quantization.QuantizationScheme
    format: str
    factory: CTMethodFactory


def _checkpoint_names(prefix: str, layer: nn.Module) -> list[str]:
    if isinstance(layer, FusedMoE):
        return [f"{prefix}.0.{p}" for p in EXPERT_PROJECTIONS]
    return checkpoint_module_names(prefix)


@register_quant_config(QuantizationMethod.COMPRESSED_TENSORS)
@dataclass(frozen=True)
class CompressedTensorsConfig(QuantConfig):
    groups: tuple[CTGroup, ...]
    ignore: tuple[str, ...] = ()

    method = QuantizationMethod.COMPRESSED_TENSORS

    @classmethod
    def from_checkpoint(cls, config: dict[str, Any], requested: QuantizationMethod | None) -> "CompressedTensorsConfig":
        from compressed_tensors.quantization import QuantizationConfig

        for key in ("sparsity_config", "transform_config"):
            if config.get(key):
                raise ValueError(f"compressed-tensors {key}: sparse or transformed checkpoints are not supported")
        try:
            qc = QuantizationConfig.model_validate(_without_removed_actorder(config))
        except Exception as e:  # pydantic's ValidationError, the library's NotImplementedError / ValueError
            raise ValueError(f"compressed-tensors quantization_config does not parse: {e}") from None
        if qc.kv_cache_scheme is not None:
            # Its k_scale / v_scale tensors load with the weights (models/kv_scales.py); as in vLLM, a float8 cache is
            # the user's choice, not the checkpoint's.
            logger.info("compressed-tensors kv_cache_scheme: the checkpoint's KV scales apply with --kv-cache-dtype "
                        "fp8_e4m3 (auto keeps the model's dtype)")
        groups = []
        for name, scheme in qc.config_groups.items():
            fmt = _enum_value(scheme.format) if scheme.format is not None else qc.format
            if scheme.weights is None:
                raise ValueError(f"compressed-tensors group {name!r} quantizes no weights (activation-only schemes "
                                 f"are not supported)")
            if scheme.output_activations is not None:
                raise ValueError(f"compressed-tensors group {name!r}: output activation quantization is not "
                                 f"supported")
            key = (_enum_value(scheme.weights.type), scheme.weights.num_bits, fmt)
            factory = _CT_SCHEMES.get(key)
            if factory is None:
                known = ", ".join(f"{t}{b} {f}" for t, b, f in sorted(_CT_SCHEMES))
                raise ValueError(f"compressed-tensors group {name!r}: {key[0]}{key[1]} weights in format {fmt!r} "
                                 f"are not supported (radixlm reads: {known})")
            for is_moe in (False, True):  # refuse bad arguments now, not at the first layer
                try:
                    factory(scheme, is_moe)
                except ValueError as e:
                    raise ValueError(f"compressed-tensors group {name!r}: {e}") from None
            groups.append(CTGroup(name, scheme, fmt, factory))
        return cls(tuple(groups), tuple(qc.ignore or ()))

    def _group_of(self, name: str) -> CTGroup | None:
        """The group whose targets name the module (a name or regex before the class target `Linear`)."""
        from compressed_tensors.utils.match import match_name

        by_name = [g for g in self.groups if any(match_name(name, t) for t in g.scheme.targets)]
        if by_name:
            return by_name[0]
        by_class = [g for g in self.groups if "Linear" in g.scheme.targets]
        return by_class[0] if by_class else None

    def method_for(self, prefix: str, layer: nn.Module) -> LinearMethod | MoEMethod | None:
        from compressed_tensors.utils.match import match_name

        names = _checkpoint_names(prefix, layer)
        groups = [None if any(match_name(n, i) for i in self.ignore) else self._group_of(n) for n in names]
        if all(g is None for g in groups):
            return None
        if any(g is not groups[0] for g in groups):
            raise ValueError(f"compressed-tensors: {prefix} is loaded as one layer from {names}, which the config "
                             f"quantizes differently (its ignore list or config groups); radixlm needs them alike")
        return groups[0].factory(groups[0].scheme, isinstance(layer, FusedMoE))

    def describe(self) -> str:
        return "compressed-tensors (" + ", ".join(f"{g.name}: {g.format}" for g in self.groups) + ")"
