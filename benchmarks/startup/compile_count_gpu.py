"""Triton compilations after start-up (issue 20, deliverable 1): none, for any prompt length, prefix length, batch
size or page size serving meets.

For each engine configuration a fresh Python process (so no kernel is in memory yet) with its own empty
TRITON_CACHE_DIR (so no kernel is on disk either: a cold machine) starts an engine, timed, then runs a varied
workload: generated-shared-prefix groups (shuffled), batches of 1..N requests of random prompt lengths and output
lengths (decode batches of every size as they finish), prompts of 1 token and longer than the prefill chunk, prefix
hits extended by 1..40 tokens, prompt logprobs, and at full scale a batch of more requests than the largest CUDA graph.
Compilations are counted by Triton's JIT cache-miss hook (triton.knobs.runtime.jit_cache_hook: every kernel the
process had to build or load) and by the kernels the cache directory gains; both must stay at 0 after start-up.

    python benchmarks/startup/compile_count_gpu.py --out $OUT/compile_count_llama8b.json          # Llama-3.1-8B, bf16, dummy
    python benchmarks/startup/compile_count_gpu.py --configs default page16 nograph --out ...
    python benchmarks/startup/compile_count_gpu.py --model DIR --scale tiny ...   # as tests/runtime/engine/test_cuda.py does
    python benchmarks/startup/compile_count_gpu.py --model tiny --scale tiny --configs lora   # tests/runtime/lora/test_lora_cuda.py

Prints one line per configuration (start-up seconds, compilations during start-up and after it, the kernels
compiled after start-up if any) and writes them as JSON. --shared-cache runs every configuration over one cache
directory (faster; start-up then is warm after the first configuration). The start-up cost of building every variant:
the same command with RADIXLM_TREE=DIR, DIR holding the radixlm of the commit before (`git archive REV radixlm
benchmarks | tar -x -C DIR`), on the same machine."""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
# RADIXLM_TREE=DIR measures another tree's radixlm (an earlier commit's, unpacked by `git archive REV radixlm
# benchmarks`) with this script: the start-up cost and compile counts before and after a change, on one machine.
sys.path.insert(0, os.environ.get("RADIXLM_TREE", str(REPO)))

from benchmarks.lib.profiling import cache_entries  # noqa: E402

# Engine configurations: server arguments on top of the run's.
CONFIGS: dict[str, dict] = {
    "default": {},
    "page16": {"page_size": 16},
    "chunked": {"chunked_prefill_size": 256},
    "fcfs_nomixed": {"schedule_policy": "fcfs", "mixed_chunk": "off"},
    # Decode batches past 8 rows run eagerly, and those with groups read each group's prefix once (the prefix
    # kernel, row starts, more slots).
    "small_graphs": {"cuda_graph_max_bs": 8},
    "nograph": {"disable_cuda_graph": True},
    "sync": {"overlap_schedule": "off", "page_size": 4},
    # Online FP8 of a float checkpoint: the FP8 GEMMs, and for MoE models the grouped quantized experts' kernels.
    "fp8": {"quantization": "fp8"},
    # Multi-LoRA (issue 53): LORA_ADAPTERS dummy adapters of ranks 8 and 16 (run_one writes them) under a max rank of
    # 16, every request on one of them or the base model: the LoRA kernels of eager passes (blocks of 64 rows) and of
    # the graphs (blocks of 16, K split).
    "lora": {"max_loras_per_batch": 4, "max_lora_rank": 16},
}
LORA_ADAPTERS = 3
SCALES = {
    # groups x prompts of (prefix + question), outputs; largest sweep batch; longest random prompt; huge batch
    "tiny": dict(groups=4, per_group=6, prefix=300, question=24, out=8, sweep=[1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33],
                 max_prompt=600, huge=0),
    "full": dict(groups=8, per_group=8, prefix=2048, question=128, out=16,
                 sweep=[1, 2, 3, 4, 5, 8, 9, 16, 31, 64, 100], max_prompt=3000, huge=600),
}


