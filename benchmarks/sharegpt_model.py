"""How long ShareGPT-like (issue 20) takes if the device never waits: the workload's own lengths (seed 1, the
peer-anchors draw) run as every prompt prefilled first, then one decode step per output position, each step costing
the measured decode step at its batch size (linear between the measured sizes, extrapolated past the largest).
Prefill is priced at a GEMM rate (2 x parameters FLOPs a token). Reads a side-by-side run's JSON for the curve.

    python benchmarks/sharegpt_model.py benchmarks/results/peer_runs/688c66c/peer_default_r2.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixlm.bench.datasets import sharegpt_like_dataset  # noqa: E402

PARAMS = 8.03e9  # Llama-3.1-8B


def lengths(seed: int = 1, n: int = 1000) -> tuple[list[int], list[int]]:
    """(input lengths, output lengths) of the workload, drawn as the benchmark draws them (ids are not needed)."""
    src = SimpleNamespace(ids=lambda k: k, request=lambda n_in, n_out: (n_in, n_out))
    reqs = sharegpt_like_dataset(src, n, seed)
    return [r[0] for r in reqs], [r[1] for r in reqs]


def step_ms(curve: list[tuple[int, float]], batch: int) -> float:
    for (b0, t0), (b1, t1) in zip(curve, curve[1:]):
        if batch <= b1:
            return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
    (b0, t0), (b1, t1) = curve[-2:]
    return t1 + (batch - b1) * (t1 - t0) / (b1 - b0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run", help="a peer_side_by_side.py run's JSON (its raw decode curve)")
    p.add_argument("--prefill-tflops", type=float, default=780.0)
    args = p.parse_args()
    run = json.loads(Path(args.run).read_text())
    curve = sorted((d["batch"], d["step_ms"]) for d in run["raw"]["decode"])
    ins, outs = lengths()
    regions = {"> 256 requests": 0.0, "64-256 requests": 0.0, "< 64 requests": 0.0}
    for t in range(1, max(outs)):
        batch = sum(o > t for o in outs)
        key = "> 256 requests" if batch > 256 else "64-256 requests" if batch >= 64 else "< 64 requests"
        regions[key] += step_ms(curve, batch) / 1e3
    prefill_s = sum(ins) * 2 * PARAMS / (args.prefill_tflops * 1e12)
    total = prefill_s + sum(regions.values())
    print(f"{len(ins)} requests, {sum(ins)} input and {sum(outs)} output tokens")
    print(f"prefill {prefill_s:.2f} s at {args.prefill_tflops:.0f} TFLOP/s")
    for key, s in regions.items():
        print(f"decode steps at {key}: {s:.2f} s")
    measured = run["raw"].get("sharegpt_like", {}).get("wall_s")
    print(f"modelled {total:.2f} s ({sum(outs) / total:,.0f} output tok/s)"
          + (f"; the run measured {measured:.2f} s" if measured else ""))


if __name__ == "__main__":
    main()
