"""A step's outputs as one BatchReqOutput (model-free): it crosses the wire whole, the rarely used columns stay absent
until a row sets them, each row reads back as the ReqOutput it was built from, and a front fed rows gives the
snapshots the per-request outputs gave; one request finishing or failing leaves the other rows as they are."""
from __future__ import annotations

import pickle
from types import SimpleNamespace

from radixlm.runtime.detokenizer_manager import DetokenizerManager
from radixlm.runtime.front import ReqState
from radixlm.runtime.messages import (OUTPUT_PICKLE_PROTOCOL, BatchReqOutput, BatchStrOutput, BatchTokenOutput,
                                      DetokenizeInfo, ReqOutput)
from radixlm.runtime.scheduler.config import OutputConfig
from radixlm.runtime.scheduler.outbox import Outbox


def wire(msg):
    return pickle.loads(pickle.dumps(msg, protocol=OUTPUT_PICKLE_PROTOCOL))


PLAIN = ReqOutput("a", [5, 6], None, 3, 2, 1, queue_time=0.25)
FULL = ReqOutput("b", [7], {"type": "stop", "matched": 7}, 4, 1, 0, num_retractions=1, spec_verify_ct=2,
                 spec_draft_tokens=4, spec_accepted_tokens=3, input_token_logprobs=[(None, 1), (-0.5, 2)],
                 input_top_logprobs=[None, [(-0.5, 2)]], output_token_logprobs=[(-0.1, 7)],
                 output_top_logprobs=[[(-0.1, 7), (-3.0, 8)]], output_token_ids_logprobs=[[(-2.0, 9)]])
EMBED = ReqOutput("c", [], {"type": "length", "length": 0}, 2, 0, 0, embedding=[0.5, -0.5])


def test_round_trip_with_optional_columns_absent_then_present():
    plain = BatchReqOutput.of([PLAIN, PLAIN])
    assert plain.spec is None and plain.logprobs is None and plain.embeddings is None
    back = wire(BatchTokenOutput([DetokenizeInfo("a", [1])], plain))
    assert back.new_reqs == [DetokenizeInfo("a", [1])] and back.outputs == plain and list(back.outputs) == [PLAIN] * 2

    mixed = BatchReqOutput.of([PLAIN, FULL, EMBED, PLAIN])  # the optional columns appear at row 1 and 2
    assert mixed.spec is not None and mixed.logprobs is not None and mixed.embeddings is not None
    assert list(wire(mixed)) == [PLAIN, FULL, EMBED, PLAIN]
    assert mixed[-3] == FULL and len(wire(BatchReqOutput())) == 0  # the watchdog's heartbeat: an empty step


def test_outbox_batch_keeps_a_finished_row_apart_from_running_ones():
    def req(rid, finished=None, logprob=False):
        return SimpleNamespace(
            rid=rid, output_ids=[1, 2, 3], sent_len=1, origin_input_ids=[9] * 5, cached_tokens=2, num_retractions=0,
            finished_reason=SimpleNamespace(to_json=lambda: finished) if finished else None, spec_verify_ct=0,
            spec_draft_tokens=0, spec_accepted_tokens=0, queue_time=None, embedding=None,
            input_token_logprobs=[], input_top_logprobs=[], output_token_logprobs=[(-0.2, 2), (-0.3, 3)] if logprob
            else [], output_top_logprobs=[], output_token_ids_logprobs=[])

    outbox = Outbox(OutputConfig(stream_interval=1))
    reqs = [req("r0"), req("r1", {"type": "length", "length": 3}, logprob=True), req("r2")]
    for r in reqs:
        outbox.emit(r)
    batch = wire(outbox.take())
    assert len(outbox.outputs) == 0 and all(r.sent_len == 3 for r in reqs)
    assert batch.rids == ["r0", "r1", "r2"] and batch.new_output_ids == [[2, 3]] * 3
    assert batch.finished_reasons == [None, {"type": "length", "length": 3}, None]
    assert batch.logprobs == [([], [], [], [], []), ([], [], [(-0.2, 2), (-0.3, 3)], [], []), ([], [], [], [], [])]
    assert reqs[1].output_token_logprobs == []  # handed over, not sent twice

    states = {rid: ReqState(rid, None, True, False) for rid in batch.rids}
    for i, rid in enumerate(batch.rids):
        states[rid].add_row(batch, i, "t")
    assert [s.finished for s in states.values()] == [False, True, False]
    assert states["r1"].snapshot()["meta_info"]["output_token_logprobs"] == [(-0.2, 2, None), (-0.3, 3, None)]


def test_rows_give_the_snapshots_per_request_outputs_gave():
    batch = BatchReqOutput.of([PLAIN, FULL, EMBED])
    for i, out in enumerate(batch):
        for logprob in (False, True):
            by_row, alone = ReqState(out.rid, None, logprob, False), ReqState(out.rid, None, logprob, False)
            by_row.add_row(batch, i, "x")
            alone.add(out, "x")
            got, want = by_row.snapshot(), alone.snapshot()
            assert (got["meta_info"].pop("e2e_latency", 0) > 0) == (want["meta_info"].pop("e2e_latency", 0) > 0)
            assert got == want and list(got["meta_info"]) == list(want["meta_info"])  # the JSON's order too


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        if 13 in ids:
            raise ValueError("bad id")
        return "".join(chr(96 + i) for i in ids)


def test_an_error_for_one_request_fails_that_row_only():
    manager = DetokenizerManager(_Tok())
    batch = BatchReqOutput.of([ReqOutput("ok", [1, 2], None, 1, 2, 0), ReqOutput("bad", [13], None, 1, 1, 0),
                               ReqOutput("done", [3], {"type": "length", "length": 1}, 1, 1, 0)])
    out = wire(manager.handle(BatchTokenOutput([DetokenizeInfo(r, []) for r in batch.rids], batch)))
    assert isinstance(out, BatchStrOutput) and out.texts == ["ab", "", "c"]
    assert out.outputs.finished_reasons[0] is None and out.outputs.finished_reasons[2]["type"] == "length"
    assert out.outputs.finished_reasons[1]["status_code"] == 500 and "bad id" in out.outputs.finished_reasons[1]["message"]
    assert set(manager.states) == {"ok"}  # finished and failed rows dropped their decode state
