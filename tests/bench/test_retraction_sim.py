"""benchmarks/scheduler/retraction_sim.py on a tiny shape (seconds): every request finishes with its full output
whatever the admission knobs; prefill covers every prompt once and recomputes exactly what retractions dropped (less
what the tree kept); no retraction when the pool holds the whole workload, max_running_requests keeps within it, or
admission has learned that requests run to their budgets."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.scheduler import retraction_sim as rs  # noqa: E402

N, IN, OUT = 12, 32, 16
SHAPE = ["--num-requests", str(N), "--input-len", str(IN), "--output-len", str(OUT)]


def _check(r: dict) -> None:
    minimum = N * IN
    assert r["finished"] == r["finished_full"] == N
    assert r["output_tokens"] == N * OUT
    assert r["prefill_tokens_min"] == minimum
    assert r["prefill_tokens"] >= minimum - r["first_admission_cached_tokens"]
    assert 0 <= r["recomputed_tokens"] <= r["kv_dropped_tokens"]
    assert r["retractions"] >= r["requests_retracted"]
    p = r["passes"]
    assert p["total"] == p["prefill"] + p["decode"] + p["mixed"] > 0
    assert 0 < r["decode_batch_max"] <= r["admission"]["max_running_requests"]
    if r["retractions"] == 0:
        assert r["recomputed_tokens"] == r["kv_dropped_tokens"] == 0


def test_small_pool_retracts_and_finishes(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    sweep = ["", "start_ratio=min", "start_ratio=min,schedule_conservativeness=2", "max_running_requests=4",
             "chunked_prefill_size=16,overlap_schedule=off", "budget_use=1.0"]
    results = dict(rs.main([*SHAPE, "--pool-tokens", "300", "--out", str(out), "--sweep", *sweep]))
    for r in results.values():
        _check(r)
    # 300 slots hold 6 whole requests (48 tokens each); admitting on a ratio of the output over-commits.
    assert results["start_ratio=min"]["retractions"] > 0
    assert results["start_ratio=min"]["recomputed_tokens"] > 0
    assert results["max_running_requests=4"]["retractions"] == 0
    assert results["max_running_requests=4"]["decode_batch_max"] == 4
    # An engine that learned from earlier requests that they run to max_new_tokens admits no more than fit them.
    assert results["budget_use=1.0"]["retractions"] == 0
    assert results["budget_use=1.0"]["admission"]["start_new_token_ratio"] == 1.0
    assert results["start_ratio=min"]["admission"]["start_new_token_ratio"] == results["start_ratio=min"][
        "admission"]["min_new_token_ratio"]
    saved = json.loads(out.read_text())
    assert [run["setting"] for run in saved["runs"]] == ["default", *sweep[1:]]
    assert "retraction_sim.py" in saved["command"] and "--sweep" in saved["command"]


def test_pool_holding_the_workload_never_retracts() -> None:
    results = rs.main([*SHAPE, "--pool-tokens", str(N * (IN + OUT) + 64), "--sweep", "", "start_ratio=min"])
    for _, r in results:
        _check(r)
        assert r["retractions"] == 0
        assert r["prefill_tokens"] == N * IN - r["first_admission_cached_tokens"]
