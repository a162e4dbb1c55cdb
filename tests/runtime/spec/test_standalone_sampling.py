"""Sampled requests under STANDALONE drafts: the draft model draws each token from its own distribution q (the
request's temperature and top-k over its logits) and verification keeps it with probability min(1, p/q), drawing
from max(0, p - q) on rejection. Checked with chi-square tests of many seeded samples of the token at a draft
position against the target's exact distribution there (transformers on the same checkpoint, summed over the
earlier tokens' top-k), with a draft model near the target but unlike it (its output layer perturbed: q overlaps p,
so both acceptances and rejections matter), without and with the overlap scheduler (drafts on a guess of the token
in flight); verifiers whose residual is p itself, or whose q rows are misaligned, fail the same tests. With the
target's own checkpoint as the draft model (q = p) nearly every draft token is kept -- the point-mass rule would
keep about sum p^2 of them. Greedy requests stay exact (test_standalone_drafts.py)."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from radixlm.runtime.messages import TokenizedGenerateReqInput
from radixlm.runtime.spec import verification
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.spec.path import DraftPath

from tests.runtime.scheduler.conftest import run_all
from tests.runtime.scheduler.fake_runner import make_prompts
from .test_speculative_sampling import CHI2_3DOF_P001, _chi2
from .test_standalone_drafts import make, models  # noqa: F401 - a fixture

SAMPLES, GROUP = 4000, 200
TEMPERATURE, TOP_K = 0.2, 8


@pytest.fixture(scope="module")
def near(models, tmp_path_factory) -> str:  # noqa: F811 - the fixture
    """The target's checkpoint with noise on its output layer: a draft model whose q overlaps p but differs."""
    model = LlamaForCausalLM.from_pretrained(models["target"], torch_dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        w = model.lm_head.weight
        w += 0.3 * w.std() * torch.randn(w.shape, generator=g)
    path = tmp_path_factory.mktemp("draft-near")
    model.save_pretrained(path)
    return str(path)


def _probs(path: str, tokens: list[int], model: LlamaForCausalLM | None = None,
           temperature: float = TEMPERATURE) -> torch.Tensor:
    """A model's sampling distribution after `tokens`: softmax(logits / T) over its top-k."""
    model = model or LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, -1].double()
    probs = torch.softmax(logits / temperature, dim=-1)
    kept = torch.zeros_like(probs)
    top = torch.topk(probs, TOP_K).indices
    kept[top] = probs[top]
    return kept / kept.sum()


def _marginal(path: str, prompt: list[int], position: int, temperature: float = TEMPERATURE) -> torch.Tensor:
    """The exact distribution of the output token at `position` (0-based): p(. | prompt + t) weighted by the
    probability of every earlier output t, over their top-k supports."""
    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    dists = [(1.0, [])]
    for _ in range(position):
        dists = [(w * float(p[t]), prefix + [t]) for w, prefix in dists
                 for p in [_probs(path, prompt + prefix, model, temperature)]
                 for t in torch.nonzero(p).flatten().tolist()]
    return sum(w * _probs(path, prompt + prefix, model, temperature) for w, prefix in dists)


def _run(sched, prompt: list[int], max_new_tokens: int = 2, temperature: float = TEMPERATURE) -> tuple[dict, dict]:
    """SAMPLES seeded requests, GROUP at a time (each group prefilled in one pass): the first token from the
    prefill's sampler, the next ones verified as drafts of the draft model."""
    outs = {}
    for start in range(0, SAMPLES, GROUP):
        for i in range(start, start + GROUP):
            sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=TOP_K,
                                sampling_seed=7000 + i, ignore_eos=True)
            sp.normalize()
            sched.add_request(TokenizedGenerateReqInput(rid=f"s{i}", input_ids=prompt, sampling_params=sp))
        outs.update({rid: r["output_ids"] for rid, r in run_all(sched).items()})
    return outs, dict(sched.grammar_stats)