class CompileCounter:
    """Every Triton JIT cache miss in this process (a compile, or a load from the on-disk cache), through
    triton.knobs.runtime.jit_cache_hook (Triton 3.4+; chains a hook already set, never skips a compile)."""

    def __init__(self):
        from triton import knobs

        self.events: list[str] = []
        self._knobs = knobs
        self._prev = knobs.runtime.jit_cache_hook

        def hook(*args, **kwargs):
            fn = kwargs.get("fn")
            name = f"{getattr(fn, 'module', '?')}.{getattr(fn, 'name', '?')}"
            self.events.append(f"{name}: {str(kwargs.get('repr', ''))[:400]}")
            return self._prev(*args, **kwargs) if self._prev is not None else False

        knobs.runtime.jit_cache_hook = hook

    def close(self) -> None:
        self._knobs.runtime.jit_cache_hook = self._prev


def varied_workload(engine, vocab: int, scale: dict, seed: int = 0, lora_names: list | None = None) -> dict:
    """lora_names: the requests' lora_path in turn (None among them: the base model)."""
    rng = random.Random(seed)

    def ids(n):
        return [rng.randrange(2, vocab) for _ in range(n)]

    def run(prompts, outs, **kw):
        params = [{"temperature": 0, "max_new_tokens": o, "ignore_eos": True} for o in outs]
        if lora_names:
            kw["lora_path"] = [lora_names[rng.randrange(len(lora_names))] for _ in prompts]
        res = engine.generate(input_ids=prompts, sampling_params=params, **kw)
        return sum(len(r["output_ids"]) for r in (res if isinstance(res, list) else [res]))

    t0, tokens, parts = time.perf_counter(), 0, {}

    def part(name, n):
        nonlocal tokens
        tokens += n
        parts[name] = round(time.perf_counter() - t0, 2)

    s = scale
    groups = [ids(s["prefix"]) for _ in range(s["groups"])]
    gsp = [g + ids(s["question"]) for g in groups for _ in range(s["per_group"])]
    rng.shuffle(gsp)
    part("shared_prefix", run(gsp, [s["out"]] * len(gsp)))
    for n in s["sweep"]:  # decode batches of every size from n down to 1 as requests of different lengths finish
        part(f"batch_{n}", run([ids(rng.randrange(1, s["max_prompt"])) for _ in range(n)],
                               [rng.randrange(1, 2 * s["out"] + 2) for _ in range(n)]))
    part("one_token_prompts", run([ids(1) for _ in range(3)], [3, 1, 5]))
    part("long_prompts", run([ids(s["max_prompt"] + rng.randrange(0, 300)) for _ in range(2)], [4, 9]))
    # Prefix hits extended by every small count (extend tiles at 16/17) and by long tails.
    base = groups[0]
    part("prefix_extends", run([base + ids(e) for e in (1, 2, 3, 15, 16, 17, 40)], [2] * 7))
    part("prefix_partial", run([base[: rng.randrange(1, len(base))] + ids(rng.randrange(1, 50)) for _ in range(6)],
                               [3] * 6))
    for n in (1, 2, 3, 5):  # prompt logprobs: eager passes, logits over chunks of rows
        part(f"logprobs_{n}", run([ids(rng.randrange(1, 40)) for _ in range(n)], [2] * n, return_logprob=True,
                                  logprob_start_len=0, top_logprobs_num=2))
    if s["huge"]:  # more running requests than the largest CUDA graph: eager decode passes
        part("huge_batch", run([ids(16) for _ in range(s["huge"])], [4] * s["huge"]))
    wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 2), "output_tokens": tokens, "output_tok_per_s": round(tokens / wall, 1),
            "parts_end_s": parts}


