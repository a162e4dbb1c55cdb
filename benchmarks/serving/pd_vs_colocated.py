"""Prefill/decode disaggregation against co-located replicas on two GPUs (unrun; for an `nvidia-h200-x2` lease):

    A. PD: one prefill server on GPU 0 and one decode server on GPU 1 behind `radixlm router --pd-disaggregation`
       (--prefill-policy cache_aware --decode-policy power_of_two);
    B. co-located: two plain replicas, one per GPU, behind `radixlm router --policy cache_aware`.

Both are driven by `radixlm.bench.serving` with random prompts of 4k-8k tokens at a fixed Poisson request rate, and
report TTFT, inter-token latency (median, p99) and throughput. The issue's bar: PD's ITL p99 <= 0.5x co-located at
equal throughput.

    python benchmarks/serving/pd_vs_colocated.py [--model-path meta-llama/Llama-3.1-8B-Instruct] [--load-format dummy]
        [--request-rate 2] [--num-prompts 200] [--input-len 8192] [--output-len 256]

Writes benchmarks/results/serving/pd_vs_colocated.json (both runs, the command, the ratios)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

from radixlm.bench.procs import free_port, stop, wait_ready
from radixlm.bench.serving import main as bench_main

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serving" / "pd_vs_colocated.json"
READY_TIMEOUT_S = 900


def _server(gpu: int, port: int, flags: list[str]) -> subprocess.Popen:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
    return subprocess.Popen([sys.executable, "-m", "radixlm.launch_server", "--port", str(port), "--random-seed", "0",
                             "--log-level", "warning", *flags], env=env)


def _router(port: int, flags: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "radixlm.router", "--port", str(port), "--log-level", "warning",
                             *flags])


def run_setup(label: str, pd: bool, model_flags: list[str], bench_args: list[str]) -> dict:
    ports = [free_port(), free_port()]
    procs: list[subprocess.Popen] = []
    try:
        if pd:
            bootstrap = free_port()
            procs.append(_server(0, ports[0], [*model_flags, "--disaggregation-mode", "prefill",
                                               "--disaggregation-bootstrap-port", str(bootstrap)]))
            procs.append(_server(1, ports[1], [*model_flags, "--disaggregation-mode", "decode"]))
            router_flags = ["--pd-disaggregation", "--prefill", f"http://127.0.0.1:{ports[0]}", str(bootstrap),
                            "--decode", f"http://127.0.0.1:{ports[1]}", "--prefill-policy", "cache_aware",
                            "--decode-policy", "power_of_two"]
        else:
            procs += [_server(g, p, model_flags) for g, p in enumerate(ports)]
            router_flags = ["--worker-urls", *(f"http://127.0.0.1:{p}" for p in ports), "--policy", "cache_aware"]
        ready = [wait_ready(proc, f"http://127.0.0.1:{port}", READY_TIMEOUT_S) for proc, port in zip(procs, ports)]
        router_port = free_port()
        procs.append(_router(router_port, router_flags))
        wait_ready(procs[-1], f"http://127.0.0.1:{router_port}", 120)
        print(f"\n### {label}: workers ready in {max(ready):.1f} s", flush=True)
        report = bench_main(["--port", str(router_port), *bench_args])
    finally:
        for proc in reversed(procs):
            stop(proc)
    report.pop("config", None)
    return {"system": label, "router_flags": router_flags, **report}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", default="meta-llama/Llama-3.1-8B-Instruct")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--tokenizer", default=None, help="tokenizer for the prompts (default: the model's)")
    p.add_argument("--request-rate", type=float, default=2.0)
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--input-len", type=int, default=8192, help="prompts are 0.5x-1x this long (4k-8k by default)")
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` stops the servers through `finally`
    model_flags = ["--model-path", args.model_path, "--load-format", args.load_format, "--dtype", "bfloat16"]
    bench_args = ["--backend", "radixlm", "--tokenizer", args.tokenizer or args.model_path, "--dataset-name", "random",
                  "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
                  "--random-range-ratio", "0.5", "--num-prompts", str(args.num_prompts), "--request-rate",
                  str(args.request_rate), "--seed", str(args.seed), "--warmup-requests", "2", "--disable-tqdm"]
    pd = run_setup("PD: 1 prefill GPU + 1 decode GPU", True, model_flags, bench_args)
    colo = run_setup("co-located: 2 replicas", False, model_flags, bench_args)
    result = {
        "benchmark": "pd_vs_colocated",
        "model": args.model_path, "load_format": args.load_format,
        "workload": {"dataset": "random", "input_len": [args.input_len // 2, args.input_len],
                     "output_len": [args.output_len // 2, args.output_len], "num_prompts": args.num_prompts,
                     "request_rate": args.request_rate, "seed": args.seed},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "command": " ".join(["python", "benchmarks/serving/pd_vs_colocated.py", *sys.argv[1:]]),
        "ratios_pd_over_colocated": {
            "itl_p99": pd["itl_ms"]["p99"] / colo["itl_ms"]["p99"],
            "itl_median": pd["itl_ms"]["median"] / colo["itl_ms"]["median"],
            "ttft_median": pd["ttft_ms"]["median"] / colo["ttft_ms"]["median"],
            "output_throughput": pd["output_throughput"] / colo["output_throughput"],
        },
        "runs": [pd, colo],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print("\n" + json.dumps(result["ratios_pd_over_colocated"], indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