def _sched(paths: dict, draft: str, **kw):
    """STANDALONE with the checkpoint at `draft`; no batch rule (speculative_max_batch_rows 0): every request
    drafts."""
    return make({**paths, "draft": draft}, "draft", max_running_requests=1024, speculative_max_batch_rows=0,
                max_total_tokens=80_000, **kw)


@pytest.mark.parametrize("residual_is_p", [False, True], ids=["rejection-sampling", "broken-residual"])
def test_sampled_tokens_keep_the_targets_distribution(models, near, monkeypatch, residual_is_p):  # noqa: F811
    if residual_is_p:
        settle = verification._settle_sampled
        monkeypatch.setattr(verification, "_settle_sampled",
                            lambda probs, draft, req, g, q=None: _p_residual(probs, draft, req, g, q, settle))
    prompt = make_prompts(41, 1, lo=12, hi=13)[0]
    outs, stats = _run(_sched(models, near), prompt)
    assert stats["draft_tokens"] >= SAMPLES // 2 and stats["model_drafts"] >= SAMPLES // 2
    chi2 = _chi2([o[1] for o in outs.values()], _marginal(models["target"], prompt, 1))
    assert _chi2([o[0] for o in outs.values()], _probs(models["target"], prompt)) < CHI2_3DOF_P001  # the sampler's
    if residual_is_p:
        assert chi2 > CHI2_3DOF_P001  # the test tells a biased verifier
    else:
        assert chi2 < CHI2_3DOF_P001, chi2
        assert 0.2 * stats["draft_tokens"] < stats["accepted_draft_tokens"] < 0.8 * stats["draft_tokens"], stats


@pytest.mark.parametrize("q_unshifted", [False, True], ids=["aligned", "broken-q-rows"])
def test_sampled_drafts_made_with_a_pass_in_flight(models, near, monkeypatch, q_unshifted):  # noqa: F811
    """Overlap: the draft after the first token is made while the pass sampling the second is in flight; its first
    token guesses that one (drawn from q too), and the third token -- verified only where the guess was right --
    keeps the target's distribution (T = 0.1: guesses are often right). Mutation: the q rows not shifted past the
    guess (each draft token judged by the previous one's q) fails the test."""
    if q_unshifted:
        split = DraftPath._split_guess

        def unshifted(self, req):
            q = req.kv.draft.q if req.kv.draft is not None else None
            split(self, req)
            if req.kv.draft is not None and q is not None:
                req.kv.draft.q = q

        monkeypatch.setattr(DraftPath, "_split_guess", unshifted)
    prompt = make_prompts(43, 1, lo=12, hi=13)[0]
    outs, stats = _run(_sched(models, near, overlap_schedule="on"), prompt, 3, temperature=0.1)
    assert stats["guessed_drafts"] >= SAMPLES // 2 and stats["guessed_drafts_accepted_tokens"] > 0, stats
    chi2 = _chi2([o[2] for o in outs.values()], _marginal(models["target"], prompt, 2, temperature=0.1))
    assert (chi2 > CHI2_3DOF_P001) if q_unshifted else (chi2 < CHI2_3DOF_P001), chi2


def _p_residual(probs, draft, req, g, q, settle):
    """The broken verifier: min(1, p/q) acceptance, but p itself (not max(0, p - q)) after a rejection."""
    kept, token = settle(probs, draft, req, g, q)
    if kept < len(draft):
        noise = torch.empty_like(probs[kept]).exponential_(generator=g)
        token = int(torch.argmax(probs[kept] / noise.clamp_min_(1e-30)))
    return kept, token


def test_a_draft_model_equal_to_the_target_is_kept(models):  # noqa: F811
    """q = p: the ratio is 1, so (up to float rounding) every sampled draft token is kept."""
    outs, stats = _run(_sched(models, models["target"]), make_prompts(42, 1, lo=12, hi=13)[0])
    assert stats["draft_tokens"] >= SAMPLES // 2
    assert stats["accepted_draft_tokens"] >= 0.97 * stats["draft_tokens"], stats
