"""`radixlm serve --dp-size 2` on a two-GPU host, as a user starts it: one replica per GPU behind the cache-aware
router. Records the start-up time, each GPU's memory in use once serving (both replicas placed, one per GPU), that
requests through the router's native and OpenAI endpoints succeed, and that SIGTERM
takes the workers down (their GPU memory is released).

    python benchmarks/multi_gpu/dp_serve_smoke.py --out $OUT/dp_serve.json      # Llama-3.1-8B shapes, dummy bf16 weights
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.models import model_dir  # noqa: E402
from radixlm.bench.procs import free_port, stop, wait_ready  # noqa: E402


def gpu_memory_used_mib() -> list[int]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--out", default="benchmarks/results/multi_gpu/dp_serve.json")
    args = p.parse_args()
    path = model_dir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "radixlm.cli", "serve", "--model-path", path, "--load-format", "dummy",
           "--dtype", "bfloat16", "--dp-size", "2", "--port", str(port), "--log-level", "warning"]
    result = {"benchmark": "dp_serve_smoke", "command": " ".join(["python", *sys.argv]), "serve": " ".join(cmd[1:]),
              "gpu_memory_used_mib_before": gpu_memory_used_mib()}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd)
    try:
        result["startup_s"] = wait_ready(proc, url, timeout=240)
        result["gpu_memory_used_mib_serving"] = gpu_memory_used_mib()
        texts = []
        with httpx.Client(timeout=120) as client:
            for i in range(args.requests):
                prefix = f"Session {i % 4}: " + "the same long system prompt " * 40
                if i % 2:
                    r = client.post(url + "/v1/completions", json={"model": "default", "prompt": prefix + f"q{i}",
                                                                   "max_tokens": 8, "temperature": 0})
                    texts.append(r.status_code == 200 and "text" in r.json()["choices"][0])
                else:
                    r = client.post(url + "/generate", json={"text": prefix + f"q{i}",
                                                             "sampling_params": {"max_new_tokens": 8}})
                    texts.append(r.status_code == 200 and "text" in r.json())
            health = client.get(url + "/health").json()
        result["requests_ok"] = sum(texts)
        result["requests"] = len(texts)
        result["router_health"] = health
    finally:
        t1 = time.monotonic()
        stop(proc)
        result["shutdown_s"] = time.monotonic() - t1
        time.sleep(2)
        result["gpu_memory_used_mib_after"] = gpu_memory_used_mib()
        result["wall_s"] = time.monotonic() - t0
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "router_health"}, indent=1))


if __name__ == "__main__":
    main()
