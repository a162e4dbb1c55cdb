"""The serving path against the offline Engine on the same work (issue 56): each workload first through
`Engine.generate` in one call, then through `radixlm serve` driven by `radixlm.bench.serving` (native /generate,
streamed, request rate inf), the same requests (one dataset builder, one seed) on the same engine arguments.
Prints a table and writes JSON: output tok/s of both and their ratio, with the server's TTFT and ITL, and the CPU
seconds (user + sys) each of the server's processes (http: the HTTP + tokenizer-manager process; scheduler;
detokenizer) and the load generator spent over each served run, per output token, with the load generator's
own core utilisation: a run whose client process used more than 80% of a core is flagged `client_bound` (its
served figure is then the client's ceiling: rerun with more `--num-client-processes`).

    python benchmarks/serving/serving_vs_offline.py --model 8b --device cuda --out $OUT/serving_vs_offline.json
    python benchmarks/serving/serving_vs_offline.py --tiny --out /tmp/tiny.json   # the serving path's CPU cost

`--tiny` (= `--model tiny --device cpu --dtype float32`, the random workload with short prompts and long outputs:
TINY_WORKLOAD) makes the model's own time small (TINY_CPU_SHAPE: 1 layer, width 16, the Llama-3.1 tokenizer), so
what is left is the serving path's: tokenization, IPC, detokenization, streaming; its CPU microseconds per token
(http, detokenizer, client) are the figures to compare (a shared CPU makes tok/s noisy). `--served-only` skips the
offline Engine."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from benchmarks.lib.engine import close, greedy  # noqa: E402
from benchmarks.lib.models import model_dir, tiny_model_dir  # noqa: E402
from radixlm import Engine  # noqa: E402
from radixlm.bench import procs, serving  # noqa: E402
from radixlm.bench.datasets import build_dataset  # noqa: E402

# The peer-anchors.md workloads (requests, and for random the input and output lengths).
WORKLOADS = {"sharegpt-like": {"num_prompts": 1000},
             "random": {"num_prompts": 500, "random_input_len": 1024, "random_output_len": 512,
                        "random_range_ratio": 1.0}}
# --tiny: many concurrent streams of long outputs, prompts short enough for a CPU's prefill; the model narrower
# than TINY_SHAPE (its 128k-row LM head is most of a CPU pass).
TINY_WORKLOAD = {"num_prompts": 64, "random_input_len": 32, "random_output_len": 512}
TINY_CPU_SHAPE = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                  "num_key_value_heads": 1, "head_dim": 8}
SEED = 1


def dataset(name: str, tokenizer, args):
    kw = {**WORKLOADS[name], **(TINY_WORKLOAD if args.tiny and name == "random" else {})}
    n = args.num_prompts or kw.pop("num_prompts")
    kw.pop("num_prompts", None)
    return build_dataset(name, tokenizer, n, SEED, **kw), n, kw


def engine_args(args) -> dict:
    """The same ServerArgs for the Engine and the server."""
    kw = {"device": args.device, "dtype": args.dtype, "context_length": 4096, "random_seed": 0}
    kw["load_format"] = "dummy"  # both models' weights are random: no checkpoint is read
    return kw


def offline(path: str, args, tokenizer, out: dict) -> dict:
    """Fills `out` per workload as each finishes (a call cut by its time limit keeps the finished ones)."""
    engine = Engine(path, **engine_args(args))
    try:
        for name in args.workloads:
            reqs, n, _ = dataset(name, tokenizer, args)
            engine.generate(input_ids=[r.input_ids for r in reqs[:8]], sampling_params=greedy(2))  # warm-up
            engine.flush_cache()
            runs = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                res = engine.generate(input_ids=[r.input_ids for r in reqs],
                                      sampling_params=[greedy(r.output_len) for r in reqs])
                wall = time.perf_counter() - t0
                engine.flush_cache()
                runs.append(sum(o["meta_info"]["completion_tokens"] for o in res) / wall)
            out[name] = {"requests": n, "output_tokens_per_s": statistics.median(runs), "runs": runs}
            print(f"offline {name}: {out[name]['output_tokens_per_s']:.0f} out tok/s (runs {runs})", flush=True)
            args.save()
    finally:
        close(engine)
    return out


class CpuMeter:
    """User + sys CPU seconds per role over a run: the server's processes (from /server_info's process_pids; the
    server's own pid is the HTTP + tokenizer-manager process) and this process over `serving.main` (client_process:
    the load generator's run plus its tokenizer's load, dataset build and warm-up; what earlier files call `client`).
    `client` is the load generator's own report: the timed run only, all its processes."""

    def __init__(self, url: str, server_pid: int):
        with urllib.request.urlopen(f"{url}/server_info", timeout=30) as r:
            pids = json.loads(r.read())["process_pids"]
        self.procs = {"http": psutil.Process(server_pid), **{n: psutil.Process(p) for n, p in pids.items()},
                      "client_process": psutil.Process()}

    def sample(self) -> dict[str, float]:
        return {n: (lambda t: t.user + t.system)(p.cpu_times()) for n, p in self.procs.items()}

    @staticmethod
    def per_token(before: dict[str, float], after: dict[str, float], tokens: int) -> dict[str, float]:
        """Microseconds of CPU per output token, per role."""
        return {n: (after[n] - before[n]) / max(tokens, 1) * 1e6 for n in before}


