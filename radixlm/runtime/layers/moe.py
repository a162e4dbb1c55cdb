"""FusedMoE: one layer's routed experts, stacked, as this rank holds them.

  ep_size == 1:        every rank holds every expert, the intermediate dim split over the tensor-parallel ranks
                       (I_local = I / tp_size): each rank's down projection yields a partial sum.
  ep_size == tp_size:  each rank holds num_experts / ep_size whole experts (I_local = I); the (token, expert) pairs
                       routed to other ranks' experts contribute zero here.

Either way the rank's output is a partial sum that the all-reduce completes (unless the caller asks to reduce later,
to fold a shared expert into the same all-reduce).

Checkpoints store each expert's projections separately; `load_weight` takes one of them with shard id
(global expert id, "gate" | "up" | "down") and copies this rank's part into w13 (gate rows, then up rows) or w2.

Quantized experts (`quant_method` set by radixlm.runtime.quantization.quantize_modules) hold their format's
w13_<name> / w2_<name> parameters (checkpoint `experts.{e}.{proj}.<name>`); their loading and computation are the
method's."""
from __future__ import annotations

import re

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel, divide
from radixlm.runtime.kernels.moe import Routing, fused_experts
from radixlm.runtime.layers.linear import copy_checked

PARTS = {"gate": "w13_weight", "up": "w13_weight", "down": "w2_weight"}


class FusedMoE(nn.Module):
    quant_method = None  # a quantization MoEMethod, or None: float

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, renormalize: bool,
                 parallel: Parallel = SINGLE, reduce_results: bool = True, routing: Routing | None = None):
        """routing: the router's whole rule (kernels.moe.Routing: DeepSeek's scoring, groups and scaling); None:
        softmax top_k, renormalised as `renormalize` says. Given, its top_k and renormalize must be these."""
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok ({top_k}) must be between 1 and num_experts ({num_experts})")
        routing = routing or Routing(top_k, renormalize)
        if (routing.top_k, routing.renormalize) != (top_k, renormalize):
            raise ValueError(f"routing {routing} disagrees with top_k={top_k}, renormalize={renormalize}")
        routing.check(num_experts)
        self.routing = routing
        self.parallel = parallel
        self.num_experts = num_experts
        self.top_k = top_k
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.renormalize = renormalize
        self.reduce_results = reduce_results
        if parallel.ep_size > 1:
            if num_experts % parallel.ep_size:
                raise ValueError(f"num_experts ({num_experts}) is not divisible by the expert-parallel size "
                                 f"{parallel.ep_size}")
            self.num_local_experts = num_experts // parallel.ep_size
            self.expert_start = parallel.ep_rank * self.num_local_experts
            self.local_intermediate = intermediate_size
            self.inter_start = 0
        else:
            self.num_local_experts = num_experts
            self.expert_start = 0
            self.local_intermediate = divide(intermediate_size, parallel.tp_size, "moe_intermediate_size")
            self.inter_start = parallel.tp_rank * self.local_intermediate
        e, i = self.num_local_experts, self.local_intermediate
        self.w13_weight = nn.Parameter(torch.empty(e, 2 * i, hidden_size), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(e, hidden_size, i), requires_grad=False)

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor,
                correction_bias: torch.Tensor | None = None) -> torch.Tensor:
        """correction_bias: the router's (num_experts,) e_score_correction_bias (DeepSeek-V3), for the choice only."""
        weights, ids = self.routing.select(router_logits, correction_bias)
        if self.quant_method is not None:
            out = self.quant_method.apply(self, hidden, weights, ids)
        else:
            out = fused_experts(hidden, self.w13_weight, self.w2_weight, weights, ids, self.expert_start,
                                self.num_experts)
        return self.parallel.all_reduce(out) if self.reduce_results else out

    def local_experts(self) -> range:
        return range(self.expert_start, self.expert_start + self.num_local_experts)

    def weight_shards(self, pname: str) -> list:
        if self.quant_method is not None:
            return self.quant_method.weight_shards(self, pname)
        parts = [p for p, name in PARTS.items() if name == pname]
        return [(e, p) for e in self.local_experts() for p in parts]

    def check_shard(self, pname: str, shard_id, prefixes: dict[str, str]) -> tuple[int, str]:
        """(expert, part) of a shard id, checked: the part belongs to pname (prefixes: part -> pname's prefix, or
        its whole name) and the expert exists."""
        try:
            expert, part = shard_id
        except (TypeError, ValueError):
            raise ValueError(f"expert weight {pname} needs a shard id (expert, 'gate'|'up'|'down'), "
                             f"got {shard_id!r}") from None
        if part not in prefixes or not (pname == prefixes[part] or pname.startswith(prefixes[part] + "_")):
            raise ValueError(f"expert weight part {part!r} does not belong to {pname}")
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} is out of range: the model has {self.num_experts} experts")
        return expert, part

    def load_weight(self, pname: str, param: nn.Parameter, w: torch.Tensor, shard_id) -> None:
        if self.quant_method is not None:
            return self.quant_method.load_weight(self, pname, param, w, shard_id)
        expert, part = self.check_shard(pname, shard_id, PARTS)
        local = expert - self.expert_start
        if not 0 <= local < self.num_local_experts:
            return  # another rank's expert
        i, lo = self.local_intermediate, self.inter_start
        what = f"{pname}[expert {expert}, {part}]"
        if part == "down":
            if w.dim() != 2 or tuple(w.shape) != (self.hidden_size, self.intermediate_size):
                raise ValueError(f"weight {what} has shape {tuple(w.shape)}, "
                                 f"expected ({self.hidden_size}, {self.intermediate_size})")
            copy_checked(param.data[local], w[:, lo : lo + i], what)
            return
        if w.dim() != 2 or tuple(w.shape) != (self.intermediate_size, self.hidden_size):
            raise ValueError(f"weight {what} has shape {tuple(w.shape)}, "
                             f"expected ({self.intermediate_size}, {self.hidden_size})")
        rows = slice(0, i) if part == "gate" else slice(i, 2 * i)
        copy_checked(param.data[local, rows], w[lo : lo + i], what)

    def checkpoint_shape(self, pname: str, shard_id) -> tuple[int, ...]:
        if self.quant_method is not None:
            return self.quant_method.checkpoint_shape(self, pname, shard_id)
        _, part = shard_id
        return (self.hidden_size, self.intermediate_size) if part == "down" else (self.intermediate_size, self.hidden_size)

    def extra_repr(self) -> str:
        return (f"experts {self.expert_start}..{self.expert_start + self.num_local_experts} of {self.num_experts}, "
                f"top_k={self.top_k}, hidden={self.hidden_size}, intermediate={self.local_intermediate} of "
                f"{self.intermediate_size}, routing={self.routing}")


def expert_weight_name(name: str, pattern: re.Pattern, parts: dict[str, str]) -> tuple[str, object] | None:
    """A checkpoint's per-expert tensor name -> (the FusedMoE parameter's name, shard id), for a model's
    map_weight_name. pattern matches the name's end `.experts.{e}.{proj}.{tensor}` (group 1: e, group 2: proj,
    group 3: the tensor's name: weight, or a quantized format's weight_scale, qweight, ...) and parts maps proj to
    "gate" | "up" | "down"; None for other names. `weight` maps to w13_weight / w2_weight, X to w13_X / w2_X."""
    m = pattern.search(name)
    if m is None:
        return None
    part = parts[m.group(2)]
    prefix = PARTS[part].removesuffix("_weight")
    return f"{name[: m.start()]}.experts.{prefix}_{m.group(3)}", (int(m.group(1)), part)
