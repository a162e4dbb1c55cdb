"""benchmarks/multi_gpu/tp_medians.py: the medians of gpu_multi logs, and each TP=2 config's ratio to TP=1 as the
median of the per-run ratios (not the ratio of the medians)."""
from __future__ import annotations

from benchmarks.multi_gpu.tp_medians import medians, parse


def _log(tp1_b1: float, tp2_b1: float, tp1_tok: int, tp2_tok: int) -> str:
    return f"""tp1: {{}}
2026-11-29 23:29:20,001 INFO scheduler0: noise
   decode batch    1:    {tp1_b1:.2f} ms/step, floor   3.53 ms,  1.22x floor
   decode batch  256:   12.00 ms/step, floor   7.78 ms,  1.63x floor
tp1: 300 requests in    7.4 s,     {tp1_tok} out tok/s,    14631 total tok/s, {{'prefill_batches': 35}}
tp2: {{'tp_size': 2}}
   decode batch    1:    {tp2_b1:.2f} ms/step, floor   1.76 ms,  1.58x floor
   decode batch  256:    8.00 ms/step, floor   3.89 ms,  2.00x floor
tp2: 300 requests in    4.9 s,     {tp2_tok} out tok/s,    22284 total tok/s, {{'prefill_batches': 35}}
tp2 / tp1: step {{'1': 0.65}}, sharegpt 1.5
"""


def test_parse_reads_each_configs_steps_and_throughput():
    run = parse(_log(4.29, 2.79, 6430, 9794))
    assert run == {"tp1": {"step_ms": {1: 4.29, 256: 12.0}, "sharegpt_out_tok_s": 6430.0},
                   "tp2": {"step_ms": {1: 2.79, 256: 8.0}, "sharegpt_out_tok_s": 9794.0}}


def test_ratios_are_medians_of_the_runs_ratios():
    runs = [parse(_log(4.0, 2.0, 100, 200)), parse(_log(5.0, 3.5, 100, 100)), parse(_log(6.0, 3.6, 100, 150))]
    m = medians(runs)["configs"]
    assert m["tp1"]["step_ms"][1] == 5.0 and m["tp2"]["step_ms"][1] == 3.5
    assert abs(m["tp2"]["step_over_tp1"][1] - 0.6) < 1e-12  # ratios 0.5, 0.7, 0.6; the medians' ratio is 0.7
    assert m["tp2"]["step_over_tp1"][256] == 8.0 / 12.0
    assert m["tp2"]["sharegpt_over_tp1"] == 1.5 and "step_over_tp1" not in m["tp1"]
