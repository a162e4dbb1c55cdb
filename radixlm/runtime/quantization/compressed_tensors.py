"""compressed-tensors checkpoints (llm-compressor's output, `quant_method: compressed-tensors`): config groups,
each a scheme (weights / input_activations arguments) for the modules its `targets` name, minus the `ignore` list.

Schemes read here: W4A16 pack-quantized (compressed_w4a16.py). A config group of another scheme is refused at
start-up, naming it.

PROVISIONAL (INT4 helper): the FP8 helper owns this config; when its version lands, W4A16Scheme plugs into its
scheme hook and this file goes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from radixlm.runtime.layers.moe import FusedMoE
from radixlm.runtime.quantization.compressed_w4a16 import W4A16Scheme
from radixlm.runtime.quantization.config import (
    QuantConfig, QuantizationMethod, checkpoint_module_names, is_ignored, name_matches, register_quant_config)

EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")


def _checkpoint_names(prefix: str, layer: nn.Module) -> list[str]:
    if isinstance(layer, FusedMoE):
        return [f"{prefix}.0.{p}" for p in EXPERT_PROJECTIONS]
    return checkpoint_module_names(prefix)


@dataclass(frozen=True)
class ConfigGroup:
    name: str
    targets: tuple[str, ...]
    scheme: W4A16Scheme

    def targets_layer(self, prefix: str, layer: nn.Module) -> bool:
        names = _checkpoint_names(prefix, layer)
        return any(t == "Linear" or any(name_matches(n, t) for n in names) for t in self.targets)


@register_quant_config(QuantizationMethod.COMPRESSED_TENSORS)
@dataclass(frozen=True)
class CompressedTensorsConfig(QuantConfig):
    method: ClassVar[QuantizationMethod] = QuantizationMethod.COMPRESSED_TENSORS

    groups: tuple[ConfigGroup, ...]
    ignore: tuple[str, ...] = ()

    @classmethod
    def from_checkpoint(cls, config: dict[str, Any], requested: QuantizationMethod | None) -> "CompressedTensorsConfig":
        for key in ("sparsity_config", "transform_config"):
            if config.get(key):
                raise ValueError(f"quantization_config.{key}: compressed-tensors {key.split('_')[0]} is not supported")
        groups = []
        for name, group in (config.get("config_groups") or {}).items():
            where = f"quantization_config.config_groups.{name}"
            weights, acts = group.get("weights"), group.get("input_activations")
            if not W4A16Scheme.matches(weights, acts):
                raise ValueError(f"{where}: this compressed-tensors scheme (weights {weights}, input_activations "
                                 f"{acts}) is not supported yet")
            fmt = group.get("format") or config.get("format")
            targets = tuple(group.get("targets") or ())
            if not targets:
                raise ValueError(f"{where}.targets is empty")
            groups.append(ConfigGroup(name, targets, W4A16Scheme.from_args(weights, fmt, where)))
        if not groups:
            raise ValueError("quantization_config.config_groups is empty")
        return cls(tuple(groups), tuple(config.get("ignore") or ()))

    def method_for(self, prefix: str, layer: nn.Module):
        if is_ignored(prefix, self.ignore):
            return None
        for group in self.groups:
            if group.targets_layer(prefix, layer):
                return group.scheme.method_for(prefix, layer)
        return None

    def describe(self) -> str:
        return "compressed-tensors (" + ", ".join(f"{g.name}: {g.scheme.describe()}" for g in self.groups) + ")"
