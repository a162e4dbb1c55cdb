"""Medians of several `gpu_multi.py --parts tp` runs, from their logs (the lines gpu_multi prints, so a run whose JSON
did not come back from the device still counts): each config's decode step by batch and ShareGPT-like throughput,
and each TP=2 config's ratios to TP=1 as the median of the per-run ratios (issue 56's "medians of three").

    python3 benchmarks/multi_gpu/tp_medians.py f2_r1.log f2_r2.log f2_r3.log --out multi_tp_medians.json
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys

CONFIG = re.compile(r"^(tp\w*): \{")
STEP = re.compile(r"^\s+decode batch\s+(\d+):\s+([\d.]+) ms/step")
SHAREGPT = re.compile(r"^(tp\w*): \d+ requests in .*?(\d+) out tok/s")


def parse(text: str) -> dict[str, dict]:
    """{config: {"step_ms": {batch: ms}, "sharegpt_out_tok_s": float}} of one run's log."""
    runs: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if m := CONFIG.match(line):
            current = runs.setdefault(m.group(1), {"step_ms": {}})
        elif (m := STEP.match(line)) and current is not None:
            current["step_ms"][int(m.group(1))] = float(m.group(2))
        elif m := SHAREGPT.match(line):
            runs.setdefault(m.group(1), {"step_ms": {}})["sharegpt_out_tok_s"] = float(m.group(2))
    return runs


def medians(runs: list[dict[str, dict]], base: str = "tp1") -> dict:
    configs = sorted({c for r in runs for c in r})
    out: dict = {"runs": len(runs), "configs": {}}
    for c in configs:
        rows = [r[c] for r in runs if c in r]
        batches = sorted({b for r in rows for b in r["step_ms"]})
        entry = {"step_ms": {b: statistics.median(r["step_ms"][b] for r in rows if b in r["step_ms"]) for b in batches}}
        tput = [r["sharegpt_out_tok_s"] for r in rows if "sharegpt_out_tok_s" in r]
        if tput:
            entry["sharegpt_out_tok_s"] = statistics.median(tput)
        if c != base:
            pairs = [(r[c], r[base]) for r in runs if c in r and base in r]
            entry["step_over_tp1"] = {b: statistics.median(x["step_ms"][b] / y["step_ms"][b] for x, y in pairs
                                                           if b in x["step_ms"] and b in y["step_ms"]) for b in batches}
            ratios = [x["sharegpt_out_tok_s"] / y["sharegpt_out_tok_s"] for x, y in pairs
                      if "sharegpt_out_tok_s" in x and "sharegpt_out_tok_s" in y]
            if ratios:
                entry["sharegpt_over_tp1"] = statistics.median(ratios)
        out["configs"][c] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+")
    p.add_argument("--out")
    args = p.parse_args(argv)
    runs = [parse(open(path, encoding="utf-8").read()) for path in args.logs]
    result = {"logs": args.logs, **medians(runs)}
    for c, e in result["configs"].items():
        steps = " / ".join(f"{v:.2f}" for v in e["step_ms"].values())
        line = f"{c:12s} step ms (batches {' / '.join(map(str, e['step_ms']))}): {steps}"
        if "sharegpt_out_tok_s" in e:
            line += f"; ShareGPT-like {e['sharegpt_out_tok_s']:.0f} out tok/s"
        if "step_over_tp1" in e:
            line += "; over tp1 " + " / ".join(f"{v:.3f}x" for v in e["step_over_tp1"].values())
        print(line)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
