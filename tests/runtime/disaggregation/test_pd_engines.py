"""A prefill Engine and a decode Engine in one process (a tiny float32 random Llama), paired by bootstrap rooms as the
PD router pairs servers: the decode side's tokens equal a plain run's (greedy, streamed, with logprobs and with
NGRAM drafts on the decode side), the decode side computes no prompt, n > 1 takes a room per sample, and an abort or
a room that never comes frees the decode side's slots."""
from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers import LlamaConfig

import radixlm
from radixlm.runtime.messages import BootstrapInfo
from tests.runtime.models.tiny import random_prompts, save_tiny
from tests.runtime.server.conftest import free_port

CFG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
SP = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


def _pair(tmp_path_factory, device: str):
    """A prefill and a decode Engine on `device`, as the module's fixtures yield them; shut down after."""
    path = tmp_path_factory.mktemp(f"pd-engines-{device}")
    save_tiny(LlamaConfig(**CFG), path, seed=0)
    port = free_port()
    common = dict(dtype="float32", device=device, max_total_tokens=2048, enable_integrity_check=True, random_seed=0,
                  page_size=4)
    prefill = radixlm.Engine(str(path), disaggregation_mode="prefill", disaggregation_bootstrap_port=port, **common)
    decode = radixlm.Engine(str(path), disaggregation_mode="decode", disaggregation_timeout=1.0,
                            speculative_algorithm="NGRAM", **common)
    yield prefill, decode, port
    prefill.shutdown()
    decode.shutdown()


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    torch.set_num_threads(1)
    yield from _pair(tmp_path_factory, "cpu")


@pytest.fixture(scope="module")
def cuda_engines(tmp_path_factory):
    """The same pair on CUDA (one GPU): the in-place write is the row-copy kernel on the prefill side's copy stream."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    yield from _pair(tmp_path_factory, "cuda")


def _abort_while_waiting(decode, port: int, ids: list[int], rid: str, room: int, waiting) -> None:
    """Sends a decode request for `room`, aborts it once waiting() says it waits for its KV, and checks the answer."""
    got = {}
    t = threading.Thread(target=lambda: got.update(out=decode.generate(
        input_ids=ids, sampling_params=SP, rid=rid, bootstrap=BootstrapInfo("127.0.0.1", port, room))))
    t.start()
    deadline = time.monotonic() + 5
    while not waiting() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waiting()
    decode.abort_request(rid)
    t.join(5)
    assert got["out"]["meta_info"]["finish_reason"]["type"] == "abort"


def _pd(engines, ids, sp, room, **kw):
    prefill, decode, port = engines
    b = BootstrapInfo("127.0.0.1", port, room)
    got = {}
    def run_prefill():
        res = prefill.generate(input_ids=ids, sampling_params=sp, bootstrap=b, **kw)
        got["p"] = list(res) if kw.get("stream") else res

    t = threading.Thread(target=run_prefill)
    t.start()
    out = decode.generate(input_ids=ids, sampling_params=sp, bootstrap=b, **kw)
    if kw.get("stream"):
        out = list(out)
    t.join()
    return out, got["p"]


def test_decode_side_matches_a_plain_run(engines):
    prefill, decode, _ = engines
    prompts = random_prompts(0, [5, 13, 30], CFG["vocab_size"])
    plain = [decode.generate(input_ids=p, sampling_params=SP, return_logprob=True, logprob_start_len=0)
             for p in prompts]
    before = decode.scheduler.stats["prefill_batches"]
    for i, (p, want) in enumerate(zip(prompts, plain)):
        out, first = _pd(engines, p, SP, 100 + i, return_logprob=True, logprob_start_len=0)
        assert out["output_ids"] == want["output_ids"]
        assert first["output_ids"] == want["output_ids"][:1]  # the prefill side stops after its first token
        got, ref = out["meta_info"], want["meta_info"]
        assert [t for _, t, *_ in got["output_token_logprobs"]] == want["output_ids"]
        assert got["output_token_logprobs"][0][0] == pytest.approx(ref["output_token_logprobs"][0][0], abs=1e-4)
        assert len(got["input_token_logprobs"]) == len(p)
    chunks, _ = _pd(engines, prompts[2] * 2, SP, 200, stream=True)
    assert chunks[-1]["output_ids"] == decode.generate(input_ids=prompts[2] * 2, sampling_params=SP)["output_ids"]
    assert decode.scheduler.stats["prefill_batches"] - before == 1  # only the plain run above prefilled here
    assert decode.scheduler.pd_decode.received >= 4


def test_grammar_advances_over_the_prefill_token(engines):
    _, decode, _ = engines
    ids = random_prompts(5, [7], CFG["vocab_size"])[0]
    sp = {"temperature": 0, "max_new_tokens": 6, "regex": "t1(t2|t3)+"}
    out, first = _pd(engines, ids, sp, 400)
    plain = decode.generate(input_ids=ids, sampling_params=sp)
    assert out["output_ids"] == plain["output_ids"] and first["output_ids"] == [1]
    assert out["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]


def test_samples_take_a_room_each(engines):
    ids = random_prompts(1, [9], CFG["vocab_size"])[0]
    out, first = _pd(engines, ids, {"temperature": 1.0, "max_new_tokens": 4, "n": 3}, 300)
    assert [o["output_ids"][0] for o in out] == [f["output_ids"][0] for f in first]


def test_abort_and_missing_room_free_the_slots(engines):
    _, decode, port = engines
    ids = random_prompts(2, [11], CFG["vocab_size"])[0]
    t0 = time.monotonic()
    out = decode.generate(input_ids=ids, sampling_params=SP, bootstrap=BootstrapInfo("127.0.0.1", port, 999))
    assert time.monotonic() - t0 >= 0.9
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert "no KV for room 999" in out["meta_info"]["finish_reason"]["message"]
    _abort_while_waiting(decode, port, ids, "waits", 1000, decode.scheduler.pd_decode.holding)
    assert decode.flush_cache()  # idle, and the accounting check passed with nothing held
    assert not decode.scheduler.pd_decode.pending


class _SameProcessPeers:
    """The decode Engine's pool as the prefill side's opened export (one process: the CPU stands in for CUDA IPC)."""

    def __init__(self, buffers):
        self.buffers, self.opened = buffers, 0

    def open(self, export):
        self.opened += 1
        return self.buffers


@pytest.fixture
def pair(request):
    """The CPU pair, or the CUDA one where a test is parametrized with "cuda_engines"."""
    return request.getfixturevalue(getattr(request, "param", "engines"))


@pytest.fixture
def in_place(pair, monkeypatch):
    """Both Engines as on one CUDA host: the decode side's fetches carry a pool, and the prefill side writes into it."""
    from radixlm.runtime.scheduler import disagg_decode

    prefill, decode, _ = pair
    side = decode.scheduler.pd_decode
    monkeypatch.setattr(disagg_decode, "export_pool", lambda bufs: {"host": "this", "buffers": []})
    monkeypatch.setattr(side, "_export", None)
    peers = _SameProcessPeers(decode.scheduler.runner.token_to_kv_pool.buffers())
    monkeypatch.setattr(prefill.scheduler.disagg.prefill, "peers", peers)  # rooms whose fetch came first
    monkeypatch.setattr(prefill.scheduler.disagg.prefill.sender, "peers", peers)  # rooms that finished first
    yield peers
    side._export = None


