"""Which quantization a model runs with: the `--quantization` flag and the checkpoint's `quantization_config`
(config.json), reconciled at start-up into one QuantConfig, whose `method_for(prefix, layer)` then picks each layer's
LinearMethod / MoEMethod (or None: the layer stays in float).

Each format's module registers its QuantConfig class for the `quant_method` values it reads
(`@register_quant_config(...)`); the package's __init__ imports every format module, so the registry is complete
once `radixlm.runtime.quantization` is imported. Refusals (unknown method, the flag contradicting the checkpoint, a
format that needs a checkpoint config) are ValueErrors naming the method and the config key."""
from __future__ import annotations

import enum
import json
import os
import re
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from torch import nn

if TYPE_CHECKING:
    from radixlm.runtime.quantization.base import LinearMethod, MoEMethod


class QuantizationMethod(str, enum.Enum):
    """SGLang's `--quantization` spellings (and the checkpoints' `quant_method` values)."""

    FP8 = "fp8"
    W8A8_FP8 = "w8a8_fp8"
    AWQ = "awq"
    GPTQ = "gptq"
    COMPRESSED_TENSORS = "compressed-tensors"
    W8A8_INT8 = "w8a8_int8"
    MODELOPT = "modelopt"
    # Flags only: SGLang's and vLLM's names for a kernel choice over a format above (KERNEL_FLAGS).
    AWQ_MARLIN = "awq_marlin"
    GPTQ_MARLIN = "gptq_marlin"
    MOE_WNA16 = "moe_wna16"
    MODELOPT_FP8 = "modelopt_fp8"

    @classmethod
    def parse(cls, value: str, where: str) -> "QuantizationMethod":
        key = str(value).strip().lower().replace("compressed_tensors", "compressed-tensors")
        try:
            return cls(key)
        except ValueError:
            known = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown quantization method {value!r} ({where}); radixlm knows {known}") from None


# `--quantization` values that pick another engine's kernels for checkpoints of these formats: radixlm reads the
# checkpoint as its format and runs its own kernels.
KERNEL_FLAGS: dict[QuantizationMethod, tuple[QuantizationMethod, ...]] = {
    QuantizationMethod.AWQ_MARLIN: (QuantizationMethod.AWQ,),
    QuantizationMethod.GPTQ_MARLIN: (QuantizationMethod.GPTQ,),
    QuantizationMethod.MOE_WNA16: (QuantizationMethod.AWQ, QuantizationMethod.GPTQ),
    QuantizationMethod.MODELOPT_FP8: (QuantizationMethod.MODELOPT,),
}


# Our fused modules -> the checkpoint modules stacked into them (an ignore list names the checkpoint's).
FUSED_MODULES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def checkpoint_module_names(prefix: str) -> list[str]:
    """Our module prefix -> the checkpoint module names it was loaded from (one, or the fused ones)."""
    head, _, last = prefix.rpartition(".")
    parts = FUSED_MODULES.get(last)
    if parts is None:
        return [prefix]
    return [f"{head}.{p}" if head else p for p in parts]


def name_matches(name: str, pattern: str) -> bool:
    """compressed-tensors' / vLLM's convention: `re:<regex>` is matched (re.match) against the whole module name;
    anything else names a module exactly or as the name's last dotted components (`lm_head`, `mlp.down_proj`)."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return name == pattern or name.endswith("." + pattern)


def is_ignored(prefix: str, ignore: tuple[str, ...] | list[str]) -> bool:
    """Whether the module (our prefix; a fused one through all of its checkpoint modules) is in the ignore list. A
    fused module whose parts disagree is refused: its weight would be half float, half quantized."""
    if not ignore:
        return False
    names = checkpoint_module_names(prefix)
    hits = [any(name_matches(n, p) for p in ignore) for n in names]
    if any(hits) and not all(hits):
        listed = [n for n, h in zip(names, hits) if h]
        raise ValueError(f"the quantization config's ignore list names {listed} but not all of {names}: radixlm "
                         f"loads them as one fused layer ({prefix}), quantized or not as a whole")
    return all(hits)


class QuantConfig(ABC):
    """One model's quantization: built from the checkpoint's `quantization_config` dict (or from the flag alone, for
    online quantization of a float checkpoint)."""

    method: ClassVar[QuantizationMethod]
    # Other `--quantization` values that may be given for a checkpoint of this format (e.g. fp8 / w8a8_fp8).
    flag_aliases: ClassVar[frozenset[QuantizationMethod]] = frozenset()

    @classmethod
    @abstractmethod
    def from_checkpoint(cls, config: dict[str, Any], requested: QuantizationMethod | None) -> "QuantConfig":
        """From config.json's quantization_config (refuses keys it cannot honour, naming them)."""

    @classmethod
    def from_flag(cls, requested: QuantizationMethod) -> "QuantConfig":
        """`--quantization` on a checkpoint without a quantization_config (online quantization where supported)."""
        raise ValueError(f"--quantization {requested.value} needs a checkpoint quantized in that format (config.json "
                         f"with a quantization_config); this checkpoint has none")

    @abstractmethod
    def method_for(self, prefix: str, layer: nn.Module) -> "LinearMethod | MoEMethod | None":
        """The method of the layer at `prefix` (our module name), None to leave it in float."""

    @property
    def online(self) -> bool:
        """Whether the checkpoint is float and quantized as it loads (no layer holds a checkpoint format)."""
        return False

    def describe(self) -> str:
        return self.method.value


