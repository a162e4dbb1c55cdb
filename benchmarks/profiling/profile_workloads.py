"""Where the time goes on the offline workloads radixlm loses to SGLang (issue 20, deliverable 2): Llama-3.1-8B
shapes (bf16, dummy weights), the workloads of ../shared/reference/peer-anchors.md at full size, one engine with
the defaults per invocation.

Each workload runs twice after a small warm-up of its shapes, the radix cache flushed before each run:
  1. measured: wall time, output tok/s, passes by kind (prefill = new requests only, mixed = new requests plus the
     running ones' decode rows, decode), prefill tokens computed, hit rate, host time per scheduler phase
     (benchmarks/lib/phases.py PhaseTimer) and host launch time per pass kind;
  2. profiled: torch.profiler (CPU + CUDA) over two windows of --window passes, `start` (from the first pass: prefill
     dominates) and `steady` (centred on the run's middle pass): device time per kernel name per pass kind (a kernel
     belongs to the pass whose launch enqueued it; `other` = outside any launch), device busy time (union of the
     kernels' intervals) and the GPU idle share of the window's wall time.
With --cprofile N a third run has the scheduler's steps under cProfile (host hot spots: its N functions of most own
time); --window 0 leaves out the torch.profiler run. The part `decode256` gives a decode step's kernels
(profile_gpu_step.step_kernels) and host phases (gpu_multi.step_profile) at batch 256.

    python benchmarks/profiling/profile_workloads.py --parts shared_prefix decode256 --out $OUT/profile_a.json
    python benchmarks/profiling/profile_workloads.py --tiny --parts shared_prefix decode256 sharegpt random --out /tmp/p.json

--tiny: a CPU dry run (tiny random-weight Llama with the Llama-3.1 tokenizer, float32, workloads shrunk); the
"kernels" are then aten ops by their own CPU time."""
from __future__ import annotations

import argparse
import io
import json
import pstats
import random
import shutil
import sys
import time
from collections import Counter, defaultdict
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.engine import close, make_engine, offline_run  # noqa: E402
from benchmarks.lib.models import model_dir, tiny_model_dir  # noqa: E402
from benchmarks.lib.phases import PhaseTimer, profile_steps  # noqa: E402
from benchmarks.lib.profiling import step_kernels, step_profile  # noqa: E402
from radixlm.bench.datasets import PromptSource, generated_shared_prefix_dataset, random_dataset  # noqa: E402
from radixlm.bench.datasets import sharegpt_like_dataset  # noqa: E402

TAG = "radixlm.pass."
KINDS = ("prefill", "mixed", "decode", "other")


def log(*a) -> None:
    print(*a, flush=True)


def workload(name: str, src: PromptSource, tiny: bool, warm: bool = False):
    """The peer-anchors.md workload (warm: a small one of the same shapes, other token ids)."""
    if name == "shared_prefix":
        g, n, pre, q, out = (2, 4, 64, 16, 16) if tiny else (32, 32, 2048, 128, 64)
        g, n = (2, 4) if warm else (g, n)
        return generated_shared_prefix_dataset(src, g, n, pre, q, 8 if warm else out, seed=3 if warm else 2)
    if name == "sharegpt":
        n = 8 if warm else (24 if tiny else 1000)
        return sharegpt_like_dataset(src, n, seed=4 if warm else 1, max_input_len=96 if tiny else 2048,
                                     max_output_len=12 if tiny else 1024)
    if name == "random":
        n, i, o = (6, 64, 12) if tiny else (500, 1024, 512)
        return random_dataset(src, 4 if warm else n, i, 4 if warm else o, 1.0)
    raise ValueError(name)


def pass_kind(batch) -> str:
    if not batch.is_prefill:
        return "decode"
    return "mixed" if len(batch.reqs) > len(batch.new_reqs) else "prefill"


