"""The router's choice: softmax over the experts' logits, the top k of them, optionally renormalised to sum to 1.

Mixtral always renormalises; Qwen2-MoE and Qwen3-MoE do as their config's `norm_topk_prob` says. The softmax and the
weights are float32 whatever the activation dtype (as the Hugging Face routers compute them)."""
from __future__ import annotations

import torch


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits (T, E) -> (weights (T, top_k) float32, expert ids (T, top_k) int32), best first."""
    if top_k > router_logits.shape[-1]:
        raise ValueError(f"top_k ({top_k}) exceeds the number of experts ({router_logits.shape[-1]})")
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)
