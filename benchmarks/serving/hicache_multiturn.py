"""The hierarchical KV cache on a multi-turn workload whose working set is several times the device KV pool: the
same conversations with --enable-hierarchical-cache and without, on the in-process Engine (dummy weights).

Each of --clients conversations sends --turns requests; a turn's prompt is the conversation so far (its first turn
--first-len tokens, each later one the previous prompt, the previous answer and --user-len new tokens). Turns go
round-robin over the clients, --max-parallel at a time, so between two turns of one conversation every other
conversation runs once: with a device pool (--max-total-tokens) well under the working set, the plain radix cache
has evicted a conversation's prefix before its next turn; the hierarchical cache keeps it in host memory.

    python benchmarks/serving/hicache_multiturn.py [--pass-clock]       # GPU: Llama-3.1-8B shapes, bf16
    python benchmarks/serving/hicache_multiturn.py --tiny --clients 6 --turns 3 --first-len 64 --user-len 16 \\
        --output-len 4 --max-total-tokens 512 --max-parallel 2          # CPU dry run (tiny shapes)

Reports per run: cache hit rate (cached prompt tokens / prompt tokens), TTFT mean/p50/p90 (streamed, first token),
end-to-end time, request and token throughput; a table, and JSON at --out (default
benchmarks/results/serving/hicache_multiturn.json).

--null-runner: the scheduler's host work on the same request stream without a model (benchmarks/lib/hicache_null.py):
the real Scheduler, tree and host tier over lib/null_runner.py's runner, a KV pool of --max-total-tokens tokens and
Llama-3.1-8B's 32 layers (rows of 8 bytes; on --null-kv-device cuda the host tier's copies are the server's kernels,
events and streams), for --modes (off, write_through, write_back): host ms per round, per request and per prefill round
by phase, prefill passes and tokens per pass, rounds from arrival to admission; a table, and JSON at --out (default
benchmarks/results/serving/hicache_null_runner.json). Seconds on any machine:

    python benchmarks/serving/hicache_multiturn.py --null-runner [--null-kv-device cpu] [--profile]"""
from __future__ import annotations

import argparse
import json
import platform
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.lib.models import model_dir, tiny_model_dir  # noqa: E402
from benchmarks.lib.profiling import PassClock, pass_buckets  # noqa: E402
from radixlm import Engine  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serving" / "hicache_multiturn.json"
NULL_RESULTS = RESULTS.with_name("hicache_null_runner.json")


def conversations(args) -> list[list[list[int]]]:
    """Per client, the new tokens of each turn (the first turn's prompt, then each user message)."""
    g = torch.Generator().manual_seed(args.seed)
    lo, hi = 1000, 30000  # ordinary tokens of the Llama-3 vocabulary (no special ids)
    return [[torch.randint(lo, hi, (args.first_len if t == 0 else args.user_len,), generator=g).tolist()
             for t in range(args.turns)] for _ in range(args.clients)]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def allocator_counts() -> dict[str, int]:
    """CUDA caching allocator counters (cudaMalloc calls, and retries after freeing the cache: each one waits for the
    device): whether a run's host work stalls on allocations."""
    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ("num_device_alloc", "num_alloc_retries", "num_sync_all_streams")}


