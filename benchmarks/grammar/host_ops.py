"""Host work per scheduler pass, deterministic (CPU): aten ops, Python calls or Python bytecodes of each
Scheduler.step of json_workload.run_mode's measured generate (its warm-up excluded), with scripted logits
(json_workload.scripted) so that every tree under comparison decodes the same tokens.

Where a GPU run is host-bound (a small model: the Python time of a scheduler step decides the wall time), these
counts tell two trees apart without a GPU and without timing noise, and say which functions do the extra work.

Usage (from the root of the tree to measure; its radixlm and its benchmarks/lib/json_workload.py, or in a tree
from before benchmarks/lib its flat json_decoding.py and host_overhead.py, are imported):
    .venv/bin/python benchmarks/grammar/json_decoding.py --constraint json_schema --save-ids /tmp/ids_js.json ...
        # once: record the outputs to replay (any device)
    cd TREE && OMP_NUM_THREADS=1 PYTHONPATH=TREE python /work/main/benchmarks/grammar/host_ops.py --ids /tmp/ids_js.json \
        --constraint json_schema --modes off,fast --keep-model --overlap --count bytecodes --out TREE.json
    python benchmarks/grammar/host_ops.py --compare BASE.json NEW.json [--top 40]   # per-function differences per pass

--count: ops (aten ops seen by a TorchDispatchMode, with the radixlm/benchmarks function that issued each), calls
(cProfile: Python calls, per function) or bytecodes (sys.settrace opcode events, per function). Run one count per
process: tracing changes what the others see. --keep-model: the real ModelRunner.forward runs (batch build,
attention metadata) with the model's layers replaced by a zeros stub; ops inside the stub, the lm head and the
scripted logits are not counted (without it the whole forward is excluded). --overlap: the overlap scheduler on,
as on CUDA. --shared N: Planner.shared_prefix_min_len = N (the CUDA default's scan, forced on here). Each mode's
output ids are written too, so two runs' outputs can be checked equal (--compare does)."""
from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import importlib
import json
import os
import pstats
import re
import sys


def _norm(path: str) -> str:
    """A function's file, relative to the tree (radixlm/..., benchmarks/...) or to site-packages."""
    m = re.search(r"(radixlm/.*|benchmarks/.*|site-packages/.*)$", path)
    return m.group(1) if m else path


class _State:
    active = False  # inside a measured step
    paused = 0  # inside work excluded from the counts (the model stub, scripted logits)


def _pausing(fn):
    @functools.wraps(fn)
    def paused(*a, **k):
        _State.paused += 1
        try:
            return fn(*a, **k)
        finally:
            _State.paused -= 1
    return paused


