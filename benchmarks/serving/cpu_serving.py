"""Online serving on CPU: radixlm server with the radix cache on, then with `--disable-radix-cache`, each driven by
`radixlm.bench.serving` with the generated-shared-prefix workload at a fixed concurrency.

    python benchmarks/serving/cpu_serving.py [--num-groups 4] [--prompts-per-group 8] [--system-prompt-len 512]
                                     [--question-len 32] [--output-len 32] [--max-concurrency 8]

Measures time to ready (process start -> GET /health 200) per server and writes
benchmarks/results/serving/cpu_serving.json with both runs and the on/off ratios.
"""
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

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serving" / "cpu_serving.json"
READY_TIMEOUT_S = 300


def start_server(port: int, extra: list[str]) -> tuple[subprocess.Popen, float]:
    cmd = [sys.executable, "-m", "radixlm.launch_server", "--port", str(port), "--random-seed", "0",
           "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd)
    return proc, wait_ready(proc, f"http://127.0.0.1:{port}", READY_TIMEOUT_S)


def run_one(label: str, server_flags: list[str], bench_args: list[str]) -> dict:
    port = free_port()
    proc, ready_s = start_server(port, server_flags)
    try:
        print(f"\n### {label}: ready in {ready_s:.1f} s", flush=True)
        report = bench_main(["--port", str(port), *bench_args])
    finally:
        stop(proc)
    report.pop("config", None)
    return {"system": label, "server_flags": server_flags, "time_to_ready_s": round(ready_s, 2), **report}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--num-groups", type=int, default=4)
    p.add_argument("--prompts-per-group", type=int, default=8)
    p.add_argument("--system-prompt-len", type=int, default=512)
    p.add_argument("--question-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    # Turn SIGTERM (e.g. from `timeout`) into SystemExit so `finally` stops the server instead of orphaning it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bench_args = ["--backend", "radixlm", "--tokenizer", "default", "--dataset-name", "generated-shared-prefix",
                  "--gsp-num-groups", str(args.num_groups), "--gsp-prompts-per-group", str(args.prompts_per_group),
                  "--gsp-system-prompt-len", str(args.system_prompt_len), "--gsp-question-len", str(args.question_len),
                  "--gsp-output-len", str(args.output_len), "--max-concurrency", str(args.max_concurrency),
                  "--seed", str(args.seed), "--warmup-requests", "2", "--flush-cache", "--disable-tqdm"]
    on = run_one("radixlm (radix cache on)", [], bench_args)
    off = run_one("radixlm (radix cache off)", ["--disable-radix-cache"], bench_args)
    result = {
        "benchmark": "cpu_serving",
        "model": "default (SmolLM2-135M-Instruct)",
        "workload": {"dataset": "generated-shared-prefix", "num_groups": args.num_groups,
                     "prompts_per_group": args.prompts_per_group, "system_prompt_len": args.system_prompt_len,
                     "question_len": args.question_len, "output_len": args.output_len,
                     "max_concurrency": args.max_concurrency, "request_rate": "inf", "seed": args.seed},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "command": " ".join(["python", "benchmarks/serving/cpu_serving.py", *sys.argv[1:]]),
        "ratios_on_vs_off": {
            "mean_ttft_off_over_on": off["ttft_ms"]["mean"] / on["ttft_ms"]["mean"],
            "median_ttft_off_over_on": off["ttft_ms"]["median"] / on["ttft_ms"]["median"],
            "output_throughput_on_over_off": on["output_throughput"] / off["output_throughput"],
            "request_throughput_on_over_off": on["request_throughput"] / off["request_throughput"],
        },
        "runs": [on, off],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print("\n" + json.dumps(result["ratios_on_vs_off"], indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
