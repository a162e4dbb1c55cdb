"""benchmarks/scheduler/scheduler_sim.py, each kind on a tiny shape (seconds).

retraction: every request finishes with its full output whatever the admission knobs; prefill covers every prompt once
and recomputes exactly what retractions dropped (less what the tree kept); no retraction when the pool holds the whole
workload, max_running_requests keeps within it, or admission has learned that requests run to their budgets.
schedules: the pass-by-pass model of ShareGPT-like under other schedules (its Model and cases).
host-queue: every request of a small queue finishes and each phase is timed."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.scheduler import scheduler_sim as sim  # noqa: E402

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
    results = dict(sim.main(["--kind", "retraction", *SHAPE, "--pool-tokens", "300", "--out", str(out), "--sweep", *sweep]))
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
    assert "scheduler_sim.py --kind retraction" in saved["command"]
    assert "--sweep" in saved["command"]


def test_pool_holding_the_workload_never_retracts() -> None:
    results = sim.main(["--kind", "retraction", *SHAPE, "--pool-tokens", str(N * (IN + OUT) + 64),
                        "--sweep", "", "start_ratio=min"])
    for _, r in results:
        _check(r)
        assert r["retractions"] == 0
        assert r["prefill_tokens"] == N * IN - r["first_admission_cached_tokens"]


@pytest.fixture(scope="module")
def model():
    return sim.Model()


def test_a_pass_costs_at_least_the_weight_read_and_grows_with_rows_and_context(model):
    empty = model.cost([], [])
    assert empty >= sim.WEIGHT_READ_S
    assert model.cost([], [100] * 8) > empty
    assert model.cost([8192], []) > model.cost([4096, 4096], []) > model.cost([], [100] * 1000) > empty


def test_every_schedule_decodes_every_token(model, monkeypatch):
    decoded = []
    step = model.step
    monkeypatch.setattr(model, "step", lambda running, rows: (decoded.append(len(rows)), step(running, rows)))
    model.chunked(mix=True, max_running=300)
    # The first token of each request comes from its prefill pass, the rest from decode rows.
    assert sum(decoded) == sum(n - 1 for n in model.outs)
    decoded.clear()
    model.budget(512, "lof")
    assert sum(decoded) == sum(n - 1 for n in model.outs)


def test_length_aware_order_with_a_small_budget_is_the_schedule_that_gains(model):
    served = model.chunked()
    assert model.chunked(mix=True) == pytest.approx(served, rel=0.02)
    assert model.budget(512, "fcfs") == pytest.approx(served, rel=0.05)
    assert model.budget(512, "lof") < 0.9 * served


def test_kinds_and_their_own_options(capsys):
    with pytest.raises(SystemExit):
        sim.main(["--sweep", ""])  # no --kind
    with pytest.raises(SystemExit):
        sim.main(["--kind", "schedules", "--sweep", ""])  # retraction's option
    capsys.readouterr()


def test_host_queue_small_queue(tmp_path: Path, capsys) -> None:
    out = tmp_path / "hq.json"
    rows = sim.main(["--kind", "host-queue", "--workloads", "shared-prefix", "--queues", "32", "--repeat", "1",
                     "--max-total-tokens", "20000", "--out", str(out)])
    (row,) = rows
    assert row["requests"] == 32 and row["steps"] > 0 and row["prefill_tokens"] > 0
    assert row["us_per_step"]["host"] > 0 and row["us_per_step"]["step"] >= row["us_per_step"]["host"]
    assert "scheduler_sim.py --kind host-queue" in json.loads(out.read_text())["command"]
    assert "host" in capsys.readouterr().out
