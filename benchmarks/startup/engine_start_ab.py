"""Engine start-up of two trees side by side on one GPU machine: each start a fresh process (spawn to ready: the
imports, then `Engine()` for Llama-3.1-8B shapes with dummy weights, the side-by-side's engine), the trees in turn
each round, every start with an empty Triton cache (--cache cold) or each tree's own kept cache (--cache warm:
filled by an untimed start first).

    python benchmarks/startup/engine_start_ab.py --base DIR [--rounds 2] [--cache cold|warm] [--out DIR]

DIR holds the other tree (`git archive REV radixlm benchmarks | tar -x -C DIR`). Prints each start and the medians,
writes engine_start_ab.json to --out (default $OUT)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
CHILD = """
import json, sys, time
spawned = float(sys.argv[1])
from benchmarks.lib.engine import close, make_engine
from benchmarks.lib.models import model_dir
imported = time.time()
engine = make_engine(model_dir())
ready = time.time()
row = {"imports_s": imported - spawned, "engine_s": ready - imported, "ready_s": ready - spawned}
print("START " + json.dumps(row))
close(engine)
"""


def start(tree: Path, cache: str) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join(
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != HERE]
        + [str(tree)]))
    out = subprocess.run([sys.executable, "-c", CHILD, str(time.time())], cwd=tree, env=env, capture_output=True,
                         text=True, timeout=600)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("START ")), None)
    if line is None:
        raise RuntimeError(f"start in {tree} failed (rc {out.returncode}): {out.stderr[-2000:]}")
    return json.loads(line[6:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the other tree's directory")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cache", choices=("cold", "warm"), default="cold")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    trees = {"base": Path(args.base).resolve(), "this": HERE}
    caches = {name: tempfile.mkdtemp(prefix=f"triton_{name}_") for name in trees}
    result = {"benchmark": "engine_start_ab", "cache": args.cache, "base": str(trees["base"]), "starts": []}
    if args.cache == "warm":  # one untimed start a tree fills its cache
        for name, tree in trees.items():
            start(tree, caches[name])
    for r in range(args.rounds):
        for name, tree in trees.items():
            if args.cache == "cold":
                shutil.rmtree(caches[name], ignore_errors=True)
                os.makedirs(caches[name])
            row = {"tree": name, "round": r + 1, **start(tree, caches[name])}
            print(json.dumps(row), flush=True)
            result["starts"].append(row)
    for name in trees:
        rows = [s for s in result["starts"] if s["tree"] == name]
        result[name] = {k: statistics.median(s[k] for s in rows) for k in ("imports_s", "engine_s", "ready_s")}
        print(name, {k: round(v, 2) for k, v in result[name].items()}, flush=True)
    Path(args.out, "engine_start_ab.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
