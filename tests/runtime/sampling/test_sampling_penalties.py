from dataclasses import dataclass, field

import torch

from radixlm.runtime.sampling.penalties import apply_penalties_and_bias
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo, token_counts
from radixlm.runtime.sampling.sampling_params import SamplingParams

torch.set_num_threads(1)
sampler = Sampler()
V = 8
EOS = 0


@dataclass
class FakeReq:
    sampling_params: SamplingParams
    origin_input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    eos_token_ids: frozenset[int] = frozenset({EOS})


def req(prompt=(), output=(), eos=frozenset({EOS}), **kw) -> FakeReq:
    p = SamplingParams(**kw)
    p.normalize()
    p.verify(V)
    return FakeReq(p, list(prompt), list(output), eos)


def process(logits, reqs):
    return apply_penalties_and_bias(logits, SamplingBatchInfo.from_reqs(reqs, V, "cpu"))


LOGITS = torch.tensor([[2.0, -1.0, 3.0, -2.0, 0.5, 1.0, -0.5, 0.0]])


def test_nothing_to_apply_returns_input():
    assert process(LOGITS, [req()]) is LOGITS


def test_token_counts_scatter():
    counts = token_counts([[1, 1, 3], [], [7]], V, "cpu")
    assert counts.tolist() == [[0, 2, 0, 1, 0, 0, 0, 0], [0] * 8, [0] * 7 + [1]]


def test_repetition_penalty_hf_semantics_over_prompt_and_output():
    out = process(LOGITS, [req(prompt=[1, 2], output=[2, 5, 6], repetition_penalty=2.0)])
    expected = LOGITS.clone()
    for t in (1, 2, 5, 6):
        x = expected[0, t]
        expected[0, t] = x / 2.0 if x > 0 else x * 2.0
    assert torch.equal(out, expected)
    assert out[0, 1] == -2.0 and out[0, 2] == 1.5 and out[0, 0] == 2.0


def test_repetition_penalty_below_one_boosts():
    out = process(LOGITS, [req(prompt=[2, 3], repetition_penalty=0.5)])
    assert out[0, 2] == 6.0 and out[0, 3] == -1.0


def test_frequency_and_presence_over_output_only():
    out = process(LOGITS, [req(prompt=[4, 4, 4], output=[2, 2, 2, 3], frequency_penalty=0.5, presence_penalty=1.5)])
    expected = LOGITS.clone()
    expected[0, 2] -= 0.5 * 3 + 1.5
    expected[0, 3] -= 0.5 * 1 + 1.5
    assert torch.allclose(out, expected, atol=0, rtol=0)  # prompt token 4 untouched


def test_negative_penalties_encourage():
    out = process(LOGITS, [req(output=[7, 7], frequency_penalty=-1.0, presence_penalty=-2.0)])
    assert out[0, 7] == 0.0 + 2 * 1.0 + 2.0


def test_order_bias_then_repetition_then_frequency():
    r = req(prompt=[1], output=[1], logit_bias={1: 3.0}, repetition_penalty=2.0, frequency_penalty=0.25)
    # bias: -1 + 3 = 2 (positive) -> repetition divides: 1 -> frequency: 1 - 0.25
    assert process(LOGITS, [r])[0, 1] == 0.75


def test_rows_without_penalties_untouched_in_mixed_batch():
    logits = LOGITS.repeat(3, 1)
    out = process(logits, [req(prompt=[2], output=[2], repetition_penalty=1.5),
                           req(prompt=[2], output=[2]),
                           req(output=[2], presence_penalty=1.0)])
    assert torch.equal(out[1], LOGITS[0])
    assert out[0, 2] == 2.0 and out[2, 2] == 2.0
    assert torch.equal(out[0, [0, 1, 3]], LOGITS[0, [0, 1, 3]])


def test_logit_bias_forces_token_when_sampling_and_greedy():
    logits = torch.randn(64, V, generator=torch.Generator().manual_seed(0))
    reqs = [req(logit_bias={"5": 100.0}, temperature=1.0 if i % 2 else 0.0) for i in range(64)]
    out = sampler(logits, SamplingBatchInfo.from_reqs(reqs, V, "cpu"), torch.Generator().manual_seed(1))
    assert torch.all(out == 5)
    out = process(LOGITS, [req(logit_bias={2: -100.0})])
    assert out[0, 2] == -97.0


def test_min_new_tokens_masks_eos_and_stop_ids_only_below_minimum():
    r0 = req(output=[], min_new_tokens=2, stop_token_ids=[3])
    r1 = req(output=[4], min_new_tokens=2, stop_token_ids=[3])
    r2 = req(output=[4, 4], min_new_tokens=2, stop_token_ids=[3])
    out = process(LOGITS.repeat(3, 1), [r0, r1, r2])
    inf = float("-inf")
    for row in (0, 1):
        assert out[row, EOS] == inf and out[row, 3] == inf
        assert torch.equal(out[row, [1, 2, 4, 5, 6, 7]], LOGITS[0, [1, 2, 4, 5, 6, 7]])
    assert process(LOGITS, [r2]) is LOGITS  # at the minimum: no mask at all


def test_min_new_tokens_with_ignore_eos_masks_only_stop_ids():
    out = process(LOGITS, [req(min_new_tokens=3, stop_token_ids=[3], ignore_eos=True)])
    assert out[0, EOS] == LOGITS[0, EOS] and out[0, 3] == float("-inf")
    assert process(LOGITS, [req(min_new_tokens=3, ignore_eos=True)]) is LOGITS


def test_min_new_tokens_several_eos_ids_and_sampler_avoids_them():
    eos = frozenset({0, 6})
    logits = torch.full((50, V), -5.0)
    logits[:, 0] = 10.0
    logits[:, 6] = 10.0
    reqs = [req(eos=eos, min_new_tokens=1, temperature=0.0 if i % 2 else 1.0) for i in range(50)]
    out = sampler(logits, SamplingBatchInfo.from_reqs(reqs, V, "cpu"), torch.Generator().manual_seed(2))
    assert not torch.isin(out, torch.tensor([0, 6])).any()
    done = [req(eos=eos, output=[1], min_new_tokens=1, temperature=0.0)]
    assert int(sampler(logits[:1], SamplingBatchInfo.from_reqs(done, V, "cpu"))) == 0
