"""Mixture-of-experts kernels: the router's top-k (topk.py) and the experts' computation (fused_moe.py: a Triton
grouped GEMM on CUDA, torch on CPU; quant_moe.py: the same on quantized experts, CUDA only, with its torch reference
quant_moe_ref.py). The module holding a rank's expert weights is layers.moe.FusedMoE."""
from radixlm.runtime.kernels.moe.fused_moe import (
    TRITON_CHUNK_TOKENS, fused_experts, fused_experts_triton, reachable_configs)
from radixlm.runtime.kernels.moe.topk import ExpertGroups, GroupScore, Routing, ScoringFunc, select_experts

__all__ = ["TRITON_CHUNK_TOKENS", "ExpertGroups", "GroupScore", "Routing", "ScoringFunc", "fused_experts",
           "fused_experts_triton", "reachable_configs", "select_experts"]