@pytest.mark.parametrize("pair", ["engines", "cuda_engines"], indirect=True)
def test_prefill_writes_into_the_decode_pool(pair, in_place):
    """With a pool in the fetch, the prefill side copies the KV into the decode side's slots and sends no KV bytes,
    whether the fetch came first (the scheduler's copy at the request's end, on CUDA on its copy stream) or the room
    finished first (the bootstrap thread's copy when the fetch comes): the tokens equal a plain run's."""
    prefill, decode, port = pair
    side = prefill.scheduler.disagg.prefill
    p1, p2 = random_prompts(6, [6, 21], CFG["vocab_size"])
    want1, want2 = (decode.generate(input_ids=p, sampling_params=SP)["output_ids"] for p in (p1, p2))
    b1, b2 = BootstrapInfo("127.0.0.1", port, 500), BootstrapInfo("127.0.0.1", port, 501)
    by_scheduler, by_thread = side.written_in_place, side.sender.written
    got = {}
    t = threading.Thread(target=lambda: got.update(out=decode.generate(input_ids=p1, sampling_params=SP,
                                                                       bootstrap=b1)))
    t.start()
    deadline = time.monotonic() + 10
    while 500 not in side.sender._dests and time.monotonic() < deadline:  # the fetch is there first
        time.sleep(0.01)
    prefill.generate(input_ids=p1, sampling_params=SP, bootstrap=b1)
    t.join(10)
    assert got["out"]["output_ids"] == want1 and side.written_in_place == by_scheduler + 1
    prefill.generate(input_ids=p2, sampling_params=SP, bootstrap=b2)  # the room is there first
    assert decode.generate(input_ids=p2, sampling_params=SP, bootstrap=b2)["output_ids"] == want2
    assert side.sender.written == by_thread + 1 and in_place.opened == 2
    assert decode.flush_cache()


def test_abort_keeps_in_place_slots_until_the_room_answers(engines, in_place):
    """An aborted request whose slots the prefill server may write keeps them (answered at once) until the room's
    answer, here its timeout, says nothing more comes; then they are freed and the accounting check passes."""
    _, decode, port = engines
    side = decode.scheduler.pd_decode
    ids = random_prompts(7, [9], CFG["vocab_size"])[0]
    _abort_while_waiting(decode, port, ids, "in-place", 1100, side.holding)
    assert 1100 in side.draining and side.holding()  # answered, its slots still held
    deadline = time.monotonic() + 10
    while side.draining and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not side.draining and not side.holding()
    assert decode.flush_cache()


def test_fetch_waits_for_the_slot_ids_and_an_abort_before_it_frees_at_once(engines, in_place, monkeypatch):
    """A fetch carrying the pool goes out only once the request's slot ids reached the host (on CUDA: behind the
    pass in flight); a request aborted before that was never fetched, so its slots are freed at once."""
    from radixlm.runtime.scheduler import disagg_decode

    _, decode, port = engines
    side = decode.scheduler.pd_decode
    class SlowSlots(disagg_decode.HostSlots):
        def ready(self) -> bool:
            return False  # (on CUDA: the pass in flight has not ended)

    monkeypatch.setattr(disagg_decode, "HostSlots", SlowSlots)
    ids = random_prompts(8, [7], CFG["vocab_size"])[0]
    # Aborted while its slots are held and no fetch went out yet.
    _abort_while_waiting(decode, port, ids, "unsent", 1200, lambda: 1200 in side.unsent and 1200 not in side.in_place)
    assert not side.unsent and not side.draining and not side.holding()
    assert decode.flush_cache()
