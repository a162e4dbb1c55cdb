"""Mixture-of-experts layers: the router's top-k (topk.py), the experts' computation (fused_moe.py: a Triton grouped
GEMM on CUDA, torch on CPU) and the module that holds a rank's expert weights (layer.py)."""
from radixlm.runtime.layers.moe.fused_moe import fused_experts
from radixlm.runtime.layers.moe.layer import FusedMoE
from radixlm.runtime.layers.moe.topk import select_experts

__all__ = ["FusedMoE", "fused_experts", "select_experts"]
