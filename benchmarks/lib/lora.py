"""Dummy PEFT LoRA adapters for a model directory's shapes (random A and B, written as PEFT saves them), so the LoRA
benchmarks need no checkpoint."""
from __future__ import annotations

import json
from pathlib import Path

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_dummy_adapter(model_dir: str, out: str, rank: int = 16, alpha: float = 32.0, seed: int = 0,
                        targets: tuple[str, ...] = ALL_TARGETS, dtype: str = "bfloat16", b_scale: float = 0.01) -> str:
    """An adapter_config.json and adapter_model.safetensors for model_dir's config.json; returns `out`. b_scale: B's
    standard deviation (small: a benchmark's adapter barely moves the model; tests that compare outputs take more)."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    shapes = {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv * head_dim), "v_proj": (hidden, kv * head_dim),
              "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
              "down_proj": (inter, hidden)}
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(layers):
        for t in targets:
            d_in, d_out = shapes[t]
            part = "self_attn" if t in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{i}.{part}.{t}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, d_in, generator=g) * d_in**-0.5).to(getattr(torch, dtype))
            tensors[f"{key}.lora_B.weight"] = (torch.randn(d_out, rank, generator=g) * b_scale).to(getattr(torch, dtype))
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(targets), "bias": "none",
        "use_rslora": False, "base_model_name_or_path": model_dir}, indent=2))
    return str(path)
