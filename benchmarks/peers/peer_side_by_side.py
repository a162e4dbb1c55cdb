"""radixlm on the workloads of ../shared/reference/peer-anchors.md, beside the peers' figures (issue 20, deliverable 4):
the decode step at batch 1..256 ((t257 - t1) / 256, fresh 512-token prompts), ShareGPT-like (1000 requests, seed 1),
random 1024/512 (500 requests), generated-shared-prefix (32 x 32, 2048 + 128 tokens, 64 out, shuffled) and start-up
to ready; Llama-3.1-8B shapes, bf16, dummy weights, token-id prompts, greedy, EOS ignored, one engine with the
defaults (plus --engine-args) per run (benchmarks/offline/gpu_llama8b.py ab_workloads).

Each run is a fresh Python process with TRITON_CACHE_DIR=--cache-dir: run index 1 wipes it first (an empty kernel
cache: cold), later indexes find what earlier runs left on this machine (warm; a fresh machine makes them cold, and
the run records it). Start-up = spawn of the process to the engine ready (imports included). Each run writes
peer_NAME_rI.json; `merge` takes the medians over runs (metric by metric), sets them beside the peers (PEERS) and
issue 20's targets (TARGETS, met or missed), writes one JSON and prints a markdown table.

`passes`: where ShareGPT-like's wall time goes by batch size (issue 20: at 726b0a8 the decode steps of 5-32 requests
got 0.26-0.37 ms faster, and a no-idle model of the run gave 0.16 s less over its tail, where the run measured 0.02 s
less). One engine (the runs': Llama-3.1-8B shapes, dummy bf16 weights, defaults), the peer workload (1000 requests,
seed 1) run --runs times with lib.profiling.PassClock attached: CUDA events around each pass's launch. Per bucket of
decode passes by row count it prints and writes the passes, their device time (mean), the device's idle time before
them (mean gap) and the bucket's share of the run; prefill passes likewise. A tail that the host holds up shows as
gaps; one dearer than the decode curve, as pass time. --exclude leaves GEMM kernels out of start-up's few-row
choice (gemm.GemmKernel names), for an A/B against the default in one call; --no-chunked: decode attention splits at
every batch size.

    python benchmarks/peers/peer_side_by_side.py run 1 2 3 --out-dir $OUT [--name NAME --engine-args JSON]
    python benchmarks/peers/peer_side_by_side.py merge FILE... --out benchmarks/results/peers/peer_side_by_side_NAME.json
    python benchmarks/peers/peer_side_by_side.py run 1 2 3 --tiny --out-dir /tmp/peer   # CPU dry run (tiny random Llama)
    python benchmarks/peers/peer_side_by_side.py passes --runs 2 [--exclude skinny_mma] [--engine-args '{...}'] \
        [--no-chunked] --out $OUT/sharegpt_passes_default.json     # --tiny --runs 1: here, on the CPU (walls only)

On the GPU through benchmarks/lease/peer_lease.sh (carry [".whl"]); one full run is ~150 s warm, ~180 s cold (estimates:
engine start ~35 s, decode table ~35 s, ShareGPT-like ~18 s, random ~45 s, shared prefix ~15 s), so a device call
(killed at 600 s) holds two runs: `run` skips a run that would not end inside --budget-s."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

BATCHES = [1, 8, 32, 64, 128, 256]
THROUGHPUT = ("sharegpt_like_output_tok_s", "random_1024_512_output_tok_s", "shared_prefix_output_tok_s")
SGLANG = "sglang_0.5.17_2026-11-23"
SGLANG_COLD_WARM = "sglang_0.5.17_2026-11-22"  # start-up with the cache state known (11-23 gives 131 s, state unstated)
# The peer figures, fields as a run's; decode_step_ms by batch; startup_s_cold / _warm where the cache state is known.
PEERS = {
    "vllm_0.26.0_2026-11-22": {
        "source": "peer-anchors.md, ## Results (measured 2026-11-22, one H100 80GB HBM3), column vLLM 0.26.0",
        "decode_step_ms": {"1": 6.50, "8": 6.85, "32": 7.62, "64": 8.89, "128": 11.25, "256": 16.49},
        "sharegpt_like_output_tok_s": 8786, "random_1024_512_output_tok_s": 6463, "shared_prefix_output_tok_s": 5308,
        "startup_s_cold": 101, "startup_s_warm": 61},
    SGLANG_COLD_WARM: {
        "source": "peer-anchors.md, ## Results (measured 2026-11-22, one H100 80GB HBM3), column SGLang 0.5.17",
        "decode_step_ms": {"1": 6.37, "8": 6.76, "32": 7.62, "64": 8.86, "128": 11.28, "256": 16.38},
        "sharegpt_like_output_tok_s": 8961, "random_1024_512_output_tok_s": 6490, "shared_prefix_output_tok_s": 5228,
        "startup_s_cold": 109, "startup_s_warm": 51},
    SGLANG: {
        "source": "peer-anchors.md, ## Re-measured 2026-11-23: radixlm and SGLang side by side in one lease, column "
                  "SGLang 0.5.17 (issue 20's targets are set against it)",
        "decode_step_ms": {"1": 6.37, "8": 6.79, "32": 7.73, "64": 8.91, "128": 11.23, "256": 16.31},
        "sharegpt_like_output_tok_s": 9512, "random_1024_512_output_tok_s": 6473, "shared_prefix_output_tok_s": 5269,
        "startup_s": 131},
    "radixlm_b52ca7f_2026-11-23": {
        "source": "peer-anchors.md, ## Re-measured 2026-11-23, column radixlm (run 1), cold kernel cache",
        "decode_step_ms": {"1": 5.69, "8": 6.68, "32": 7.88, "64": 8.66, "128": 11.25, "256": 16.89},
        "sharegpt_like_output_tok_s": 9045, "random_1024_512_output_tok_s": 6035, "shared_prefix_output_tok_s": 4393,
        "startup_s_cold": 44.6},
}
# Every PEERS figure and issue 20's targets were measured on this GPU model: runs on another get no ratio or verdict.
PEERS_GPU = "NVIDIA H100 80GB HBM3"
# Issue 20, "Done when": (metric, "min" = at least | "max" = at most, bound).
TARGETS = [("shared_prefix_output_tok_s", "min", 6320), ("sharegpt_like_output_tok_s", "min", 10460),
           ("random_1024_512_output_tok_s", "min", 7120), ("decode_step_ms.256", "max", 15.0),
           ("decode_step_ms.1", "max", 5.69), ("startup_s_cold", "max", 45.0)]
TINY_SIZES = {"prompt_len": 32, "sharegpt": (24, 96, 12), "random": (6, 64, 12), "prefix": (2, 4, 64, 16, 16)}


def log(*a) -> None:
    print(*a, flush=True)


def figures(raw: dict, startup_s: float | None) -> dict:
    """The peer fields from ab_workloads' result (what is measured so far)."""
    out: dict = {}
    if "decode" in raw:
        out["decode_step_ms"] = {str(r["batch"]): r["step_ms"] for r in raw["decode"]}
    for key, field in zip(("sharegpt_like", "random_1024_512", "shared_prefix"), THROUGHPUT):
        if key in raw:
            out[field] = raw[key]["output_tokens_per_s"]
    if startup_s is not None:
        out["startup_s"] = startup_s
    return out


