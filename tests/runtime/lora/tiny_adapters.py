"""PEFT adapters on tiny random checkpoints (tests/runtime/models/tiny.py), with random non-zero A and B
(init_lora_weights=False), and the PEFT-merged transformers model of each as the reference."""
from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(hf, path, seed: int, r: int = 8, alpha: float = 16, targets=ALL, rslora: bool = False):
    """Saves a PEFT adapter of `hf` (left unchanged) to path; returns the merged model (float32, eval)."""
    import copy

    torch.manual_seed(seed)
    base = copy.deepcopy(hf)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False,
                        use_rslora=rslora, lora_dropout=0.0)
    peft_model = get_peft_model(base, config)
    with torch.no_grad():  # PEFT's non-default init leaves B small: larger so the adapter changes the answers
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.mul_(4.0 if "lora_B" in name else 1.0)
    peft_model.save_pretrained(path)
    return peft_model.merge_and_unload().eval()
