"""(e) Online serving of Llama-3.1-8B (bf16, dummy weights) through the HTTP server: time from launch to ready, then
`radixlm.bench.serving` (native /generate, streamed) with ShareGPT-like requests at three Poisson request rates:
TTFT, ITL, throughput.

    python benchmarks/serving/online_llama8b.py --rates 10 25 50 --num-prompts 400 --out $OUT/online_llama8b.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.models import model_dir  # noqa: E402
from radixlm.bench import procs, serving  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rates", type=float, nargs="+", default=[10, 25, 50])
    p.add_argument("--num-prompts", type=int, default=400)
    p.add_argument("--out", default="benchmarks/results/serving/online_llama8b.json")
    args = p.parse_args()
    path = model_dir()
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "radixlm.cli", "serve", "--model-path", path, "--load-format", "dummy",
           "--dtype", "bfloat16", "--context-length", "4096", "--port", str(port), "--log-level", "warning"]
    t0 = time.monotonic()
    proc = procs.start(cmd, url)
    ready_s = time.monotonic() - t0
    print(f"server ready in {ready_s:.1f} s (dummy weights: no checkpoint read)", flush=True)
    result = {"benchmark": "online_llama8b", "server_command": " ".join(cmd), "ready_seconds": ready_s,
              "command": " ".join(["python", *sys.argv]), "runs": []}
    try:
        for i, rate in enumerate(args.rates):
            report = serving.main(["--backend", "radixlm", "--port", str(port), "--tokenizer", path,
                                   "--dataset-name", "sharegpt-like", "--num-prompts", str(args.num_prompts),
                                   "--request-rate", str(rate), "--seed", str(1 + i), "--disable-tqdm",
                                   "--warmup-requests", "8" if i == 0 else "0", "--flush-cache"])
            result["runs"].append({"request_rate": rate, **{k: v for k, v in report.items() if k != "config"}})
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        procs.stop(proc)


if __name__ == "__main__":
    main()
