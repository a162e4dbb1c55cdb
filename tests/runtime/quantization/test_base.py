"""The framework's slicing (quantization/base.py) that every format's method inherits: a QuantParam's checkpoint
tensor split over 2 ranks for merged column-parallel and row-parallel layers, with packed and grouped dims (a
GPTQ-like qweight (K / 8, N) and scales (K / g, N)), a per-input-channel tensor shared by merged shards, and a
per-shard vector (compressed-tensors' weight_shape): the ranks' parts put back together are the checkpoint."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.distributed.parallel import Parallel
from radixlm.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear, Shard
from radixlm.runtime.quantization import LinearMethod, QuantParam

K, G = 64, 16
PARAMS = [
    QuantParam("qweight", torch.int32, out_dim=1, in_dim=0, in_unit=8, exact_dtype=True),
    QuantParam("scales", torch.float32, out_dim=1, in_dim=0, in_unit=G),
    QuantParam("g_idx", torch.int32, out_dim=None, in_dim=0, exact_dtype=True),
    QuantParam("weight_shape", torch.int64, out_dim=None, in_dim=None, per_shard=True, value_shape=(2,),
               exact_dtype=True),
]


class Toy(LinearMethod):
    def __init__(self, params=tuple(PARAMS)):
        self._params = list(params)

    def params(self, layer):
        return self._params

    def quantize_checkpoint(self, layer, w):
        raise NotImplementedError

    def apply(self, layer, x, bias):
        raise NotImplementedError


def _tensors(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"qweight": torch.randint(-2**31, 2**31 - 1, (K // 8, n), generator=g, dtype=torch.int32),
            "scales": torch.rand(K // G, n, generator=g), "g_idx": torch.arange(K, dtype=torch.int32) // G,
            "weight_shape": torch.tensor([n, K])}


def _load(layer, shards_full):
    layer.quant_method = Toy()
    layer.quant_method.create_weights(layer)
    assert not hasattr(layer, "weight") or layer.weight is None
    for sid, tensors in enumerate(shards_full):
        for p in PARAMS:
            layer.load_weight(p.name, getattr(layer, p.name), tensors[p.name],
                              sid if len(shards_full) > 1 else None)
    return layer


def test_merged_column_parallel():
    full = [_tensors(32, 0), _tensors(16, 1), _tensors(16, 2)]
    parts = []
    for rank in range(2):
        par = Parallel(tp_rank=rank, tp_size=2)
        layer = ColumnParallelLinear(K, [Shard.split(32, par, "q"), Shard.split(16, par, "k"),
                                         Shard.split(16, par, "v")])
        parts.append(_load(layer, full))
        assert layer.quant_method.weight_shards(layer, "qweight") == [0, 1, 2]
        assert layer.checkpoint_shape("scales", 1) == (K // G, 16)
    for i, (lo, n) in enumerate([(0, 16), (16, 8), (24, 8)]):
        for name in ("qweight", "scales"):
            got = torch.cat([getattr(p, name)[:, lo:lo + n] for p in parts], dim=1)
            assert torch.equal(got, full[i][name])
        assert all(torch.equal(p.weight_shape[i], full[i]["weight_shape"]) for p in parts)
    assert all(torch.equal(p.g_idx, full[0]["g_idx"]) for p in parts)


def test_row_parallel():
    full = _tensors(24, 3)
    parts = [_load(RowParallelLinear(K, 24, parallel=Parallel(tp_rank=r, tp_size=2)), [full]) for r in range(2)]
    for name in ("qweight", "scales", "g_idx"):
        assert torch.equal(torch.cat([getattr(p, name) for p in parts], dim=0), full[name])
    assert parts[0].qweight.shape == (K // 16, 24) and parts[1].scales.shape == (K // G // 2, 24)


def test_a_split_inside_a_group_is_refused():
    layer = RowParallelLinear(K, 24, parallel=Parallel(tp_rank=1, tp_size=4))  # 16 input channels per rank
    layer.quant_method = Toy([*PARAMS, QuantParam("big_groups", torch.float32, out_dim=1, in_dim=0, in_unit=32)])
    with pytest.raises(ValueError, match=r"input channels 16\.\.32 of 64 do not fall on the 32-channel"):
        layer.quant_method.create_weights(layer)


def test_dtype_and_shape_errors_name_the_tensor():
    layer = _load(ColumnParallelLinear(K, [Shard(24, 24, 0)]), [_tensors(24, 4)])
    with pytest.raises(ValueError, match="tensor qweight is stored as torch.float32, expected torch.int32"):
        layer.load_weight("qweight", layer.qweight, torch.zeros(K // 8, 24), None)
    with pytest.raises(ValueError, match=r"tensor scales has shape \(3, 24\), expected \(4, 24\)"):
        layer.load_weight("scales", layer.scales, torch.zeros(3, 24), None)