_REGISTRY: dict[QuantizationMethod, type[QuantConfig]] = {}


def register_quant_config(*methods: QuantizationMethod) -> Callable[[type[QuantConfig]], type[QuantConfig]]:
    """Class decorator of a format's QuantConfig: the checkpoint `quant_method` values (and flags) it reads."""

    def deco(cls: type[QuantConfig]) -> type[QuantConfig]:
        for m in methods:
            if m in _REGISTRY and _REGISTRY[m] is not cls:
                raise ValueError(f"quantization method {m.value} registered twice ({_REGISTRY[m].__name__}, "
                                 f"{cls.__name__})")
            _REGISTRY[m] = cls
        return cls

    return deco


def registered_methods() -> list[QuantizationMethod]:
    return [m for m in QuantizationMethod if m in _REGISTRY]


def _config_class(method: QuantizationMethod, where: str) -> type[QuantConfig]:
    cls = _REGISTRY.get(method)
    if cls is None:
        known = ", ".join(m.value for m in registered_methods())
        raise ValueError(f"quantization method {method.value} ({where}) is not supported by radixlm yet; "
                         f"supported: {known}")
    return cls


MODELOPT_CONFIG_FILE = "hf_quant_config.json"


def checkpoint_quantization_config(hf_config, model_dir: str | None = None) -> dict[str, Any] | None:
    """config.json's quantization_config (a multimodal model's may sit on its text config), as a dict; else, in
    model_dir, ModelOpt's hf_quant_config.json (`{"producer": ..., "quantization": {"quant_algo": ...}}`) as a
    quantization_config of quant_method modelopt."""
    for cfg in (hf_config, getattr(hf_config, "get_text_config", lambda: None)()):
        qc = getattr(cfg, "quantization_config", None) if cfg is not None else None
        if qc is None:
            continue
        if not isinstance(qc, dict):
            qc = qc.to_dict() if hasattr(qc, "to_dict") else dict(vars(qc))
        return qc
    path = os.path.join(model_dir, MODELOPT_CONFIG_FILE) if model_dir else None
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        quantization = data["quantization"]
        if not isinstance(quantization, dict):
            raise TypeError("'quantization' is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read {MODELOPT_CONFIG_FILE}: {type(e).__name__}: {e}") from None
    return {**quantization, "quant_method": QuantizationMethod.MODELOPT.value}


def quant_config_from(hf_config, requested: str | QuantizationMethod | None,
                      model_dir: str | None = None) -> QuantConfig | None:
    """The model's QuantConfig from its checkpoint config (model_dir: where a ModelOpt checkpoint keeps its own file)
    and the `--quantization` flag (None: float).

    Refused: an unknown method on either side; a flag naming another method than the checkpoint's (but for the
    format's aliases and KERNEL_FLAGS); a flag for a format that only exists as checkpoints, on a float checkpoint."""
    # Importing the package registers every format.
    import radixlm.runtime.quantization  # noqa: F401

    flag = None if requested in (None, "", "none") else QuantizationMethod.parse(requested, "--quantization")
    qc = checkpoint_quantization_config(hf_config, model_dir)
    if qc is None:
        if flag in KERNEL_FLAGS:
            formats = " or ".join(m.value for m in KERNEL_FLAGS[flag])
            raise ValueError(f"--quantization {flag.value} runs {formats} checkpoints; this checkpoint has no "
                             f"quantization_config")
        return None if flag is None else _config_class(flag, "--quantization").from_flag(flag)
    if "quant_method" not in qc:
        raise ValueError("config.json's quantization_config has no quant_method")
    ckpt = QuantizationMethod.parse(qc["quant_method"], "config.json quantization_config.quant_method")
    if ckpt in KERNEL_FLAGS:
        raise ValueError(f"config.json quantization_config.quant_method {ckpt.value!r} is a --quantization flag, "
                         f"not a checkpoint format")
    cls = _config_class(ckpt, "config.json quantization_config.quant_method")
    if (flag is not None and flag is not ckpt and flag not in cls.flag_aliases
            and ckpt not in KERNEL_FLAGS.get(flag, ())):
        raise ValueError(f"--quantization {flag.value} contradicts the checkpoint, which is quantized with "
                         f"{ckpt.value} (config.json quantization_config.quant_method); drop the flag or pass "
                         f"--quantization {ckpt.value}")
    return cls.from_checkpoint(qc, flag)
