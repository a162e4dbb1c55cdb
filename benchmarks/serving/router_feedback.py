"""How honest is the router's approximate tree? Two CPU workers with small KV pools behind a cache_aware router,
a generated-shared-prefix workload with more prompt groups than the pools hold (so the workers evict), run once
without and once with `--cache-feedback`. Reported per run: the router's estimated hit rate (tree match
characters / input characters), the workers' reported hit rate (cached / prompt tokens of the proxied responses),
their absolute gap, the feedback corrections made, and throughput.

    python benchmarks/serving/router_feedback.py [--num-groups 16] [--rounds 5] [--system-prompt-words 200]
                                         [--max-total-tokens 1536] [--output-len 8] [--max-concurrency 4]

Writes benchmarks/results/serving/router_feedback_cpu.json and prints a table.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from radixlm.bench.procs import free_port, start, stop, wait_ready

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serving" / "router_feedback_cpu.json"
WORDS = ("river stone lantern orbit meadow copper signal harbor thistle quartz engine falcon velvet canyon ember "
         "glacier atlas prism willow cinder beacon marble tundra saffron compass violet granite ripple anchor "
         "monsoon ledger cobalt juniper summit hollow ferry basalt plume cedar drift").split()


def workload(num_groups: int, rounds: int, words: int, seed: int) -> list[str]:
    """Each round visits every group once in a fresh random order, so a group comes back only after most of
    the others passed through the (too small) pools."""
    rng = random.Random(seed)
    prefixes = [f"System {g}: " + " ".join(rng.choice(WORDS) for _ in range(words)) + ".\n"
                for g in range(num_groups)]
    prompts = []
    for r in range(rounds):
        order = list(range(num_groups))
        rng.shuffle(order)
        prompts += [prefixes[g] + f"Question {r}: which word above comes first?" for g in order]
    return prompts


@dataclass
class RunResult:
    label: str
    router_flags: list[str]
    requests: int
    failed: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    estimated_hit_rate: float  # router: tree-matched characters / input characters
    reported_hit_rate: float  # workers: cached / prompt tokens of the proxied responses
    abs_gap: float
    driver_reported_hit_rate: float  # the same, summed by this driver from the responses (a cross-check)
    workers_evicted_tokens: int
    corrections: dict


async def drive(url: str, prompts: list[str], output_len: int, concurrency: int) -> tuple[int, int, int, int, float]:
    sem = asyncio.Semaphore(concurrency)
    totals = {"failed": 0, "cached": 0, "prompt": 0, "out": 0}

    async def one(client: httpx.AsyncClient, text: str) -> None:
        async with sem:
            r = await client.post("/generate", json={"text": text, "sampling_params": {
                "max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}})
        if r.status_code != 200:
            totals["failed"] += 1
            return
        meta = r.json()["meta_info"]
        totals["cached"] += meta["cached_tokens"]
        totals["prompt"] += meta["prompt_tokens"]
        totals["out"] += meta["completion_tokens"]

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, p) for p in prompts))
        dt = time.perf_counter() - t0
    return totals["failed"], totals["cached"], totals["prompt"], totals["out"], dt


def evicted(workers: list[str]) -> int:
    return sum(httpx.get(w + "/cache_state", timeout=30).json()["evicted_tokens_total"] for w in workers)


def run_one(label: str, flags: list[str], workers: list[str], prompts: list[str], args) -> RunResult:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    router = start([sys.executable, "-m", "radixlm.router", "--worker-urls", *workers, "--port", str(port),
                    "--policy", "cache_aware", "--log-level", "warning", *flags], url)
    try:
        assert httpx.post(url + "/flush_cache", timeout=60).status_code == 200  # both runs start cold
        ev0 = evicted(workers)
        failed, cached, prompt, out, dt = asyncio.run(drive(url, prompts, args.output_len, args.max_concurrency))
        fb = httpx.get(url + "/cache_feedback", timeout=30).json()
        ev = evicted(workers) - ev0
    finally:
        stop(router)
    est, rep = fb["estimated_cache_hit_rate"], fb["reported_cache_hit_rate"]
    corrections = {k: fb[k] for k in ("clears", "shrinks", "shrunk_chars", "phantom_drops", "phantom_chars",
                                      "polls", "poll_errors", "decisions", "tree_chars")}
    return RunResult(label, flags, len(prompts), failed, round(dt, 2), len(prompts) / dt, out / dt, est, rep,
                     abs(est - rep), cached / prompt if prompt else 0.0, ev, corrections)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--num-groups", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--system-prompt-words", type=int, default=200)
    p.add_argument("--max-total-tokens", type=int, default=1536)
    p.add_argument("--output-len", type=int, default=8)
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument("--feedback-interval", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    # Turn SIGTERM (e.g. from `timeout`) into SystemExit so `finally` stops the servers instead of orphaning them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    prompts = workload(args.num_groups, args.rounds, args.system_prompt_words, args.seed)
    ports = [free_port(), free_port()]
    workers = [f"http://127.0.0.1:{q}" for q in ports]
    procs: list[subprocess.Popen] = []
    try:
        for q in ports:
            procs.append(subprocess.Popen([sys.executable, "-m", "radixlm.launch_server", "--port", str(q),
                                           "--max-total-tokens", str(args.max_total_tokens), "--random-seed", "0",
                                           "--log-level", "warning"]))
        for proc, w in zip(procs, workers):
            wait_ready(proc, w)
        runs = [run_one("cache_aware", [], workers, prompts, args),
                run_one("cache_aware --cache-feedback",
                        ["--cache-feedback", "--cache-feedback-interval", str(args.feedback_interval)],
                        workers, prompts, args)]
    finally:
        for proc in procs:
            stop(proc)
    result = {
        "benchmark": "router_feedback",
        "model": "default (SmolLM2-135M-Instruct)",
        "workload": {"dataset": "generated shared prefix (random words, rounds of shuffled groups)",
                     "num_groups": args.num_groups, "rounds": args.rounds, "requests": len(prompts),
                     "system_prompt_words": args.system_prompt_words, "output_len": args.output_len,
                     "max_concurrency": args.max_concurrency, "seed": args.seed,
                     "prefix_chars_total": sum(len(x.split("\n")[0]) for x in prompts[:args.num_groups])},
        "workers": {"count": 2, "max_total_tokens": args.max_total_tokens},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "command": " ".join(["python", "benchmarks/serving/router_feedback.py", *sys.argv[1:]]),
        "runs": [asdict(r) for r in runs],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'run':32} {'est hit':>8} {'reported':>9} {'|gap|':>7} {'req/s':>7} {'out tok/s':>10} "
          f"{'evicted':>8} {'clears':>6} {'shrinks':>7} {'phantoms':>8}")
    for r in runs:
        c = r.corrections
        print(f"{r.label:32} {r.estimated_hit_rate:8.3f} {r.reported_hit_rate:9.3f} {r.abs_gap:7.3f} "
              f"{r.request_throughput:7.2f} {r.output_throughput:10.1f} {r.workers_evicted_tokens:8d} "
              f"{c['clears']:6d} {c['shrinks']:7d} {c['phantom_drops']:8d}")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
