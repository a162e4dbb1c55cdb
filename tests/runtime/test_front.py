"""RequestBuilder's bounds (shared by the offline Engine and the server) and the TokenizerManager's build of a
large batch, which must leave the event loop to other requests between chunks."""
from __future__ import annotations

import asyncio

import pytest

from radixlm.runtime.front import MAX_GRAMMAR_CHARS, MAX_N, FrontLimits, RequestBuilder
from radixlm.runtime.tokenizer_manager import TokenizerManager

VOCAB = 1000


class ByteTokenizer:
    """One token per character (its code point modulo the vocabulary)."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) % VOCAB for c in text]

    def __call__(self, texts: list[str]) -> dict:
        return {"input_ids": [self.encode(t) for t in texts]}


def builder(max_logprobs: int = 20) -> RequestBuilder:
    return RequestBuilder(ByteTokenizer(), FrontLimits(VOCAB, context_len=256, max_total_num_tokens=512,
                                                       max_logprobs=max_logprobs))


@pytest.mark.parametrize("kwargs,message", [
    ({"return_logprob": True, "top_logprobs_num": 21}, "at most 20"),
    ({"return_logprob": True, "top_logprobs_num": VOCAB + 1}, "at most 20"),
    ({"return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
    ({"sampling_params": {"n": MAX_N + 1}}, "n must be in"),
    ({"sampling_params": {"n": 0}}, "n must be in"),
    ({"sampling_params": {"n": "2"}}, "n must be an integer"),
    ({"sampling_params": {"stop": ["s"] * 65}}, "at most 64 stop strings"),
    ({"sampling_params": {"stop": "x" * 1025}}, "at most 1024 characters"),
    ({"sampling_params": {"regex": "a" * (MAX_GRAMMAR_CHARS + 1)}}, "regex: at most"),
    ({"sampling_params": {"max_new_tokens": 10**9}}, "context length"),
    ({"priority": True}, "priority must be an integer"),
    ({"priority": 2.0}, "priority must be an integer"),
    ({"priority": 1 << 62}, "priority must be in"),
    ({"timeout_s": 0}, "timeout_s must be a finite number"),
    ({"timeout_s": float("inf")}, "timeout_s must be a finite number"),
    ({"timeout_s": "5"}, "timeout_s must be a number"),
])
def test_out_of_range_values_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        builder().build(prompt="hello", **kwargs)


@pytest.mark.parametrize("ids", [[1, -1], [1, VOCAB], [1, True], [2.0], [1, "2"], [1, None], [1, [2]]])
def test_input_ids_outside_the_vocabulary_or_not_integers_are_refused(ids):
    with pytest.raises(ValueError, match=rf"input_ids must be integers in \[0, {VOCAB}\)"):
        builder().build(input_ids=ids)
    with pytest.raises(ValueError, match="input_ids must be integers"):
        builder().build(input_ids=[[3, 4], ids])  # in a batch too


def test_input_ids_at_the_vocabulary_bounds_are_taken():
    assert builder().build(input_ids=[0, VOCAB - 1]).msgs[0].input_ids == [0, VOCAB - 1]


def test_max_logprobs_minus_one_allows_the_whole_vocabulary():
    built = builder(max_logprobs=-1).build(prompt="hello", return_logprob=True, top_logprobs_num=VOCAB)
    assert built.msgs[0].top_logprobs_num == VOCAB
    with pytest.raises(ValueError, match=f"at most {VOCAB}"):
        builder(max_logprobs=-1).build(prompt="hello", return_logprob=True, top_logprobs_num=VOCAB + 1)


def test_priority_and_timeout_reach_every_request_of_a_batch():
    built = builder().build(prompt=["a", "b"], sampling_params={"n": 2}, priority=[3, None], timeout_s=2)
    assert [(m.priority, m.timeout_s) for m in built.msgs] == [(3, 2.0), (3, 2.0), (None, 2.0), (None, 2.0)]
    assert [(m.priority, m.timeout_s) for m in built.prefix_requests()] == [(3, 2.0), (None, 2.0)]


def test_top_logprobs_num_is_ignored_without_return_logprob():
    assert builder().build(prompt="hello", top_logprobs_num=10**6).msgs[0].top_logprobs_num == 0


def test_a_batch_is_built_in_steps_with_the_same_result():
    prompts = [f"prompt {i}" for i in range(600)]  # more than one tokenizer chunk
    whole = builder().build(prompt=prompts, sampling_params={"n": 2}, rid=[f"r{i}" for i in range(600)])
    steps = builder().build_steps(prompt=prompts, sampling_params={"n": 2}, rid=[f"r{i}" for i in range(600)])
    count = 0
    while True:
        try:
            next(steps)
            count += 1
        except StopIteration as done:
            stepped = done.value
            break
    assert count == 1200
    assert [m.input_ids for m in stepped.msgs] == [m.input_ids for m in whole.msgs]
    assert [m.rid for m in stepped.msgs] == [m.rid for m in whole.msgs] and whole.msgs[1].rid == "r0-1"
    assert stepped.warm == whole.warm == list(range(0, 1200, 2))


def test_build_async_lets_other_tasks_run_during_a_large_batch():
    tm = TokenizerManager.__new__(TokenizerManager)  # only the builder is needed
    tm.builder = builder()

    async def main() -> tuple[int, int]:
        ticks = 0
        stop = asyncio.Event()

        async def health_probe():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        probe = asyncio.create_task(health_probe())
        await asyncio.sleep(0)
        built = await tm.build_async(prompt=[f"p{i}" for i in range(2000)])
        stop.set()
        await probe
        return ticks, len(built.msgs)

    ticks, made = asyncio.run(main())
    assert made == 2000
    assert ticks >= 2000 // 64  # the probe ran between every chunk of 64 requests
