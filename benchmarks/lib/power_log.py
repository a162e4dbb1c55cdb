"""The GPU's clocks and power during a run: nvidia-smi sampled beside it (`nvidia-smi --query-gpu=FIELDS --format=csv
-lms 250 > SMI.csv`, as quant_lease.sh's SMI=1 does), summarized here: how much of the busy time ran at the software
power cap, and at which SM clocks.

    python -m benchmarks.lib.power_log SMI.csv [--busy-w 150]
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
from dataclasses import asdict, dataclass

FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
SW_POWER_CAP = 0x4  # nvidia-smi's clocks_event_reasons bit: clocks lowered to hold the power limit


@dataclass
class PowerSummary:
    samples: int
    busy: int  # samples above the busy threshold (the GPU working, not idle between steps)
    power_capped: int  # busy samples with SW_POWER_CAP set
    busy_sm_mhz: float  # mean SM clock of the busy samples
    capped_sm_mhz: float | None
    max_sm_mhz: int
    max_power_w: float


def _column(header: list[str], prefix: str) -> int:
    return next(i for i, name in enumerate(header) if name.strip().startswith(prefix))


def summarize(rows: list[list[str]], busy_w: float = 150.0) -> PowerSummary:
    """rows: the CSV as nvidia-smi writes it, header first (columns found by name: any query with the SM clock,
    the power draw and the clock reasons; unparsable rows skipped)."""
    header, data = rows[0], []
    sm, power = _column(header, "clocks.current.sm"), _column(header, "power.draw")
    reasons = _column(header, "clocks_")  # clocks_event_reasons (clocks_throttle_reasons before driver 535)
    for r in rows[1:]:
        try:
            data.append((int(r[sm].split()[0]), float(r[power].split()[0]), int(r[reasons].strip(), 16)))
        except (IndexError, ValueError):
            continue
    busy = [d for d in data if d[1] > busy_w]
    capped = [d for d in busy if d[2] & SW_POWER_CAP]
    return PowerSummary(len(data), len(busy), len(capped),
                        round(statistics.mean(d[0] for d in busy), 1) if busy else 0.0,
                        round(statistics.mean(d[0] for d in capped), 1) if capped else None,
                        max((d[0] for d in data), default=0), max((d[1] for d in data), default=0.0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv")
    p.add_argument("--busy-w", type=float, default=150.0)
    args = p.parse_args()
    with open(args.csv) as f:
        rows = list(csv.reader(f))
    print(json.dumps(asdict(summarize(rows, args.busy_w)), indent=1))


if __name__ == "__main__":
    main()
