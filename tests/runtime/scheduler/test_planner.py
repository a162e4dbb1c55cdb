"""The Planner and the KVCursor on their own (no Scheduler): the rows a pass gets for prefill, prompt chunks, decode,
drafts and tokens in flight, how launching and taking tokens move the cursor, and the page arithmetic. Passes planned
here run through FakeRunner, whose tokens depend on the KV the rows wrote, so the rows are checked by their tokens
too."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.cache.radix_cache import RadixCache, RadixKey
from radixlm.runtime.executor.forward_batch import IN_FLIGHT, ForwardMode
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.cursor import KVCursor, can_launch_ahead, can_plan_ahead
from radixlm.runtime.scheduler.planner import Planner, launched, pages_needed
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.spec.draft import Draft, DraftSource, DraftTraits

from .fake_runner import FakeKVError, FakeRunner, fake_logits, make_prompts, next_token, reference, seq_hash


class NoSource(DraftSource):
    def propose(self, req):
        pass


def setup(page_size: int = 1, size: int = 512, radix: bool = True):
    runner = FakeRunner(size=size, page_size=page_size, max_running_requests=8)
    tree = RadixCache(runner.req_to_token_pool, runner.token_to_kv_pool_allocator, page_size=page_size,
                      disable=not radix)
    planner = Planner(runner.req_to_token_pool, runner.token_to_kv_pool_allocator, tree, page_size)
    return runner, tree, planner


def new_req(tree: RadixCache, rid: str, prompt: list[int], chunk: int | None = None, max_new: int = 16, **sp) -> Req:
    """A request as admission leaves it (no cached prefix): locked at the root, `chunk` rows of its prompt (all)."""
    params = SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True, **sp)
    params.normalize()
    req = Req(rid, list(prompt), params)
    req.cache_lock, _ = tree.lock(tree.root_node, 0)
    req.extend_input_len = len(prompt) if chunk is None else chunk
    req.is_chunked = req.extend_input_len < len(prompt)
    return req


def take_sampled(batch, out) -> list[int]:
    """What processing a pass does for its samplers (greedy): the token appended, the cursor moved."""
    toks = out.next_token_logits.argmax(-1).tolist()
    for req, tok in zip(batch.samplers, toks):
        req.kv.in_flight -= 1
        req.kv.taken(req.seqlen + 1, req.append_tokens([tok], None))
    return toks


def run(runner, planner, running, new=(), token_buf=None):
    batch = planner.plan(list(running), list(new), token_buf)
    out = runner.forward(batch.worker)
    launched(batch)
    return batch, out


# ---------------------------------------------------------------------- prefill and decode
def test_prefill_rows_then_one_row_per_request_each_decode():
    runner, tree, planner = setup()
    p1, p2 = make_prompts(0, 2)
    r1, r2 = new_req(tree, "a", p1), new_req(tree, "b", p2)
    batch = planner.plan([], [r1, r2])
    wb = batch.worker
    assert batch.is_prefill and batch.chunk is None and batch.reqs == [r1, r2] and batch.new_reqs == [r1, r2]
    assert wb.input_ids == p1 + p2
    assert wb.positions == list(range(len(p1))) + list(range(len(p2)))
    assert (wb.prefix_lens, wb.extend_lens, wb.seq_lens) == ([0, 0], [len(p1), len(p2)], [len(p1), len(p2)])
    assert wb.logits.sample_rows == [len(p1) - 1, len(p1) + len(p2) - 1] and batch.samplers == [r1, r2]
    assert wb.logits.verify_rows == [] and batch.verifiers == [] and not wb.has_in_flight
    table = runner.req_to_token_pool.req_to_token
    assert torch.equal(torch.cat([table[r1.req_pool_idx, : len(p1)], table[r2.req_pool_idx, : len(p2)]]),
                       wb.out_cache_loc)
    out = runner.forward(wb)
    assert out.forward_mode is ForwardMode.REQUEST_SPANS and out.verify_logits is None
    launched(batch)
    assert (r1.kv.committed, r1.kv.in_flight, r2.kv.committed, r2.kv.in_flight) == (len(p1), 1, len(p2), 1)
    assert take_sampled(batch, out) == [reference(p1, 1)[0], reference(p2, 1)[0]]
    assert (r1.kv.committed, r1.kv.in_flight) == (len(p1), 0)  # the new token's KV is not written yet

    for step in range(1, 6):
        batch = planner.plan([r1, r2], [])
        wb = batch.worker
        assert not batch.is_prefill and batch.num_rows == 2 and wb.extend_lens == [1, 1]
        assert wb.input_ids == [r1.output_ids[-1], r2.output_ids[-1]]
        assert wb.positions == [r1.seqlen - 1, r2.seqlen - 1] == wb.prefix_lens
        assert wb.logits.sample_rows == [0, 1] and batch.samplers == [r1, r2]
        out = runner.forward(wb)
        assert out.forward_mode is ForwardMode.TOKEN_ROWS
        launched(batch)
        take_sampled(batch, out)
        assert r1.output_ids == reference(p1, step + 1) and r2.output_ids == reference(p2, step + 1)


def test_prompt_chunk_has_rows_and_no_sampler_then_the_last_chunk_samples():
    runner, tree, planner = setup()
    p = make_prompts(1, 1, lo=30, hi=31)[0]
    req = new_req(tree, "c", p, chunk=8)
    batch, out = run(runner, planner, [], [req])
    wb = batch.worker
    assert batch.chunk is req and batch.samplers == [] and wb.logits.sample_rows == []
    assert wb.input_ids == p[:8] and wb.positions == list(range(8)) and wb.seq_lens == [8]
    assert out.next_token_logits.shape[0] == 0
    assert (req.kv.committed, req.kv.in_flight) == (8, 0)  # launched, but it yields no token

    req.extend_input_len, req.is_chunked = len(p) - 8, False
    batch, out = run(runner, planner, [], [req])
    assert batch.chunk is None and batch.worker.positions == list(range(8, len(p)))
    assert batch.worker.logits.sample_rows == [len(p) - 9] and batch.samplers == [req]
    assert take_sampled(batch, out) == reference(p, 1)  # read back through the first chunk's slots


def test_decode_rows_of_running_requests_come_before_new_prompts():
    runner, tree, planner = setup()
    p1, p2 = make_prompts(2, 2)
    r1 = new_req(tree, "a", p1)
    batch, out = run(runner, planner, [], [r1])
    take_sampled(batch, out)
    r2 = new_req(tree, "b", p2)
    batch = planner.plan([r1], [r2])  # a mixed pass
    wb = batch.worker
    assert batch.reqs == [r1, r2] and batch.new_reqs == [r2] and batch.is_prefill
    assert wb.input_ids == [r1.output_ids[-1]] + p2 and wb.extend_lens == [1, len(p2)]
    assert wb.logits.sample_rows == [0, len(p2)] and batch.samplers == [r1, r2]
    out = runner.forward(wb)
    launched(batch)
    take_sampled(batch, out)
    assert r1.output_ids == reference(p1, 2) and r2.output_ids == reference(p2, 1)


# ---------------------------------------------------------------------- drafts
def _decoding(runner, tree, planner, prompts):
    """Requests prefilled, their first token taken."""
    reqs = [new_req(tree, f"r{i}", p) for i, p in enumerate(prompts)]
    batch, out = run(runner, planner, [], reqs)
    take_sampled(batch, out)
    return reqs


@pytest.mark.parametrize("drafted", [0, 1])
def test_a_draft_gets_verify_rows_at_the_end_of_its_requests_rows(drafted):
    runner, tree, planner = setup()
    reqs = _decoding(runner, tree, planner, make_prompts(3, 2))
    req, other = reqs[drafted], reqs[1 - drafted]
    truth = reference(req.origin_input_ids + req.output_ids, 3)
    draft = [truth[0], truth[1] + 1, truth[2]]  # the second token is wrong
    req.kv.draft = Draft(draft, NoSource())
    known = req.seqlen
    # Its rows need nothing but lengths: a pass may be planned with them while another is in flight.
    assert req.kv.end(known) == known + 3 and can_plan_ahead(req)
    batch = planner.plan(reqs, [])
    wb = batch.worker
    first = 0 if drafted == 0 else 1  # the drafted request's first row
    rows = list(range(first, first + 4))
    assert wb.extend_lens[drafted] == 4 and wb.extend_lens[1 - drafted] == 1
    assert wb.input_ids[first : first + 4] == [req.output_ids[-1]] + draft
    assert wb.positions[first : first + 4] == list(range(known - 1, known + 3))
    assert wb.logits.verify_rows == rows and batch.verifiers == [req]
    assert wb.logits.sample_rows == [4 if drafted == 0 else 0] and batch.samplers == [other]
    out = runner.forward(wb)
    assert out.verify_logits.shape[0] == 4 and out.next_token_logits.shape[0] == 1
    choices = out.verify_logits.argmax(-1).tolist()
    # Row j: the model's token after the request's tokens and the draft's first j.
    assert choices == [next_token(req.origin_input_ids + req.output_ids + draft[:j]) for j in range(4)]
    assert choices[:2] == truth[:2]
    launched(batch)
    assert (req.kv.committed, req.kv.in_flight) == (known + 3, 1)
    assert not can_plan_ahead(req)  # where its next rows start is the verdict's
    take_sampled(batch, out)

    # The verdict: draft[0] kept, then the model's token; the KV of the rejected draft positions is invalid.
    req.kv.in_flight -= 1
    req.kv.take_draft()
    appended = req.append_tokens([draft[0], choices[1]], None)
    req.kv.taken(req.seqlen, appended)
    assert req.kv.committed == known + 1 == req.seqlen - 1
    assert req.output_ids[-2:] == truth[:2]
    batch, out = run(runner, planner, reqs, [])
    assert batch.worker.positions[first] == known + 1  # the position whose KV held a rejected token is recomputed
    take_sampled(batch, out)
    assert req.output_ids == reference(req.origin_input_ids, len(req.output_ids))
    assert other.output_ids == reference(other.origin_input_ids, len(other.output_ids))


def test_a_draft_at_admission_is_verified_by_the_prefill():
    runner, tree, planner = setup()
    p = make_prompts(4, 1)[0]
    req = new_req(tree, "d", p)
    req.kv.draft = Draft(reference(p, 2), NoSource())
    batch = planner.plan([], [req])
    wb = batch.worker
    assert wb.input_ids == p + reference(p, 2) and wb.seq_lens == [len(p) + 2]
    assert wb.logits.verify_rows == [len(p) - 1, len(p), len(p) + 1] and wb.logits.sample_rows == []
    out = runner.forward(wb)
    assert out.verify_logits.argmax(-1).tolist() == reference(p, 3)


# ---------------------------------------------------------------------- the cursor
def test_launched_moves_committed_and_in_flight():
    runner, tree, planner = setup()
    p = make_prompts(5, 1, lo=20, hi=21)[0]
    chunked, whole = new_req(tree, "c", p, chunk=8), new_req(tree, "w", p)
    batch = planner.plan([], [chunked, whole])
    assert (chunked.kv.committed, whole.kv.committed) == (0, 0)  # planning alone moves nothing
    launched(batch)
    assert (chunked.kv.committed, chunked.kv.in_flight) == (8, 0)
    assert (whole.kv.committed, whole.kv.in_flight) == (20, 1)
    # Overlap: the next pass is launched before the first is processed.
    batch = planner.plan([whole], [], torch.zeros(runner.req_to_token_pool.size, dtype=torch.int64))
    launched(batch)
    assert (whole.kv.committed, whole.kv.in_flight) == (21, 2)


@pytest.mark.parametrize("committed, in_flight, known, appended, expected", [
    (10, 0, 11, 1, 10),  # decode: the token just appended has no KV yet
    (11, 1, 11, 1, 11),  # overlap: the next pass (in flight) already wrote the KV of the token appended now
    (13, 0, 12, 2, 11),  # a draft of 3 at 10..12, one kept: position 11's KV was the rejected draft token's
    (13, 0, 14, 4, 13),  # all kept: KV valid up to the last draft token; the model's token after it has none yet
    (13, 0, 10, 0, 10),  # nothing appended (a verdict without tokens): only what is known and in flight
])
def test_cursor_taken(committed, in_flight, known, appended, expected):
    kv = KVCursor(committed=committed, in_flight=in_flight)
    kv.taken(known=known, appended=appended)
    assert kv.committed == expected


def test_cursor_end_and_reset():
    kv = KVCursor(committed=5, in_flight=1, draft=Draft([1, 2], NoSource()))
    assert kv.end(5) == 8 and kv.draft_len() == 2
    kv.reset()
    assert (kv.committed, kv.in_flight, kv.draft) == (0, 0, None) and kv.end(5) == 5


def test_in_flight_tokens_are_read_from_the_token_buffer():
    runner, tree, planner = setup()
    p1, p2 = make_prompts(6, 2)
    buf = torch.zeros(runner.req_to_token_pool.size, dtype=torch.int64)
    r1 = new_req(tree, "a", p1)
    batch, out = run(runner, planner, [], [r1], buf)
    sampled = out.next_token_logits.argmax(-1)
    buf[r1.req_pool_idx] = sampled[0]  # what launch_batch does under overlap
    # The next pass is planned before the host has read the token: a decode pass...
    decode = planner.plan([r1], [], buf)
    assert decode.worker.input_ids == [IN_FLIGHT] and decode.worker.has_in_flight
    assert decode.worker.positions == [len(p1)] and decode.worker.token_buf is buf
    # ...or one mixed with a new prompt (rows per token).
    r2 = new_req(tree, "b", p2)
    mixed = planner.plan([r1], [r2], buf)
    assert mixed.worker.input_ids == [IN_FLIGHT] + p2 and mixed.worker.has_in_flight
    out2 = runner.forward(mixed.worker)
    assert runner.resolved_ids[-1] == reference(p1, 1) + p2
    assert out2.next_token_logits.argmax(-1).tolist() == [reference(p1, 2)[1], reference(p2, 1)[0]]
    # Without the token on the host and without a buffer, there is nothing to read it from.
    with pytest.raises(FakeKVError, match="IN_FLIGHT"):
        runner.forward(planner.plan([r1], []).worker)


def test_can_plan_ahead_and_can_launch_ahead():
    _, tree, _ = setup()
    plain = new_req(tree, "p", [5, 6, 7])
    assert can_plan_ahead(plain)
    pending = new_req(tree, "q", [5, 6, 7])
    pending.kv.draft = Draft([8], NoSource())
    assert can_plan_ahead(pending)  # a draft not yet launched: its rows are known
    drafted = new_req(tree, "d", [5, 6, 7])
    drafted.kv.draft = Draft([8], NoSource())
    drafted.kv.launched(3, samples=True)  # being verified: its verdict decides where the next rows start
    sourced = new_req(tree, "s", [5, 6, 7])
    sourced.draft_sources = (NoSource(),)  # a source that cannot draft with a pass in flight
    guessing = new_req(tree, "n", [5, 6, 7])
    guessing.draft_sources = (type("Guessing", (NoSource,), {"traits": DraftTraits(guesses=True)})(),)
    assert can_plan_ahead(guessing) and not can_plan_ahead(sourced) and can_plan_ahead(sourced, drafting=False)
    grammar = new_req(tree, "g", [5, 6, 7])
    grammar.grammar = object()
    penalized = [new_req(tree, "r", [5], repetition_penalty=1.2), new_req(tree, "f", [5], frequency_penalty=0.5),
                 new_req(tree, "pp", [5], presence_penalty=0.5)]
    for req in [drafted, sourced, grammar] + penalized:
        assert not can_plan_ahead(req), req.rid
    assert can_launch_ahead([plain, plain]) and can_launch_ahead([])
    assert not can_launch_ahead([plain, drafted])
    assert not can_launch_ahead([plain, penalized[0]])


# ---------------------------------------------------------------------- pages
@pytest.mark.parametrize("prefix_len, seq_len, expected", [
    (0, 0, 0), (0, 1, 4), (0, 4, 4), (0, 5, 8), (3, 4, 0), (3, 5, 4), (4, 5, 4), (4, 8, 4), (4, 9, 8), (5, 8, 0),
    (7, 16, 8),
])
def test_pages_needed(prefix_len, seq_len, expected):
    assert pages_needed(prefix_len, seq_len, 4) == expected
    assert pages_needed(prefix_len, seq_len, 1) == seq_len - prefix_len


def test_page_size_4_slots_follow_positions_and_decode_fills_the_last_page():
    runner, tree, planner = setup(page_size=4, size=128)
    alloc = runner.token_to_kv_pool_allocator
    p1, p2 = [5, 6, 7, 8, 9, 10], [11, 12, 13]
    r1, r2 = new_req(tree, "a", p1), new_req(tree, "b", p2)
    assert planner.kv_needed([r1, r2]) == 8 + 4
    free = alloc.available_size()
    batch, out = run(runner, planner, [], [r1, r2])
    assert free - alloc.available_size() == 12
    assert all(s % 4 == p % 4 for s, p in zip(batch.worker.out_cache_loc.tolist(), batch.worker.positions))
    take_sampled(batch, out)
    # Positions 6 and 3: both continue a partly used page.
    assert planner.kv_needed([r1, r2]) == 0
    free = alloc.available_size()
    batch, out = run(runner, planner, [r1, r2], [])
    take_sampled(batch, out)
    assert alloc.available_size() == free
    # Position 7 still fits r1's page; position 4 starts a new page for r2.
    assert planner.kv_needed([r1, r2]) == 4
    batch, out = run(runner, planner, [r1, r2], [])
    take_sampled(batch, out)
    assert alloc.available_size() == free - 4
    table = runner.req_to_token_pool.req_to_token
    for req in (r1, r2):
        slots = table[req.req_pool_idx, : req.kv.committed].tolist()
        assert all(s % 4 == p % 4 for p, s in enumerate(slots))
        assert len({s // 4 for s in slots}) == -(-len(slots) // 4)  # consecutive positions share pages
        assert req.output_ids == reference(req.origin_input_ids, 3)


def test_fits_evicts_cached_prefixes_to_make_room():
    runner, tree, planner = setup(size=24)
    alloc = runner.token_to_kv_pool_allocator
    p = make_prompts(7, 1, lo=16, hi=17)[0]
    req = new_req(tree, "a", p)
    run(runner, planner, [], [req])
    planner.release(req)  # its 16 slots become the tree's
    assert tree.evictable_size() == 16 and alloc.available_size() == 8
    other = new_req(tree, "b", make_prompts(8, 1, lo=20, hi=21)[0])
    assert planner.fits([other])
    assert alloc.available_size() >= 20 and tree.evictable_size() <= 4
    too_big = new_req(tree, "c", make_prompts(9, 1, lo=25, hi=26)[0])
    assert not planner.fits([too_big])


# ---------------------------------------------------------------------- the fake model itself
def test_fake_model_reference_and_logits():
    p = [5, 6, 7]
    ref = reference(p, 6)
    assert ref == [next_token(p + ref[:i]) for i in range(6)]
    assert all(3 <= t < 512 for t in ref)
    rows = fake_logits([seq_hash(p), seq_hash(p + ref[:1])])
    assert rows.argmax(-1).tolist() == ref[:2]
    assert rows.dtype == torch.float32 and rows.shape == (2, 512)
    assert float(rows.topk(2, dim=-1).values[:, 1].max()) <= 1.0  # a clear maximum


@pytest.mark.parametrize("damage, message", [("corrupt", "holds position"), ("free", "free slot")])
def test_fake_kv_check_fires(damage, message):
    """A slot holding another position, or a slot freed under the request, raises in the fake's attention."""
    runner, tree, planner = setup()
    p = make_prompts(10, 1)[0]
    req = new_req(tree, "a", p)
    batch, out = run(runner, planner, [], [req])
    take_sampled(batch, out)
    row = runner.req_to_token_pool.req_to_token[req.req_pool_idx]
    if damage == "corrupt":
        runner.corrupt(int(row[2]))
    else:
        runner.token_to_kv_pool_allocator.free(row[1:2].clone())
    with pytest.raises(FakeKVError, match=message):
        runner.forward(planner.plan([req], []).worker)


def test_a_stale_token_changes_the_next_token():
    """A slot holding the right position but another token (KV of another sequence) changes the output."""
    runner, tree, planner = setup()
    p = make_prompts(12, 1)[0]
    req = new_req(tree, "a", p)
    batch, out = run(runner, planner, [], [req])
    take_sampled(batch, out)
    runner.kv_token[int(runner.req_to_token_pool.req_to_token[req.req_pool_idx, 0])] += 1
    batch, out = run(runner, planner, [req], [])
    assert out.next_token_logits.argmax(-1).tolist() != reference(p, 2)[1:]


def test_committed_key_matches_the_tokens_in_the_kv():
    runner, tree, planner = setup()
    reqs = _decoding(runner, tree, planner, make_prompts(13, 2))
    for _ in range(3):
        batch, out = run(runner, planner, reqs, [])
        take_sampled(batch, out)
    for req in reqs:
        key = req.committed_key()
        assert isinstance(key, RadixKey) and len(key) == req.kv.committed == req.seqlen - 1
        slots = runner.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv.committed]
        assert runner.kv_token[slots].tolist() == key.token_ids
