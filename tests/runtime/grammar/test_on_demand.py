"""Grammar masks on demand: a greedy row's token (and an exact draft's verdict) equals what the always-filled mask
gives, while masks are filled only where neither the raw argmax nor the model's top candidates decide it."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch

from radixlm.runtime.grammar.jump_forward import verify_draft
from radixlm.runtime.grammar.on_demand import CANDIDATES, launch_on_demand, resolve
from radixlm.runtime.sampling.sampling_params import SamplingParams

V = 64


class StepMatcher:
    """Allows `allowed[step]` (everything when absent) at each step."""

    def __init__(self, allowed: dict[int, set[int]] | None = None):
        self.allowed = allowed or {}
        self.accepted: list[int] = []

    def allowed_now(self) -> set[int] | None:
        return self.allowed.get(len(self.accepted))

    def accept_token(self, t: int) -> bool:
        ok = self.allowed_now()
        if ok is not None and t not in ok:
            return False
        self.accepted.append(t)
        return True

    def rollback(self, n: int) -> None:
        del self.accepted[len(self.accepted) - n:]

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        ok = self.allowed_now()
        if ok is not None:
            bitmask[row] = False
            bitmask[row, list(ok)] = True


class BoolMaskBackend:
    """A bitmask row is a bool vector over the vocabulary; counts the masks it fills."""

    def __init__(self):
        self.filled = 0

    def allocate_bitmask(self, n):
        return torch.ones(n, V, dtype=torch.bool)

    def fill_bitmasks(self, matchers, bitmask, rows):
        for m, r in zip(matchers, rows):
            self.filled += 1
            m.fill_bitmask(bitmask, r)

    def apply_bitmask(self, logits, bitmask, rows):
        for r in rows:
            logits[r].masked_fill_(~bitmask[r], float("-inf"))


@dataclass
class FakeReq:
    grammar: StepMatcher
    sampling_params: SamplingParams = field(default_factory=lambda: _greedy())
    origin_input_ids: list[int] = field(default_factory=lambda: [1, 2])
    output_ids: list[int] = field(default_factory=lambda: [3])
    eos_token_ids: frozenset = frozenset({0})


def _greedy() -> SamplingParams:
    p = SamplingParams(temperature=0)
    p.normalize()
    return p


def _on_demand(reqs, drafts, logits, backend):
    verdicts, filled = resolve(launch_on_demand(reqs, drafts, logits), backend)
    out = list(verdicts)
    assert [r.grammar.accepted for r in reqs] == [v.tokens for v in out], "grammars advanced over their verdicts"
    return out, filled


@pytest.mark.parametrize("scores, allowed, token, masks", [
    ({9: 3.0}, {9, 10}, 9, 0),  # an allowed argmax needs no mask
    ({9: 3.0, 4: 2.0, 12: 2.5}, {4, 12}, 12, 0),  # a refused argmax: the best allowed candidate
    # Every token but the refused argmax scores 0: a tie that reaches beyond the candidates, so the mask decides
    # (the lowest allowed id among the tied tokens, as argmax over the masked row gives).
    ({9: 3.0}, {50, 40}, 40, 1),
])
def test_one_row_is_decided_as_the_masked_argmax(scores, allowed, token, masks):
    logits = torch.zeros(1, V)
    for t, score in scores.items():
        logits[0, t] = score
    backend = BoolMaskBackend()
    [v], filled = _on_demand([FakeReq(StepMatcher({0: allowed}))], [[]], logits, backend)
    assert (v.tokens, filled, backend.filled) == ([token], masks, masks)


def test_a_draft_continues_while_the_constrained_choice_agrees():
    logits = torch.zeros(3, V)
    logits[0, 5] = 1.0  # agrees with draft[0]
    logits[1, 7], logits[1, 6] = 2.0, 1.0  # 7 refused: the constrained choice is draft[1] = 6
    logits[2, 8] = 1.0  # after the draft: the model's own token
    [v], _ = _on_demand([FakeReq(StepMatcher({1: {6}}))], [[5, 6]], logits, BoolMaskBackend())
    assert (v.tokens, v.accepted, v.violated) == ([5, 6, 8], 2, False)


def test_nothing_allowed_is_violated():
    [v], filled = _on_demand([FakeReq(StepMatcher({1: set()}))], [[5]], _rows_with_argmax([5, 6]), BoolMaskBackend())
    assert (v.tokens, v.accepted, v.violated, filled) == ([5], 1, True, 1)


def _rows_with_argmax(argmaxes: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(argmaxes), V)
    for i, a in enumerate(argmaxes):
        logits[i, a] = 1.0
    return logits


def test_matches_the_always_filled_mask_on_random_cases():
    """Random logits with many ties, random grammars and drafts, several requests resolved together: every
    verdict equals exact verification with every mask filled (jump_forward.verify_draft)."""
    rng = random.Random(0)
    fills = 0
    for case in range(200):
        reqs, drafts, blocks, expected = [], [], [], []
        for _ in range(rng.randrange(1, 5)):
            draft = [rng.randrange(V) for _ in range(rng.choice([0, 0, 1, 3]))]
            allowed = {}
            for step in range(len(draft) + 1):
                kind = rng.random()
                if kind < 0.35:
                    allowed[step] = set(rng.sample(range(V), rng.randrange(1, V)))
                elif kind < 0.4:
                    allowed[step] = set()
                elif kind < 0.6 and step < len(draft):
                    allowed[step] = {draft[step], rng.randrange(V)}
            # Few distinct values: ties everywhere, at the top and at the last candidate.
            logits = torch.tensor([[float(rng.randrange(4)) for _ in range(V)] for _ in range(len(draft) + 1)])
            eager_req = FakeReq(StepMatcher(allowed))
            res = verify_draft(eager_req, draft, logits.clone(), BoolMaskBackend(), None)
            expected.append((res.tokens, res.accepted, res.violated))
            reqs.append(FakeReq(StepMatcher(allowed)))
            drafts.append(draft)
            blocks.append(logits)
        backend = BoolMaskBackend()
        verdicts, filled = _on_demand(reqs, drafts, torch.cat(blocks), backend)
        assert [(v.tokens, v.accepted, v.violated) for v in verdicts] == expected, case
        assert filled == backend.filled
        fills += filled
    assert fills > 0  # the ties made some rows need their mask
    assert CANDIDATES < V  # so that the candidates' cut-off is exercised