def child(args) -> None:
    """One run in this process: engine start-up (timed from the parent's spawn) and the workloads."""
    import random

    import torch

    from benchmarks.lib import engine as engine_lib
    from benchmarks.lib.engine import PEER_SIZES, ab_workloads, close, make_engine
    from benchmarks.lib.models import model_dir, tiny_model_dir
    from benchmarks.lib.profiling import cache_entries
    from radixlm import Engine
    from radixlm.bench.datasets import PromptSource
    from radixlm.runtime.kernels.gemm import format_gemm_choices

    imported_at = time.time()
    engine_args = json.loads(args.engine_args)
    cache_dir = os.environ.get("TRITON_CACHE_DIR", "")
    kernels0 = cache_entries(cache_dir)
    path = tiny_model_dir() if args.tiny else model_dir()
    out = Path(args.out_dir) / f"peer_{args.name}_r{args.run_index}.json"
    run = {"benchmark": "peer_side_by_side", "name": args.name, "run_index": args.run_index, "tiny": args.tiny,
           "engine_args": engine_args, "kernel_cache": "warm" if kernels0 else "cold",
           "triton_cache_kernels_at_start": kernels0, "host": os.uname().nodename, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    run["imports_s"] = imported_at - args.spawned_at  # interpreter start and imports (start-up's share outside Engine)
    run["before_engine_s"] = time.time() - args.spawned_at
    t0 = time.perf_counter()
    if args.tiny:
        engine = Engine(path, load_format="dummy", dtype="float32", device="cpu", context_length=4096, random_seed=0,
                        max_total_tokens=16384, **engine_args)
    else:

        engine_lib.ENGINE_ARGS.update(engine_args)
        engine = make_engine(path)
    run["engine_init_s"] = time.perf_counter() - t0
    run["startup_s"] = time.time() - args.spawned_at
    run["triton_cache_kernels_after_startup"] = cache_entries(cache_dir)
    run["gemm_choices"] = engine.runner.gemm_choice_counts()  # few-row GEMMs: layers per kernel by choice key
    if run["gemm_choices"]:
        log(f"run {args.run_index}: few-row GEMMs (rows or padded rows: kernel layers): "
            + format_gemm_choices(run["gemm_choices"]))
    log(f"run {args.run_index}: ready {run['startup_s']:.1f} s after spawn (imports {run['imports_s']:.1f} s, "
        f"Engine() {run['engine_init_s']:.1f} s), "
        f"kernel cache {run['kernel_cache']} ({kernels0} kernels)")
    raw: dict = {}

    def checkpoint() -> None:
        run.update(figures(raw, run["startup_s"]), raw=raw, bench_seconds=time.time() - args.spawned_at)
        out.write_text(json.dumps(run, indent=1) + "\n")

    from transformers import AutoTokenizer  # after ready: the harness's own import is not the engine's start-up

    src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
    try:
        checkpoint()
        ab_workloads(engine, src, [1, 2, 4] if args.tiny else BATCHES, 4 if args.tiny else 256,
                     TINY_SIZES if args.tiny else PEER_SIZES, mfu=not args.tiny, result=raw, checkpoint=checkpoint)
        run["triton_cache_kernels_at_end"] = cache_entries(cache_dir)
        checkpoint()
    finally:
        close(engine)
        if args.tiny:
            shutil.rmtree(path, ignore_errors=True)
    log(f"wrote {out}")


def run_all(args) -> None:
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0, last = time.time(), 0.0
    for i in args.indexes:
        left = args.budget_s - (time.time() - t0)
        if last and left < 1.1 * last:  # a run that cannot end inside the call's budget is left to the next call
            log(f"run {i}: skipped, {left:.0f} s of the budget left and the last run took {last:.0f} s")
            continue
        if i == 1:
            shutil.rmtree(args.cache_dir, ignore_errors=True)
        env = dict(os.environ, TRITON_CACHE_DIR=args.cache_dir, PYTHONUNBUFFERED="1")
        cmd = [sys.executable, __file__, "child", "--run-index", str(i), "--spawned-at", str(time.time()),
               "--out-dir", str(out_dir), "--name", args.name, "--engine-args", args.engine_args]
        cmd += ["--tiny"] if args.tiny else []
        t1 = time.time()
        try:
            rc = subprocess.run(cmd, env=env, timeout=max(left, 1)).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        last = time.time() - t1
        log(f"run {i}: rc {rc} in {last:.0f} s")
    files = sorted(out_dir.glob(f"peer_{args.name}_r*.json"))
    if files:
        merge([str(f) for f in files], str(out_dir / f"peer_{args.name}.json"))


def _get(d: dict, metric: str):
    for part in metric.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict]) -> dict:
    """Medians over runs, metric by metric (a run cut short counts for what it measured), and the targets' verdicts."""
    med = {"decode_step_ms": {}, "runs": len(runs)}
    for b in sorted({b for r in runs for b in r.get("decode_step_ms", {})}, key=int):
        med["decode_step_ms"][b] = _median([_get(r, f"decode_step_ms.{b}") for r in runs])
    for field in THROUGHPUT:
        med[field] = _median([r.get(field) for r in runs])
    for state in ("cold", "warm"):
        med[f"startup_s_{state}"] = _median([r.get("startup_s") for r in runs if r.get("kernel_cache") == state])
    gpus = {r.get("gpu") for r in runs}
    if len(gpus) > 1:
        raise SystemExit(f"runs on several GPU models: {sorted(map(str, gpus))}")
    gpu = gpus.pop() if gpus else None
    comparable = gpu is None or gpu == PEERS_GPU  # None: the CPU dry run (--tiny) or a run that did not record it
    verdicts = []
    for metric, sense, bound in TARGETS:
        v = _get(med, metric)
        met = None if v is None or not comparable else (v >= bound if sense == "min" else v <= bound)
        verdicts.append({"metric": metric, "target": f"{'>=' if sense == 'min' else '<='} {bound}", "bound": bound,
                         "value": v, "met": met})
    return {"medians": med, "comparable_to_peers": comparable, "targets": verdicts}


