"""An adapter's host copy: its PEFT config and each (layer, module)'s A and B read from adapter_model.safetensors in
the model's dtype. Swapping it into a slot reads from here (LoraManager); nothing is sliced until then."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch

from radixlm.runtime.lora.config import WEIGHTS_FILE, PeftConfig, normalize_modules

# PEFT's names: base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight (older saves: .lora_A.default.weight)
KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")


@dataclass(frozen=True)
class HostAdapter:
    lora_id: str  # unique per load: the radix cache's namespace
    name: str
    path: str
    config: PeftConfig
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, PEFT module) -> (A (r, in), B (out, r))

    @property
    def rank(self) -> int:
        return self.config.r

    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())

    @staticmethod
    def read(lora_id: str, name: str, path: str, num_layers: int, dtype: torch.dtype,
             allowed_modules: tuple[str, ...], max_rank: int) -> "HostAdapter":
        """Raises ValueError naming what is wrong: the path, the format, a rank above max_rank, a target outside
        allowed_modules (--lora-target-modules), a tensor that is missing or of the wrong rank."""
        from safetensors.torch import load_file

        config = PeftConfig.read(path)
        if config.r > max_rank:
            raise ValueError(f"LoRA adapter {name!r} has rank {config.r}, above --max-lora-rank {max_rank}")
        outside = [m for m in config.target_modules if m not in allowed_modules]
        if outside:
            raise ValueError(f"LoRA adapter {name!r} targets {outside}, outside --lora-target-modules "
                             f"{list(normalize_modules(allowed_modules))}")
        try:
            tensors = load_file(os.path.join(path, WEIGHTS_FILE))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise ValueError(f"LoRA adapter {name!r}: cannot read {WEIGHTS_FILE}: {e}") from None
        pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        for key, t in tensors.items():
            m = KEY.search(key)
            if m is None:
                raise ValueError(f"LoRA adapter {name!r}: tensor {key!r} is not a q/k/v/o/gate/up/down lora_A or "
                                 "lora_B weight of a decoder layer")
            layer, module, which = int(m.group(1)), m.group(2), m.group(3)
            if module not in config.target_modules:
                raise ValueError(f"LoRA adapter {name!r}: tensor {key!r} is of a module its config does not target")
            if layer >= num_layers:
                raise ValueError(f"LoRA adapter {name!r}: tensor {key!r} is for layer {layer}; the model has "
                                 f"{num_layers}")
            pairs.setdefault((layer, module), {})[which] = t.to(dtype)
        weights = {}
        for (layer, module), ab in pairs.items():
            if set(ab) != {"A", "B"}:
                raise ValueError(f"LoRA adapter {name!r}: layer {layer} {module} lacks its lora_A or lora_B")
            a, b = ab["A"], ab["B"]
            if a.dim() != 2 or b.dim() != 2 or a.shape[0] != config.r or b.shape[1] != config.r:
                raise ValueError(f"LoRA adapter {name!r}: layer {layer} {module}: lora_A {tuple(a.shape)} and lora_B "
                                 f"{tuple(b.shape)} are not of rank r={config.r}")
            weights[(layer, module)] = (a.contiguous(), b.contiguous())
        if not weights:
            raise ValueError(f"LoRA adapter {name!r} holds no lora_A / lora_B weights")
        return HostAdapter(lora_id, name, path, config, weights)
