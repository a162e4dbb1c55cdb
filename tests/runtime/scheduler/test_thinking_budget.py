"""A thinking budget through the real scheduler (tiny random Llama): the end tag is forced after exactly N reasoning
tokens, the tokens before it are the greedy ones, and the overlap scheduler and prompt-lookup drafts give the same
outputs as the synchronous scheduler (scheduler/cursor.py's overlap rule)."""
from __future__ import annotations

import dataclasses

import pytest

from radixlm.runtime.sampling.thinking_budget import ThinkingBudget

from .conftest import make_scheduler, request, run_all

END = 11


def _reqs(budgets: list[int | None]) -> list:
    # Repetitive prompts, so that prompt lookup drafts.
    prompts = [[(7 * j) % 40 + 20 for j in range(24)], [(3 * j) % 10 + 50 for j in range(17)], [60, 61, 62] * 6]
    out = []
    for i, (p, b) in enumerate(zip(prompts, budgets)):
        r = request(f"r{i}", p, max_new_tokens=14)
        if b is not None:
            r = dataclasses.replace(r, thinking=ThinkingBudget(b, (10,), (END,), starts_open=True))
        out.append(r)
    return out


def _outputs(model_dir, budgets, **kw) -> dict[str, list[int]]:
    sched = make_scheduler(model_dir, **kw)
    for r in _reqs(budgets):
        sched.add_request(r)
    res = run_all(sched)
    sched.check_memory()
    return {k: v["output_ids"] for k, v in res.items()}


@pytest.mark.parametrize("kw", [{"overlap_schedule": "on"}, {"speculative_algorithm": "NGRAM"},
                                {"overlap_schedule": "on", "speculative_algorithm": "NGRAM"}])
def test_budget_forces_the_end_tag_exactly_and_every_mode_agrees(tiny_model_dir, kw):
    free = _outputs(tiny_model_dir, [None, None, None])
    budgets = [1, 5, 9]
    want = _outputs(tiny_model_dir, budgets)
    for rid, n in zip(sorted(free), budgets):
        if END not in free[rid][:n]:
            assert want[rid][:n] == free[rid][:n] and want[rid][n] == END  # N greedy tokens, then the tag
    assert _outputs(tiny_model_dir, budgets, **kw) == want
