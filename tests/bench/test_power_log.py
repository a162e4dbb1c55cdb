"""benchmarks/lib/power_log.py: nvidia-smi's CSV (either query's columns, found by name) summarized: busy samples, those
at the software power cap, their SM clocks."""
from __future__ import annotations

import csv
import io

from benchmarks.lib.power_log import summarize

SMI = """timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu, clocks_event_reasons.active
2026/12/01 11:12:30.730, 345 MHz, 3201 MHz, 77.89 W, 37, 0x0000000000000001
2026/12/01 11:13:06.774, 1200 MHz, 3201 MHz, 664.20 W, 57, 0x0000000000000004
2026/12/01 11:13:08.779, 1600 MHz, 3201 MHz, 689.40 W, 58, 0x0000000000000004
2026/12/01 11:13:22.792, 1980 MHz, 3201 MHz, 548.63 W, 51, 0x0000000000000000
2026/12/01 11:13:23.000, [N/A], 3201 MHz, [N/A], 51, [N/A]
"""


def test_summary_counts_capped_busy_samples_and_their_clocks():
    s = summarize(list(csv.reader(io.StringIO(SMI))))
    assert (s.samples, s.busy, s.power_capped) == (4, 3, 2)  # the [N/A] row skipped; 77.89 W is idle
    assert s.capped_sm_mhz == 1400.0 and s.busy_sm_mhz == round((1200 + 1600 + 1980) / 3, 1)
    assert s.max_sm_mhz == 1980 and s.max_power_w == 689.40


def test_columns_are_found_by_name_whatever_the_query():
    rows = [["timestamp", " power.draw [W]", " clocks.current.sm [MHz]", " clocks_throttle_reasons.active"],
            ["t", "700.0 W", "1500 MHz", "0x4"], ["t", "300.0 W", "1980 MHz", "0x0"]]
    s = summarize(rows)
    assert (s.busy, s.power_capped, s.capped_sm_mhz) == (2, 1, 1500.0)
