"""Data-parallel serving through the router: two workers (on one GPU, each with its own KV pool; or on the CPU)
behind `radixlm router`, the generated-shared-prefix workload, `cache_aware` vs `round_robin`: throughput, the
workers' cache hit rate (cached / prompt tokens, from /v1/loads) and how the requests spread over the workers.

    python benchmarks/serving/router_dp.py --model llama-3.1-8b --load-format dummy --device cuda --dtype bfloat16 \\
        --max-total-tokens 70000 --num-groups 32 --prompts-per-group 8 --system-prompt-len 4096 \\
        --question-len 64 --output-len 16 --max-concurrency 16 --order rounds --out router_dp_gpu.json

(benchmarks/lease/staged_gpu.sh on the GPU machine, retired: git show 1be8d06:benchmarks/lease/staged_gpu.sh). The KV pools are sized so that every group's prefix fits in the
two pools together but not in one: routing decides whether each prefix is cached once or on both workers (and
evicted). With prompts arriving in rounds (interleaved sessions), a worker that sees every group cycles through
more prefixes than it holds; with a shuffled order some of a group's prompts still arrive close together.
`--model llama-3.1-8b` is the Llama-3.1-8B architecture kept in benchmarks/models (use --load-format dummy)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from radixlm.bench.datasets import GSP_ORDERS
from radixlm.bench.procs import free_port, stop, wait_ready
from radixlm.bench.serving import main as bench_main

def worker_stats(urls: list[str]) -> list[dict]:
    return [httpx.get(u + "/v1/loads", timeout=30).json()["loads"][0] for u in urls]


def run_single(worker: str, bench_args: list[str]) -> dict:
    """The same workload sent to one worker directly: what one replica does alone."""
    port = worker.rsplit(":", 1)[1]
    httpx.post(worker + "/flush_cache", timeout=60)
    before = worker_stats([worker])[0]
    report = bench_main(["--port", port, *bench_args])
    after = worker_stats([worker])[0]
    report.pop("config", None)
    cached = after["cached_tokens_total"] - before["cached_tokens_total"]
    prompt = after["prompt_tokens_total"] - before["prompt_tokens_total"]
    return {"policy": "one replica, no router", "worker_cached_tokens": [cached], "worker_prompt_tokens": [prompt],
            "worker_hit_rate": cached / max(1, prompt), **report}


def run_policy(policy: str, workers: list[str], args, bench_args: list[str]) -> dict:
    port = free_port()
    router = subprocess.Popen([sys.executable, "-m", "radixlm.router", "--worker-urls", *workers, "--port", str(port),
                               "--policy", policy, "--log-level", "warning"])
    try:
        wait_ready(router, f"http://127.0.0.1:{port}")
        for w in workers:
            httpx.post(w + "/flush_cache", timeout=60)
        before = worker_stats(workers)
        report = bench_main(["--port", str(port), *bench_args])
        after = worker_stats(workers)
    finally:
        stop(router)
    cached = [a["cached_tokens_total"] - b["cached_tokens_total"] for a, b in zip(after, before)]
    prompt = [a["prompt_tokens_total"] - b["prompt_tokens_total"] for a, b in zip(after, before)]
    report.pop("config", None)
    return {"policy": policy, "worker_cached_tokens": cached, "worker_prompt_tokens": prompt,
            "worker_hit_rate": sum(cached) / max(1, sum(prompt)), "requests_per_worker_share":
            [p / max(1, sum(prompt)) for p in prompt], **report}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--load-format", default="auto", help="dummy: random weights (with --model llama-3.1-8b)")
    p.add_argument("--order", default="shuffled", choices=GSP_ORDERS, help="arrival order of the prompts")
    p.add_argument("--max-total-tokens", type=int, default=40000)
    p.add_argument("--num-groups", type=int, default=32)
    p.add_argument("--prompts-per-group", type=int, default=8)
    p.add_argument("--system-prompt-len", type=int, default=1024)
    p.add_argument("--question-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--worker-gpus", nargs="+", default=None,
                   help="one CUDA_VISIBLE_DEVICES value per worker (one replica per GPU); default: all share the device")
    p.add_argument("--single-replica", action="store_true", help="also send the workload to one worker alone")
    p.add_argument("--out", default="benchmarks/results/serving/router_dp.json")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.model == "llama-3.1-8b":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from benchmarks.lib.models import model_dir

        args.model = model_dir()
    ports = [free_port(), free_port()]
    workers = [f"http://127.0.0.1:{q}" for q in ports]
    flags = ["--model-path", args.model, "--device", args.device, "--dtype", args.dtype, "--max-total-tokens",
             str(args.max_total_tokens), "--load-format", args.load_format, "--random-seed", "0", "--log-level", "warning"]
    envs = [dict(os.environ, CUDA_VISIBLE_DEVICES=g) for g in args.worker_gpus] if args.worker_gpus else [None] * 2
    procs = [subprocess.Popen([sys.executable, "-m", "radixlm.launch_server", "--port", str(q), *flags], env=env)
             for q, env in zip(ports, envs)]
    bench_args = ["--backend", "radixlm", "--tokenizer", args.model, "--dataset-name", "generated-shared-prefix",
                  "--gsp-num-groups", str(args.num_groups), "--gsp-prompts-per-group", str(args.prompts_per_group),
                  "--gsp-system-prompt-len", str(args.system_prompt_len), "--gsp-question-len", str(args.question_len),
                  "--gsp-output-len", str(args.output_len), "--gsp-order", args.order,
                  "--max-concurrency", str(args.max_concurrency),
                  "--seed", str(args.seed), "--warmup-requests", "2", "--disable-tqdm"]
    try:
        for proc, url in zip(procs, workers):
            wait_ready(proc, url)
        runs = [run_policy(policy, workers, args, bench_args) for policy in ("cache_aware", "round_robin")]
        if args.single_replica:
            runs.append(run_single(workers[0], bench_args))
    finally:
        for proc in procs:
            stop(proc)
    ca, rr = runs[:2]
    result = {
        "benchmark": "router_dp", "workers": 2, "model": args.model, "device": args.device,
        "workload": {k: getattr(args, k) for k in ("num_groups", "prompts_per_group", "system_prompt_len",
                                                     "question_len", "output_len", "max_concurrency", "seed", "order")},
        "worker_max_total_tokens": args.max_total_tokens,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "command": " ".join(["python", *sys.argv]),
        "ratios_cache_aware_over_round_robin": {
            "request_throughput": ca["request_throughput"] / rr["request_throughput"],
            "output_throughput": ca["output_throughput"] / rr["output_throughput"],
            "worker_hit_rate": ca["worker_hit_rate"] / max(rr["worker_hit_rate"], 1e-9),
        },
        "ratios_cache_aware_over_one_replica": {
            "request_throughput": ca["request_throughput"] / runs[2]["request_throughput"],
            "output_throughput": ca["output_throughput"] / runs[2]["output_throughput"],
        } if args.single_replica else None,
        "worker_gpus": args.worker_gpus,
        "runs": runs,
    }
    print(f"{'policy':24} {'req/s':>7} {'out tok/s':>10} {'hit rate':>9} {'mean TTFT ms':>13}")
    for r in runs:
        print(f"{r['policy']:24} {r['request_throughput']:7.2f} {r['output_throughput']:10.1f} "
              f"{r['worker_hit_rate']:9.3f} {r['ttft_ms']['mean']:13.1f}")
    print(json.dumps(result["ratios_cache_aware_over_round_robin"], indent=1))
    print(json.dumps(result["ratios_cache_aware_over_one_replica"], indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
