"""Where start-up time goes (issue 20: start-up to ready <= 45 s): the imports one by one in a fresh interpreter, then
Engine() for Llama-3.1-8B shapes (dummy bf16, the side-by-side's engine) under cProfile (the Triton cache as
TRITON_CACHE_DIR finds it), then the decode step at batch 1, 2, 4 and 64 (the few-row GEMMs chosen at start-up).
Prints the imports and the slowest radixlm/torch/triton functions by cumulative time, writes JSON.

--server instead: what a `radixlm serve` start-up costs the machine, over --runs start-ups (the default model, or
the serve arguments after --): wall time to the first healthy /health, and the CPU seconds of each process of the
server (main, and every process below it) when it is ready. Run it in two trees side by side to compare them (a
machine's load moves absolute seconds).

--ab DIR instead (a GPU machine): `Engine()` start-ups of the tree in DIR (`git archive REV radixlm benchmarks | tar
-x -C DIR`) and of this one in turn, --runs rounds, each a fresh process (spawn to ready: the imports, then the
side-by-side's engine), with an empty Triton cache each (--cache cold) or each tree's own kept cache (--cache warm:
filled by an untimed start first).

    bash benchmarks/lease/startup_lease.sh                       # on the device (carry .whl): cold, then warm
    python benchmarks/startup/startup_profile.py --tiny --out F    # here, on the CPU: the same with tiny shapes
    python benchmarks/startup/startup_profile.py --server --runs 3 --out F [-- SERVE ARGS...]
    python benchmarks/startup/startup_profile.py --ab DIR --runs 2 --cache cold --out F

--libs DIR instead: this tree's start-ups with the installed packages and with those installed in DIR ahead of them,
in turn (ABBA over --runs rounds): e.g. the transformers a fresh install resolves against the device image's own
(`bash benchmarks/lease/startup_lease.sh libs`).
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
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# "module:name" also takes the name from the module: transformers' lazy package imports AutoTokenizer's modules then.
IMPORTS = ("torch", "triton", "transformers", "transformers:AutoTokenizer", "xgrammar", "radixlm",
           "radixlm.runtime.engine", "benchmarks.lib.engine")
KEEP = ("radixlm/", "torch/cuda", "torch/_inductor", "triton/", "transformers/", "safetensors")


def timed_imports() -> list[dict]:
    rows = []
    for name in IMPORTS:
        module, _, attr = name.partition(":")
        t0 = time.perf_counter()
        try:
            imported = importlib.import_module(module)
            if attr:
                getattr(imported, attr)
            ok = True
        except (ImportError, AttributeError):
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


TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds of root and every process below it."""
    stats = {int(d): s for d in os.listdir("/proc") if d.isdigit() and (s := _stat(int(d))) is not None}
    out, frontier = {}, [root]
    while frontier:
        out.update({p: stats[p][1] for p in frontier if p in stats})
        frontier = [p for p, (pp, _) in stats.items() if pp in frontier]
    return out


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[-60:]
    except OSError:
        return "?"


def one_start(serve_args: list[str], timeout_s: float) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "radixlm.cli", "serve", "--port", str(port), "--log-level",
                             "warning", *serve_args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}")
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"not healthy in {timeout_s} s")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        ready_s = time.perf_counter() - t0
        cpu = tree_cpu(proc.pid)
        return {"ready_s": round(ready_s, 2), "cpu_s": round(sum(cpu.values()), 2),
                "processes": [{"pid": p, "cmd": _cmd(p), "cpu_s": round(c, 2)} for p, c in cpu.items()]}
    finally:
        proc.terminate()
        proc.wait(60)


def server_starts(args: argparse.Namespace) -> dict:
    """--server: args.runs start-ups of `radixlm serve` with args.serve_args."""
    runs = [one_start(args.serve_args, args.timeout_s) for _ in range(args.runs)]
    result = {"benchmark": "server_cpu", "command": " ".join(sys.argv), "cpus": os.cpu_count(), "runs": runs,
              "median_ready_s": statistics.median(r["ready_s"] for r in runs),
              "median_cpu_s": statistics.median(r["cpu_s"] for r in runs)}
    for i, r in enumerate(runs):
        print(f"run {i}: ready {r['ready_s']:6.2f} s, CPU {r['cpu_s']:6.2f} s: "
              + ", ".join(f"{q['cpu_s']:.1f}" for q in r["processes"]))
    print(f"median: ready {result['median_ready_s']:.2f} s, CPU {result['median_cpu_s']:.2f} s")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


