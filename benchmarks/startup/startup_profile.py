"""Where start-up time goes (issue 20: start-up to ready <= 45 s): the imports one by one in a fresh interpreter, then
Engine() for Llama-3.1-8B shapes (dummy bf16, the side-by-side's engine) under cProfile (the Triton cache as
TRITON_CACHE_DIR finds it), then the decode step at batch 1, 2, 4 and 64 (the few-row GEMMs chosen at start-up).
Prints the imports and the slowest radixlm/torch/triton functions by cumulative time, writes JSON.

    bash benchmarks/lease/startup_lease.sh                       # on the device (carry .whl): cold, then warm
    python benchmarks/startup/startup_profile.py --tiny --out F    # here, on the CPU: the same with tiny shapes
"""
from __future__ import annotations

import time

SPAWNED = time.time()

import argparse  # noqa: E402
import cProfile  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

IMPORTS = ("torch", "triton", "transformers", "xgrammar", "radixlm", "radixlm.runtime.engine", "benchmarks.lib.engine")
KEEP = ("radixlm/", "torch/cuda", "torch/_inductor", "triton/", "transformers/", "safetensors")


def timed_imports() -> list[dict]:
    rows = []
    for name in IMPORTS:
        t0 = time.perf_counter()
        try:
            importlib.import_module(name)
            ok = True
        except ImportError:
            ok = False
        rows.append({"module": name, "s": round(time.perf_counter() - t0, 3), "ok": ok})
    return rows


def top_functions(prof: cProfile.Profile, n: int) -> list[dict]:
    stats = pstats.Stats(prof)
    rows = []
    for (path, line, func), (_cc, ncalls, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if any(k in path for k in KEEP):
            i = max(path.find(k) for k in KEEP if k in path)
            rows.append({"function": f"{path[i:]}:{line}:{func}", "calls": ncalls, "cumulative_s": round(ct, 3)})
    rows.sort(key=lambda r: -r["cumulative_s"])
    return rows[:n]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (the dry run)")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    interpreter_s = time.time() - SPAWNED
    imports = timed_imports()
    from radixlm import Engine

    cache_dir = os.environ.get("TRITON_CACHE_DIR", "")
    kernels = sum(1 for _ in Path(cache_dir).glob("*/*")) if cache_dir and Path(cache_dir).is_dir() else 0
    prof = cProfile.Profile()
    setup = Engine._setup

    def profiled_setup(engine) -> None:  # the engine builds everything on its own thread: profile that one
        prof.enable()
        try:
            setup(engine)
        finally:
            prof.disable()

    Engine._setup = profiled_setup
    t0 = time.perf_counter()
    if args.tiny:
        from benchmarks.lib.models import tiny_model_dir

        path = tiny_model_dir()
        engine = Engine(path, load_format="dummy", dtype="float32", device="cpu", context_length=4096,
                        random_seed=0, max_total_tokens=16384)
    else:
        from benchmarks.lib.engine import make_engine
        from benchmarks.lib.models import model_dir

        path = model_dir()
        engine = make_engine(path)
    engine_s = time.perf_counter() - t0
    result = {"benchmark": "startup_profile", "tiny": args.tiny, "kernel_cache_entries_at_start": kernels,
              "interpreter_s": round(interpreter_s, 3), "imports": imports,
              "imports_s": round(sum(r["s"] for r in imports), 3), "engine_init_s": round(engine_s, 3),
              "ready_s": round(time.time() - SPAWNED, 3), "top_cumulative": top_functions(prof, args.top)}
    if not args.tiny:  # the GEMM choices made at start-up, seen from a decode step (the side-by-side's measure)
        import random

        from transformers import AutoTokenizer

        from benchmarks.lib.engine import decode_steps
        from radixlm.bench.datasets import PromptSource

        src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
        decode_steps(engine, src, 8, steps=16)  # warm-up
        result["decode_step_ms"] = {b: round(decode_steps(engine, src, b) * 1e3, 3) for b in (1, 2, 4, 64)}
        print(f"decode step ms by batch: {result['decode_step_ms']}")
    engine.shutdown()
    print(f"interpreter {result['interpreter_s']:.2f} s, imports {result['imports_s']:.2f} s, Engine() "
          f"{engine_s:.2f} s (kernel cache entries at start: {kernels}), ready {result['ready_s']:.2f} s")
    for r in imports:
        print(f"  import {r['module']:28} {r['s']:7.2f} s{'' if r['ok'] else ' (missing)'}")
    for r in result["top_cumulative"]:
        print(f"  {r['cumulative_s']:8.2f} s {r['calls']:7d}  {r['function']}")
    Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
