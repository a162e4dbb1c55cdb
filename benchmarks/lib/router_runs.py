"""Pieces of the router benchmarks (benchmarks/serving/router.py): two workers started as `radixlm` servers, their
load counters (/v1/loads, /cache_state), and --kind feedback's workload and driver (rounds of shuffled prompt
groups, answers' cache counters summed)."""
from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from radixlm.bench.procs import free_port, stop, wait_ready

WORDS = ("river stone lantern orbit meadow copper signal harbor thistle quartz engine falcon velvet canyon ember "
         "glacier atlas prism willow cinder beacon marble tundra saffron compass violet granite ripple anchor "
         "monsoon ledger cobalt juniper summit hollow ferry basalt plume cedar drift").split()


def start_server(port: int, flags: list[str], gpu: str | None = None) -> subprocess.Popen:
    """`python -m radixlm.launch_server` on 127.0.0.1:port (gpu: its CUDA_VISIBLE_DEVICES; None: this process's)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu) if gpu is not None else None
    return subprocess.Popen([sys.executable, "-m", "radixlm.launch_server", "--port", str(port), "--random-seed", "0",
                             "--log-level", "warning", *flags], env=env)


def start_workers(flags: list[str], gpus: list[str] | None) -> tuple[list[subprocess.Popen], list[str]]:
    """Two workers, ready; on a failure the started ones are stopped."""
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{q}" for q in ports]
    procs: list[subprocess.Popen] = []
    try:
        for q, gpu in zip(ports, gpus or [None, None]):
            procs.append(start_server(q, flags, gpu))
        for proc, url in zip(procs, urls):
            wait_ready(proc, url)
    except BaseException:
        stop_all(procs)
        raise
    return procs, urls


def stop_all(procs: list[subprocess.Popen]) -> None:
    for proc in reversed(procs):
        stop(proc)


def worker_stats(urls: list[str]) -> list[dict]:
    return [httpx.get(u + "/v1/loads", timeout=30).json()["loads"][0] for u in urls]


def evicted(workers: list[str]) -> int:
    return sum(httpx.get(w + "/cache_state", timeout=30).json()["evicted_tokens_total"] for w in workers)


def feedback_workload(num_groups: int, rounds: int, words: int, seed: int) -> list[str]:
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


@dataclass(frozen=True)
class Driven:
    failed: int
    cached: int
    prompt: int
    out: int
    seconds: float


async def drive(url: str, prompts: list[str], output_len: int, concurrency: int) -> Driven:
    """Every prompt to url's /generate, `concurrency` at once; the answers' cache counters summed."""
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
    return Driven(totals["failed"], totals["cached"], totals["prompt"], totals["out"], dt)
