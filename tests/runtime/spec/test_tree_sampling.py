"""Sampled requests keep their distribution under tree drafts: at each node the target draws a token from its row's
distribution and the walk moves to the child holding it (the multi-candidate rule for point-mass drafts,
spec_tree.walk). Checked as the chain test does (test_speculative_sampling.py): a chi-square test of many seeded
samples against the fake model's exact probabilities at the first position and, given the likeliest token there, the
second -- here with the likeliest token the middle of three siblings at each level, so paths through a later sibling
are accepted. A verifier that always follows the first child fails the same test."""
from __future__ import annotations

import pytest

from radixlm.runtime.messages import TokenizedGenerateReqInput
from radixlm.runtime.spec import verification
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.spec.draft import Draft, DraftSource
from radixlm.runtime.spec.path import DraftPath

from tests.runtime.scheduler.conftest import run_all
from tests.runtime.scheduler.fake_runner import fake_logits, make_fake_scheduler, make_prompts, reference, seq_hash
from .test_speculative_sampling import CHI2_3DOF_P001, SAMPLES, _chi2, _probs


def _ranked(tokens: list[int]) -> list[int]:
    """The fake model's three likeliest next tokens after `tokens`, likeliest first."""
    return fake_logits([seq_hash(tokens)])[0].argsort(descending=True)[:3].tolist()


class ThreeWayTrees(DraftSource):
    """Two levels of three siblings each, in the order (second, likeliest, third)."""

    def __init__(self):
        self.proposed = 0

    def applies_to(self, req) -> bool:
        return True

    def propose(self, req) -> None:
        if req.tokens_left() < 2:
            return
        seq = req.origin_input_ids + req.output_ids
        top, second, third = _ranked(seq)
        tokens, parents = [second, top, third], [-1, -1, -1]
        for i, t in enumerate(list(tokens)):
            a, b, c = _ranked(seq + [t])
            tokens += [b, a, c]
            parents += [i, i, i]
        req.kv.draft = Draft(tokens, self, parents=parents)
        self.proposed += 1

    def learn(self, req, draft, accepted: int, token: int) -> None:
        pass


def _first_child_walk(parents, tokens, choose):
    path, at = [], -1
    while (child := next((i for i, p in enumerate(parents) if p == at), None)) is not None:
        path.append(child)
        at = child
    return path, choose(1 + at)


@pytest.mark.parametrize("broken", [False, True], ids=["tree-walk", "broken-follows-first-child"])
def test_sampled_tokens_keep_their_distribution_under_tree_drafts(monkeypatch, broken):
    if broken:
        monkeypatch.setattr(verification, "walk", _first_child_walk)
    prompt = make_prompts(43, 1, lo=12, hi=13)[0]
    sched = make_fake_scheduler(max_running_requests=256, max_total_tokens=4096)
    oracle = ThreeWayTrees()
    sched.drafts = DraftPath([oracle], None, sched.page_size, sched.grammar_stats)
    for i in range(SAMPLES):
        sp = SamplingParams(max_new_tokens=3, temperature=1.0, sampling_seed=2000 + i, ignore_eos=True)
        sp.normalize()
        sched.add_request(TokenizedGenerateReqInput(rid=f"s{i}", input_ids=prompt, sampling_params=sp))
    outs = [r["output_ids"] for r in run_all(sched).values()]
    assert oracle.proposed >= SAMPLES
    first = [o[0] for o in outs]
    top = reference(prompt, 1)[0]
    second = [o[1] for o in outs if o[0] == top]
    stats = (_chi2(first, _probs(prompt)), _chi2(second, _probs(prompt + [top])))
    if broken:
        assert max(stats) > CHI2_3DOF_P001
        return
    assert max(stats) < CHI2_3DOF_P001, stats
    assert 0.5 < len(second) / SAMPLES < 0.99
    g = sched.grammar_stats
    assert g["accepted_draft_tokens"] > g["draft_verifications"]  # two-deep paths through the middle sibling
    assert sched.stats["tree_kv_moves"] > 0
    sched.check_memory()