class PassProfiler:
    """On the scheduler's thread: counts passes by kind, times their launch on the host, and runs torch.profiler
    over windows of passes {label: (first pass, end pass)}, each window made of whole scheduler steps."""

    def __init__(self, engine, windows: dict[str, tuple[int, int]] | None = None):
        self.sched = engine.scheduler
        self.cuda = torch.cuda.is_available()
        self.passes: Counter = Counter()
        self.launch_s: Counter = Counter()
        self.n = 0
        self.pending = sorted((w for w in (windows or {}).items() if w[1][1] > w[1][0]), key=lambda w: w[1][0])
        self.windows: dict[str, dict] = {}
        self._prof = None
        launch, step = self.sched.launch_batch, self.sched.step

        def launch_batch(batch):
            kind = pass_kind(batch)
            t0 = time.perf_counter()
            with record_function(TAG + kind) if self._prof is not None else nullcontext():
                result = launch(batch)
            self.launch_s[kind] += time.perf_counter() - t0
            self.passes[kind] += 1
            self.n += 1
            return result

        def timed_step():
            if self._prof is not None and self.n >= self._end:
                self._stop()
            if self._prof is None and self.pending and self.n >= self.pending[0][1][0]:
                label, (_, end) = self.pending.pop(0)
                self._start(label, end)
            return step()

        self.sched.launch_batch, self.sched.step = launch_batch, timed_step

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _start(self, label: str, end: int) -> None:
        self._sync()  # the window holds only its own passes' kernels
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._label, self._end, self._n0, self._kinds0 = label, end, self.n, Counter(self.passes)
        self._prof = profile(activities=acts)
        self._prof.start()
        self._t0 = time.perf_counter()

    def _stop(self) -> None:
        self._sync()
        wall = time.perf_counter() - self._t0
        prof, self._prof = self._prof, None
        prof.stop()
        passes = {k: self.passes[k] - self._kinds0[k] for k in KINDS if self.passes[k] - self._kinds0[k]}
        self.windows[self._label] = {"first_pass": self._n0, "passes": passes, "wall_us": wall * 1e6,
                                     **summarize(prof.events(), self.cuda, passes, wall * 1e6)}

    def detach(self) -> None:
        if self._prof is not None:
            self._stop()
        del self.sched.launch_batch, self.sched.step


def kind_of(event) -> str:
    e = event
    while e is not None:
        if e.name.startswith(TAG):
            return e.name[len(TAG):]
        e = e.cpu_parent
    return "other"


def summarize(events, cuda: bool, passes: dict, wall_us: float, top: int = 15) -> dict:
    """Device time per kernel name per pass kind; on the CPU (no kernels) the aten ops' own CPU time."""
    us = defaultdict(Counter)
    calls = defaultdict(Counter)
    cpu = torch.autograd.DeviceType.CPU
    for e in events:
        if e.device_type != cpu:
            continue
        if cuda:
            if e.kernels:
                kind = kind_of(e)
                for k in e.kernels:
                    if k.name.startswith(TAG):  # the annotation's own span on the device timeline, not a kernel
                        continue
                    us[kind][k.name] += k.duration
                    calls[kind][k.name] += 1
        elif e.name.startswith("aten::") and e.self_cpu_time_total > 0:
            kind = kind_of(e)
            us[kind][e.name] += e.self_cpu_time_total
            calls[kind][e.name] += 1
    if cuda:
        device = [e for e in events if e.device_type != cpu and not e.name.startswith(TAG)]
        spans = sorted((e.time_range.start, e.time_range.end) for e in device)
        total = sum(b - a for a, b in spans)
        linked_us, linked_calls = Counter(), Counter()
        for kind in list(us):
            linked_us.update(us[kind])
            linked_calls.update(calls[kind])
        for e in device:  # kernels no op of a pass claims (no launching op on record) still get a table
            us["unlinked"][e.name] += e.time_range.end - e.time_range.start
            calls["unlinked"][e.name] += 1
        us["unlinked"] = Counter({n: v for n, v in (us["unlinked"] - linked_us).items() if v > 1e-3})
        calls["unlinked"] = Counter({n: max(calls["unlinked"][n] - linked_calls[n], 1) for n in us["unlinked"]})
        busy, reach = 0.0, float("-inf")
        for a, b in spans:  # union: kernels of two streams may overlap
            busy += max(0.0, b - max(a, reach))
            reach = max(reach, b)
    else:
        busy = total = float(sum(sum(c.values()) for c in us.values()))
    attributed = sum(sum(c.values()) for k, c in us.items() if k != "unlinked")
    by_kind = {}
    for kind in (*KINDS, "unlinked"):
        if not us[kind]:
            continue
        n = max(passes.get(kind, 0) if kind in KINDS[:3] else sum(passes.values()), 1)
        kind_us = sum(us[kind].values())
        by_kind[kind] = {"device_us": kind_us, "device_us_per_pass": kind_us / n, "kernels": [
            {"name": name[:160], "us": v, "us_per_pass": v / n, "calls": calls[kind][name], "share": v / kind_us}
            for name, v in us[kind].most_common(top)]}
    return {"device_busy_us": busy, "device_kernel_us": total, "unlinked_kernel_us": max(total - attributed, 0.0),
            "gpu_idle_share": max(0.0, 1 - busy / wall_us) if wall_us else None, "by_kind": by_kind}


def flush(engine) -> None:
    for _ in range(50):
        if engine.flush_cache():
            return
        time.sleep(0.1)
    raise RuntimeError("the radix cache could not be flushed")


