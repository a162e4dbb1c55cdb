"""Linear and embedding layers whose parameters start uninitialised: the loader fills every one of
them (real weights or dummy init), so skipping torch's default init saves seconds on big models.
No tensor parallelism yet; `output_sizes` records the shards of a fused projection (qkv, gate_up)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.layers import cpu_gemm, gemm


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.packed_weight: torch.Tensor | None = None  # set by pack_for_cpu() once weights are final
        self.gemm_choices: dict[int, bool] = {}  # CUDA: row count -> skinny kernel faster (set by gemm.linear)

    def pack_for_cpu(self) -> None:
        self.packed_weight = cpu_gemm.pack_weight(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemm.linear(x, self.weight, self.bias, self.packed_weight, self.gemm_choices)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output dim, e.g. q|k|v or gate|up."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False):
        super().__init__(in_features, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)

    def shard_range(self, shard_id: int) -> tuple[int, int]:
        start = sum(self.output_sizes[:shard_id])
        return start, start + self.output_sizes[shard_id]


class VocabEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
