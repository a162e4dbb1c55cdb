"""Merges `python -m radixlm.bench.programs` results of several runs (the variants of one table split across device
calls, each a --variants subset with the same workloads, program counts, --scale and seed) into one JSON, with its
markdown table and PNG next to it (radixlm.bench.programs.report).

    python benchmarks/programs/programs_merge.py $OUT/programs_gpu_p1.json $OUT/programs_gpu_p2.json \
        --out benchmarks/results/programs/programs_gpu.json [--note "..."]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixlm.bench.programs import report  # noqa: E402
from radixlm.bench.programs.runner import VARIANTS  # noqa: E402

SAME = ("backend", "model", "num_programs", "num_programs_per_workload", "seed", "scale", "workloads", "repeat")


def merge(runs: list[dict], notes: list[str] | None = None) -> dict:
    first = runs[0]["config"]
    for r in runs[1:]:
        diff = [k for k in SAME if r["config"].get(k) != first.get(k)]
        if diff:
            raise SystemExit(f"runs differ in {diff}: not one table")
    variants: dict[str, dict] = {}
    for r in runs:
        variants.update(r["variants"])
    order = [v.name for v in VARIANTS]  # the paper's order, all_off last (the baseline column)
    variants = dict(sorted(variants.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    config = dict(first)
    config["command"] = " ; ".join(r["config"]["command"] for r in runs)
    config["variants"] = {k: v for r in runs for k, v in r["config"].get("variants", {}).items()}
    config["hosts"] = [r["config"].get("host") for r in runs]
    config["notes"] = [n for r in runs for n in r["config"].get("notes", [])] + list(notes or [])
    return {"config": config, "variants": variants}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="result JSON files (missing ones are skipped with a warning)")
    p.add_argument("--out", required=True)
    p.add_argument("--note", action="append", default=[])
    args = p.parse_args(argv)
    runs = []
    for path in args.inputs:
        if Path(path).is_file():
            runs.append(json.loads(Path(path).read_text()))
        else:
            print(f"warning: {path} missing, merged without it", file=sys.stderr)
    if not runs:
        raise SystemExit("nothing to merge")
    out = merge(runs, args.note)
    for kind, path in report.write(out, args.out).items():
        print(f"wrote {kind}: {path}")
    return out


if __name__ == "__main__":
    main()
