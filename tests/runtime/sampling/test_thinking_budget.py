"""The thinking budget's state machine (sampling/thinking_budget.py), its forced-token mask in SamplingBatchInfo and
the logit processing, draft verification honouring it, and the front's resolution and checks (model-free)."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.front import FrontLimits, RequestBuilder
from radixlm.runtime.sampling.penalties import apply_penalties_and_bias
from radixlm.runtime.sampling.sampler import Sampler
from radixlm.runtime.sampling.sampling_batch_info import SamplingBatchInfo
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.sampling.thinking_budget import UNKNOWN, ThinkingBudget, ThinkingTracker
from radixlm.runtime.spec.verification import build_verification, draft_layout, plain_greedy, settle

START, END, TOOL = 5, 9, 7


def tracker(budget=3, starts_open=True, end=(END,), start=(START,), tool=()) -> ThinkingTracker:
    return ThinkingTracker(ThinkingBudget(budget, start, end, starts_open, tool))


def forced_run(t: ThinkingTracker, model: list[int]) -> list[int]:
    """The output when the model would write `model` and the budget forces its tokens (as the sampler applies them)."""
    out: list[int] = []
    for tok in model:
        f = t.forced_token(out, len(out))
        assert f is not UNKNOWN
        out.append(tok if f is None else f)
        t.advance(out)
    return out


def test_budget_forces_the_end_tag_after_n_reasoning_tokens():
    assert forced_run(tracker(3), [1, 2, 3, 4, 6, 8]) == [1, 2, 3, END, 6, 8]
    # An opening tag the model writes anyway is not counted.
    assert forced_run(tracker(3), [START, 1, 2, 3, 4, 6]) == [START, 1, 2, 3, END, 6]
    # Not open at the start: only a block the model opens at its first token is budgeted.
    assert forced_run(tracker(2, starts_open=False), [START, 1, 2, 3, 4]) == [START, 1, 2, END, 4]
    assert forced_run(tracker(2, starts_open=False), [1, START, 2, 3, 4, 6]) == [1, START, 2, 3, 4, 6]
    # Closed before the budget (by the end tag, or by the family's tool-call tag): nothing is forced.
    t = tracker(3)
    assert forced_run(t, [1, END, 2, 3, 4, 6]) == [1, END, 2, 3, 4, 6] and t.done
    assert forced_run(tracker(3, tool=(TOOL,)), [1, TOOL, 2, 3, 4]) == [1, TOOL, 2, 3, 4]


def test_multi_token_tags():
    end = (8, 9)
    assert forced_run(tracker(2, end=end), [1, 2, 3, 4, 6]) == [1, 2, 8, 9, 6]
    t = tracker(2, end=end)
    forced_run(t, [1, 2, 3])
    assert not t.done  # half the tag
    forced_run(t, [1, 2, 3, 4])
    assert t.done  # the forced tag closed the block
    # A start tag of two tokens: while the output could still be it, nothing is forced (budget 1 < the tag).
    t = tracker(1, start=(4, 5))
    assert forced_run(t, [4, 5, 1, 2, 3]) == [4, 5, 1, END, 3]
    assert forced_run(tracker(1, start=(4, 5)), [4, 6, 1, 2]) == [4, 6, END, 2]  # not the tag: reasoning from 0


def test_a_token_in_flight_makes_the_forced_window_unknown():
    t = tracker(3)
    t.advance([1, 2])
    assert t.forced_token([1, 2], 2) is None and t.decided([1, 2], 2)
    assert t.forced_token([1, 2], 3) is UNKNOWN and not t.decided([1, 2], 3)  # position 2 may close the block
    t.advance([1, 2, 3])
    assert t.forced_token([1, 2, 3], 3) == END
    assert t.forced_token([1, 2, 3], 4) is None  # past the tag (a pass in flight holds it)
    # Virtual outputs (a draft's rows) are scanned from the known state without changing it.
    assert t.forced_token([1, 2, 3, END], 4) is None and not t.done


def test_for_prompt_reads_whether_the_prompt_leaves_the_block_open():
    assert ThinkingBudget.for_prompt(4, (START,), (END,), [1, START, 2], False).starts_open
    assert not ThinkingBudget.for_prompt(4, (START,), (END,), [1, START, 2, END, 3], False).starts_open
    assert not ThinkingBudget.for_prompt(4, (START,), (END,), [1, 2], False).starts_open
    assert ThinkingBudget.for_prompt(4, (START,), (END,), [1, 2], True).starts_open
    with pytest.raises(ValueError, match="thinking_budget must be an integer >= 1"):
        ThinkingBudget(0, (START,), (END,), True)


class _Req:
    def __init__(self, output_ids, thinking=None, temperature=0.0, **sp):
        self.sampling_params = SamplingParams(temperature=temperature, **sp)
        self.sampling_params.normalize()
        self.origin_input_ids, self.output_ids, self.eos_token_ids = [1, 2], list(output_ids), frozenset()
        self.thinking, self.grammar = thinking, None
        if thinking is not None:
            thinking.advance(self.output_ids)

    def token_at(self, pos):
        return (self.origin_input_ids + self.output_ids)[pos]


def test_the_mask_keeps_only_the_forced_token_in_its_row():
    vocab = 16
    reqs = [_Req([1, 2, 3], tracker(3)), _Req([1, 2, 3]), _Req([1, 2], tracker(3), temperature=1.0)]
    info = SamplingBatchInfo.from_reqs(reqs, vocab)
    assert info.forced_rows.tolist() == [0] and info.forced_cols.tolist() == [END] and info.need_logits_processing
    logits = torch.randn(3, vocab)
    out = apply_penalties_and_bias(logits, info)
    assert out[0].argmax() == END and torch.isinf(out[0]).sum() == vocab - 1 and torch.equal(out[1:], logits[1:])
    sampled = Sampler()(torch.randn(3, vocab), SamplingBatchInfo.from_reqs(
        [_Req([1, 2, 3], tracker(3), temperature=1.0)] * 3, vocab))
    assert sampled.tolist() == [END] * 3
    # Counted with a token in flight (num_out): the window is decided when the host knows the tokens before it.
    assert SamplingBatchInfo.from_reqs([_Req([1, 2, 3], tracker(3))], vocab, num_out=[4]).forced_rows is None
    with pytest.raises(RuntimeError, match="depends on a token in flight"):
        SamplingBatchInfo.from_reqs([_Req([1, 2], tracker(3))], vocab, num_out=[3])


def test_draft_verification_honours_the_forced_tokens():
    vocab = 16
    req = _Req([1, 2], tracker(3))
    assert not plain_greedy(req)
    draft = [4, 6, 8]  # the model would go on 4, 6, 8; the budget forces END at output position 3
    logits = torch.full((4, vocab), -5.0)
    for row, tok in enumerate([4, 6, 8, 3]):
        logits[row, tok] = 5.0
    v = build_verification([req], [draft], [3], draft_layout([draft]), None, logits, None)
    got = settle(v, 0, None)
    assert got.tokens == [4, END] and got.accepted == 1
    # A draft that writes the forced tag is kept through it.
    v = build_verification([req], [[4, END, 8]], [3], draft_layout([[4, END, 8]]), None, logits, None)
    assert settle(v, 0, None).tokens == [4, END, 8, 3]


def test_front_resolves_the_budget_and_rejects_what_it_cannot_enforce():
    class Tok:
        def encode(self, text, add_special_tokens=True):
            return {"<think>": [START], "</think>": [END], "<tool_call>": [TOOL]}.get(text, [3])

    limits = FrontLimits(vocab_size=16, context_len=512, max_total_num_tokens=1024)
    qwen3 = RequestBuilder(Tok(), limits, reasoning_parser="qwen3")
    m = qwen3.make_request([1, START], {"thinking_budget": 4, "max_new_tokens": 8}, False, None, 0, None, None, False)
    assert m.thinking == ThinkingBudget(4, (START,), (END,), True, (TOOL,))
    m = qwen3.make_request([1, 2], {"thinking_budget": 4}, False, None, 0, None, None, False)
    assert not m.thinking.starts_open
    r1 = RequestBuilder(Tok(), limits, reasoning_parser="deepseek-r1")
    assert r1.make_request([1, 2], {"thinking_budget": 2}, False, None, 0, None, None, False).thinking.starts_open
    for builder, sp, match in (
            (RequestBuilder(Tok(), limits), {"thinking_budget": 4}, "needs a reasoning parser"),
            (RequestBuilder(Tok(), limits, reasoning_parser="gpt-oss"), {"thinking_budget": 4}, "harmony"),
            (qwen3, {"thinking_budget": 0}, "thinking_budget must be >= 1"),
            (qwen3, {"thinking_budget": 1.5}, "thinking_budget must be an integer"),
            (qwen3, {"thinking_budget": 4, "regex": "a"}, "cannot be combined")):
        with pytest.raises(ValueError, match=match):
            builder.make_request([1, 2], sp, False, None, 0, None, None, False)
