"""compressed-tensors test checkpoints made by the library: schemes from its presets, scales from its
calculate_qparams over each weight's min / max (per tensor, channel, group or block: what llm-compressor's min-max
observer measures), the tensors from its compressors (`compress`), and the reference weights from the same
compressors' `decompress`; config.json's quantization_config written by ModelCompressor.update_config."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.base import BaseCompressor
from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme, preset_name_to_scheme
from compressed_tensors.quantization.utils import calculate_qparams
from compressed_tensors.utils.match import match_name

from tests.runtime.quantization.helpers import quantize_saved


def scheme(preset: str, targets=("Linear",), block: tuple[int, int] | None = None, **weight_args) -> QuantizationScheme:
    s = preset_name_to_scheme(preset, list(targets))
    if block is not None:
        s.weights.block_structure = list(block)
        if s.input_activations is not None and s.input_activations.group_size:
            s.input_activations.group_size = block[1]
    for k, v in weight_args.items():
        setattr(s.weights, k, v)
    return s


def _min_max(w: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    strategy = getattr(args.strategy, "value", args.strategy)
    if strategy == "tensor":
        return w.min(), w.max()
    if strategy == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    if strategy == "group":
        g = args.group_size
        grouped = w.reshape(w.shape[0], w.shape[1] // g, g)
        return grouped.amin(dim=2), grouped.amax(dim=2)
    if strategy == "block":
        bn, bk = args.block_structure
        n, k = w.shape
        lo = F.pad(w, (0, -k % bk, 0, -n % bn), value=0.0)
        blocks = lo.reshape(lo.shape[0] // bn, bn, lo.shape[1] // bk, bk)
        return blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))
    raise ValueError(strategy)


def compress(w: torch.Tensor, s: QuantizationScheme, fmt: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One weight's compressed tensors (names local to its module) and its decompressed weight."""
    lo, hi = _min_max(w, s.weights)
    scale, zero_point = calculate_qparams(lo, hi, s.weights)
    state = {"weight": w, "weight_scale": scale.to(w.dtype)}
    if not s.weights.symmetric:
        state["weight_zero_point"] = zero_point
    act = s.input_activations
    if act is not None and not act.dynamic:
        state["input_scale"] = torch.tensor([0.0173], dtype=w.dtype)
    compressor = BaseCompressor.get_value_from_registry(fmt)
    out = compressor.compress(state, s)
    deq = compressor.decompress(dict(out), s)["weight"]
    return out, deq


def _is_target(name: str, s: QuantizationScheme) -> bool:
    return "Linear" in s.targets or any(match_name(name, t) for t in s.targets)


def quantize_ct(path: Path, groups: dict[str, QuantizationScheme], fmt: str, ignore: list[str] = ()):
    """Rewrites the float checkpoint at path as compressed-tensors; returns transformers' model of the decompressed
    weights (modules the ignore list names, or no group targets, stay float)."""
    def module(name: str) -> str:
        return name.removesuffix(".weight")

    def group_for(name: str) -> QuantizationScheme | None:
        if any(match_name(module(name), i) for i in ignore):
            return None
        named = [s for s in groups.values() if any(match_name(module(name), t) for t in s.targets)]
        return (named or [s for s in groups.values() if "Linear" in s.targets] or [None])[0]

    def quantize(name: str, w: torch.Tensor):
        return compress(w, group_for(name), fmt)

    hf = quantize_saved(path, quantize, None, skip=lambda name: group_for(name) is None)
    qc = QuantizationConfig(config_groups=dict(groups), format=fmt, ignore=list(ignore),
                            quantization_status="compressed")
    ModelCompressor(quantization_config=qc).update_config(str(path))
    return hf
