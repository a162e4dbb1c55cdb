"""DeepSeek's routing (kernels.moe.topk) against transformers' own routers on random logits: V2's greedy and
group_limited_greedy softmax top-k, V3's sigmoid top-k with the correction bias and groups scored by their best two;
the same (expert, weight) pairs per token."""
from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV2Config, DeepseekV3Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

from radixlm.runtime.kernels.moe import ExpertGroups, GroupScore, Routing, ScoringFunc, select_experts

E, H, T = 16, 8, 40


def _pairs(weights: torch.Tensor, ids: torch.Tensor) -> list[dict[int, float]]:
    return [{int(i): float(w) for i, w in zip(row_ids, row_w)} for row_ids, row_w in zip(ids, weights.detach())]


def _assert_same(got, want) -> None:
    for g, w in zip(_pairs(*got), _pairs(*want), strict=True):
        assert g.keys() == w.keys()
        assert all(abs(g[k] - w[k]) < 1e-6 for k in g)


def _hidden_and_router(router: torch.nn.Module, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        router.weight.copy_(torch.randn(E, H, generator=g))
    return torch.randn(T, H, generator=g)


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy"])
def test_v2_routing_matches_transformers(method):
    cfg = DeepseekV2Config(hidden_size=H, num_attention_heads=2, n_routed_experts=E, num_experts_per_tok=3, topk_method=method, n_group=4,
                           topk_group=2, routed_scaling_factor=1.5)
    router = DeepseekV2TopkRouter(cfg)
    x = _hidden_and_router(router, 1)
    _logits, want_w, want_ids = router(x)
    groups = ExpertGroups(4, 2, GroupScore.MAX) if method != "greedy" else None
    routing = Routing(3, False, ScoringFunc.SOFTMAX, groups, 1.5)
    _assert_same(routing.select(x @ router.weight.T), (want_w, want_ids))


@pytest.mark.parametrize("norm", [True, False])
def test_v3_routing_matches_transformers(norm):
    cfg = DeepseekV3Config(hidden_size=H, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=E, num_experts_per_tok=4, n_group=4, topk_group=2,
                           norm_topk_prob=norm, routed_scaling_factor=2.5)
    router = DeepseekV3TopkRouter(cfg)
    x = _hidden_and_router(router, 2)
    bias = torch.randn(E, generator=torch.Generator().manual_seed(3)) * 0.3
    router.e_score_correction_bias.copy_(bias)
    _logits, want_w, want_ids = router(x)
    got = select_experts(x @ router.weight.T, 4, norm, scoring=ScoringFunc.SIGMOID,
                         groups=ExpertGroups(4, 2, GroupScore.TOP2_SUM), routed_scaling_factor=2.5,
                         correction_bias=bias)
    _assert_same(got, (want_w, want_ids))
    unbiased = select_experts(x @ router.weight.T, 4, norm, scoring=ScoringFunc.SIGMOID,
                              groups=ExpertGroups(4, 2, GroupScore.TOP2_SUM), routed_scaling_factor=2.5)
    assert not torch.equal(unbiased[1].sort(-1).values, got[1].sort(-1).values)  # the bias moves the choice


def test_group_masking_only_picks_experts_of_the_best_groups():
    logits = torch.tensor([[3.0, 0.0, 0.0, 0.0, 2.5, 2.5, 0.0, 0.0]])  # group 0 has the best expert, group 2 the best two
    _w, by_max = select_experts(logits, 2, True, groups=ExpertGroups(4, 1, GroupScore.MAX))
    _w, by_top2 = select_experts(logits, 2, True, groups=ExpertGroups(4, 1, GroupScore.TOP2_SUM))
    assert sorted(by_max[0].tolist()) == [0, 1] and sorted(by_top2[0].tolist()) == [4, 5]


def test_routing_bounds_are_checked():
    logits = torch.randn(2, 8)
    with pytest.raises(ValueError, match="n_group"):
        select_experts(logits, 2, True, groups=ExpertGroups(3, 1))
    with pytest.raises(ValueError, match="topk_group"):
        select_experts(logits, 2, True, groups=ExpertGroups(4, 5))
    with pytest.raises(ValueError, match="exceeds the experts of topk_group"):
        select_experts(logits, 5, True, groups=ExpertGroups(4, 2))
    with pytest.raises(ValueError, match="correction_bias"):
        select_experts(logits, 2, True, correction_bias=torch.zeros(7))
    with pytest.raises(ValueError, match="routed_scaling_factor"):
        Routing(2, True, routed_scaling_factor=0.0)
