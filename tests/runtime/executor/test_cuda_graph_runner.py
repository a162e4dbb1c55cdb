"""The CUDA-graph runner's batching on CPU: padded decode passes run eagerly (use_graphs=False) must give the
scheduler exactly the outputs of unpadded passes. The captured graphs themselves are tested on the GPU
(tests/runtime/engine/test_cuda.py)."""
from __future__ import annotations

import random

import pytest

from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner, capture_batch_sizes, choose_padding
from tests.runtime.scheduler.conftest import make_scheduler, request, run_all, tiny_model_dir  # noqa: F401 - fixture


@pytest.mark.parametrize("max_bs, expected", [
    (1, [1]), (3, [1, 2, 3]), (8, [1, 2, 4, 8]), (20, [1, 2, 4, 8, 16, 20]),
    (100, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 100]),
    (700, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, *range(80, 384, 16), *range(384, 512, 32), 512, 576, 640, 700]),
])
def test_capture_batch_sizes(max_bs, expected):
    assert capture_batch_sizes(max_bs) == expected


def test_each_size_replays_the_cheapest_timed_graph_at_or_above_it():
    sizes = [128, 256, 272, 288, 304, 320, 352]
    # Untimed sizes keep their own graph; 288 is slower than 304, 272 than 304 by under the margin.
    times = {256: 10.0, 272: 10.5, 288: 11.6, 304: 10.4, 320: 10.9, 352: 11.5}
    assert choose_padding(sizes, times) == {128: 128, 256: 256, 272: 272, 288: 304, 304: 304, 320: 320, 352: 352}
    assert choose_padding(sizes, {}) == {s: s for s in sizes}
    runner = CudaGraphRunner.__new__(CudaGraphRunner)
    runner.capture_bs, runner.pad_to = sizes, choose_padding(sizes, times)
    assert [runner.padded_size(b) for b in (1, 128, 129, 273, 288, 289, 305)] == [128, 128, 256, 304, 304, 304, 320]


def test_passes_with_several_rows_per_request_replay_up_to_their_own_bound():
    from types import SimpleNamespace

    from radixlm.runtime.executor.model_runner import MULTI_ROW_REPLAY_MAX_ROWS, ModelRunner

    runner = SimpleNamespace(graph_runner=SimpleNamespace(max_bs=1024))
    assert ModelRunner.can_replay(runner, 1024) and not ModelRunner.can_replay(runner, 1025)
    assert ModelRunner.can_replay(runner, MULTI_ROW_REPLAY_MAX_ROWS, multi_row=True)
    assert not ModelRunner.can_replay(runner, MULTI_ROW_REPLAY_MAX_ROWS + 1, multi_row=True)
    assert not ModelRunner.can_replay(runner, 8, input_logprobs=True)
    small = SimpleNamespace(graph_runner=SimpleNamespace(max_bs=64))
    assert ModelRunner.can_replay(small, 64, multi_row=True) and not ModelRunner.can_replay(small, 65, multi_row=True)
    assert not ModelRunner.can_replay(SimpleNamespace(graph_runner=None), 1)


def _outputs(model_dir: str, graph_max_bs: int | None, page_size: int = 1, **kwargs) -> tuple[dict, object]:
    kwargs.setdefault("chunked_prefill_size", 16)
    sched = make_scheduler(model_dir, page_size=page_size, **kwargs)
    if graph_max_bs is not None:
        sched.runner.graph_runner = CudaGraphRunner(sched.runner, graph_max_bs, use_graphs=False)
    rng = random.Random(3)
    for i in range(7):
        ids = [rng.randrange(3, 500) for _ in range(rng.randrange(5, 40))]
        sched.add_request(request(f"r{i}", ids, max_new_tokens=6 + i))
    return {k: v["output_ids"] for k, v in run_all(sched).items()}, sched


@pytest.mark.parametrize("page_size", [1, 4])
def test_padded_decode_passes_match_unpadded(tiny_model_dir, page_size):
    reference, _ = _outputs(tiny_model_dir, None, page_size)
    # max_bs 4 < the 7 running requests: big batches run unpadded, smaller ones padded to 4 (5 -> runs eagerly).
    # Prefills (chunks of at most 16 tokens) of up to max_bs tokens run as decode batches with a row per token.
    for max_bs in (4, 16, 64):
        got, sched = _outputs(tiny_model_dir, max_bs, page_size)
        assert got == reference
        assert (sched.stats["prefill_row_batches"] > 0) == (max_bs >= 16)
        # ... and with the running requests' decode rows when those fit too (mixed batches).
        if max_bs != 16:
            assert (sched.stats["mixed_batches"] > 0) == (max_bs == 64)
        sched.check_memory()


@pytest.mark.parametrize("kwargs", [
    {"max_running_requests": 3},
    {"max_running_requests": 3, "overlap_schedule": "on"},
    {"max_running_requests": 4, "page_size": 4, "chunked_prefill_size": -1},
])
def test_mixed_batches_match_separate_passes(tiny_model_dir, kwargs):
    """New requests admitted while others decode: their prompt rows ride in the running requests' decode pass."""
    reference, _ = _outputs(tiny_model_dir, 64, mixed_chunk="off", **kwargs)
    got, sched = _outputs(tiny_model_dir, 64, **kwargs)
    assert got == reference
    assert sched.stats["mixed_batches"] > 0
    sched.check_memory()
