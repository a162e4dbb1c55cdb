"""The target's KV budget leaves room for a STANDALONE draft model: its weights (counted from its config before it
is loaded) and its KV beside every pooled token."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.executor import memory
from radixlm.runtime.spec.budget import DraftBudget, draft_budget, draft_reserve
from radixlm.runtime.spec.runners.draft_model import DraftModelRunner
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.model_loader.config import ModelConfig
from tests.runtime.models.tiny import save_tiny
from tests.runtime.scheduler.conftest import TINY_LLAMA

SMALL = {k: v for k, v in TINY_LLAMA.items() if k != "architectures"} | {
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 2,
    "num_key_value_heads": 1, "tie_word_embeddings": True}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    torch.set_num_threads(1)
    target, draft = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("draft")
    save_tiny(LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "architectures"}), target)
    hf = save_tiny(LlamaConfig(**SMALL), draft, seed=1)
    return str(target), str(draft), hf


def _args(target: str, draft: str | None, **kw) -> ServerArgs:
    spec = {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": draft} if draft else {}
    return ServerArgs(model_path=target, dtype="float32", device="cpu", **spec, **kw)


def test_budget_counts_the_draft_weights_and_kv(dirs):
    target, draft, hf = dirs
    cfg = ModelConfig.from_path(target, dtype="float32", device="cpu")
    assert draft_budget(_args(target, None), cfg) == DraftBudget()
    budget = draft_budget(_args(target, draft), cfg)
    # Every matrix of the checkpoint (norms left out), float32; the tied embeddings once.
    matrices = sum(p.numel() for n, p in hf.named_parameters() if p.dim() > 1)
    assert budget.weight_bytes == 4 * matrices
    assert budget.kv_bytes_per_token == SMALL["num_hidden_layers"] * 2 * 1 * 16 * 4
    # With 10 request rows, their scratch slots: 4 each (speculative_num_steps by default: 4 drafted tokens, so
    # speculative_num_draft_tokens 5, the verified root counted).
    assert draft_budget(_args(target, draft), cfg, 10).weight_bytes == budget.weight_bytes + 40 * budget.kv_bytes_per_token
    runner = DraftModelRunner(_args(target, draft, max_total_tokens=64),
                              ModelRunner(_args(target, None, max_total_tokens=64), cfg, "cpu"), 4)
    assert sum(p.numel() for p in runner.model.parameters() if p.dim() > 1) == matrices
    assert runner.kv_bytes_per_token() == budget.kv_bytes_per_token


def test_the_pool_shrinks_to_hold_both_models_kv(dirs, monkeypatch):
    target, draft, _ = dirs
    monkeypatch.setattr(memory, "physical_memory_bytes", lambda: 1 << 30)
    cfg = ModelConfig.from_path(target, dtype="float32", device="cpu")
    frac = 1e-3  # a 1 MiB budget
    alone = ModelRunner(_args(target, None, mem_fraction_static=frac), cfg, "cpu")
    both = ModelRunner(_args(target, draft, mem_fraction_static=frac), cfg, "cpu",
                       reserve=draft_reserve(_args(target, draft), cfg))
    per_token = alone.kv_bytes_per_token()
    extra = draft_budget(_args(target, draft), cfg).kv_bytes_per_token
    assert alone.max_total_num_tokens == (1 << 30) * frac // per_token
    assert both.max_total_num_tokens == (1 << 30) * frac // (per_token + extra)