def measured_run(engine, reqs, name: str) -> dict:
    flush(engine)
    stats0 = dict(engine.scheduler.stats)
    counter = PassProfiler(engine)
    timer = PhaseTimer.attach(engine)
    try:
        row = offline_run(engine, reqs, name, mfu=False)
    finally:
        timer.detach()
        counter.detach()
    st = engine.scheduler.stats
    delta = {k: st[k] - stats0.get(k, 0) for k in ("prefill_tokens", "cached_tokens", "prompt_tokens", "mixed_batches")}
    phases = timer.as_dict()
    n = counter.n
    step = phases.get("scheduler step", {}).get("seconds", 0.0)
    wait = phases.get("wait for device", {}).get("seconds", 0.0)
    row.update({"passes": n, "passes_by_kind": dict(counter.passes), "prefill_tokens_computed": delta["prefill_tokens"],
                "hit_rate": delta["cached_tokens"] / max(delta["prompt_tokens"], 1),
                "mixed_batches": delta["mixed_batches"],
                "host_launch_us_per_pass": {k: counter.launch_s[k] / counter.passes[k] * 1e6 for k in counter.passes},
                "host_step_us_per_pass": step / max(n, 1) * 1e6, "wait_for_device_us_per_pass": wait / max(n, 1) * 1e6,
                "host_busy_us_per_pass": (step - wait) / max(n, 1) * 1e6, "host_phases": phases,
                "host_phase_table": timer.table(row["wall_s"], n, row["output_tokens"])})
    return row


