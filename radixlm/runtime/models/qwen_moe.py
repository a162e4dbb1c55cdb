"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B) and Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B).

Both: a layer's feed-forward block is sparse unless the layer is in `mlp_only_layers` or `decoder_sparse_step` skips
it (then a dense MLP of `intermediate_size`); the router's top-k weights are renormalised iff `norm_topk_prob`; each
expert has `moe_intermediate_size`. Qwen2-MoE adds a shared expert to every sparse block, scaled per token by
sigmoid(shared_expert_gate(x)), and has a bias on q, k, v; Qwen3-MoE has no shared expert and RMSNorms q and k per
head (as Qwen3)."""
from __future__ import annotations

import re

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.kernels.gemm import Prologue, apply_prologue
from radixlm.runtime.layers.activation import SiluAndMul
from radixlm.runtime.layers.linear import ColumnParallelLinear, Linear, RowParallelLinear, Shard
from radixlm.runtime.layers.moe import FusedMoE, expert_weight_name
from radixlm.runtime.models.llama import LlamaForCausalLM, LlamaMLP

# Checkpoint: model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight
_EXPERT = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(\w+)$")
_PARTS = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}


class SharedExpertMLP(nn.Module):
    """The shared expert: a dense gated MLP split over the tensor-parallel ranks, its output not yet reduced."""

    def __init__(self, hidden_size: int, intermediate_size: int, parallel: Parallel):
        super().__init__()
        part = Shard.split(intermediate_size, parallel, "shared_expert_intermediate_size")
        self.gate_up_proj = ColumnParallelLinear(hidden_size, [part, part])
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, parallel=parallel)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x), self.act_fn.prologue(), reduce=False)


class QwenSparseMoeBlock(nn.Module):
    can_defer_reduce = True  # LlamaDecoderLayer may leave the sum over ranks to the next norm

    def __init__(self, config, parallel: Parallel, shared_expert_size: int):
        super().__init__()
        self.parallel = parallel
        self.gate = Linear(config.hidden_size, config.num_experts)  # the router, replicated
        # The routed and shared partial sums share one all-reduce (here, or the next norm's).
        self.experts = FusedMoE(config.num_experts, config.num_experts_per_tok, config.hidden_size,
                                config.moe_intermediate_size, renormalize=bool(config.norm_topk_prob),
                                parallel=parallel, reduce_results=False)
        if shared_expert_size:
            self.shared_expert = SharedExpertMLP(config.hidden_size, shared_expert_size, parallel)
            self.shared_expert_gate = Linear(config.hidden_size, 1)
        else:
            self.shared_expert = self.shared_expert_gate = None

    def forward(self, hidden: torch.Tensor, prologue: Prologue | None = None, reduce: bool = True) -> torch.Tensor:
        """reduce=False: this rank's partial sum (tensor parallel), left to the next norm."""
        hidden = apply_prologue(prologue, hidden)
        out = self.experts(hidden, self.gate(hidden))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(hidden)) * self.shared_expert(hidden)
        return self.parallel.all_reduce(out) if reduce else out


def is_sparse_layer(config, layer_id: int) -> bool:
    """As transformers decides: not in mlp_only_layers, and every decoder_sparse_step-th layer (1-based)."""
    mlp_only = getattr(config, "mlp_only_layers", None) or []
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return layer_id not in mlp_only and config.num_experts > 0 and (layer_id + 1) % step == 0


class _QwenMoeForCausalLM(LlamaForCausalLM):
    has_shared_expert = False

    @classmethod
    def build_mlp(cls, config, layer_id: int, parallel: Parallel) -> nn.Module:
        if not is_sparse_layer(config, layer_id):
            return LlamaMLP(config.hidden_size, config.intermediate_size, parallel=parallel)
        shared = getattr(config, "shared_expert_intermediate_size", 0) if cls.has_shared_expert else 0
        return QwenSparseMoeBlock(config, parallel, shared or 0)

    def map_weight_name(self, name: str) -> tuple[str, object]:
        return expert_weight_name(name, _EXPERT, _PARTS) or super().map_weight_name(name)


class Qwen2MoeForCausalLM(_QwenMoeForCausalLM):
    o_bias_follows_attention_bias = False
    has_shared_expert = True

    def __init__(self, config, parallel: Parallel = SINGLE):
        # transformers' Qwen2MoeConfig says `qkv_bias` (default True); LlamaForCausalLM reads this before building.
        self.qkv_bias_default = bool(getattr(config, "qkv_bias", True))
        super().__init__(config, parallel)


class Qwen3MoeForCausalLM(_QwenMoeForCausalLM):
    qk_norm = True