class Counter:
    """One of the three counts around a measured step; per-function totals in `funcs`."""

    def __init__(self, kind: str):
        self.kind = kind
        self.funcs: collections.Counter = collections.Counter()
        self.ops: collections.Counter = collections.Counter()
        self.prof = cProfile.Profile() if kind == "calls" else None
        if kind == "ops":
            from torch.utils._python_dispatch import TorchDispatchMode

            counter = self

            class Mode(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    if not _State.paused:
                        counter.ops[str(func)] += 1
                        counter.funcs[f"{str(func)} @ {_caller()}"] += 1
                    return func(*args, **(kwargs or {}))

            self.mode_cls = Mode

    def run(self, step):
        if self.kind == "bytecodes":
            funcs = self.funcs

            def local(frame, event, arg):
                if event == "opcode" and not _State.paused:
                    c = frame.f_code
                    funcs[f"{_norm(c.co_filename)}:{c.co_name}"] += 1
                return local

            def tracer(frame, event, arg):
                if frame.f_code.co_filename == __file__:
                    return None  # this file's wrappers (_pausing, the counted step) are not the tree's work
                frame.f_trace_opcodes = True
                return local

            sys.settrace(tracer)
            try:
                return step()
            finally:
                sys.settrace(None)
        if self.kind == "calls":
            self.prof.enable()
            try:
                return step()
            finally:
                self.prof.disable()
        with self.mode_cls():
            return step()

    def totals(self) -> tuple[int, dict]:
        if self.kind == "calls":
            st = pstats.Stats(self.prof)
            funcs = collections.Counter()
            for (path, _, name), v in st.stats.items():
                funcs[f"{_norm(path)}:{name}"] += v[1]  # ncalls, recursive ones included
            return st.total_calls, dict(funcs)
        if self.kind == "ops":
            return sum(self.ops.values()), {**dict(self.ops), **{"@" + k: v for k, v in self.funcs.items()}}
        return sum(self.funcs.values()), dict(self.funcs)


def _caller() -> str:
    f = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename
        if ("/radixlm/" in path or "/benchmarks/" in path) and not path.endswith("host_ops.py"):
            return f"{_norm(path)}:{f.f_code.co_name}"
        f = f.f_back
    return "?"


def measure(args) -> dict:
    tree = os.path.abspath(args.tree)
    sys.path[:0] = [tree, os.path.join(tree, "benchmarks")]  # the measured tree's modules, not this file's tree
    import torch

    if os.path.exists(os.path.join(tree, "benchmarks", "lib", "json_workload.py")):
        workload = scripting = importlib.import_module("benchmarks.lib.json_workload")
    else:  # a tree from before benchmarks/lib: its flat scripts
        workload, scripting = importlib.import_module("json_decoding"), importlib.import_module("host_overhead")

    if args.overlap:
        engine_cls = workload.Engine
        workload.Engine = lambda *a, **k: engine_cls(*a, overlap_schedule="on", **k)
    n = len(json.loads(open(args.ids).read()))
    ns = argparse.Namespace(model=args.model, constraint=args.constraint, max_running=args.max_running,
                            device="cpu", dtype="float32", max_total_tokens=args.max_total_tokens, phases=False)
    texts = workload.passages(n, 0)
    results = {}
    for mode in args.modes.split(","):
        counter = Counter(args.count)
        seen = {}

        def prepare(engine, prompts, sp, mode=mode, counter=counter, seen=seen):
            scripting.scripted(args.ids, None, mode, args.keep_model)(engine, prompts, sp)
            if args.shared:
                engine.scheduler.planner.shared_prefix_min_len = args.shared
            if args.keep_model:
                fwd = engine.runner.forward  # json_workload.ScriptedForward around the real forward
                fwd._logits = _pausing(fwd._logits)
                hidden = engine.runner.model.lm_head.weight.shape[1]
                engine.runner.model.forward = _pausing(lambda ids, *a, **k: torch.zeros(ids.shape[0], hidden))
                engine.runner.logits_processor = _pausing(engine.runner.logits_processor)
            else:
                engine.runner.forward = _pausing(engine.runner.forward)
            step, generate = engine.scheduler.step, engine.generate
            steps = [0]

            def counted_step():
                if not _State.active:
                    return step()
                steps[0] += 1
                return counter.run(step)

            def counted_generate(*a, **k):
                seen["calls"] = seen.get("calls", 0) + 1
                _State.active = seen["calls"] == 2  # the measured generate (the first is the warm-up)
                before = dict(engine.scheduler.stats)
                try:
                    return generate(*a, **k)
                finally:
                    _State.active = False
                    seen["steps"] = steps[0]
                    seen["stats"] = {k2: v - before.get(k2, 0) for k2, v in engine.scheduler.stats.items()}

            engine.scheduler.step = counted_step
            engine.generate = counted_generate

        r = workload.run_mode(mode, ns, texts, prepare=prepare)
        total, funcs = counter.totals()
        passes = r["forward_passes"]
        results[mode] = {"count": args.count, "passes": passes, "steps": seen.get("steps"),
                         "output_tokens": r["output_tokens"], "per_pass": total / passes, "total": total,
                         "funcs": funcs, "sched_stats": seen.get("stats"), "ids": r["_ids"]}
        print(f"{mode}: {passes} passes, {args.count}/pass {total / passes:.1f}", flush=True)
    return results


def compare(a_path: str, b_path: str, top: int) -> None:
    a, b = json.load(open(a_path)), json.load(open(b_path))
    for mode in [m for m in a if m in b]:
        x, y = a[mode], b[mode]
        print(f"== {mode} ({x['count']}): per pass {x['per_pass']:.1f} -> {y['per_pass']:.1f} "
              f"({y['per_pass'] - x['per_pass']:+.1f}); passes {x['passes']} / {y['passes']}; "
              f"outputs equal: {x['ids'] == y['ids']}")
        per = collections.defaultdict(lambda: [0.0, 0.0])
        files = collections.defaultdict(lambda: [0.0, 0.0])
        for i, d in enumerate((x, y)):
            for k, v in d["funcs"].items():
                per[k][i] += v / d["passes"]
                files[k.rsplit(":", 1)[0] if not k.startswith("@") else "(by caller)"][i] += v / d["passes"]
        for label, table, n in (("file", files, 12), ("function", per, top)):
            print(f"  by {label}: {a_path} | {b_path} | difference")
            for k, (u, v) in sorted(table.items(), key=lambda kv: -abs(kv[1][1] - kv[1][0]))[:n]:
                print(f"    {u:10.1f} {v:10.1f} {v - u:+10.1f}  {k}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two --out files instead of measuring")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--tree", default=".", help="the tree whose radixlm and benchmarks run (default: cwd)")
    p.add_argument("--ids", help="outputs recorded by json_decoding.py --save-ids (their prompts are replayed)")
    p.add_argument("--constraint", default="json_schema", choices=["json_schema", "regex"])
    p.add_argument("--modes", default="off,fast")
    p.add_argument("--model", default="default")
    p.add_argument("--max-running", type=int, default=32)
    p.add_argument("--max-total-tokens", type=int, default=131072, help="the KV pool (float32 SmolLM2: 46 KB a token)")
    p.add_argument("--count", default="bytecodes", choices=["ops", "calls", "bytecodes"])
    p.add_argument("--keep-model", action="store_true")
    p.add_argument("--overlap", action="store_true")
    p.add_argument("--shared", type=int, default=0)
    p.add_argument("--out")
    args = p.parse_args()
    if args.compare:
        compare(*args.compare, args.top)
        return
    if not args.ids or not args.out:
        p.error("--ids and --out are needed to measure")
    json.dump(measure(args), open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