def served(path: str, args, out: dict) -> dict:
    """Fills `out` per workload as each finishes, as `offline` does."""
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in engine_args(args).items()]
    cmd = [sys.executable, "-m", "radixlm.cli", "serve", "--model-path", path, "--port", str(port),
           "--log-level", "warning", *flags]
    proc = procs.start(cmd, url)
    out["server_command"] = " ".join(cmd)
    try:
        meter = CpuMeter(url, proc.pid)
        for name in args.workloads:
            _, n, kw = dataset(name, None, args)
            argv = ["--backend", "radixlm", "--port", str(port), "--tokenizer", path, "--dataset-name", name,
                    "--num-prompts", str(n), "--seed", str(SEED), "--request-rate", "inf", "--warmup-requests", "8",
                    "--flush-cache", "--disable-tqdm", "--num-client-processes", str(args.num_client_processes)]
            argv += [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
            runs, cpu = [], []
            for _ in range(args.repeats):
                before = meter.sample()
                runs.append(serving.main(argv))
                cpu.append(CpuMeter.per_token(before, meter.sample(), runs[-1]["total_output_tokens"])
                           | {"client": runs[-1]["client"]["cpu_us_per_output_token"]})
            tps = [r["output_throughput"] for r in runs]
            mid = runs[tps.index(statistics.median_low(tps))]
            out[name] = {"output_tokens_per_s": statistics.median(tps), "runs": tps,
                         **{k: mid[k] for k in mid if k.endswith(("ttft_ms", "itl_ms"))},
                         "cpu_us_per_token": {n: statistics.median(c[n] for c in cpu) for n in cpu[0]},
                         "cpu_us_per_token_runs": cpu, "command": mid["config"]["command"],
                         "client_cpu_utilization_runs": [max(r["client"]["cpu_utilization"]) for r in runs],
                         "client_cpu_us_per_token_runs": [r["client"]["cpu_us_per_output_token"] for r in runs],
                         "client_bound": any(r["client_bound"] for r in runs)}
            print(f"served {name}: {out[name]['output_tokens_per_s']:.0f} out tok/s, CPU us/token "
                  + ", ".join(f"{n} {v:.1f}" for n, v in out[name]["cpu_us_per_token"].items())
                  + f"; client max core use {max(out[name]['client_cpu_utilization_runs']):.0%}"
                  + (" CLIENT BOUND" if out[name]["client_bound"] else ""), flush=True)
            args.save()
    finally:
        procs.stop(proc)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true", help="the CPU measurement: --model tiny --device cpu --dtype "
                   "float32, the random workload with TINY_WORKLOAD's lengths (flags given after still apply)")
    p.add_argument("--model", choices=["8b", "tiny"], default="8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=sorted(WORKLOADS))
    p.add_argument("--num-prompts", type=int, default=None, help="overrides each workload's request count")
    p.add_argument("--repeats", type=int, default=3, help="runs per side; the median is reported")
    p.add_argument("--num-client-processes", type=int, default=1, help="load-generator processes (bench.serving's)")
    p.add_argument("--served-only", action="store_true", help="skip the offline Engine (the CPU profile's A/B)")
    p.add_argument("--out", default="benchmarks/results/serving/serving_vs_offline.json")
    args = p.parse_args()
    if args.tiny:
        tiny = {"model": "tiny", "device": "cpu", "dtype": "float32", "workloads": ["random"]}
        args = p.parse_args(namespace=argparse.Namespace(**{**vars(args), **tiny}))
    path = model_dir() if args.model == "8b" else tiny_model_dir()
    if args.tiny:
        config = Path(path) / "config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), **TINY_CPU_SHAPE}, indent=2))
    tokenizer = AutoTokenizer.from_pretrained(path)
    result = {"benchmark": "serving_vs_offline", "command": " ".join(["python", *sys.argv]),
              "model": args.model, "device": args.device, "dtype": args.dtype}
    result["offline"], result["served"] = {}, {}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    args.save = lambda: out.write_text(json.dumps(result, indent=2))
    if not args.served_only:
        offline(path, args, tokenizer, result["offline"])
    served(path, args, result["served"])
    print(f"\n{'workload':16s} {'offline tok/s':>14s} {'served tok/s':>13s} {'ratio':>6s} {'client bound':>13s}")
    for name in args.workloads if result["offline"] else []:
        off, on = result["offline"][name]["output_tokens_per_s"], result["served"][name]["output_tokens_per_s"]
        result.setdefault("ratio", {})[name] = on / off
        print(f"{name:16s} {off:14.0f} {on:13.0f} {on / off:6.2f} {str(result['served'][name]['client_bound']):>13s}")
    args.save()
    print(f"wrote {args.out}")

if __name__ == "__main__":
    main()
