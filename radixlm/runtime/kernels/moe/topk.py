"""The router's choice of experts per token, from its logits, as the Hugging Face routers compute it (in float32
whatever the activation dtype):

  scores   softmax over the experts (Mixtral, Qwen-MoE, DeepSeek-V2) or an independent sigmoid per expert
           (DeepSeek-V3's noaux_tc);
  choice   the top k of the scores, plus `correction_bias` where given (V3's aux-loss-free balancing: the bias moves
           the choice only, the weights stay the unbiased scores); with groups (DeepSeek's grouped top-k) only experts
           of the `topk_group` best of `num_groups` equal groups are eligible, a group scored by its best expert (V2's
           group_limited_greedy) or the sum of its best two (V3);
  weights  the chosen scores, renormalised to sum to 1 when `renormalize` (norm_topk_prob), then times
           `routed_scaling_factor`.

Mixtral always renormalises; Qwen2-MoE and Qwen3-MoE do as their config's `norm_topk_prob` says."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ScoringFunc(str, enum.Enum):
    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


class GroupScore(str, enum.Enum):
    MAX = "max"  # DeepSeek-V2 group_limited_greedy
    TOP2_SUM = "top2_sum"  # DeepSeek-V3 noaux_tc


@dataclass(frozen=True)
class ExpertGroups:
    num_groups: int
    topk_group: int
    score: GroupScore = GroupScore.MAX

    def check(self, num_experts: int, top_k: int) -> None:
        if self.num_groups < 1 or num_experts % self.num_groups:
            raise ValueError(f"n_group ({self.num_groups}) must divide the number of experts ({num_experts})")
        if not 1 <= self.topk_group <= self.num_groups:
            raise ValueError(f"topk_group ({self.topk_group}) must be between 1 and n_group ({self.num_groups})")
        per_group = num_experts // self.num_groups
        if self.score is GroupScore.TOP2_SUM and per_group < 2:
            raise ValueError(f"groups scored by their best two experts need at least 2 experts per group, got "
                             f"{per_group}")
        if top_k > self.topk_group * per_group:
            raise ValueError(f"top_k ({top_k}) exceeds the experts of topk_group ({self.topk_group}) groups of "
                             f"{per_group}")


@dataclass(frozen=True)
class Routing:
    top_k: int
    renormalize: bool
    scoring: ScoringFunc = ScoringFunc.SOFTMAX
    groups: ExpertGroups | None = None
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}")
        if not self.routed_scaling_factor > 0:
            raise ValueError(f"routed_scaling_factor must be positive, got {self.routed_scaling_factor}")

    def check(self, num_experts: int) -> None:
        if self.top_k > num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds the number of experts ({num_experts})")
        if self.groups is not None:
            self.groups.check(num_experts, self.top_k)


    def select(self, router_logits: torch.Tensor,
               correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return select_experts(router_logits, self.top_k, self.renormalize, scoring=self.scoring, groups=self.groups,
                              routed_scaling_factor=self.routed_scaling_factor, correction_bias=correction_bias)


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool, *,
                   scoring: ScoringFunc = ScoringFunc.SOFTMAX, groups: ExpertGroups | None = None,
                   routed_scaling_factor: float = 1.0,
                   correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits (T, E) -> (weights (T, top_k) float32, expert ids (T, top_k) int32), best first unless groups
    or a correction bias reorder the choice. correction_bias: (E,), added to the scores for the choice only."""
    num_experts = router_logits.shape[-1]
    Routing(top_k, renormalize, scoring, groups, routed_scaling_factor).check(num_experts)
    if correction_bias is not None and tuple(correction_bias.shape) != (num_experts,):
        raise ValueError(f"correction_bias has shape {tuple(correction_bias.shape)}, expected ({num_experts},)")
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring is ScoringFunc.SOFTMAX else logits.sigmoid()
    if groups is None and correction_bias is None:
        weights, ids = torch.topk(scores, top_k, dim=-1)
    else:
        choice = scores if correction_bias is None else scores + correction_bias.float()
        if groups is not None:
            choice = _mask_groups(choice, groups)
        ids = torch.topk(choice, top_k, dim=-1).indices
        weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights, ids.to(torch.int32)


def _mask_groups(choice: torch.Tensor, groups: ExpertGroups) -> torch.Tensor:
    """choice with the experts outside each token's topk_group best groups set to -inf."""
    t, e = choice.shape
    grouped = choice.view(t, groups.num_groups, e // groups.num_groups)
    if groups.score is GroupScore.MAX:
        group_scores = grouped.max(dim=-1).values
    else:
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    keep = torch.topk(group_scores, groups.topk_group, dim=-1).indices
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
    return grouped.masked_fill(~mask[:, :, None], float("-inf")).view(t, e)
