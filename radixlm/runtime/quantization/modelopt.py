"""NVIDIA ModelOpt FP8 checkpoints (`quant_method: modelopt` in config.json, or ModelOpt's own hf_quant_config.json:
config.checkpoint_quantization_config). Their tensors are FP8's: `weight` float8_e4m3fn with a per-tensor
`weight_scale` and a static per-tensor `input_scale` (`quant_algo: FP8`), or a per-channel `weight_scale` with
activations quantized per token (`FP8_PER_CHANNEL_PER_TOKEN`); KV-cache scales (`kv_cache_quant_algo: FP8`) sit on
the attention projections (`k_proj.k_scale`), which models/kv_scales.py reads. So the format is fp8.py's methods
under another config: what differs is the keys and the exclusion list, whose entries are module names or globs
(`model.layers.*.mlp.gate`, `model.visual*`) naming a module or the subtree under it."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.quantization.config import QuantizationMethod, register_quant_config
from radixlm.runtime.quantization.fp8 import ActivationScheme, Fp8Config, Fp8Granularity, Fp8Scheme

SCHEMES = {
    "FP8": Fp8Scheme(Fp8Granularity.TENSOR, ActivationScheme.STATIC),
    "FP8_PER_CHANNEL_PER_TOKEN": Fp8Scheme(Fp8Granularity.CHANNEL, ActivationScheme.DYNAMIC),
}
KV_CACHE_ALGOS = (None, "FP8")


def exclusion_patterns(entries) -> tuple[str, ...]:
    """ModelOpt's exclusion entries as config.is_ignored patterns: each entry as it is (a module name, or its last
    dotted components) and as a `re:` pattern matching the glob over the whole name or a module under it."""
    if entries is None:
        return ()
    if isinstance(entries, str) or not all(isinstance(e, str) for e in entries):
        raise ValueError(f"quantization_config.exclude_modules must be a list of module names, got {entries!r}")
    out: list[str] = []
    for entry in entries:
        glob = re.escape(entry).replace(r"\*", ".*")
        out += [entry, rf"re:{glob}(\..+)?$"]
    return tuple(out)


@register_quant_config(QuantizationMethod.MODELOPT)
@dataclass(frozen=True)
class ModelOptFp8Config(Fp8Config):
    quant_method: QuantizationMethod = QuantizationMethod.MODELOPT

    @classmethod
    def from_checkpoint(cls, config: dict[str, Any], requested: QuantizationMethod | None) -> "ModelOptFp8Config":
        algo = config.get("quant_algo")
        if algo not in SCHEMES:
            raise ValueError(f"quantization_config.quant_algo {algo!r}: radixlm reads ModelOpt's "
                             f"{' and '.join(SCHEMES)} checkpoints (not NVFP4, MXFP8, INT4 or mixed precision)")
        kv = config.get("kv_cache_quant_algo")
        if kv not in KV_CACHE_ALGOS:
            raise ValueError(f"quantization_config.kv_cache_quant_algo {kv!r}: radixlm reads FP8 KV-cache scales "
                             f"only")
        ignore = exclusion_patterns(config.get("exclude_modules")) + exclusion_patterns(config.get("ignore"))
        return cls(SCHEMES[algo], ignore)

    @classmethod
    def from_flag(cls, requested: QuantizationMethod) -> "ModelOptFp8Config":
        raise ValueError(f"--quantization {requested.value} reads checkpoints exported by NVIDIA ModelOpt "
                         f"(hf_quant_config.json, or quant_method modelopt in config.json); this checkpoint has "
                         f"neither: for FP8 of a float checkpoint at load, pass --quantization fp8")
