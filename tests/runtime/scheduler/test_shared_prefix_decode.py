"""Shared-prefix decode (on unless --disable-shared-prefix-decode): the planner's groups (scheduler/shared_prefix.py) hold
identical req_to_token slots over their prefix, through the real Scheduler (torch_native, pages of 1 and 4,
siblings admitted together and requests arriving while others decode); and the Triton backend's decode pass over such
groups gives the logits and greedy tokens of the same pass without them (the tiny model's runner on the CPU, kernels
under TRITON_INTERPRET=1; the kernel's own cases: tests/runtime/layers/test_shared_prefix_attn.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from radixlm.runtime.scheduler.shared_prefix import decode_groups, eager_pays, shared_prefix_groups
from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "shared-prefix decode greedy cases passed"
MIN_LEN = 16  # the tests' prompts are short: groups from 16 cached tokens on


def test_groups_by_matched_node_and_length():
    a, b = object(), object()
    reqs = [SimpleNamespace(prefix_len=p, last_node=n) for p, n in [
        (300, a), (300, a), (300, b), (0, None), (300, a), (100, a), (300, b), (255, a), (255, a), (300, None)]]
    assert shared_prefix_groups(reqs, 256) == [(300, [0, 1, 4]), (300, [2, 6])]
    assert shared_prefix_groups(reqs, 100) == [(300, [0, 1, 4]), (300, [2, 6]), (255, [7, 8])]
    assert shared_prefix_groups(reqs[1:4], 256) is None  # a group needs two requests
    assert shared_prefix_groups(reqs, 400) is None


def prompts(groups=3, per_group=4, prefix=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(groups):
        head = torch.randint(3, 500, (prefix,), generator=g).tolist()
        out += [head + torch.randint(3, 500, (3 + j,), generator=g).tolist() for j in range(per_group)]
    return out


def record_groups(sched):
    """Wraps the planner: every decode pass's groups are checked against the request table and kept."""
    seen = []
    plan = sched.planner.plan

    def checked(*a, **kw):
        batch = plan(*a, **kw)
        wb = batch.worker
        for prefix_len, rows in wb.shared_prefixes or []:
            assert len(rows) >= 2 and prefix_len >= sched.planner.shared_prefix_min_len
            table = sched.req_to_token_pool.req_to_token[[wb.req_pool_indices[i] for i in rows], :prefix_len]
            assert bool((table == table[:1]).all()), f"group of {len(rows)} rows with different slots"
            assert all(wb.seq_lens[i] > prefix_len for i in rows)
            seen.append((prefix_len, len(rows)))
        return batch

    sched.planner.plan = checked
    return seen


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("every", [0, 3])
def test_groups_hold_identical_slots(tiny_model_dir, page_size, every):
    from tests.runtime.scheduler.conftest import make_scheduler, request
    from tests.runtime.scheduler.fake_serving import serve

    sched = make_scheduler(tiny_model_dir, page_size=page_size)
    assert sched.planner.shared_prefix_min_len == 0  # torch_native does not take them
    sched.planner.shared_prefix_min_len = MIN_LEN
    seen = record_groups(sched)
    reqs = [request(f"r{i}", p, max_new_tokens=6) for i, p in enumerate(prompts())]
    serve(sched, reqs, every=every)
    assert seen and max(n for _, n in seen) >= 3, seen
    assert all(p >= 40 // page_size * page_size for p, _ in seen)
    sched.check_memory()


def test_groups_that_spare_enough_reads_take_a_large_pass_off_its_graph():
    groups = [(2048, list(range(i * 32, i * 32 + 32))) for i in range(32)]
    assert eager_pays(groups) and eager_pays(groups[:1])
    assert eager_pays([(300, list(range(600)))])  # a system prompt over a large batch
    assert not eager_pays([(300, list(range(8)))]) and not eager_pays([(1 << 14, [0, 1])])
    reqs = [SimpleNamespace(prefix_len=2048, last_node=node) for node in (object(), object()) for _ in range(256)]
    assert decode_groups(reqs, 256, replayable=False) == decode_groups(reqs, 256, replayable=True)
    assert len(decode_groups(reqs, 256, replayable=True)) == 2
    # A small pass replays (its eager enqueue would cost more than the prefix reads it spares).
    assert decode_groups(reqs[:511], 256, replayable=True) is None
    assert decode_groups(reqs[:511], 256, replayable=False) is not None


def test_passes_that_replay_a_graph_carry_groups_only_when_eager_pays(tiny_model_dir, monkeypatch):
    """CUDA graphs read no shared prefixes (the executor replays them for small batches): a pass the runner would
    replay carries its groups (and then runs eagerly) only when they spare enough KV reads; the others always do."""
    from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
    from radixlm.runtime.scheduler import shared_prefix
    from tests.runtime.scheduler.conftest import make_scheduler, request
    from tests.runtime.scheduler.fake_serving import serve

    found, default = {}, shared_prefix.EAGER_MIN_SHARED_READS
    monkeypatch.setattr(shared_prefix, "EAGER_MIN_ROWS", 1)
    for graph_rows, min_reads in ((0, default), (64, default), (64, 80)):
        monkeypatch.setattr(shared_prefix, "EAGER_MIN_SHARED_READS", min_reads)
        sched = make_scheduler(tiny_model_dir)
        sched.planner.shared_prefix_min_len = MIN_LEN
        sched.planner.replays = lambda rows, g=graph_rows: 0 < rows <= g
        seen = record_groups(sched)
        serve(sched, [request(f"r{i}", p, max_new_tokens=6) for i, p in enumerate(prompts())])
        found[graph_rows, min_reads] = len(seen)
    assert found[0, default] > 0 and found[64, default] == 0
    assert found[64, 80] > 0  # 3 rows x 40 tokens spare 80 reads
    # The graph runner leaves a pass with groups to the eager path.
    graphs = SimpleNamespace(max_bs=64, rope_offsets=None)
    fb = SimpleNamespace(forward_mode=SimpleNamespace(is_token_rows=lambda: True), decode_rows=object(), batch_size=8,
                         rope_offsets=None, shared_prefixes=None)
    assert CudaGraphRunner.can_run(graphs, fb)
    fb.shared_prefixes = [(40, [0, 1])]
    assert not CudaGraphRunner.can_run(graphs, fb)


def grouped_decode_pass(page_size: int, seed: int):
    """A decode pass of 7 requests (two groups of 3 on 68- and 40-token prefixes, one alone) over KV filled with noise:
    a group's req_to_token rows share their prefix's slots (pages in shuffled order), each row its own after it."""
    from radixlm.runtime.executor.forward_batch import ModelWorkerBatch
    from radixlm.runtime.executor.logits import LogitsPlan

    g = torch.Generator().manual_seed(seed)
    groups, lens = [(68, [0, 2, 5]), (40, [1, 3, 6])], [72, 75, 71, 90, 30, 83, 42]
    pages = (torch.randperm(2048 // page_size - 1, generator=g) + 1).tolist()

    def take(n):
        own = [pages.pop() for _ in range(-(-n // page_size))]
        return [p * page_size + j for p in own for j in range(page_size)][:n]

    table = {}
    for prefix_len, rows in groups:
        shared = take(prefix_len)
        for r in rows:
            table[r] = shared + take(lens[r] - prefix_len)
    table[4] = take(lens[4])
    pool_rows = [9, 3, 7, 1, 12, 5, 10]
    wb = ModelWorkerBatch(
        input_ids=torch.randint(3, 500, (7,), generator=g).tolist(), positions=[n - 1 for n in lens],
        req_pool_indices=pool_rows, prefix_lens=[n - 1 for n in lens], extend_lens=[1] * 7, seq_lens=lens,
        out_cache_loc=torch.tensor([table[r][-1] for r in range(7)]), logits=LogitsPlan(sample_rows=list(range(7))),
        shared_prefixes=groups)
    return wb, table


def run_cases(device: str) -> None:
    """The Triton backend's decode passes with ForwardBatch.shared_prefixes (the shared-prefix kernel fed from the
    planner's groups, its tiles built once for the pass's layers) give the logits and greedy tokens of the same pass
    without them; with the flag off the planner forms no groups. Pages of 1 and 4."""
    import dataclasses
    import json
    import tempfile
    from pathlib import Path

    from radixlm.runtime.layers.attention import triton_backend
    from tests.runtime.scheduler.conftest import TINY_LLAMA, make_scheduler

    d = Path(tempfile.mkdtemp())
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    built = []
    orig = triton_backend.shared_prefixes
    triton_backend.shared_prefixes = lambda groups, *a: built.append(len(groups)) or orig(groups, *a)
    for page_size in (1, 4):
        scheds = {on: make_scheduler(str(d), page_size=page_size, attention_backend="triton",
                                     disable_shared_prefix_decode=not on, max_total_tokens=2048)
                  for on in (False, True)}
        for on, sched in scheds.items():
            assert sched.planner.shared_prefix_min_len == (256 if on else 0)
            assert sched.runner.takes_shared_prefixes == on
        runner = scheds[True].runner
        assert isinstance(runner.attn_backend, triton_backend.TritonAttnBackend)
        wb, table = grouped_decode_pass(page_size, seed=page_size)
        g = torch.Generator().manual_seed(page_size)
        pool = runner.token_to_kv_pool
        for layer in range(pool.num_layers):
            for buf in (pool.get_key_buffer(layer), pool.get_value_buffer(layer)):
                buf.copy_(torch.randn(buf.shape, generator=g, dtype=buf.dtype))
        for r, slots in table.items():
            runner.req_to_token_pool.req_to_token[wb.req_pool_indices[r], : len(slots)] = torch.tensor(slots)
        built.clear()
        plain = runner.forward(dataclasses.replace(wb, shared_prefixes=None)).next_token_logits.float()
        assert not built
        grouped = runner.forward(wb).next_token_logits.float()
        assert built == [2], f"page size {page_size}: the groups' tiles were built {len(built)} times"
        torch.testing.assert_close(grouped, plain, atol=1e-4, rtol=1e-4, msg=lambda m: f"page size {page_size}: {m}")
        assert grouped.argmax(-1).tolist() == plain.argmax(-1).tolist(), f"page size {page_size}"
        for sched in scheds.values():
            sched.check_memory()
    print(MARKER)


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter, 3.7 or later")
def test_greedy_tokens_same_with_shared_prefix_decode_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=600)


if __name__ == "__main__":
    torch.set_num_threads(1)
    run_cases("cpu")
