"""Quantized test checkpoints from tiny random transformers models, and the comparison every format's test makes.

A float model is saved (tests/runtime/models/tiny.py), its projection weights are replaced in the safetensors file by
a format's tensors (written from the format's specification here, or by compressed-tensors), config.json gets the
format's quantization_config, and the transformers model's weights are set to the dequantized weights (dequantized
here independently of radixlm's kernels.quant, or by the compressed-tensors library): radixlm loading the quantized
checkpoint must then produce transformers' greedy tokens exactly (float32)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig, Qwen2Config, Qwen2MoeConfig

from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.loader import load_model
from tests.runtime.models.conftest import run_logits
from tests.runtime.models.tiny import hf_greedy, random_prompts, save_tiny

VOCAB = 97
PROJ = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
# DeepSeek's projections, MLA's included (q_a / q_b, kv_a_proj_with_mqa, kv_b_proj): every one its FP8 release
# quantizes (the routers stay float).
DEEPSEEK_PROJ = re.compile(
    r"\.(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj|gate_proj|up_proj|down_proj)\.weight$")
NEW_TOKENS = 8


def dense_config(kind: str = "llama", hidden: int = 64, inter: int = 96):
    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_attention_heads=4,
                  num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=128, rms_norm_eps=1e-6,
                  tie_word_embeddings=False)
    return LlamaConfig(**common) if kind == "llama" else Qwen2Config(**common)


def moe_config(kind: str = "mixtral"):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_attention_heads=4,
                  num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=128, rms_norm_eps=1e-6,
                  tie_word_embeddings=False)
    if kind == "mixtral":
        return MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
    return Qwen2MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          shared_expert_intermediate_size=32, norm_topk_prob=False)


# quantize(name, float weight) -> (the checkpoint tensors that replace `<module>.weight`, keyed by their last name
# component, and the dequantized float weight)
Quantizer = Callable[[str, torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]]


def quantize_saved(path: Path, quantize: Quantizer, quantization_config: dict | None,
                   skip: Callable[[str], bool] = lambda name: False, write: bool = True, names: re.Pattern = PROJ):
    """Rewrites the float checkpoint at path: each projection weight (`names`, but those `skip` names) becomes
    quantize's tensors, and config.json gets quantization_config (write False: path stays as it is, for online
    quantization). Returns transformers' model (float32, eval) of the dequantized weights (saved beside path and loaded back:
    transformers maps the per-expert names itself)."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    assert len(files) == 1
    tensors = load_file(files[0])
    out, ref = {}, {}
    for name, t in tensors.items():
        if not names.search(name) or skip(name):
            out[name] = ref[name] = t
            continue
        parts, deq = quantize(name, t.float())
        module = name.removesuffix(".weight")
        for key, value in parts.items():
            out[f"{module}.{key}"] = value.contiguous()
        ref[name] = deq.to(t.dtype).contiguous()
    ref_dir = path.parent / f"{path.name}-dequantized"
    shutil.copytree(path, ref_dir, dirs_exist_ok=True)
    save_file(ref, ref_dir / files[0].name, metadata={"format": "pt"})
    if write:
        save_file(out, files[0], metadata={"format": "pt"})
        set_quantization_config(path, quantization_config)
    return reference_model(ref_dir)


def reference_model(path: Path):
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    return hf.eval()


def set_quantization_config(path: Path, quantization_config: dict | None) -> None:
    cfg_path = Path(path) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if quantization_config is None:
        cfg.pop("quantization_config", None)
    else:
        cfg["quantization_config"] = quantization_config
    cfg_path.write_text(json.dumps(cfg, indent=2))


def radix_greedy(model, prompt: list[int], new_tokens: int, eos: frozenset[int]) -> list[int]:
    ids = list(prompt)
    out = []
    for _ in range(new_tokens):
        tok = int(run_logits(model, torch.tensor(ids))[-1].argmax())
        out.append(tok)
        if tok in eos:
            break
        ids.append(tok)
    return out


def load(path, quantization: str | None = None, load_format: str = "auto", parallel=None):
    from radixlm.runtime.distributed.parallel import SINGLE

    cfg = ModelConfig.from_path(str(path), dtype="float32", quantization=quantization)
    return load_model(cfg, load_format, "cpu", parallel or SINGLE), cfg


def assert_greedy_matches(path, hf, quantization: str | None = None, seed: int = 1, lens=(5, 11)) -> None:
    """radixlm on the quantized checkpoint: the same greedy tokens as transformers on the dequantized weights, and
    the prompt's logits within float32 rounding."""
    torch.set_num_threads(1)
    model, cfg = load(path, quantization)
    assert_quantized(model)
    prompts = random_prompts(seed, list(lens), VOCAB)
    reference = hf_greedy(hf, prompts, cfg.eos_token_ids, NEW_TOKENS)
    for prompt, (ref_ids, _) in zip(prompts, reference):
        assert radix_greedy(model, prompt, NEW_TOKENS, cfg.eos_token_ids) == ref_ids
    ids = torch.tensor(prompts[-1])
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
    assert (run_logits(model, ids) - ref).abs().max().item() < 1e-4


def tiny_float(path, config, seed: int = 0):
    return save_tiny(config, path, seed)


def assert_quantized(model) -> None:
    """Every projection and expert layer holds a quantized method (none silently left in float)."""
    from radixlm.runtime.quantization.modules import QUANTIZABLE

    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, QUANTIZABLE)]
    left = [n for n, m in layers if m.quant_method is None]
    assert layers and not left, left
