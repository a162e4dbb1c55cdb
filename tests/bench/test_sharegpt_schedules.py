"""benchmarks/scheduler/sharegpt_schedules.py: the pass-by-pass model of ShareGPT-like under other schedules."""
from __future__ import annotations

import pytest

from benchmarks.scheduler import sharegpt_schedules


@pytest.fixture(scope="module")
def model():
    return sharegpt_schedules.Model()


def test_a_pass_costs_at_least_the_weight_read_and_grows_with_rows_and_context(model):
    empty = model.cost([], [])
    assert empty >= sharegpt_schedules.WEIGHT_READ_S
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
