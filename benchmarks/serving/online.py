"""Online serving through the HTTP server as a user starts it, driven by `radixlm.bench.serving` (native /generate,
streamed); each server's time from launch to ready (GET /health 200) is recorded too.

- --kind rates (the default; a GPU): Llama-3.1-8B, bf16, dummy weights (no checkpoint read), ShareGPT-like requests
  at Poisson request rates: TTFT, ITL, throughput per rate (JSON rewritten after each rate).
- --kind radix-cache (the CPU): the default model with the radix cache on, then with --disable-radix-cache, each
  with the generated-shared-prefix workload at a fixed concurrency, and the on/off ratios.

    python benchmarks/serving/online.py --rates 10 25 50 --num-prompts 400 --out $OUT/online_llama8b.json
    python benchmarks/serving/online.py --kind radix-cache [--num-groups 4] [--prompts-per-group 8]
        [--system-prompt-len 512] [--question-len 32] [--output-len 32] [--max-concurrency 8]
        # writes benchmarks/results/serving/cpu_serving.json by default
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from enum import Enum
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.models import model_dir  # noqa: E402
from radixlm.bench import procs, serving  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serving"
CPU_READY_TIMEOUT_S = 300


class Kind(str, Enum):
    RATES = "rates"
    RADIX_CACHE = "radix-cache"


def serve(cmd_args: list[str], bench_args: list[list[str]], timeout: float = procs.READY_TIMEOUT_S, on_report=None):
    """Starts `python -m radixlm.cli serve CMD_ARGS` on a free port, runs radixlm.bench.serving once per entry of
    bench_args (--port added), stops the server. Returns (the command, seconds to ready, the reports less their
    config); on_report(reports so far) after each run."""
    port = procs.free_port()
    cmd = [sys.executable, "-m", "radixlm.cli", "serve", *cmd_args, "--port", str(port), "--log-level", "warning"]
    t0 = time.monotonic()
    proc = procs.start(cmd, f"http://127.0.0.1:{port}", timeout)
    ready_s = time.monotonic() - t0
    print(f"server ready in {ready_s:.1f} s: {' '.join(cmd_args)}", flush=True)
    reports = []
    try:
        for args in bench_args:
            report = serving.main(["--port", str(port), *args])
            reports.append({k: v for k, v in report.items() if k != "config"})
            if on_report is not None:
                on_report(cmd, ready_s, reports)
    finally:
        procs.stop(proc)
    return cmd, ready_s, reports


def run_rates(args) -> None:
    path = model_dir()
    out = Path(args.out or RESULTS / "online_llama8b.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    bench = [["--backend", "radixlm", "--tokenizer", path, "--dataset-name", "sharegpt-like", "--num-prompts",
              str(args.num_prompts), "--request-rate", str(rate), "--seed", str(1 + i), "--disable-tqdm",
              "--warmup-requests", "8" if i == 0 else "0", "--flush-cache"] for i, rate in enumerate(args.rates)]

    def write(cmd: list[str], ready_s: float, reports: list[dict]) -> None:
        result = {"benchmark": "online_llama8b", "server_command": " ".join(cmd), "ready_seconds": ready_s,
                  "command": " ".join(["python", *sys.argv]),
                  "runs": [{"request_rate": rate, **r} for rate, r in zip(args.rates, reports)]}
        out.write_text(json.dumps(result, indent=2) + "\n")

    serve(["--model-path", path, "--load-format", "dummy", "--dtype", "bfloat16", "--context-length", "4096"],
          bench, on_report=write)


def run_radix_cache(args) -> None:
    bench = ["--backend", "radixlm", "--tokenizer", "default", "--dataset-name", "generated-shared-prefix",
             "--gsp-num-groups", str(args.num_groups), "--gsp-prompts-per-group", str(args.prompts_per_group),
             "--gsp-system-prompt-len", str(args.system_prompt_len), "--gsp-question-len", str(args.question_len),
             "--gsp-output-len", str(args.output_len), "--max-concurrency", str(args.max_concurrency),
             "--seed", str(args.seed), "--warmup-requests", "2", "--flush-cache", "--disable-tqdm"]
    runs = []
    for label, flags in (("radixlm (radix cache on)", []), ("radixlm (radix cache off)", ["--disable-radix-cache"])):
        _, ready_s, (report,) = serve(["--random-seed", "0", *flags], [bench], CPU_READY_TIMEOUT_S)
        runs.append({"system": label, "server_flags": flags, "time_to_ready_s": round(ready_s, 2), **report})
    on, off = runs
    result = {
        "benchmark": "cpu_serving",
        "model": "default (SmolLM2-135M-Instruct)",
        "workload": {"dataset": "generated-shared-prefix", "num_groups": args.num_groups,
                     "prompts_per_group": args.prompts_per_group, "system_prompt_len": args.system_prompt_len,
                     "question_len": args.question_len, "output_len": args.output_len,
                     "max_concurrency": args.max_concurrency, "request_rate": "inf", "seed": args.seed},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "command": " ".join(["python", "benchmarks/serving/online.py", *sys.argv[1:]]),
        "ratios_on_vs_off": {
            "mean_ttft_off_over_on": off["ttft_ms"]["mean"] / on["ttft_ms"]["mean"],
            "median_ttft_off_over_on": off["ttft_ms"]["median"] / on["ttft_ms"]["median"],
            "output_throughput_on_over_off": on["output_throughput"] / off["output_throughput"],
            "request_throughput_on_over_off": on["request_throughput"] / off["request_throughput"],
        },
        "runs": runs,
    }
    out = Path(args.out or RESULTS / "cpu_serving.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n" + json.dumps(result["ratios_on_vs_off"], indent=2))
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", type=Kind, default=Kind.RATES, choices=list(Kind))
    p.add_argument("--rates", type=float, nargs="+", default=[10, 25, 50], help="rates: requests/s")
    p.add_argument("--num-prompts", type=int, default=400, help="rates: requests a rate")
    p.add_argument("--num-groups", type=int, default=4, help="radix-cache")
    p.add_argument("--prompts-per-group", type=int, default=8, help="radix-cache")
    p.add_argument("--system-prompt-len", type=int, default=512, help="radix-cache")
    p.add_argument("--question-len", type=int, default=32, help="radix-cache")
    p.add_argument("--output-len", type=int, default=32, help="radix-cache")
    p.add_argument("--max-concurrency", type=int, default=8, help="radix-cache")
    p.add_argument("--seed", type=int, default=1, help="radix-cache")
    p.add_argument("--out", default=None, help="default: benchmarks/results/serving/online_llama8b.json (rates) or "
                                               "cpu_serving.json (radix-cache)")
    args = p.parse_args()
    if any(r <= 0 for r in args.rates) or args.num_prompts < 1:
        p.error("--rates and --num-prompts: positive")
    # SIGTERM (e.g. from `timeout`) as SystemExit: `finally` then stops the server instead of orphaning it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    (run_rates if args.kind is Kind.RATES else run_radix_cache)(args)


if __name__ == "__main__":
    main()
