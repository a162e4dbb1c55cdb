from dataclasses import dataclass, field

import pytest
import torch

from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo
from radixlm.runtime.sampling.sampling_params import SamplingParams

torch.set_num_threads(1)
sampler = Sampler()


@dataclass
class FakeReq:
    sampling_params: SamplingParams
    origin_input_ids: list[int] = field(default_factory=lambda: [1, 2, 3])
    output_ids: list[int] = field(default_factory=list)
    eos_token_ids: frozenset[int] = frozenset({0})


def req(**kw) -> FakeReq:
    extra = {k: kw.pop(k) for k in ("origin_input_ids", "output_ids", "eos_token_ids") if k in kw}
    p = SamplingParams(**kw)
    p.normalize()
    p.verify(1 << 20)
    return FakeReq(p, **extra)


def info_for(reqs, vocab):
    return SamplingBatchInfo.from_reqs(reqs, vocab, "cpu")


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def draw(logits_row, n, vocab, seed=0, **kw):
    """n independent draws of one request (n identical rows in one batch)."""
    logits = logits_row.reshape(1, -1).expand(n, vocab).contiguous()
    return sampler(logits, info_for([req(**kw) for _ in range(n)], vocab), gen(seed))


def test_greedy_fast_path_is_a_single_argmax(monkeypatch):
    vocab = 50
    logits = torch.randn(6, vocab, generator=gen(1))
    info = info_for([req(temperature=0.0), req(top_k=1), req(temperature=1e-7)] * 2, vocab)
    assert info.use_greedy_fast_path

    def boom(*a, **k):
        raise AssertionError("fast path must not sort or softmax")

    monkeypatch.setattr(torch, "softmax", boom)
    monkeypatch.setattr(torch, "sort", boom)
    assert torch.equal(sampler(logits, info), logits.argmax(-1))


def test_greedy_with_penalty_leaves_fast_path():
    info = info_for([req(temperature=0.0, repetition_penalty=1.2)], 10)
    assert info.is_all_greedy and not info.use_greedy_fast_path


def test_top_k_one_equals_greedy_on_random_logits():
    vocab = 257
    g = gen(3)
    for trial in range(5):
        logits = torch.randn(16, vocab, generator=g) * 3
        reqs = [req(top_k=1, temperature=0.3 + i * 0.2, top_p=0.9, min_p=0.05) for i in range(8)]
        reqs += [req(temperature=1.0) for _ in range(8)]  # sampled rows keep the batch off the fast path
        out = sampler(logits, info_for(reqs, vocab), gen(trial))
        assert torch.equal(out[:8], logits[:8].argmax(-1))


def test_zero_temperature_row_in_mixed_batch_is_argmax():
    vocab = 64
    logits = torch.randn(4, vocab, generator=gen(4))
    out = sampler(logits, info_for([req(temperature=1.5), req(temperature=0.0)] * 2, vocab), gen(0))
    assert out[1] == logits[1].argmax() and out[3] == logits[3].argmax()


