"""Exact jump-forward verification: greedy keeps a draft token only when it is the constrained argmax; sampling
keeps the output distribution (speculative acceptance against a point-mass draft)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from radixlm.runtime.grammar.jump_forward import verify_draft
from radixlm.runtime.sampling.sampling_params import SamplingParams

V = 8


class AllowListMatcher:
    """Allows `allowed[step]` (or everything) at each step; records what it accepted."""

    def __init__(self, allowed: dict[int, set[int]] | None = None):
        self.allowed = allowed or {}
        self.accepted: list[int] = []

    def fill_bitmask(self, bitmask, row):
        ok = self.allowed.get(len(self.accepted))
        if ok is not None:
            bits = torch.zeros(V, dtype=torch.bool)
            bits[list(ok)] = True
            bitmask[row] = _pack(bits)

    def accept_token(self, t):
        ok = self.allowed.get(len(self.accepted))
        if ok is not None and t not in ok:
            return False
        self.accepted.append(t)
        return True

    def rollback(self, n):
        del self.accepted[len(self.accepted) - n:]


def _pack(bits: torch.Tensor) -> torch.Tensor:
    word = 0
    for i, b in enumerate(bits.tolist()):
        word |= int(b) << i
    return torch.tensor([word if word < 2**31 else word - 2**32], dtype=torch.int32)


class BoolMaskBackend:
    def allocate_bitmask(self, n):
        return torch.full((n, 1), -1, dtype=torch.int32)

    def fill_bitmasks(self, matchers, bitmask, rows):
        for m, r in zip(matchers, rows):
            m.fill_bitmask(bitmask, r)

    def apply_bitmask(self, logits, bitmask, rows):
        for r in rows:
            allowed = torch.tensor([(int(bitmask[r, 0]) >> i) & 1 for i in range(V)], dtype=torch.bool)
            logits[r].masked_fill_(~allowed, float("-inf"))


@dataclass
class FakeReq:
    sampling_params: SamplingParams
    grammar: AllowListMatcher
    origin_input_ids: list[int] = field(default_factory=lambda: [1, 2])
    output_ids: list[int] = field(default_factory=lambda: [3])
    eos_token_ids: frozenset = frozenset({0})


def _req(allowed=None, **sp) -> FakeReq:
    params = SamplingParams(**sp)
    params.normalize()
    return FakeReq(params, AllowListMatcher(allowed))


def _rows(*argmaxes: int) -> torch.Tensor:
    logits = torch.zeros(len(argmaxes), V)
    for i, a in enumerate(argmaxes):
        logits[i, a] = 5.0
    return logits


def test_greedy_keeps_the_agreeing_prefix_then_the_models_token():
    req = _req(temperature=0)
    res = verify_draft(req, [4, 5, 6], _rows(4, 5, 7, 1), BoolMaskBackend(), None)
    assert (res.tokens, res.accepted, res.violated) == ([4, 5, 7], 2, False)
    assert req.grammar.accepted == [4, 5, 7]


def test_greedy_all_accepted_plus_bonus_token():
    req = _req(temperature=0)
    res = verify_draft(req, [4, 5], _rows(4, 5, 2), BoolMaskBackend(), None)
    assert (res.tokens, res.accepted) == ([4, 5, 2], 2)


def test_greedy_choice_is_the_constrained_argmax():
    # Row 1's raw argmax (5) is not allowed; the allowed best is the draft token 6.
    logits = _rows(4, 5, 2)
    logits[1, 6] = 3.0
    req = _req({1: {6, 7}}, temperature=0)
    res = verify_draft(req, [4, 6], logits, BoolMaskBackend(), None)
    assert (res.tokens, res.accepted) == ([4, 6, 2], 2)


def test_penalties_see_the_accepted_draft_tokens():
    # With a repetition penalty, token 4 (already accepted at row 0) loses to token 5 at row 1.
    logits = torch.zeros(2, V)
    logits[0, 4] = 2.0
    logits[1, 4], logits[1, 5] = 2.0, 1.5
    req = _req(temperature=0, repetition_penalty=2.0)
    res = verify_draft(req, [4], logits, BoolMaskBackend(), None)
    assert res.tokens == [4, 5]


def test_a_draft_token_the_grammar_refuses_ends_the_draft():
    # Step 1 allows only 6 and 7: the draft's 5 is cut, so the model's best allowed token (7) follows 4.
    req = _req({1: {6, 7}}, temperature=0)
    res = verify_draft(req, [4, 5, 2], _rows(4, 7, 2, 3), BoolMaskBackend(), None)
    assert (res.tokens, res.accepted) == ([4, 7], 1) and req.grammar.accepted == [4, 7]


def test_nothing_allowed_is_reported_as_violated():
    req = _req({0: set()}, temperature=0)
    res = verify_draft(req, [4], _rows(4, 1), BoolMaskBackend(), None)
    assert res.violated and res.tokens == []


@pytest.mark.parametrize("draft_token", [1, 3])
def test_sampling_keeps_the_distribution(draft_token):
    logits = torch.tensor([[0.5, 1.0, 0.2, -0.3, 0.9, -1.0, 0.0, 0.4], [0.0] * V])
    target = torch.softmax(logits[0] / 0.7, dim=-1)
    n = 6000
    g = torch.Generator().manual_seed(1234)
    counts = torch.zeros(V)
    for _ in range(n):
        res = verify_draft(_req(temperature=0.7), [draft_token], logits, BoolMaskBackend(), g)
        counts[res.tokens[0]] += 1
    freq = counts / n
    sigma = (target * (1 - target) / n).sqrt()
    assert bool(((freq - target).abs() <= 4 * sigma + 1e-3).all()), (freq, target)


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    a = verify_draft(_req(temperature=1.0, sampling_seed=7), [2, 3], logits, BoolMaskBackend(), None)
    b = verify_draft(_req(temperature=1.0, sampling_seed=7), [2, 3], logits, BoolMaskBackend(), None)
    assert a == b
