"""What an adapter is before its weights are read: the `--lora-paths` entries (SGLang's three forms) and a PEFT
`adapter_config.json` (rank, alpha, rsLoRA, target modules), with every unsupported option refused by name."""
from __future__ import annotations

import enum
import json
import math
import os
from dataclasses import dataclass

from radixlm.runtime.args.choices import LORA_TARGET_MODULES, MAX_LORA_RANK

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


class LoraTarget(enum.Enum):
    """Our (fused) projections an adapter can change, each with the PEFT modules it stacks, in their order."""

    QKV = ("qkv_proj", ("q_proj", "k_proj", "v_proj"))
    O = ("o_proj", ("o_proj",))
    GATE_UP = ("gate_up_proj", ("gate_proj", "up_proj"))
    DOWN = ("down_proj", ("down_proj",))

    @property
    def module(self) -> str:
        return self.value[0]

    @property
    def parts(self) -> tuple[str, ...]:
        return self.value[1]

    @property
    def row_parallel(self) -> bool:
        """o_proj and down_proj split their input across ranks (A is sliced); the others their output (B is)."""
        return self in (LoraTarget.O, LoraTarget.DOWN)

    @staticmethod
    def of(peft_module: str) -> tuple["LoraTarget", int]:
        for t in LoraTarget:
            if peft_module in t.parts:
                return t, t.parts.index(peft_module)
        raise ValueError(f"unknown LoRA target module {peft_module!r}; supported: {LORA_TARGET_MODULES}")


def targets_of(modules) -> frozenset[LoraTarget]:
    return frozenset(LoraTarget.of(m)[0] for m in modules)


def normalize_modules(modules) -> tuple[str, ...]:
    """`--lora-target-modules` / PEFT's target_modules -> PEFT module names; "all" and "all-linear" mean every one."""
    if isinstance(modules, str):
        modules = [modules]
    out: list[str] = []
    for m in modules:
        if m in ("all", "all-linear"):
            return LORA_TARGET_MODULES
        if m not in LORA_TARGET_MODULES:
            raise ValueError(f"unsupported LoRA target module {m!r}; supported: {LORA_TARGET_MODULES}")
        out.append(m)
    return tuple(sorted(set(out), key=LORA_TARGET_MODULES.index))


@dataclass(frozen=True)
class LoraSpec:
    """One adapter to load: its name (what requests give as lora_path / model) and its directory."""

    name: str
    path: str
    pinned: bool = False

    @staticmethod
    def parse(entry: str) -> "LoraSpec":
        """SGLang's forms: NAME=PATH, PATH (the adapter is named by its path), JSON {lora_name, lora_path, pinned}."""
        entry = entry.strip()
        if entry.startswith("{"):
            try:
                d = json.loads(entry)
            except json.JSONDecodeError as e:
                raise ValueError(f"--lora-paths entry {entry!r} is not valid JSON: {e}") from None
            unknown = set(d) - {"lora_name", "lora_path", "pinned"}
            if unknown or not isinstance(d.get("lora_name"), str) or not isinstance(d.get("lora_path"), str):
                raise ValueError(f"--lora-paths JSON entry needs string lora_name and lora_path (and optional "
                                 f"pinned), got {entry!r}")
            return LoraSpec(d["lora_name"], d["lora_path"], bool(d.get("pinned", False)))
        name, sep, path = entry.partition("=")
        return LoraSpec(name, path) if sep else LoraSpec(entry, entry)


def check_name(name) -> str:
    if not isinstance(name, str) or not name or len(name) > 256 or ":" in name:
        raise ValueError(f"a LoRA adapter name must be a non-empty string of at most 256 characters without ':', "
                         f"got {name!r}")
    return name


@dataclass(frozen=True)
class PeftConfig:
    """The part of a PEFT LoraConfig radixlm serves."""

    r: int
    lora_alpha: float
    use_rslora: bool
    target_modules: tuple[str, ...]

    @property
    def scaling(self) -> float:
        """PEFT's: alpha / r, or alpha / sqrt(r) with rsLoRA."""
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    @property
    def targets(self) -> frozenset[LoraTarget]:
        return targets_of(self.target_modules)

    @staticmethod
    def read(path: str) -> "PeftConfig":
        file = os.path.join(path, CONFIG_FILE)
        if not os.path.isdir(path):
            raise ValueError(f"LoRA adapter path {path!r} is not a directory")
        if not os.path.isfile(file) or not os.path.isfile(os.path.join(path, WEIGHTS_FILE)):
            raise ValueError(f"LoRA adapter path {path!r} lacks {CONFIG_FILE} or {WEIGHTS_FILE} (PEFT's format)")
        try:
            with open(file) as f:
                return PeftConfig.from_dict(json.load(f))
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{file}: {e}") from None

    @staticmethod
    def from_dict(d: dict) -> "PeftConfig":
        if d.get("peft_type", "LORA") != "LORA":
            raise ValueError(f"only LORA adapters are served, not {d.get('peft_type')!r}")
        refused = {"use_dora": False, "bias": "none", "fan_in_fan_out": False}
        for key, ok in refused.items():
            if d.get(key, ok) != ok:
                raise ValueError(f"adapter_config.json sets {key}={d[key]!r}, which radixlm does not serve")
        for key in ("modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern"):
            if d.get(key):
                raise ValueError(f"adapter_config.json sets {key}, which radixlm does not serve")
        r = d.get("r")
        if not isinstance(r, int) or not 1 <= r <= MAX_LORA_RANK:
            raise ValueError(f"adapter rank r must be an integer in [1, {MAX_LORA_RANK}], got {r!r}")
        alpha = d.get("lora_alpha", 8)
        if not isinstance(alpha, (int, float)) or alpha <= 0:
            raise ValueError(f"lora_alpha must be a positive number, got {alpha!r}")
        modules = d.get("target_modules")
        if not modules:
            raise ValueError("adapter_config.json names no target_modules")
        return PeftConfig(r, float(alpha), bool(d.get("use_rslora", False)), normalize_modules(modules))