def test_seeded_sampling_independent_of_batch_and_row():
    vocab = 1000
    target = torch.randn(vocab, generator=gen(5))
    others = torch.randn(8, vocab, generator=gen(6))

    def run(position, n_other, other_seed):
        rows = [others[i] for i in range(n_other)]
        reqs = [req(temperature=0.9, top_p=0.95, sampling_seed=other_seed + i) for i in range(n_other // 2)]
        reqs += [req(temperature=1.3) for _ in range(n_other - n_other // 2)]
        rows.insert(position, target)
        reqs.insert(position, req(temperature=1.0, top_k=200, sampling_seed=1234, output_ids=[5, 6, 7]))
        return int(sampler(torch.stack(rows), info_for(reqs, vocab), gen(other_seed))[position])

    results = {run(pos, n, s) for pos, n, s in [(0, 0, 0), (0, 5, 1), (3, 5, 2), (8, 8, 3), (2, 7, 99)]}
    assert len(results) == 1


def test_seed_noise_changes_with_step_and_seed():
    vocab = 1000
    logits = torch.zeros(1, vocab)  # uniform: the draw is the noise's argmax
    picks = {
        int(sampler(logits, info_for([req(sampling_seed=s, output_ids=[1] * step)], vocab)))
        for s in range(3) for step in range(4)
    }
    assert len(picks) > 6


def test_unseeded_sampling_reproducible_with_fixed_generator():
    vocab = 300
    logits = torch.randn(32, vocab, generator=gen(7))
    info = info_for([req(temperature=0.8, top_p=0.9) for _ in range(32)], vocab)
    a, b = sampler(logits, info, gen(11)), sampler(logits, info, gen(11))
    assert torch.equal(a, b)
    assert not torch.equal(a, sampler(logits, info, gen(12)))


def test_logits_not_modified():
    vocab = 20
    logits = torch.randn(2, vocab, generator=gen(8))
    before = logits.clone()
    reqs = [req(repetition_penalty=1.5, frequency_penalty=1.0, logit_bias={3: 2.0}, min_new_tokens=2,
                top_k=5, top_p=0.8, min_p=0.1, temperature=0.5), req(temperature=0.0)]
    sampler(logits, info_for(reqs, vocab), gen(0))
    assert torch.equal(logits, before)


PROBS = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])


@pytest.mark.parametrize("kw,allowed", [
    ({"top_k": 3}, {0, 1, 2}),
    ({"top_p": 0.7}, {0, 1, 2}),  # mass before token 2 is 0.65 < 0.7; before token 3 it is 0.8
    ({"top_p": 0.3}, {0}),
    ({"min_p": 0.3}, {0, 1, 2}),  # threshold 0.12
    ({"top_k": 4, "top_p": 0.75}, {0, 1, 2}),  # top_p on the renormalized top-4 (0.9 mass): 0.65/0.9 < 0.75
    ({"top_k": 5, "min_p": 0.2}, {0, 1, 2, 3}),
])
def test_filters_never_pick_filtered_tokens(kw, allowed):
    vocab = len(PROBS)
    out = draw(PROBS.log(), 6000, vocab, seed=1, **kw)
    counts = torch.bincount(out, minlength=vocab)
    assert set(torch.nonzero(counts).flatten().tolist()) == allowed
    # The kept tokens keep their relative probabilities.
    kept = torch.tensor(sorted(allowed))
    expected = PROBS[kept] / PROBS[kept].sum() * 6000
    assert torch.all((counts[kept] - expected).abs() < 5 * expected.sqrt() + 1)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_matches_softmax_distribution(temperature):
    vocab, n = 5, 20000
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.5])
    out = draw(logits, n, vocab, seed=2, temperature=temperature)
    counts = torch.bincount(out, minlength=vocab).double()
    expected = torch.softmax(logits.double() / temperature, -1) * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.5  # chi-square, 4 dof, p = 0.001; deterministic generator so it cannot flake
    # Wrong temperatures must be rejected by the same statistic.
    for wrong in (temperature * 0.7, temperature * 1.4):
        exp_wrong = torch.softmax(logits.double() / wrong, -1) * n
        assert float(((counts - exp_wrong) ** 2 / exp_wrong).sum()) > 30


def test_lower_temperature_concentrates_mass():
    vocab = 5
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.5])
    top = [int((draw(logits, 5000, vocab, seed=3, temperature=t) == 0).sum()) for t in (0.3, 1.0, 3.0)]
    assert top[0] > top[1] > top[2]


def test_vocab_mismatch_and_empty_batch():
    with pytest.raises(ValueError, match="logits shape"):
        sampler(torch.zeros(1, 11), info_for([req()], 10))
    out = sampler(torch.zeros(0, 10), info_for([], 10))
    assert out.shape == (0,) and out.dtype == torch.int64
