"""--kv-cache-dtype fp8_e4m3 / fp8_e5m2 through the ModelRunner and the Scheduler on a tiny random-weight Llama: the
pool holds twice the tokens in the same memory, and greedy decoding over it gives the tokens of the model-dtype pool
with logits close to them. (The model is float32 here: float8 holds four times the tokens; twice bfloat16's.)"""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.executor import memory
from tests.runtime.scheduler.conftest import make_scheduler, request, run_all, tiny_model_dir  # noqa: F401 - fixture


def _greedy(model_dir: str, kv_cache_dtype: str) -> tuple[dict, list[torch.Tensor]]:
    sched = make_scheduler(model_dir, kv_cache_dtype=kv_cache_dtype)
    logits, run = [], sched.runner._run

    def recording(fb, plan):
        out = run(fb, plan)
        logits.append(out.next_token_logits.clone())
        return out

    sched.runner._run = recording
    for i, ids in enumerate(([5, 9, 13, 200, 41, 7, 300, 12], [5, 9, 13, 77])):
        sched.add_request(request(f"r{i}", ids, max_new_tokens=8))
    out = {k: v["output_ids"] for k, v in run_all(sched).items()}
    sched.check_memory()
    return out, logits


@pytest.mark.parametrize("kv_cache_dtype, tol", [("fp8_e4m3", 0.03), ("fp8_e5m2", 0.06)])
def test_fp8_cache_gives_the_same_greedy_tokens_and_close_logits(tiny_model_dir, kv_cache_dtype, tol):
    want, want_logits = _greedy(tiny_model_dir, "auto")
    got, got_logits = _greedy(tiny_model_dir, kv_cache_dtype)
    assert got == want
    assert len(got_logits) == len(want_logits)
    spread = float(want_logits[0].std())
    diffs = [float((a - b).abs().max()) for a, b in zip(got_logits, want_logits)]
    assert max(diffs) < tol and max(diffs) < 0.4 * spread
    assert max(diffs) > 0  # the pool is float8: not the float32 pool's numbers


def test_fp8_pool_holds_twice_the_tokens_in_the_same_memory(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(memory, "physical_memory_bytes", lambda: 1 << 28)
    runners = {kv: make_scheduler(tiny_model_dir, kv_cache_dtype=kv, max_total_tokens=None,
                                  mem_fraction_static=0.01).runner for kv in ("auto", "fp8_e4m3")}
    auto, fp8 = runners["auto"], runners["fp8_e4m3"]
    assert fp8.token_to_kv_pool.dtype is torch.float8_e4m3fn and auto.token_to_kv_pool.dtype is torch.float32
    assert 4 * fp8.kv_bytes_per_token() == auto.kv_bytes_per_token()  # float32 model: a quarter of the bytes
    assert fp8.max_total_num_tokens // 4 == auto.max_total_num_tokens
    assert fp8.max_total_num_tokens < memory.CPU_MAX_TOTAL_TOKENS  # the memory, not the cap, sets both
    fp8_bytes, auto_bytes = fp8.token_to_kv_pool.mem_bytes(), auto.token_to_kv_pool.mem_bytes()
    assert abs(fp8_bytes - auto_bytes) < 0.01 * auto_bytes