def run(args, path: str, hierarchical: bool, convs) -> dict:
    kw = dict(load_format="dummy", random_seed=0, max_total_tokens=args.max_total_tokens,
              context_length=args.first_len + args.turns * (args.user_len + args.output_len) + 64,
              enable_hierarchical_cache=hierarchical)
    if hierarchical:
        kw.update(hicache_ratio=args.hicache_ratio, hicache_write_policy=args.write_policy)
    if args.tiny:
        kw.update(device="cpu", dtype="float32")
    else:
        kw.update(device="cuda", dtype="bfloat16")
    t0 = time.perf_counter()
    engine = Engine(path, **kw)
    startup = time.perf_counter() - t0
    params = {"temperature": 0.0, "max_new_tokens": args.output_len, "ignore_eos": True}
    history = [[] for _ in convs]
    records: list[dict] = []
    lock = threading.Lock()

    def one(client: int, turn: int) -> None:
        ids = history[client] + convs[client][turn]
        start = time.perf_counter()
        first = None
        final = None
        for snap in engine.generate(input_ids=ids, sampling_params=params, stream=True):
            if first is None and snap.get("output_ids"):
                first = time.perf_counter() - start
            final = snap
        with lock:
            history[client] = ids + final["output_ids"]
            meta = final["meta_info"]
            records.append({"client": client, "turn": turn, "prompt_tokens": len(ids),
                            "cached_tokens": meta["cached_tokens"], "output_tokens": len(final["output_ids"]),
                            "ttft_s": first, "latency_s": time.perf_counter() - start})

    try:
        # Warm-up outside the measurement (CUDA graphs, kernels' first calls), then a clean cache.
        engine.generate(input_ids=[[7] * 32] * 2, sampling_params={**params, "max_new_tokens": 2})
        engine.flush_cache()
        clock = PassClock(engine) if args.pass_clock else None
        before = allocator_counts()
        t0 = time.perf_counter()
        for turn in range(args.turns):
            todo: queue.Queue = queue.Queue()
            for c in range(len(convs)):
                todo.put(c)

            def worker() -> None:
                while True:
                    try:
                        c = todo.get_nowait()
                    except queue.Empty:
                        return
                    one(c, turn)

            threads = [threading.Thread(target=worker) for _ in range(args.max_parallel)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        wall = time.perf_counter() - t0
        passes = pass_buckets(clock.passes()) if clock is not None else None
        allocs = {k: v - before.get(k, 0) for k, v in allocator_counts().items()}
    finally:
        engine.shutdown()
    prompt = sum(r["prompt_tokens"] for r in records)
    cached = sum(r["cached_tokens"] for r in records)
    later = [r for r in records if r["turn"] > 0]
    ttft = [r["ttft_s"] for r in records if r["ttft_s"] is not None]
    out_tokens = sum(r["output_tokens"] for r in records)
    return {
        "hierarchical_cache": hierarchical, "startup_s": round(startup, 2), "wall_s": round(wall, 3),
        "requests": len(records), "prompt_tokens": prompt, "cached_tokens": cached,
        "hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        "hit_rate_after_first_turn": round(sum(r["cached_tokens"] for r in later) /
                                           max(1, sum(r["prompt_tokens"] for r in later)), 4),
        "ttft_mean_s": round(statistics.fmean(ttft), 4) if ttft else None,
        "ttft_p50_s": round(pct(ttft, 0.5), 4), "ttft_p90_s": round(pct(ttft, 0.9), 4),
        "request_throughput": round(len(records) / wall, 3),
        "input_token_throughput": round(prompt / wall, 1), "output_token_throughput": round(out_tokens / wall, 1),
        **({"passes": passes} if passes is not None else {}),
        **({"cuda_allocator": allocs} if allocs else {}),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny random Llama on the CPU (a dry run of the GPU one)")
    p.add_argument("--clients", type=int, default=48)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--first-len", type=int, default=1024)
    p.add_argument("--user-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-parallel", type=int, default=16)
    p.add_argument("--max-total-tokens", type=int, default=36864, help="device KV pool (tokens)")
    p.add_argument("--hicache-ratio", type=float, default=5.0)
    p.add_argument("--write-policy", default="write_through")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", choices=("on", "off"), help="run one configuration")
    p.add_argument("--out", type=Path, default=None, help=f"JSON (default {RESULTS.name}, or {NULL_RESULTS.name})")
    p.add_argument("--null-runner", action="store_true", help="host work per round without a model (no engine)")
    p.add_argument("--modes", default="off,write_through,write_back", help="--null-runner's configurations")
    p.add_argument("--null-kv-device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="--null-runner: where the KV pool (and so the host tier's copies) lives")
    p.add_argument("--page-size", type=int, default=1, help="--null-runner: KV page size (the server's default)")
    p.add_argument("--integrity-check", action="store_true", help="--null-runner: the accounting check every round")
    p.add_argument("--per-request-loads", action="store_true",
                   help="--null-runner: issue each request's load at its admission (the CPU server's rule, and CUDA's "
                        "before 2026-11-29) instead of once per round (CUDA's)")
    p.add_argument("--profile", action="store_true", help="--null-runner: cProfile's top functions (tottime)")
    p.add_argument("--profile-top", type=int, default=30)
    p.add_argument("--pass-clock", action="store_true",
                   help="CUDA: each pass's device time and the idle gaps before it, by prefill / decode batch size "
                        "(benchmarks/lib/profiling.py PassClock): where a run's seconds go")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = NULL_RESULTS if args.null_runner else RESULTS
    if args.null_runner:
        return null_runner(args, argv)
    final_ctx = args.first_len + (args.turns - 1) * (args.user_len + args.output_len) + args.output_len
    working_set = args.clients * final_ctx
    print(f"working set {working_set} tokens = {working_set / args.max_total_tokens:.1f} x the device pool "
          f"({args.max_total_tokens})", flush=True)
    path = tiny_model_dir() if args.tiny else model_dir()
    convs = conversations(args)
    runs = [run(args, path, h, convs) for h in (False, True) if args.only in (None, "on" if h else "off")]
    header = ("hicache", "hit rate", "hit (turns>1)", "TTFT mean", "TTFT p90", "wall s", "req/s", "in tok/s")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in runs:
        print(f"| {'on' if r['hierarchical_cache'] else 'off'} | {r['hit_rate']:.3f} | "
              f"{r['hit_rate_after_first_turn']:.3f} | {r['ttft_mean_s']} | {r['ttft_p90_s']} | {r['wall_s']} | "
              f"{r['request_throughput']} | {r['input_token_throughput']} |")
    for r in runs:
        for b in r.get("passes") or []:
            print(f"{'on' if r['hierarchical_cache'] else 'off'} {b['bucket']:>8}: {b['passes']:5d} passes, "
                  f"busy {b['busy_s']:.2f} s, idle before them {b['idle_s']:.2f} s ({b['share']:.1%} of the span)")
    report = {
        "command": "python benchmarks/serving/hicache_multiturn.py " + " ".join(argv if argv is not None else
                                                                              sys.argv[1:]),
        "model": "tiny random Llama (CPU)" if args.tiny else "Llama-3.1-8B shapes, dummy weights, bf16",
        "device": platform.node() if args.tiny else torch.cuda.get_device_name(0),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "working_set_tokens": working_set, "working_set_over_pool": round(working_set / args.max_total_tokens, 2),
        "runs": runs,
    }
    if len(runs) == 2 and runs[0]["request_throughput"]:
        report["throughput_ratio_on_over_off"] = round(runs[1]["request_throughput"] / runs[0]["request_throughput"], 3)
        report["ttft_mean_ratio_on_over_off"] = round(runs[1]["ttft_mean_s"] / runs[0]["ttft_mean_s"], 3)
        print(f"throughput on/off: {report['throughput_ratio_on_over_off']}x; TTFT mean on/off: "
              f"{report['ttft_mean_ratio_on_over_off']}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def null_runner(args, argv: list[str] | None) -> dict:
    from benchmarks.lib.hicache_null import MODES, run_mode, table

    modes = args.modes.split(",")
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"--modes: unknown {sorted(unknown)}; choose from {', '.join(MODES)}")
    convs = conversations(args)
    runs = []
    for mode in modes:
        runs.append(run_mode(args, mode, convs, profile=args.profile))
        print(f"{mode}: host {runs[-1]['host_s_total']:.3f} s ({runs[-1]['host_s_prefill_rounds']:.3f} s in prefill "
              f"rounds), {runs[-1]['rounds']} rounds", flush=True)
    print(table(runs))
    report = {
        "command": "python benchmarks/serving/hicache_multiturn.py " + " ".join(argv if argv is not None else
                                                                              sys.argv[1:]),
        "machine": platform.node(), "processor": platform.processor() or platform.machine(),
        "device": torch.cuda.get_device_name(0) if args.null_kv_device == "cuda" else "cpu",
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