AB_CHILD = """
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


def _pythonpath(*parts: str) -> str:
    return os.pathsep.join(p for p in parts if p)


def engine_start(tree: Path, cache: str, libs: str = "") -> dict:
    """One `Engine()` start-up of the tree at `tree` in a fresh process, with this Triton cache directory (and libs,
    a folder of installed packages, ahead of everything else on the path)."""
    here = Path(__file__).resolve().parents[2]
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != here]
    env = dict(os.environ, TRITON_CACHE_DIR=cache, PYTHONPATH=_pythonpath(libs, *path, str(tree)))
    out = subprocess.run([sys.executable, "-c", AB_CHILD, str(time.time())], cwd=tree, env=env, capture_output=True,
                         text=True, timeout=600)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("START ")), None)
    if line is None:
        raise RuntimeError(f"start in {tree} failed (rc {out.returncode}): {out.stderr[-2000:]}")
    return json.loads(line[6:])


LIB_VERSIONS = ("import transformers as t, tokenizers as k, huggingface_hub as h; "
                "print(t.__version__, k.__version__, h.__version__)")


def ab_starts(args: argparse.Namespace) -> dict:
    """--ab: the two trees' start-ups in turn; --libs: this tree's with the installed packages as they are and with
    the folder's ahead of them (versions of transformers, tokenizers and huggingface-hub recorded per arm)."""
    import shutil
    import tempfile

    here = Path(__file__).resolve().parents[2]
    arms = ({"base": (Path(args.ab).resolve(), ""), "this": (here, "")} if args.ab
            else {"installed": (here, ""), "with_libs": (here, str(Path(args.libs).resolve()))})
    caches = {name: tempfile.mkdtemp(prefix=f"triton_{name}_") for name in arms}
    # (each arm's medians go under its name, after the run)
    result = {"benchmark": "engine_start_ab", "cache": args.cache, "base_tree": args.ab, "libs_dir": args.libs,
              "starts": [], "versions": {}}
    for name, (_, libs) in arms.items():
        env = dict(os.environ, PYTHONPATH=_pythonpath(libs, os.environ.get("PYTHONPATH", "")))
        out = subprocess.run([sys.executable, "-c", LIB_VERSIONS], env=env, capture_output=True, text=True)
        result["versions"][name] = out.stdout.strip()
    if args.cache == "warm":
        for name, (tree, libs) in arms.items():
            engine_start(tree, caches[name], libs)
    for r in range(args.runs):
        order = list(arms.items()) if r % 2 == 0 else list(arms.items())[::-1]  # ABBA
        for name, (tree, libs) in order:
            if args.cache == "cold":
                shutil.rmtree(caches[name], ignore_errors=True)
                os.makedirs(caches[name])
            row = {"tree": name, "round": r + 1, **engine_start(tree, caches[name], libs)}
            print(json.dumps(row), flush=True)
            result["starts"].append(row)
    for name in arms:
        rows = [s for s in result["starts"] if s["tree"] == name]
        result[name] = {k: statistics.median(s[k] for s in rows) for k in ("imports_s", "engine_s", "ready_s")}
        print(name, {k: round(v, 2) for k, v in result[name].items()}, flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (the dry run)")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--out", required=True)
    p.add_argument("--server", action="store_true", help="time `radixlm serve` start-ups instead (module docstring)")
    p.add_argument("--ab", metavar="DIR", help="time Engine() start-ups of the tree in DIR and this one in turn")
    p.add_argument("--libs", metavar="DIR", help="time this tree's Engine() start-ups with the installed packages and "
                   "with DIR's (pip install --target DIR) ahead of them, in turn")
    p.add_argument("--cache", choices=("cold", "warm"), default="cold",
                   help="--ab, --libs: the Triton cache of each start")
    p.add_argument("--runs", type=int, default=3, help="--server: start-ups; --ab, --libs: rounds")
    p.add_argument("--timeout-s", type=float, default=180.0, help="--server: a start-up's limit")
    p.add_argument("serve_args", nargs="*", help="--server, after --: extra `radixlm serve` arguments")
    args = p.parse_args(argv)
    if args.server:
        return server_starts(args)
    if args.ab or args.libs:
        return ab_starts(args)
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