def run_one(config: str, model: str, dtype: str, scale: str, load_format: str, context_length: int | None,
            engine_args: dict, device: str = "cuda") -> dict:
    """One engine in this process: start-up and workload, compilations counted."""
    import torch
    import triton

    import radixlm

    cache_dir = os.environ.get("TRITON_CACHE_DIR", "")
    counter = CompileCounter()
    kw = {**engine_args, **CONFIGS[config]}
    if context_length:
        kw["context_length"] = context_length
    lora_names = None
    if config == "lora":
        from benchmarks.lib.lora import write_dummy_adapter

        root = tempfile.mkdtemp(prefix="radixlm_lora_adapters_")
        lora_names = [f"lora{i}" for i in range(LORA_ADAPTERS)]
        kw["lora_paths"] = [f"{n}=" + write_dummy_adapter(model, os.path.join(root, n), rank=(8, 16)[i % 2], seed=i,
                                                          dtype=dtype) for i, n in enumerate(lora_names)]
        lora_names.append(None)
    t0 = time.perf_counter()
    engine = radixlm.Engine(model, device=device, dtype=dtype, load_format=load_format, random_seed=0, **kw)
    startup_s = time.perf_counter() - t0
    at_start = len(counter.events)
    disk_start = cache_entries(cache_dir)
    try:
        work = varied_workload(engine, engine.runner.model_config.vocab_size, SCALES[scale], lora_names=lora_names)
    finally:
        engine.shutdown()
    after = counter.events[at_start:]
    counter.close()
    return {"config": config, "engine_args": kw, "startup_s": round(startup_s, 2),
            "compiles_at_startup": at_start, "compiles_after_startup": len(after), "compiled_after_startup": after,
            "cache_dir_kernels_at_startup": disk_start,
            "cache_dir_kernels_after_startup": cache_entries(cache_dir) - disk_start,
            "workload": work, "radixlm": str(Path(radixlm.__file__).parent), "triton": triton.__version__,
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if device == "cuda" else device}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model directory (default: Llama-3.1-8B shapes, dummy weights; "
                    "tiny: benchmarks/lib/models.py's tiny Llama, dummy weights)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--load-format", default=None, help="default: dummy for the 8B model, auto otherwise")
    ap.add_argument("--context-length", type=int, default=None, help="default: 4096 for the 8B model")
    ap.add_argument("--configs", nargs="+", default=["default", "page16"], choices=sorted(CONFIGS))
    ap.add_argument("--scale", default="full", choices=sorted(SCALES))
    ap.add_argument("--engine-args", default="{}", help="JSON: server arguments for every configuration")
    ap.add_argument("--shared-cache", action="store_true", help="one TRITON_CACHE_DIR for all configurations")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per configuration")
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cpu checks the plumbing only (no Triton kernel runs there)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child: run this configuration, print JSON
    args = ap.parse_args()
    model, load_format, context = args.model, args.load_format, args.context_length
    if model is None:
        from benchmarks.lib.models import model_dir

        model, load_format, context = model_dir(), load_format or "dummy", context or 4096
    elif model == "tiny":
        from benchmarks.lib.models import tiny_model_dir

        model, load_format, context = tiny_model_dir(), load_format or "dummy", context or 4096
    load_format = load_format or "auto"
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, model, args.dtype, args.scale, load_format, context,
                                             json.loads(args.engine_args), args.device)), flush=True)
        return
    rows, shared = [], tempfile.mkdtemp(prefix="triton-cache-")
    for config in args.configs:
        cache = shared if args.shared_cache else tempfile.mkdtemp(prefix="triton-cache-")
        env = dict(os.environ, TRITON_CACHE_DIR=cache, PYTHONUNBUFFERED="1")
        cmd = [sys.executable, __file__, "--one", config, "--model", model, "--dtype", args.dtype, "--scale",
               args.scale, "--load-format", load_format, "--engine-args", args.engine_args, "--device", args.device]
        cmd += ["--context-length", str(context)] if context else []
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULT ")), None)
            row = json.loads(line[7:]) if line else {"config": config, "error": (proc.stderr or proc.stdout)[-3000:]}
        except subprocess.TimeoutExpired:
            row = {"config": config, "error": f"timed out after {args.timeout} s"}
        rows.append(row)
        if "error" in row:
            print(f"{config}: FAILED\n{row['error']}", flush=True)
        else:
            print(f"{config}: start-up {row['startup_s']} s, compiles at start-up {row['compiles_at_startup']} "
                  f"(cache dir {row['cache_dir_kernels_at_startup']}), after start-up {row['compiles_after_startup']} "
                  f"(cache dir {row['cache_dir_kernels_after_startup']}), workload {row['workload']['wall_s']} s, "
                  f"{row['workload']['output_tok_per_s']} tok/s", flush=True)
            for e in row["compiled_after_startup"]:
                print("    compiled after start-up:", e[:200], flush=True)
    result = {"command": " ".join(sys.argv), "model": model, "dtype": args.dtype, "scale": args.scale,
              "engine_args": json.loads(args.engine_args),
              "shared_cache": args.shared_cache, "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    sys.exit(0 if all("error" not in r and r["compiles_after_startup"] == 0 for r in rows) else 1)


if __name__ == "__main__":
    main()