def table(summary: dict, runs: list[dict]) -> str:
    med, sg = summary["medians"], PEERS[SGLANG]
    verdict = {t["metric"]: t for t in summary["targets"]}
    rows = [(f"decode step, batch {b} (ms)", f"decode_step_ms.{b}", "time") for b in med["decode_step_ms"]]
    rows += [(f"{f.rsplit('_output', 1)[0]}, output tok/s", f, "rate") for f in THROUGHPUT]
    rows += [("start-up to ready, cold (s)", "startup_s_cold", "time"),
             ("start-up to ready, warm (s)", "startup_s_warm", "time")]
    lines = ["| metric | radixlm median | runs | SGLang 0.5.17 (11-23; start-up 11-22) | vLLM 0.26.0 "
             "| radixlm / SGLang (speed) | target | met |", "|---|---|---|---|---|---|---|---|"]

    def fmt(v):
        return "-" if v is None else (f"{v:,.0f}" if v >= 1000 else f"{v:.2f}")

    for label, metric, sense in rows:
        v = _get(med, metric)
        key = "startup_s" if metric.startswith("startup") else metric
        each = " / ".join(fmt(_get(r, key)) for r in runs
                          if not metric.startswith("startup") or r.get("kernel_cache") == metric.rsplit("_", 1)[1])
        peer = _get(sg, metric) if _get(sg, metric) is not None else _get(PEERS[SGLANG_COLD_WARM], metric)
        ratio = None if v is None or peer is None else (v / peer if sense == "rate" else peer / v)
        t, vllm = verdict.get(metric), _get(PEERS["vllm_0.26.0_2026-11-22"], metric)
        shown = "-" if ratio is None else f"{ratio:.2f}x" if summary["comparable_to_peers"] else "n/a"
        lines.append(f"| {label} | {fmt(v)} | {each or '-'} | {fmt(peer)} | {fmt(vllm)} "
                     f"| {shown} | {t['target'] if t else ''} "
                     f"| {'' if not t else {True: 'yes', False: 'NO', None: '-'}[t['met']]} |")
    if not summary["comparable_to_peers"]:
        lines.append(f"\nradixlm ran on {runs[0]['gpu']}; the peers' figures and the targets are for {PEERS_GPU}: "
                     "no ratio or verdict across GPU models.")
    return "\n".join(lines)


