"""Batched sampling state for one forward pass, built from the batch's requests (rebuilt every step)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.sampling.thinking_budget import UNKNOWN

_MASK64 = (1 << 64) - 1


class SamplingReq(Protocol):
    """What from_reqs reads from a request (the scheduler's Req satisfies this)."""

    sampling_params: SamplingParams  # normalized
    origin_input_ids: list[int]
    output_ids: list[int]
    eos_token_ids: frozenset[int]
    # Optional: `thinking` (a ThinkingTracker, or None), read with getattr.


def derive_seed(sampling_seed: int, step: int) -> int:
    """Generator seed for a seeded request's `step`-th output token (splitmix64 of the pair), in [0, 2**63)."""
    z = (sampling_seed * 0x9E3779B97F4A7C15 + (step + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def token_id_matrix(id_lists: Sequence[Sequence[int]], pad: int, device: torch.device | str) -> torch.Tensor:
    """(bs, max_len) int64, rows right-padded with `pad`."""
    width = max((len(ids) for ids in id_lists), default=0)
    rows = [list(ids) + [pad] * (width - len(ids)) for ids in id_lists]
    return host_to_device(rows, torch.int64, device).reshape(len(id_lists), width)


def token_counts(id_lists: Sequence[Sequence[int]], vocab_size: int, device: torch.device | str) -> torch.Tensor:
    """(bs, vocab_size) float32: how often each token occurs in each row's list (scatter_add, no vocab loop)."""
    # Pad (and a media item's pad ids, which are >= vocab_size) land in an extra column, dropped below.
    ids = token_id_matrix(id_lists, vocab_size, device).clamp_(max=vocab_size)
    counts = torch.zeros(len(id_lists), vocab_size + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def _sparse(pairs: list[tuple[int, int]], device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    t = host_to_device(pairs, torch.int64, device).reshape(-1, 2)
    return t[:, 0].contiguous(), t[:, 1].contiguous()


@dataclass
class SamplingBatchInfo:
    vocab_size: int
    device: torch.device
    temperatures: torch.Tensor  # (bs, 1) float32; 1.0 on greedy rows so division is harmless
    top_ps: torch.Tensor  # (bs,) float32
    top_ks: torch.Tensor  # (bs,) int64; -1 already replaced by vocab_size
    min_ps: torch.Tensor  # (bs,) float32
    is_greedy: torch.Tensor  # (bs,) bool: temperature < 1e-6 or top_k == 1
    # Host-side flags so the sampler never syncs with the device to pick a path.
    is_all_greedy: bool
    need_top_k: bool
    need_top_p: bool
    need_min_p: bool
    # Repetition penalty over prompt + output tokens (None when every row has 1.0).
    repetition_penalties: torch.Tensor | None = None  # (bs, 1) float32
    seen_mask: torch.Tensor | None = None  # (bs, V) bool
    # Frequency / presence penalties over output tokens (None when every row has 0 for both).
    frequency_penalties: torch.Tensor | None = None  # (bs, 1) float32
    presence_penalties: torch.Tensor | None = None  # (bs, 1) float32
    output_counts: torch.Tensor | None = None  # (bs, V) float32
    # Sparse logit bias: logits[rows[j], cols[j]] += values[j].
    logit_bias_rows: torch.Tensor | None = None
    logit_bias_cols: torch.Tensor | None = None
    logit_bias_values: torch.Tensor | None = None
    # Sparse min_new_tokens mask: logits[rows[j], cols[j]] = -inf.
    min_tokens_rows: torch.Tensor | None = None
    min_tokens_cols: torch.Tensor | None = None
    # Sparse forced tokens (a thinking budget's end tag): row rows[j] keeps only cols[j] (every other logit -inf).
    forced_rows: torch.Tensor | None = None
    forced_cols: torch.Tensor | None = None
    # (row, generator seed) for each request with a sampling_seed, seed already mixed with the step.
    seeded_rows: list[tuple[int, int]] = field(default_factory=list)
    # Grammar constraints (set by the scheduler): a packed bitmask of allowed tokens, the rows it applies to,
    # and the grammar backend's in-place apply(logits, bitmask, rows) that sets disallowed tokens to -inf.
    vocab_mask: torch.Tensor | None = None
    vocab_mask_rows: list[int] = field(default_factory=list)
    apply_vocab_mask: Callable[[torch.Tensor, torch.Tensor, list[int]], None] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.top_ps.shape[0])

    @property
    def has_logit_bias(self) -> bool:
        return self.logit_bias_rows is not None

    @property
    def has_min_tokens_mask(self) -> bool:
        return self.min_tokens_rows is not None

    @property
    def need_logits_processing(self) -> bool:
        """Anything to apply before argmax / temperature (bias, penalties, min_new_tokens mask, grammar mask, forced
        tokens)."""
        return (
            self.has_logit_bias
            or self.repetition_penalties is not None
            or self.output_counts is not None
            or self.has_min_tokens_mask
            or self.vocab_mask is not None
            or self.forced_rows is not None
        )

    @property
    def use_greedy_fast_path(self) -> bool:
        """All rows greedy and nothing to apply: the sampler is a single argmax."""
        return self.is_all_greedy and not self.need_logits_processing

    @classmethod
    def from_reqs(
        cls, reqs: Sequence[SamplingReq], vocab_size: int, device: torch.device | str = "cpu",
        num_out: Sequence[int] | None = None,
    ) -> "SamplingBatchInfo":
        """num_out: each request's output tokens so far, counting any sampled by passes still in flight (overlap
        scheduling); default len(output_ids). min_new_tokens, per-request seeds and thinking budgets depend on it."""
        device = torch.device(device)
        params = [r.sampling_params for r in reqs]
        greedy = [p.is_greedy for p in params]
        temps = [1.0 if g else float(p.temperature) for p, g in zip(params, greedy)]
        top_ks = [vocab_size if p.top_k == -1 else min(int(p.top_k), vocab_size) for p in params]
        sampled = [not g for g in greedy]

        def f32(xs: list[float]) -> torch.Tensor:
            return host_to_device(xs, torch.float32, device)

        info = cls(
            vocab_size=vocab_size,
            device=device,
            temperatures=f32(temps).reshape(-1, 1),
            top_ps=f32([float(p.top_p) for p in params]),
            top_ks=host_to_device(top_ks, torch.int64, device),
            min_ps=f32([float(p.min_p) for p in params]),
            is_greedy=host_to_device(greedy, torch.bool, device),
            is_all_greedy=all(greedy),
            need_top_k=any(s and k < vocab_size for s, k in zip(sampled, top_ks)),
            need_top_p=any(s and p.top_p < 1.0 for s, p in zip(sampled, params)),
            need_min_p=any(s and p.min_p > 0.0 for s, p in zip(sampled, params)),
        )

        if any(p.repetition_penalty != 1.0 for p in params):
            info.repetition_penalties = f32([float(p.repetition_penalty) for p in params]).reshape(-1, 1)
            # Rows without a penalty contribute no ids: their mask stays empty.
            seen = [
                list(r.origin_input_ids) + list(r.output_ids) if p.repetition_penalty != 1.0 else []
                for r, p in zip(reqs, params)
            ]
            info.seen_mask = token_counts(seen, vocab_size, device) > 0

        if any(p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 for p in params):
            info.frequency_penalties = f32([float(p.frequency_penalty) for p in params]).reshape(-1, 1)
            info.presence_penalties = f32([float(p.presence_penalty) for p in params]).reshape(-1, 1)
            outs = [
                r.output_ids if (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0) else []
                for r, p in zip(reqs, params)
            ]
            info.output_counts = token_counts(outs, vocab_size, device)

        bias_pairs: list[tuple[int, int]] = []
        bias_values: list[float] = []
        for i, p in enumerate(params):
            for tid, bias in (p.logit_bias or {}).items():
                bias_pairs.append((i, int(tid)))
                bias_values.append(float(bias))
        if bias_pairs:
            info.logit_bias_rows, info.logit_bias_cols = _sparse(bias_pairs, device)
            info.logit_bias_values = f32(bias_values)

        if num_out is None:
            num_out = [len(r.output_ids) for r in reqs]
        banned: list[tuple[int, int]] = []
        for i, (r, p) in enumerate(zip(reqs, params)):
            if num_out[i] < p.min_new_tokens:
                # With ignore_eos, EOS cannot end the request, so only stop_token_ids need masking.
                ids = set(p.stop_token_ids or ()) | (set() if p.ignore_eos else set(r.eos_token_ids))
                banned.extend((i, t) for t in sorted(ids) if 0 <= t < vocab_size)
        if banned:
            info.min_tokens_rows, info.min_tokens_cols = _sparse(banned, device)

        forced: list[tuple[int, int]] = []
        for i, r in enumerate(reqs):
            thinking = getattr(r, "thinking", None)
            if thinking is None or thinking.done:
                continue
            tok = thinking.forced_token(r.output_ids, num_out[i])
            if tok is UNKNOWN:
                # The overlap rule (can_plan_ahead) keeps such a request from being planned ahead.
                raise RuntimeError(f"thinking budget: the forced token at output position {num_out[i]} depends on "
                                   "a token in flight")
            if tok is not None:
                forced.append((i, tok))
        if forced:
            info.forced_rows, info.forced_cols = _sparse(forced, device)

        info.seeded_rows = [
            (i, derive_seed(p.sampling_seed, num_out[i]))
            for i, (r, p) in enumerate(zip(reqs, params))
            if p.sampling_seed is not None and not greedy[i]
        ]
        return info
