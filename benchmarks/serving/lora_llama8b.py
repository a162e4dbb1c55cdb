"""Multi-LoRA (issue 53): Llama-3.1-8B (bf16, dummy weights), ShareGPT-like requests spread round robin over 1, 8 and
32 distinct rank-16 dummy adapters (all seven targets), against the base model without LoRA. Three modes:

- served: through `radixlm serve` + radixlm.bench.serving: output throughput, TTFT and ITL per run, and each run's
  ratio to the base (the issue's bar: 32 adapters >= 0.8x the base's throughput);
- offline: the same requests through the Engine in-process (no HTTP, tokenizer or streaming), the base model on an
  engine without LoRA, then 0 (LoRA on, no request uses it), 1, 8 and 32 adapters on one engine with LoRA: what
  LoRA itself costs, apart from the serving path's own;
- profile (with offline: it reuses its engines): torch.profiler's kernel table (top 15 by CUDA time) of a decode step
  at batch 8, 64 and 256 and of one prefill pass, base vs 32 adapters.

    python benchmarks/serving/lora_llama8b.py --adapters 32 1 8 --num-prompts 400 --out $OUT/lora_llama8b.json
    python benchmarks/serving/lora_llama8b.py --mode offline profile --out $OUT/lora_offline.json \
        --profile-out $OUT/lora_profile.json
    (each JSON is written after every run: a run cut short leaves those before it)
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
SEED = 1
PROFILE_BATCHES = (8, 64, 256)  # 8: the rows of a run's tail, where a fixed cost per step shows most
PROFILE_STEPS = 8
PROFILE_TOP = 15


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
                    "--num-prompts", str(args.num_prompts), "--request-rate", str(args.rate), "--seed", str(SEED),
                    "--disable-tqdm", "--warmup-requests", "8" if i == 0 else "0", "--flush-cache"]
            report = serving.main(argv + (["--lora-name", *lora] if lora else []))
            runs.append({"adapters": len(lora), **{k: report.get(k) for k in KEYS}})
            if done is not None:
                done(runs)
    finally:
        procs.stop(proc)
    return runs


def _vs_base(run: dict, base: dict, key: str = "output_throughput") -> dict:
    tput = base[key]
    out = {**run, f"{key}_vs_base": run[key] / tput if tput else None}
    if "itl_ms" in run:
        itl = base["itl_ms"]["median"]
        out["median_itl_vs_base"] = run["itl_ms"]["median"] / itl if itl else None
    return out


def served(args, path: str, dtype: str, names: list[str], paths: list[str], result: dict, save) -> None:
    base = [sys.executable, "-m", "radixlm.cli", "serve", "--model-path", path, "--load-format", "dummy",
            "--dtype", dtype, "--context-length", "4096", "--log-level", "warning"]
    port = procs.free_port()
    result["base"] = _serve_and_bench(base + ["--port", str(port)], port, path, args, [[]])[0]
    save()
    port = procs.free_port()
    lora = base + ["--port", str(port), "--max-loras-per-batch", str(len(names)), "--max-lora-rank", str(args.rank),
                   "--lora-paths", *[f"{n}={q}" for n, q in zip(names, paths)]]
    result["server_command_lora"] = " ".join(lora)

    def done(runs):
        result["runs"] = [_vs_base(run, result["base"]) for run in runs]
        save()

    _serve_and_bench(lora, port, path, args, [names[:n] for n in args.adapters], done=done)


# -- offline and profile: the Engine in-process ------------------------------------------------------------------------

def _engine(path: str, args, dtype: str, lora: dict | None = None):
    import gc

    import torch

    from radixlm import Engine

    gc.collect()  # the previous engine's memory back first
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

    kw = dict(lora or {})
    if not args.tiny:
        kw["mem_fraction_static"] = 0.85
    return Engine(path, load_format="dummy", dtype=dtype, device=args.device, context_length=4096, random_seed=0,
                  **kw)


def _round_robin(names: list[str], n: int) -> list[str | None]:
    return [names[i % len(names)] for i in range(n)] if names else [None] * n


def _offline_run(engine, reqs, names: list[str]) -> dict:
    from benchmarks.lib.engine import greedy

    loras = _round_robin(names, len(reqs))
    kw = {"lora_path": loras} if names else {}
    engine.flush_cache()
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=[r.input_ids for r in reqs], sampling_params=[greedy(r.output_len) for r in reqs],
                           **kw)
    wall = time.perf_counter() - t0
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"adapters": len(names), "seconds": wall, "output_tokens": tokens, "output_tokens_per_s": tokens / wall}


def _kernel_table(engine, prompts, n_out: int, names: list[str]) -> tuple[float, dict, dict]:
    """(wall s, device us per kernel, launches per kernel) of one generate call under torch.profiler (CPU: aten
    ops' own time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.lib.engine import greedy

    cuda = torch.device(engine.runner.device).type == "cuda"
    kw = {"lora_path": _round_robin(names, len(prompts))} if names else {}
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        engine.generate(input_ids=prompts, sampling_params=greedy(n_out), **kw)
        wall = time.perf_counter() - t0
    us: dict[str, float] = {}
    calls: dict[str, int] = {}
    for e in prof.events():
        if cuda and e.device_type == torch.autograd.DeviceType.CUDA:
            t = e.device_time
        elif not cuda and e.name.startswith("aten::") and e.self_cpu_time_total > 0:
            t = e.self_cpu_time_total
        else:
            continue
        us[e.name] = us.get(e.name, 0.0) + t
        calls[e.name] = calls.get(e.name, 0) + 1
    return wall, us, calls


def _table(us: dict, calls: dict, scale: float = 1.0) -> list[dict]:
    ranked = sorted(us.items(), key=lambda kv: -kv[1])[:PROFILE_TOP]
    return [{"name": n[:120], "us": v * scale, "launches": calls[n] * scale} for n, v in ranked]


def _profile(engine, src, names: list[str], tiny: bool) -> dict:
    """Decode steps at PROFILE_BATCHES rows of 256-token prompts ((1 + PROFILE_STEPS) tokens minus 1 token, per
    step) and one prefill pass of 8192 tokens (8 prompts, 1 token each); tiny: 4 and 8 rows, 32 and 128 tokens."""
    out = {}
    prompt_len, prefill_tokens = (32, 128) if tiny else (256, 8192)
    for bs in (4, 8) if tiny else PROFILE_BATCHES:
        prompts = [src.ids(prompt_len) for _ in range(bs)]
        engine.flush_cache()
        w1, k1, c1 = _kernel_table(engine, prompts, 1, names)
        engine.flush_cache()
        w2, k2, c2 = _kernel_table(engine, prompts, 1 + PROFILE_STEPS, names)
        us = {n: (k2[n] - k1.get(n, 0.0)) / PROFILE_STEPS for n in k2}
        calls = {n: (c2[n] - c1.get(n, 0)) / PROFILE_STEPS for n in c2}
        us = {n: v for n, v in us.items() if v > 0}
        out[f"decode_bs{bs}"] = {"wall_us_per_step": (w2 - w1) / PROFILE_STEPS * 1e6,
                                 "gpu_busy_us_per_step": sum(us.values()),
                                 "launches_per_step": sum(v for v in calls.values() if v > 0),
                                 "kernels": _table(us, calls)}
    engine.flush_cache()
    prompts = [src.ids(prefill_tokens // 8) for _ in range(8)]
    wall, us, calls = _kernel_table(engine, prompts, 1, names)
    out["prefill"] = {"tokens": prefill_tokens, "wall_us": wall * 1e6, "gpu_busy_us": sum(us.values()),
                      "launches": sum(calls.values()), "kernels": _table(us, calls)}
    return out


def offline(args, path: str, dtype: str, names: list[str], paths: list[str], result: dict, save,
            profile: dict | None, save_profile) -> None:
    import random

    from transformers import AutoTokenizer

    from benchmarks.lib.engine import close, greedy
    from radixlm.bench.datasets import PromptSource, build_dataset

    tok = AutoTokenizer.from_pretrained(path)
    reqs = build_dataset("sharegpt-like", tok, args.num_prompts, SEED)
    warm = [r.input_ids for r in reqs[:8]]
    engine = _engine(path, args, dtype)
    try:
        engine.generate(input_ids=warm, sampling_params=greedy(2))
        result["base"] = _offline_run(engine, reqs, [])
        print(f"offline base: {result['base']['output_tokens_per_s']:.0f} out tok/s", flush=True)
        save()
        if profile is not None:
            profile["base"] = _profile(engine, PromptSource(tok, random.Random(SEED)), [], args.tiny)
            save_profile()
    finally:
        close(engine)
    lora = {"max_loras_per_batch": len(names), "max_lora_rank": args.rank,
            "lora_paths": [f"{n}={q}" for n, q in zip(names, paths)]}
    engine = _engine(path, args, dtype, lora)
    try:
        # Every adapter swapped into its slot before the runs (a swap is once per adapter here: as many slots)
        engine.generate(input_ids=[warm[i % len(warm)] for i in range(len(names))], sampling_params=greedy(2),
                        lora_path=names)
        result["runs"] = []
        for n in [0, *args.adapters]:
            run = _vs_base(_offline_run(engine, reqs, names[:n]), result["base"], "output_tokens_per_s")
            result["runs"].append(run)
            print(f"offline {n} adapters: {run['output_tokens_per_s']:.0f} out tok/s "
                  f"({run['output_tokens_per_s_vs_base']:.2f}x)", flush=True)
            save()
        if profile is not None:
            profile[f"{len(names)}_adapters"] = _profile(engine, PromptSource(tok, random.Random(SEED)), names,
                                                         args.tiny)
            save_profile()
    finally:
        close(engine)


def _adapters(path: str, names: list[str], rank: int, dtype: str, shape: str) -> list[str]:
    """The dummy adapters, written once per machine (a marker after the last; ~20 s for 32 of Llama-3.1-8B's): the
    lease's offline and served steps share them."""
    root = Path(tempfile.gettempdir()) / f"radixlm_lora_bench_{shape}_r{rank}_{dtype}"
    paths = [str(root / n) for n in names]
    done = root / f".written_{len(names)}"
    if done.exists():
        return paths
    t0 = time.monotonic()
    for i, (n, q) in enumerate(zip(names, paths)):
        write_dummy_adapter(path, q, rank=rank, seed=i, dtype=dtype)
    done.touch()
    print(f"{len(names)} dummy adapters written in {time.monotonic() - t0:.1f} s", flush=True)
    return paths


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", nargs="+", choices=("served", "offline", "profile"), default=["served"],
                   help="profile runs with offline (its engines)")
    p.add_argument("--adapters", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--num-prompts", type=int, default=400)
    p.add_argument("--rate", type=float, default=float("inf"), help="Poisson arrivals per second (inf: all at once)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a dry run of the script)")
    p.add_argument("--out", default="benchmarks/results/serving/lora_llama8b.json")
    p.add_argument("--profile-out", default=None, help="the profile's JSON (mode profile)")
    args = p.parse_args()
    if "profile" in args.mode and "offline" not in args.mode:
        args.mode.append("offline")
    if "served" in args.mode and len(args.mode) > 1:
        p.error("served runs alone (its servers take the GPU); run offline/profile in another call")
    if "profile" in args.mode and not args.profile_out:
        p.error("--mode profile needs --profile-out")
    args.device = "cpu" if args.tiny else "cuda"
    path = tiny_model_dir() if args.tiny else model_dir()
    most = max(args.adapters)
    names = [f"lora{i}" for i in range(most)]
    dtype = "float32" if args.tiny else "bfloat16"
    paths = _adapters(path, names, args.rank, dtype, "tiny" if args.tiny else "8b")
    mode = "served" if "served" in args.mode else "offline"
    result = {"benchmark": "lora_llama8b", "mode": mode, "command": " ".join(["python", *sys.argv]),
              "rank": args.rank, "num_prompts": args.num_prompts}
    if mode == "served":
        result["request_rate"] = str(args.rate)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out.write_text(json.dumps(result, indent=2) + "\n")

    if mode == "served":
        served(args, path, dtype, names, paths, result, save)
    else:
        profile = None
        if "profile" in args.mode:
            profile = {"benchmark": "lora_llama8b_profile", "command": result["command"], "rank": args.rank,
                       "decode_steps": PROFILE_STEPS, "top": PROFILE_TOP}
        prof_out = Path(args.profile_out) if args.profile_out else None

        def save_profile() -> None:
            prof_out.parent.mkdir(parents=True, exist_ok=True)
            prof_out.write_text(json.dumps(profile, indent=2) + "\n")

        offline(args, path, dtype, names, paths, result, save, profile, save_profile)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
