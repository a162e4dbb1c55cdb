"""Tiny INT4 checkpoints (AWQ, GPTQ, compressed-tensors W4A16) made from a float checkpoint written by transformers,
and the float checkpoint of their dequantized weights (transformers' reference for them).

Every linear radixlm quantizes (attention and MLP projections, experts, shared experts) is quantized round-to-
nearest; embeddings, lm_head, routers and the shared-expert gate stay float. Act-order draws one channel order per
input (q | k | v share the attention's, gate | up the MLP's or the expert's), as GPTQ's Hessian order does."""
from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from radixlm.runtime.quantization.int4 import quantize_codes
from radixlm.runtime.quantization.int4_formats import AWQFormat, CompressedW4A16Format, GPTQFormat, Int4Format

QUANTIZED = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
# The projections that read the same input share an act-order channel order.
SHARED_INPUT = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "gate_proj": "mlp", "up_proj": "mlp",
                "w1": "mlp", "w3": "mlp"}


@dataclass(frozen=True)
class Int4Spec:
    """What to write: the format ("awq", "gptq", "compressed-tensors") and its options."""

    method: str
    group_size: int = 32
    sym: bool = False
    act_order: bool = False
    v1: bool = True
    skip: tuple[str, ...] = field(default=())  # module names left float (modules_to_not_convert / ignore)

    def fmt(self) -> Int4Format:
        if self.method == "awq":
            return AWQFormat()
        if self.method == "gptq":
            return GPTQFormat(v1=self.v1, act_order=self.act_order, symmetric=self.sym)
        return CompressedW4A16Format(symmetric=self.sym, act_order=self.act_order)

    def quantization_config(self) -> dict:
        if self.method == "awq":
            return {"quant_method": "awq", "bits": 4, "group_size": self.group_size, "zero_point": True,
                    "version": "gemm", "modules_to_not_convert": list(self.skip) or None}
        if self.method == "gptq":
            return {"quant_method": "gptq", "bits": 4, "group_size": self.group_size, "desc_act": self.act_order,
                    "sym": self.sym, "checkpoint_format": "gptq" if self.v1 else "gptq_v2",
                    "modules_to_not_convert": list(self.skip) or None}
        weights = {"num_bits": 4, "type": "int", "symmetric": self.sym, "dynamic": False,
                   "strategy": "channel" if self.group_size == -1 else "group",
                   "group_size": None if self.group_size == -1 else self.group_size,
                   "actorder": "group" if self.act_order else None}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized",
                "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                              "output_activations": None, "format": "pack-quantized"}},
                "ignore": ["lm_head", *self.skip]}


def _order(module: str, k: int) -> torch.Tensor:
    m = QUANTIZED.search(module + ".weight")
    proj = m.group(1) if m else ""
    key = module[: module.rfind(".")] + "/" + SHARED_INPUT.get(proj, proj)
    return torch.randperm(k, generator=torch.Generator().manual_seed(zlib.crc32(key.encode())))


def quantize_checkpoint(src: str | Path, dst: str | Path, ref: str | Path, spec: Int4Spec,
                        names: re.Pattern = QUANTIZED) -> None:
    """src: a float checkpoint dir (one model.safetensors); dst: the INT4 checkpoint; ref: the float checkpoint of
    the dequantized weights. Both copy src's config (dst with quantization_config) and tokenizer files."""
    src, dst, ref = Path(src), Path(dst), Path(ref)
    tensors = load_file(str(src / "model.safetensors"))
    fmt = spec.fmt()
    quantized: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        module = name.removesuffix(".weight")
        if names.search(name) is None or any(re.search(rf"(^|\.){re.escape(s)}($|\.)", module)
                                                 for s in spec.skip):
            quantized[name] = dequantized[name] = w
            continue
        k = w.shape[1]
        group = k if spec.group_size == -1 else spec.group_size
        order = _order(module, k) if spec.act_order else None
        codes = quantize_codes(w.float(), group, fmt.symmetric, order)
        dequantized[name] = codes.dequantize().to(w.dtype)
        for tname, t in fmt.pack(codes).items():
            quantized[f"{module}.{tname}"] = t.contiguous()
    for path, out in ((dst, quantized), (ref, dequantized)):
        path.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.name != "model.safetensors" and f.is_file():
                (path / f.name).write_bytes(f.read_bytes())
        save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = spec.quantization_config()
    (dst / "config.json").write_text(json.dumps(config, indent=2))
