"""Multi-LoRA serving (issue 53): Llama-3.1-8B (bf16, dummy weights) through the HTTP server, ShareGPT-like requests
spread round robin over 1, 8 and 32 distinct rank-16 dummy adapters (all seven targets), against the base model
served without LoRA: output throughput, TTFT and ITL (the decode step) per run, and each run's ratio to the base.

    python benchmarks/serving/lora_llama8b.py --adapters 1 8 32 --num-prompts 400 --out $OUT/lora_llama8b.json
    (the JSON is written after every run: a run cut short leaves those before it)
    python benchmarks/serving/lora_llama8b.py --tiny --num-prompts 16 --out /tmp/lora_tiny.json   # CPU dry run
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.lora import write_dummy_adapter  # noqa: E402
from benchmarks.lib.models import model_dir, tiny_model_dir  # noqa: E402
from radixlm.bench import procs, serving  # noqa: E402

KEYS = ("completed", "failed", "output_throughput", "request_throughput", "ttft_ms", "itl_ms", "tpot_ms")


def _serve_and_bench(cmd: list[str], port: int, path: str, args, names: list[list[str]], done=None) -> list[dict]:
    """One server; a run per adapter list (empty: the base model); done(runs) after each."""
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    proc = procs.start(cmd, url)
    print(f"server ready in {time.monotonic() - t0:.1f} s: {' '.join(cmd[3:])}", flush=True)
    runs = []
    try:
        for i, lora in enumerate(names):
            argv = ["--backend", "radixlm", "--port", str(port), "--tokenizer", path, "--dataset-name", "sharegpt-like",
                    "--num-prompts", str(args.num_prompts), "--request-rate", str(args.rate), "--seed", "1",
                    "--disable-tqdm", "--warmup-requests", "8" if i == 0 else "0", "--flush-cache"]
            report = serving.main(argv + (["--lora-name", *lora] if lora else []))
            runs.append({"adapters": len(lora), **{k: report.get(k) for k in KEYS}})
            if done is not None:
                done(runs)
    finally:
        procs.stop(proc)
    return runs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--adapters", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--num-prompts", type=int, default=400)
    p.add_argument("--rate", type=float, default=float("inf"), help="Poisson arrivals per second (inf: all at once)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a dry run of the script)")
    p.add_argument("--out", default="benchmarks/results/serving/lora_llama8b.json")
    args = p.parse_args()
    path = tiny_model_dir() if args.tiny else model_dir()
    root = Path(tempfile.mkdtemp(prefix="radixlm_lora_bench_"))
    most = max(args.adapters)
    names = [f"lora{i}" for i in range(most)]
    t0 = time.monotonic()
    dtype = "float32" if args.tiny else "bfloat16"
    paths = [write_dummy_adapter(path, str(root / n), rank=args.rank, seed=i, dtype=dtype) for i, n in enumerate(names)]
    print(f"{most} dummy adapters written in {time.monotonic() - t0:.1f} s", flush=True)
    base = [sys.executable, "-m", "radixlm.cli", "serve", "--model-path", path, "--load-format", "dummy",
            "--dtype", dtype, "--context-length", "4096", "--log-level", "warning"]
    result = {"benchmark": "lora_llama8b", "command": " ".join(["python", *sys.argv]), "rank": args.rank,
              "num_prompts": args.num_prompts, "request_rate": str(args.rate)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(runs=None) -> None:
        """After every run: a run cut short (a device call's time limit) leaves those before it."""
        if runs is not None:
            result["runs"] = [_vs_base(run, result["base"]) for run in runs]
        out.write_text(json.dumps(result, indent=2) + "\n")

    port = procs.free_port()
    result["base"] = _serve_and_bench(base + ["--port", str(port)], port, path, args, [[]])[0]
    save()
    port = procs.free_port()
    lora = base + ["--port", str(port), "--max-loras-per-batch", str(most), "--max-lora-rank", str(args.rank),
                   "--lora-paths", *[f"{n}={q}" for n, q in zip(names, paths)]]
    result["server_command_lora"] = " ".join(lora)
    _serve_and_bench(lora, port, path, args, [names[:n] for n in args.adapters], done=save)
    print(json.dumps(result, indent=2))


def _vs_base(run: dict, base: dict) -> dict:
    tput, itl = base["output_throughput"], base["itl_ms"]["median"]
    return {**run, "output_throughput_vs_base": run["output_throughput"] / tput if tput else None,
            "median_itl_vs_base": run["itl_ms"]["median"] / itl if itl else None}


if __name__ == "__main__":
    main()
