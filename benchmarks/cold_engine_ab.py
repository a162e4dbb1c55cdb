"""Cold Engine() with and without the parallel kernel builds of start-up (issue 20: start-up to ready <= 45 s, met at
44.5 s with ~20 s of it kernel builds). Variants: "both" (the default engine), "prebuild" (the skinny GEMM's configs
built in threads, no discovery run), "none" (every kernel built at its first launch, as before). Each run is a fresh
process with an empty Triton cache, the variants in turn; prints and writes each run's Engine() seconds and the
medians.

    python benchmarks/cold_engine_ab.py --runs 2 --out $OUT/cold_engine_ab.json
    python benchmarks/cold_engine_ab.py --runs 1 --variants prebuild none   # the 2026-11-26 A/B (before discovery)
    python benchmarks/cold_engine_ab.py --runs 1 --variants both --log-dir $OUT/startup_logs   # with the engine's logs
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import logging, sys, time
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
sys.path.insert(0, {root!r})
from benchmarks.gpu_llama8b import close, make_engine
from benchmarks.llama8b import model_dir
from radixlm.runtime.executor.model_runner import ModelRunner
if {variant!r} == "prebuild":
    ModelRunner._discover_kernels = lambda self, plan, builds: None
if {variant!r} == "none":
    ModelRunner._build_in_parallel = lambda self, plan: None
path = model_dir()
t0 = time.perf_counter()
engine = make_engine(path)
print("ENGINE_S", time.perf_counter() - t0, flush=True)
close(engine)
"""


VARIANTS = ("both", "prebuild", "none")


def run(variant: str, log: Path | None = None) -> float:
    env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="triton_cold_")}
    out = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), variant=variant)], env=env,
                         capture_output=True, text=True, timeout=300)
    if log is not None:  # the engine's start-up log (its phases' seconds)
        log.write_text(out.stderr)
    for line in out.stdout.splitlines():
        if line.startswith("ENGINE_S"):
            return float(line.split()[1])
    raise RuntimeError(out.stderr[-3000:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--out", default="/tmp/cold_engine_ab.json")
    p.add_argument("--log-dir", type=Path, help="write each run's engine log here (<variant>_r<run>.log)")
    args = p.parse_args()
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(args.runs):
        for variant in args.variants:
            t0 = time.time()
            s = run(variant, args.log_dir / f"{variant}_r{i}.log" if args.log_dir else None)
            rows.append({"run": i, "variant": variant, "engine_init_s": s})
            print(f"run {i} {variant}: Engine() {s:.2f} s (process {time.time() - t0:.1f} s)", flush=True)
    med = {v: statistics.median(r["engine_init_s"] for r in rows if r["variant"] == v) for v in args.variants}
    print("median Engine(): " + ", ".join(f"{v} {s:.2f} s" for v, s in med.items()), flush=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "rows": rows,
                                          "median_engine_init_s": med}, indent=1) + "\n")


if __name__ == "__main__":
    main()