def profiled_run(engine, reqs, name: str, total: int, window: int) -> dict:
    mid = max(total // 2 - window // 2, window)
    windows = {"start": (0, min(window, total - 1)), "steady": (mid, min(mid + window, total - 1))}
    if windows["steady"][1] <= windows["steady"][0]:
        windows.pop("steady")
    flush(engine)
    prof = PassProfiler(engine, windows)
    try:
        row = offline_run(engine, reqs, name + " (profiled)", mfu=False)
    finally:
        prof.detach()
    return {"wall_s": row["wall_s"], "output_tokens_per_s": row["output_tokens_per_s"], "windows": prof.windows}


def estimate_idle(measured: dict, windows: dict) -> float | None:
    """The whole run's GPU idle share, were each pass kind's device time per pass that of the windows."""
    per_pass = {}
    for w in windows.values():
        for kind, d in w["by_kind"].items():
            if kind in w["passes"]:
                per_pass.setdefault(kind, []).append(d["device_us_per_pass"])
    if not per_pass:
        return None
    busy = sum(n * sum(per_pass[k]) / len(per_pass[k]) for k, n in measured["passes_by_kind"].items() if k in per_pass)
    return max(0.0, 1 - busy / (measured["wall_s"] * 1e6))


def host_profile_run(engine, reqs, name: str, top: int) -> dict:
    """The scheduler's steps under cProfile (its own run: cProfile slows the host): the `top` functions by own time."""
    flush(engine)
    prof = profile_steps(engine)
    try:
        row = offline_run(engine, reqs, name + " (cProfile)", mfu=False)
    finally:
        engine.scheduler.__dict__.pop("step", None)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return {"wall_s": row["wall_s"], "by_tottime": text.getvalue()}


def part_workload(engine, src: PromptSource, name: str, tiny: bool, window: int, cprofile_top: int = 0) -> dict:
    offline_run(engine, workload(name, src, tiny, warm=True), f"{name} warm-up", mfu=False)
    reqs = workload(name, src, tiny)
    measured = measured_run(engine, reqs, name)
    out = {"measured": measured}
    if window:
        out["profiled"] = profiled_run(engine, reqs, name, measured["passes"], window)
        measured["gpu_idle_share_estimate"] = estimate_idle(measured, out["profiled"]["windows"])
    if cprofile_top:
        out["host_profile"] = host_profile_run(engine, reqs, name, cprofile_top)
    return out


def part_decode(engine, src: PromptSource, batch: int, steps: int, prompt_len: int) -> dict:
    """step_kernels and step_profile at `batch` (512-token prompts in both), and a PassProfiler window over `steps`
    decode passes after the prompts' prefill (the passes a 1-token run of other such prompts took, plus 2)."""
    def run(n_out: int, prof: PassProfiler | None = None) -> int:
        counter = prof or PassProfiler(engine)
        try:
            engine.generate(input_ids=[src.ids(prompt_len) for _ in range(batch)],
                            sampling_params={"max_new_tokens": n_out, "temperature": 0, "ignore_eos": True})
        finally:
            counter.detach()
        return counter.n

    run(2)
    prefill = run(1)
    prof = PassProfiler(engine, {"decode": (prefill + 2, prefill + 2 + steps)})
    run(steps + 4, prof)
    kernels = step_kernels(engine, src, batch, steps, top=20)
    host = step_profile(engine, src, batch, steps)
    return {"batch": batch, "steps": steps, "kernels": kernels, "host": host, "window": prof.windows.get("decode")}


def report(name: str, r: dict) -> None:
    if name == "decode256":
        k, h = r["kernels"], r["host"]
        log(f"decode batch {r['batch']}: wall {k['wall_us_per_step']:.0f} us/step, device busy "
            f"{k['gpu_busy_us_per_step']:.0f} us, idle {k['idle_us_per_step']:.0f} us; host busy "
            f"{h['host_busy_us']:.0f} us, waiting {h['wait_for_device_us']:.0f} us")
        for kk in k["kernels"][:10]:
            log(f"   {kk['us_per_step']:9.1f} us  x{kk['launches_per_step']:5.1f}  {kk['name'][:100]}")
        windows = {"decode": r["window"]} if r["window"] else {}
    else:
        m = r["measured"]
        log(f"{name}: {m['wall_s']:.2f} s, {m['output_tokens_per_s']:.0f} out tok/s, passes {m['passes_by_kind']}, "
            f"prefill tokens {m['prefill_tokens_computed']}, hit rate {m['hit_rate']:.1%}, host busy "
            f"{m['host_busy_us_per_pass']:.0f} us/pass, est. GPU idle {m.get('gpu_idle_share_estimate') or 0:.1%}")
        log(m["host_phase_table"])
        windows = r["profiled"]["windows"] if "profiled" in r else {}
        if "host_profile" in r:
            log(f"cProfile'd run: {r['host_profile']['wall_s']:.2f} s\n{r['host_profile']['by_tottime']}")
    for label, w in windows.items():
        log(f"  window {label} (from pass {w['first_pass']}, {w['passes']}): wall {w['wall_us'] / 1e3:.1f} ms, "
            f"busy {w['device_busy_us'] / 1e3:.1f} ms, idle {w['gpu_idle_share']:.1%}, kernels no pass claims "
            f"{w['unlinked_kernel_us'] / 1e3:.1f} ms")
        for kind, d in w["by_kind"].items():
            log(f"    {kind}: {d['device_us_per_pass']:.0f} us/pass")
            for kk in d["kernels"][:6]:
                log(f"      {kk['us_per_pass']:9.1f} us/pass {kk['share']:6.1%}  {kk['name'][:90]}")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--parts", nargs="+", default=["shared_prefix", "decode256"],
                   choices=["shared_prefix", "sharegpt", "random", "decode256"])
    p.add_argument("--window", type=int, default=None, help="passes per profiled window (default 40; tiny 4; 0: no "
                   "torch.profiler run)")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="also a run under cProfile (the scheduler's "
                   "steps): its N functions of most own time")
    p.add_argument("--decode-batch", type=int, default=None, help="default 256 (tiny 4)")
    p.add_argument("--decode-steps", type=int, default=None, help="default 64 (tiny 4)")
    p.add_argument("--engine-args", default="{}", help="JSON of extra server arguments, e.g. '{\"page_size\": 16}'")
    p.add_argument("--tiny", action="store_true", help="CPU dry run: tiny random Llama, float32, small workloads")
    p.add_argument("--out", default="benchmarks/results/profiling/profile_workloads.json")
    args = p.parse_args(argv)
    tiny = args.tiny
    window = args.window if args.window is not None else (4 if tiny else 40)
    batch = args.decode_batch or (4 if tiny else 256)
    steps = args.decode_steps or (4 if tiny else 64)
    path = tiny_model_dir() if tiny else model_dir()
    from transformers import AutoTokenizer

    from radixlm import Engine

    src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])):
        pass  # the profiler's first start registers it with its thread: here, not on the scheduler's
    t0 = time.perf_counter()
    if tiny:
        engine = Engine(path, load_format="dummy", dtype="float32", device="cpu", context_length=4096, random_seed=0,
                        max_total_tokens=16384, **{"max_running_requests": 64, **json.loads(args.engine_args)})
    else:
        engine = make_engine(path, **json.loads(args.engine_args))
    result = {"benchmark": "profile_workloads", "tiny": tiny, "window": window, "engine_args": json.loads(args.engine_args),
              "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "engine_start_s": time.perf_counter() - t0,
              "command": " ".join(["python", *sys.argv[:1], *(argv if argv is not None else sys.argv[1:])])}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        for name in args.parts:  # each part written as soon as it is measured
            result[name] = (part_decode(engine, src, batch, steps, 32 if tiny else 512) if name == "decode256"
                            else part_workload(engine, src, name, tiny, window, args.cprofile))
            report(name, result[name])
            result["bench_seconds"] = time.perf_counter() - t0
            out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        close(engine)
        if tiny:
            shutil.rmtree(path, ignore_errors=True)
    log(f"wrote {out} after {result.get('bench_seconds', 0):.0f} s")
    return result


if __name__ == "__main__":
    main()
