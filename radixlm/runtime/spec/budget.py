"""The memory a draft model (STANDALONE, an EAGLE head) will take, known before it is loaded: the target's KV budget leaves room for
it (its pool has one slot per target slot, so every pooled token costs both models' KV)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.runtime.args import ServerArgs, SpeculativeAlgorithm
from radixlm.runtime.cache.kv_pool import KVLayout
from radixlm.runtime.cache.kv_quant import kv_cache_torch_dtype
from radixlm.runtime.executor.memory import MemoryReserve
from radixlm.runtime.model_loader.config import ModelConfig, resolve_dtype
from radixlm.runtime.spec.mtp import mtp_config, mtp_weight_bytes, uses_mtp


@dataclass(frozen=True)
class DraftBudget:
    weight_bytes: int = 0  # and the scratch slots'
    kv_bytes_per_token: int = 0


def draft_steps(args: ServerArgs) -> int:
    """Draft tokens a request's draft model chain may have (an EAGLE tree's depth): --speculative-num-steps, which
    ServerArgs sets for a draft model (--speculative-num-draft-tokens - 1 where only that is given)."""
    return args.speculative_num_steps or args.max_draft_tokens


def draft_scratch(args: ServerArgs) -> int:
    """Scratch slots per request row: a chain's steps, or an EAGLE tree's frontiers (spec/eagle_tree.py)."""
    steps = draft_steps(args)
    return max(steps, (steps - 1) * args.speculative_eagle_topk)


def draft_budget(args: ServerArgs, target: ModelConfig, rows: int = 0) -> DraftBudget:
    """Zero without a draft model. Weights are counted from the config as a dense decoder's (attention, gated MLP,
    embeddings; norms left out), a DeepSeek MTP head's as built; `rows` request rows' scratch slots
    (DraftModelRunner) count with them."""
    algo = args.speculative_algorithm
    eagle = algo is not None and algo.is_eagle
    if algo is not SpeculativeAlgorithm.STANDALONE and not eagle:
        return DraftBudget()
    if eagle and uses_mtp(args, target):  # the target's own MTP layer: one latent KV row per token
        kv_bytes = KVLayout.mla(mtp_config(target).num_layers, kv_cache_torch_dtype(args.kv_cache_dtype, target.dtype),
                                target.mla.kv_lora_rank, target.mla.qk_rope_head_dim).bytes_per_token
        return DraftBudget(mtp_weight_bytes(target) + rows * draft_scratch(args) * kv_bytes, kv_bytes)
    path = args.speculative_draft_model_path
    cfg = head_config(path, target) if eagle else ModelConfig.from_path(
        path, dtype=target.dtype, device="cpu", context_length=target.context_len, load_format=args.load_format)
    tc = getattr(cfg.hf_config, "text_config", None) or cfg.hf_config
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = h * (2 * q + 2 * kv) + 3 * h * getattr(tc, "intermediate_size", 4 * h)
    if not eagle:
        embeddings = cfg.vocab_size * h * (1 if getattr(tc, "tie_word_embeddings", False) else 2)
    elif getattr(tc, "draft_vocab_size", None):  # EAGLE-3: fc from 3h, q/k/v from 2h, its own lm_head
        embeddings = 3 * h * h + h * (q + 2 * kv) + tc.draft_vocab_size * h
    else:  # EAGLE-1: fc from 2h; the target's embeddings and lm_head
        embeddings = 2 * h * h
    size = torch.tensor([], dtype=cfg.dtype).element_size()
    kv_bytes = cfg.num_layers * 2 * kv * kv_cache_torch_dtype(args.kv_cache_dtype, cfg.dtype).itemsize
    return DraftBudget((cfg.num_layers * per_layer + embeddings) * size + rows * draft_scratch(args) * kv_bytes, kv_bytes)


def draft_reserve(args: ServerArgs, target: ModelConfig) -> MemoryReserve:
    """What the target's ModelRunner leaves room for: the draft model's weights, its scratch slots per request row
    and its KV beside every pooled token (nothing without a draft model)."""
    budget = draft_budget(args, target)
    if budget == DraftBudget():
        return MemoryReserve()
    return MemoryReserve(budget.weight_bytes, draft_scratch(args) * budget.kv_bytes_per_token, budget.kv_bytes_per_token)


def head_config(path: str, target: ModelConfig) -> ModelConfig:
    """An EAGLE head's config (its architecture names a head, not a model the registry knows), in the target's
    dtype and context length."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(path)
    heads = hf.num_attention_heads
    return ModelConfig(
        model_path=path, hf_config=hf, architecture=(getattr(hf, "architectures", None) or ["EagleHead"])[0],
        dtype=resolve_dtype(target.dtype, hf, "cpu"), context_len=target.context_len, num_layers=hf.num_hidden_layers,
        num_heads=heads, num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
        head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads, hidden_size=hf.hidden_size,
        vocab_size=hf.vocab_size, eos_token_ids=target.eos_token_ids)
