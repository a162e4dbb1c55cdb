"""Tensor-parallel layers on 2 gloo ranks give the single-rank result (float32, to rounding)."""
from __future__ import annotations

import torch

from radixlm.runtime.distributed.parallel import SINGLE
from radixlm.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear, Shard, VocabEmbedding
from tests.runtime.distributed.harness import run_ranks


def _weights():
    g = torch.Generator().manual_seed(0)
    return {"qkv": [torch.randn(n, 16, generator=g) for n in (8, 4, 4)], "o": torch.randn(16, 8, generator=g),
            "emb": torch.randn(11, 16, generator=g), "x": torch.randn(5, 16, generator=g),
            "ids": torch.tensor([0, 3, 5, 6, 10])}


def _block(parallel, w):
    """Embedding -> q|k|v (2 q heads, 1 kv head of dim 4: the kv head is replicated at tp 2) -> o of q -> head."""
    emb = VocabEmbedding(11, 16, parallel)
    emb.load_weight("weight", emb.weight, w["emb"], None)
    qkv = ColumnParallelLinear(16, [Shard.heads(2, 4, parallel, "q"), Shard.heads(1, 4, parallel, "kv"),
                                    Shard.heads(1, 4, parallel, "kv")])
    for i, t in enumerate(w["qkv"]):
        qkv.load_weight("weight", qkv.weight, t, i)
    o = RowParallelLinear(8, 16, parallel=parallel)
    o.load_weight("weight", o.weight, w["o"], None)
    h = emb(w["ids"]) + w["x"]
    q, k, v = qkv(h).split(qkv.output_sizes, dim=-1)
    out = o(q * (k.sum(-1, keepdim=True) + v.mean(-1, keepdim=True)))
    logits = parallel.all_gather(out @ emb.weight.T)[:, :11]
    return out, logits


def test_two_ranks_equal_one():
    w = _weights()
    ref_out, ref_logits = _block(SINGLE, w)
    for out, logits in run_ranks(2, _block, w):
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)


def _broadcasts(parallel):
    sent = [None, ("abort", 3), list(range(5000))]  # nothing, a small object, one past the first collective
    return [parallel.broadcast_object(x if parallel.tp_rank == 0 else "not rank 0's") for x in sent]


def test_broadcast_object_gives_every_rank_rank0s_object():
    for got in run_ranks(2, _broadcasts):
        assert got == [None, ("abort", 3), list(range(5000))]


def test_indivisible_sizes_are_refused():
    import pytest

    from radixlm.runtime.distributed.parallel import Parallel

    two = Parallel(tp_rank=0, tp_size=2)
    with pytest.raises(ValueError, match="not divisible"):
        Shard.heads(3, 4, two, "num_attention_heads")
    with pytest.raises(ValueError, match="ep-size"):
        Parallel(tp_rank=0, tp_size=2, ep_size=3)
