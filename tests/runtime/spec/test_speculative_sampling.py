"""Sampled requests keep their distribution under drafts: speculative sampling keeps a draft token with probability
p(token) and otherwise draws from p without it, so each output token is distributed as without the draft. Checked
with a chi-square test of many seeded samples against the fake model's exact probabilities, at the first draft
position and (given it was kept) the second; a verifier that keeps every draft fails the same test."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.spec import verification
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.messages import TokenizedGenerateReqInput

from tests.runtime.scheduler.conftest import run_all
from tests.runtime.scheduler.fake_runner import fake_logits, make_fake_scheduler, make_prompts, reference, seq_hash
from tests.runtime.scheduler.fake_serving import with_oracle

SAMPLES = 1500
CHI2_3DOF_P001 = 16.266  # chi-square critical value, 3 degrees of freedom, p = 0.001


def _probs(tokens: list[int]) -> torch.Tensor:
    return torch.softmax(fake_logits([seq_hash(tokens)])[0].double(), dim=-1)


def _chi2(samples: list[int], probs: torch.Tensor) -> float:
    """Chi-square statistic over 4 bins: the most likely token, and the others in 3 groups of similar mass."""
    order = torch.argsort(probs, descending=True).tolist()
    top, rest = order[0], order[1:]
    cum, groups, mass = 0.0, [[], [], []], float(probs[rest].sum())
    for t in rest:
        groups[min(int(3 * cum / mass), 2)].append(t)
        cum += float(probs[t])
    bins = [[top], *groups]
    where = {t: i for i, b in enumerate(bins) for t in b}
    observed = [0] * 4
    for s in samples:
        observed[where[s]] += 1
    n = len(samples)
    expected = [n * float(probs[b].sum()) for b in bins]
    return sum((o - e) ** 2 / e for o, e in zip(observed, expected))


def _sample_runs(prompt: list[int]) -> dict[str, list[int]]:
    sched = make_fake_scheduler(max_running_requests=256, max_total_tokens=4096)
    with_oracle(sched, k=2, mistakes=False)  # drafts the two most likely tokens
    for i in range(SAMPLES):
        sp = SamplingParams(max_new_tokens=2, temperature=1.0, sampling_seed=1000 + i, ignore_eos=True)
        sp.normalize()
        sched.add_request(TokenizedGenerateReqInput(rid=f"s{i}", input_ids=prompt, sampling_params=sp))
    outs = {rid: r["output_ids"] for rid, r in run_all(sched).items()}
    assert sched.grammar_stats["draft_tokens"] > 0
    return outs


@pytest.mark.parametrize("keep_all", [False, True], ids=["speculative-sampling", "broken-keeps-every-draft"])
def test_sampled_tokens_keep_their_distribution_under_drafts(monkeypatch, keep_all):
    if keep_all:
        monkeypatch.setattr(verification, "_settle_sampled",
                            lambda probs, draft, req, g, q=None: (len(draft), int(torch.argmax(probs[len(draft)]))))
    prompt = make_prompts(41, 1, lo=12, hi=13)[0]
    outs = _sample_runs(prompt)
    first = [o[0] for o in outs.values()]
    top = reference(prompt, 1)[0]
    second = [o[1] for o in outs.values() if o[0] == top]
    stats = (_chi2(first, _probs(prompt)), _chi2(second, _probs(prompt + [top])))
    if keep_all:
        assert max(stats) > CHI2_3DOF_P001  # the test can tell a biased verifier
    else:
        assert max(stats) < CHI2_3DOF_P001, stats
        assert 0.5 < len(second) / SAMPLES < 0.99  # the first draft token was kept about p(top) of the time
