"""Mixtral: Mistral's attention with a sparse MoE block in every layer (router `gate`, experts w1 = gate, w3 = up,
w2 = down; the top-k routing weights always renormalised)."""
from __future__ import annotations

import re

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import Parallel
from radixlm.runtime.kernels.gemm import Prologue, apply_prologue
from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.moe import FusedMoE, expert_weight_name
from radixlm.runtime.models.mistral import MistralForCausalLM

# Checkpoint: model.layers.{i}.block_sparse_moe.experts.{e}.w{1,2,3}.weight
_EXPERT = re.compile(r"\.experts\.(\d+)\.(w1|w2|w3)\.(\w+)$")
_PARTS = {"w1": "gate", "w3": "up", "w2": "down"}


class MixtralMoE(nn.Module):
    can_defer_reduce = True  # LlamaDecoderLayer may leave the sum over ranks to the next norm

    def __init__(self, config, parallel: Parallel):
        super().__init__()
        self.parallel = parallel
        self.gate = Linear(config.hidden_size, config.num_local_experts)  # the router, replicated
        self.experts = FusedMoE(config.num_local_experts, config.num_experts_per_tok, config.hidden_size,
                                config.intermediate_size, renormalize=True, parallel=parallel, reduce_results=False)

    def forward(self, hidden: torch.Tensor, prologue: Prologue | None = None, reduce: bool = True) -> torch.Tensor:
        """reduce=False: this rank's partial sum (tensor parallel), left to the next norm."""
        hidden = apply_prologue(prologue, hidden)
        out = self.experts(hidden, self.gate(hidden))
        return self.parallel.all_reduce(out) if reduce else out


class MixtralForCausalLM(MistralForCausalLM):
    @staticmethod
    def build_mlp(config, layer_id: int, parallel: Parallel) -> nn.Module:
        return MixtralMoE(config, parallel)

    def map_weight_name(self, name: str) -> tuple[str, object]:
        name = name.replace(".block_sparse_moe.", ".mlp.")
        return expert_weight_name(name, _EXPERT, _PARTS) or super().map_weight_name(name)
