"""ModelRunner on CPU: the start-up warm-up of eager passes (on CUDA it builds the Triton kernels) leaves nothing
behind that a request could see."""
from __future__ import annotations

from tests.runtime.scheduler.conftest import make_scheduler, request, run_all, tiny_model_dir  # noqa: F401 - fixture


def _run(sched) -> dict:
    for i, ids in enumerate(([5, 9, 13, 200, 41, 7, 300, 12], [5, 9, 13, 77])):
        sched.add_request(request(f"r{i}", ids, max_new_tokens=8))
    return {k: v["output_ids"] for k, v in run_all(sched).items()}


def test_warm_up_extend_leaves_no_trace(tiny_model_dir):
    reference = _run(make_scheduler(tiny_model_dir))
    sched = make_scheduler(tiny_model_dir)
    free_slots, free_rows = sched.allocator.available_size(), sched.req_to_token_pool.available_size()
    sched.runner.warm_up_extend()
    assert (sched.allocator.available_size(), sched.req_to_token_pool.available_size()) == (free_slots, free_rows)
    assert _run(sched) == reference
    sched.check_memory()