def merge(files: list[str], out: str) -> dict:
    runs = sorted((json.loads(Path(f).read_text()) for f in files), key=lambda r: (r.get("name", ""), r["run_index"]))
    names = {r.get("name") for r in runs}
    if len(names) > 1:
        raise SystemExit(f"runs of several configurations: {sorted(names)}")
    summary = summarize(runs)
    hosts = sorted({r.get("host") for r in runs})
    result = {"benchmark": "peer_side_by_side", "name": runs[0].get("name"), "engine_args": runs[0].get("engine_args"),
              "workloads": "../shared/reference/peer-anchors.md", "hosts": hosts, "gpu": runs[0].get("gpu"),
              "kernel_cache_by_run": {r["run_index"]: r.get("kernel_cache") for r in runs},
              **summary, "peers": PEERS, "table": table(summary, runs),
              "runs": runs}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    log(result["table"])
    log(f"runs {[r['run_index'] for r in runs]}, kernel cache {result['kernel_cache_by_run']}, hosts {hosts}")
    log(f"wrote {out}")
    return result


def passes(args) -> dict:
    """`passes`: ShareGPT-like's passes bucketed by row count, --runs times on one engine (the module docstring)."""
    import random

    import torch
    from transformers import AutoTokenizer

    from benchmarks.lib.engine import PEER_SIZES, close, make_engine, offline_run
    from benchmarks.lib.models import model_dir, tiny_model_dir
    from benchmarks.lib.profiling import PassClock, exclude_gemm_kernels, pass_buckets
    from radixlm import Engine
    from radixlm.bench.datasets import PromptSource, sharegpt_like_dataset

    engine_args = json.loads(args.engine_args)
    if args.exclude:
        exclude_gemm_kernels(args.exclude)
    if args.no_chunked:
        from radixlm.runtime.kernels.attention import decode_splits

        decode_splits.DECODE_CHUNK_MAX_ROWS = 0  # decode_chunk_capacity: 0 at every batch size
    if args.tiny:
        path = tiny_model_dir()
        engine = Engine(path, load_format="dummy", dtype="float32", device="cpu", context_length=4096,
                        random_seed=0, max_total_tokens=16384, **engine_args)
        n, max_in, max_out = TINY_SIZES["sharegpt"]
    else:
        path = model_dir()
        engine = make_engine(path, **engine_args)
        n, max_in, max_out = PEER_SIZES["sharegpt"]
    result = {"benchmark": "sharegpt_passes", "command": " ".join(["python", *sys.argv]), "excluded": args.exclude,
              "chunked": not args.no_chunked, "engine_args": engine_args,
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "gemm_choices": engine.runner.gemm_choice_counts(), "runs": []}
    try:
        src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
        for i in range(args.runs):
            reqs = sharegpt_like_dataset(src, n, seed=1, max_input_len=max_in, max_output_len=max_out)
            clock = PassClock(engine)
            try:
                row = offline_run(engine, reqs, f"sharegpt-like run {i + 1}", mfu=not args.tiny)
            finally:
                clock.detach()
            row["buckets"] = pass_buckets(clock.passes())
            for b in row["buckets"]:
                gap = "-" if b["gap_us_mean"] is None else f"{b['gap_us_mean']:7.1f}"
                log(f"  {b['bucket']:>8}: {b['passes']:5d} passes, pass {b['pass_us_mean']:9.1f} us, gap {gap} us, "
                    f"busy {b['busy_s']:6.2f} s, idle {b['idle_s']:5.2f} s, {b['share']:6.1%} of the device's span")
            result["runs"].append(row)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    finally:
        close(engine)
        if args.tiny:
            shutil.rmtree(path, ignore_errors=True)
    log(f"wrote {args.out}")
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "child"):
        s = sub.add_parser(name)
        s.add_argument("--out-dir", required=True)
        s.add_argument("--name", default="default", help="the configuration's name (file names)")
        s.add_argument("--engine-args", default="{}", help="JSON: server arguments on top of the defaults")
        s.add_argument("--tiny", action="store_true", help="CPU dry run: tiny random Llama, float32, small workloads")
    r = sub.choices["run"]
    r.add_argument("indexes", type=int, nargs="+", help="run indexes; 1 wipes the kernel cache first")
    r.add_argument("--cache-dir", default="/tmp/radixlm_peer_triton_cache")
    r.add_argument("--budget-s", type=float, default=540.0, help="seconds this invocation may take")
    c = sub.choices["child"]
    c.add_argument("--run-index", type=int, required=True)
    c.add_argument("--spawned-at", type=float, required=True)
    m = sub.add_parser("merge")
    m.add_argument("files", nargs="+")
    m.add_argument("--out", required=True)
    s = sub.add_parser("passes")
    s.add_argument("--runs", type=int, default=2)
    s.add_argument("--exclude", nargs="*", default=[], metavar="KERNEL", help="skinny, skinny_mma")
    s.add_argument("--tiny", action="store_true", help="CPU dry run: tiny random Llama, float32, 24 requests")
    s.add_argument("--engine-args", default="{}", help="JSON: server arguments on top of the defaults")
    s.add_argument("--no-chunked", action="store_true", help="decode attention splits at every batch size (A/B)")
    s.add_argument("--out", default="/tmp/sharegpt_passes.json")
    args = p.parse_args(argv)
    if args.cmd == "child":
        child(args)
    elif args.cmd == "run":
        run_all(args)
    elif args.cmd == "passes":
        passes(args)
    else:
        merge(args.files, args.out)


if __name__ == "__main__":
    main()
