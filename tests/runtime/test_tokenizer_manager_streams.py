"""The TokenizerManager's per-request mailbox (model-free): outputs that arrive while the reader is busy are read as
one cumulative snapshot, equal to the one the last of them alone would have given; errors and the finish pass
through; a non-streamed request's reader builds no snapshot before the finish."""
from __future__ import annotations

import asyncio

import pytest

from radixlm.runtime.front import ReqState
from radixlm.runtime.messages import ReqOutput
from radixlm.runtime.tokenizer_manager import RequestFailed, _ReqEntry


def out(ids: list[int], total: int, finished: dict | None = None, logprobs: bool = False) -> ReqOutput:
    return ReqOutput("r", ids, finished, prompt_tokens=3, completion_tokens=total, cached_tokens=1,
                     output_token_logprobs=[(-0.5, t) for t in ids] if logprobs else [])


def feed(state: ReqState, outputs: list[tuple[ReqOutput, str]]) -> None:
    for o, text in outputs:
        state.add(o, text)


OUTPUTS = [(out([5], 1), "a"), (out([6, 7], 3), "abc"), (out([8], 4, {"type": "length", "length": 4}), "abcd")]


@pytest.mark.parametrize("logprobs", [False, True])
def test_coalesced_snapshot_equals_the_last_outputs_own(logprobs):
    outputs = [(out(o.new_output_ids, o.completion_tokens, o.finished_reason, logprobs), t) for o, t in OUTPUTS]
    one_by_one = ReqState("r", None, logprobs, False)
    snaps = [one_by_one.update(o, t) for o, t in outputs]
    together = ReqState("r", None, logprobs, False)
    feed(together, outputs[:2])
    mid = together.snapshot()
    assert mid == snaps[1]
    feed(together, outputs[2:])
    final = together.snapshot()
    final["meta_info"].pop("e2e_latency"), snaps[2]["meta_info"].pop("e2e_latency")
    assert final == snaps[2] and final["output_ids"] == [5, 6, 7, 8]
    assert mid["output_ids"] == [5, 6, 7]  # a snapshot is not changed by later outputs


def test_a_busy_reader_gets_one_chunk_for_a_backlog():
    async def main() -> list[dict]:
        entry = _ReqEntry(ReqState("r", None, False, False), None)
        got = []

        async def reader():
            while True:
                snap = await entry.next_snapshot()
                got.append(snap)
                if snap["meta_info"]["finish_reason"] is not None:
                    return

        task = asyncio.create_task(reader())
        entry.state.add(*OUTPUTS[0])
        entry.deliver()
        await asyncio.sleep(0)  # the reader takes the first output alone
        for o, t in OUTPUTS[1:]:  # then two arrive before it runs again
            entry.state.add(o, t)
            entry.deliver()
        await task
        return got

    got = asyncio.run(main())
    assert [g["text"] for g in got] == ["a", "abcd"] and got[-1]["output_ids"] == [5, 6, 7, 8]


def test_errors_and_the_final_snapshot():
    async def main():
        entry = _ReqEntry(ReqState("r", None, False, False), None)
        built = []
        entry.state.snapshot = lambda real=entry.state.snapshot: built.append(1) or real()
        waiter = asyncio.create_task(entry.final())
        for o, t in OUTPUTS:
            entry.state.add(o, t)
            entry.deliver()
            await asyncio.sleep(0)
        final = await waiter
        failing = _ReqEntry(ReqState("x", None, False, False), None)
        failing.fail(RequestFailed("the scheduler died", 500))
        with pytest.raises(RequestFailed):
            await failing.next_snapshot()
        return final, built, failing.finished

    final, built, failed_finished = asyncio.run(main())
    assert final["text"] == "abcd" and final["meta_info"]["finish_reason"]["type"] == "length"
    assert built == [1] and failed_finished


def test_req_output_pickles_every_field():
    import dataclasses
    import pickle

    full = ReqOutput("r", [1, 2], {"type": "stop", "matched": 2}, 3, 2, 1, num_retractions=1, spec_verify_ct=2,
                     spec_draft_tokens=4, spec_accepted_tokens=3, queue_time=0.5, input_token_logprobs=[(None, 7)],
                     input_top_logprobs=[None], output_token_logprobs=[(-0.1, 1)], output_top_logprobs=[[(-0.1, 1)]],
                     embedding=[0.5], output_token_ids_logprobs=[[(-2.0, 9)]])
    back = pickle.loads(pickle.dumps(full, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == full and all(getattr(back, f.name) == getattr(full, f.name) for f in dataclasses.fields(ReqOutput))
