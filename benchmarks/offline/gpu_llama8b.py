"""Llama-3.1-8B (bf16, dummy weights, the Llama-3.1 tokenizer) on one GPU through the offline Engine: the GPU
issue's benchmark table, parts chosen with --parts:

  decode   (a) decode step time at batch 1..256 (512-token prompts; (t257 - t1) / 256 as in peer-anchors.md) vs the
               floor (weight bytes + KV bytes read per step) / device-to-device copy bandwidth measured in this run
  offline  (b) offline throughput: ShareGPT-like (1000 requests) and random 1024/512 (500 requests, as the peers),
               output and total tokens/s, MFU; transformers `generate` on 16 of the random prompts as the naive
               reference, next to ours on the same 16
  prefix   (c) generated-shared-prefix (32 groups x 32, 2048 + 128 tokens, 64 out): radix cache on vs off
  overhead (d) radix-tree time (match, insert, evict, lock, cache_*_req) as a share of wall time, zero reuse
               (the random 1024/512 workload again, its tree operations timed)
  modes    (f) overlap on/off x CUDA graphs on/off: step time at batch 1 and 64
  ab           one engine for the decode table (--decode-steps), ShareGPT-like, random 1024/512 and
               generated-shared-prefix (--prefix-groups x 32, radix cache on): the workloads of an A/B of two
               trees (benchmarks/ab/ab_trees.sh runs this script under each tree's radixlm)
               (its workloads, ab_workloads, at the peers' full sizes: benchmarks/peers/peer_side_by_side.py)

    python benchmarks/offline/gpu_llama8b.py --parts decode modes --out $OUT/llama8b_a_f.json

Prompts are random token ids (no prefix sharing unless the workload has it); greedy; EOS ignored.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.engine import CONTEXT_LEN, ENGINE_ARGS, PEER_SIZES, ab_workloads, close  # noqa: E402
from benchmarks.lib.engine import decode_steps, log, make_engine, measure_copy_bandwidth, model_bytes  # noqa: E402
from benchmarks.lib.engine import offline_run  # noqa: E402
from benchmarks.lib.models import QUANT_FORMATS, quantized_model_dir  # noqa: E402
from radixlm.bench.datasets import PromptSource, generated_shared_prefix_dataset, random_dataset  # noqa: E402
from radixlm.bench.datasets import sharegpt_like_dataset  # noqa: E402

def part_decode(path: str, src: PromptSource, batches: list[int]) -> dict:
    bw = measure_copy_bandwidth()
    engine = make_engine(path, max_running_requests=max(batches, default=256))
    try:
        weight_bytes, _, _ = model_bytes(engine)
        kv_per_token = engine.runner.kv_bytes_per_token()
        decode_steps(engine, src, 8, steps=16)  # warm-up
        rows = []
        for b in batches:
            step = decode_steps(engine, src, b)
            # The 256 measured steps read on average 512 + 128 positions of KV per request.
            floor = (weight_bytes + b * (512 + 128) * kv_per_token) / bw
            rows.append({"batch": b, "step_ms": step * 1e3, "floor_ms": floor * 1e3, "ratio_to_floor": step / floor,
                         "output_tokens_per_s": b / step})
            log(f"decode batch {b:4d}: {step * 1e3:7.2f} ms/step, floor {floor * 1e3:6.2f} ms, {step / floor:5.2f}x floor")
        return {"copy_bandwidth_TBps": bw / 1e12, "weight_bytes_per_step": weight_bytes, "kv_bytes_per_token": kv_per_token,
                "rows": rows, "target": "batch 1 <= 1.10 x floor"}
    finally:
        close(engine)


class TreeTimer:
    """Wraps the radix cache's public operations on one instance and sums their wall time (outermost calls only)."""

    METHODS = ("match_prefix", "insert", "evict", "inc_lock_ref", "dec_lock_ref", "cache_finished_req",
               "cache_unfinished_req")

    def __init__(self, cache):
        self.seconds = 0.0
        self.calls = 0
        self.per_method: dict[str, list[float]] = {}  # name -> [outermost calls, seconds]
        self._depth = 0
        for name in self.METHODS:
            setattr(cache, name, self._wrap(name, getattr(cache, name)))

    def _wrap(self, name, fn):
        def timed_call(*a, **kw):
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    dt = time.perf_counter() - t0
                    self.seconds += dt
                    self.calls += 1
                    m = self.per_method.setdefault(name, [0, 0.0])
                    m[0] += 1
                    m[1] += dt
        return timed_call


def hf_reference(path: str, prompts: list[list[int]], n_out: int) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        ids = torch.tensor(prompts, device="cuda")
        model.generate(ids[:, :16], max_new_tokens=4, do_sample=False, pad_token_id=0)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n_out, min_new_tokens=n_out, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    n = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return {"engine": "transformers generate", "requests": len(prompts), "output_tokens": n, "wall_s": wall,
            "output_tokens_per_s": n / wall}


def part_overhead(path: str, src: PromptSource, random_n: int) -> dict:
    """(d) The random workload again, with the radix cache's operations timed."""
    engine = make_engine(path)
    try:
        offline_run(engine, random_dataset(src, 64, 128, 16, 1.0), "warm-up")
        timer = TreeTimer(engine.scheduler.tree_cache)
        row = offline_run(engine, random_dataset(src, random_n, 1024, 512, 1.0), "random-1024-512, tree timed")
    finally:
        close(engine)
    wall = row["wall_s"]
    log(f"radix tree: {timer.seconds * 1e3:.1f} ms in {timer.calls} calls = {timer.seconds / wall:.3%} of wall")
    for name, (n, sec) in sorted(timer.per_method.items(), key=lambda kv: -kv[1][1]):
        log(f"   {name:22} {n:7d} calls {sec * 1e3:9.1f} ms {sec / n * 1e6:8.1f} us/call")
    return {"workload": "random-1024-512 (no shared prefixes)", "run": row, "tree_seconds": timer.seconds,
            "tree_calls": timer.calls, "share": timer.seconds / wall, "target": "< 0.3%",
            "per_method": {k: {"calls": n, "seconds": sec} for k, (n, sec) in timer.per_method.items()}}


def part_offline(path: str, src: PromptSource, sharegpt_n: int, random_n: int) -> dict:
    result = {}
    engine = make_engine(path)
    try:
        offline_run(engine, random_dataset(src, 64, 128, 16, 1.0), "warm-up")
        result["sharegpt_like"] = offline_run(engine, sharegpt_like_dataset(src, sharegpt_n, seed=1), "sharegpt-like")
        if not random_n:
            return result
        reqs = random_dataset(src, random_n, 1024, 512, 1.0)
        result["random_1024_512"] = offline_run(engine, reqs, "random-1024-512")
        small = reqs[:16]
        ours16 = offline_run(engine, small, "ours, 16 of random-1024-512")
    finally:
        close(engine)
    hf = hf_reference(path, [r.input_ids for r in small], 512)
    log(f"transformers generate, 16 x 1024/512: {hf['output_tokens_per_s']:.0f} out tok/s")
    result["naive_reference"] = {"transformers": hf, "radixlm": ours16,
                                 "speedup": ours16["output_tokens_per_s"] / hf["output_tokens_per_s"]}
    return result


def part_prefix(path: str, src: PromptSource) -> dict:
    reqs = generated_shared_prefix_dataset(src, 32, 32, 2048, 128, 64, seed=2)
    rows = {}
    for name, kw in (("radix_on", {}), ("radix_off", {"disable_radix_cache": True})):
        engine = make_engine(path, **kw)
        try:
            offline_run(engine, random_dataset(src, 32, 128, 8, 1.0), "warm-up")
            stats0 = dict(engine.scheduler.stats)
            row = offline_run(engine, reqs, f"generated-shared-prefix, {name}")
            st = engine.scheduler.stats
            row["hit_rate"] = (st["cached_tokens"] - stats0["cached_tokens"]) / max(st["prompt_tokens"] - stats0["prompt_tokens"], 1)
            rows[name] = row
        finally:
            close(engine)
    rows["throughput_ratio"] = rows["radix_on"]["output_tokens_per_s"] / rows["radix_off"]["output_tokens_per_s"]
    log(f"shared prefix: radix on/off throughput {rows['throughput_ratio']:.2f}x, hit rate "
        f"{rows['radix_on']['hit_rate']:.1%} vs {rows['radix_off']['hit_rate']:.1%}")
    return rows


AB_RUNNING = 256


def part_ab(path: str, src: PromptSource, batches: list[int], steps: int, sharegpt_n: int, random_n: int,
            prefix_groups: int, sharegpt_repeats: int = 1) -> dict:
    # At least AB_RUNNING requests run at once whatever the decode batches: the throughput workloads ran one
    # request at a time under BATCHES="1" (benchmarks/results/offline/quant/l2_prefetch/README.md).
    engine = make_engine(path, max_running_requests=max([*batches, AB_RUNNING]))
    sizes = {**PEER_SIZES, "sharegpt": (sharegpt_n, 2048, 1024), "random": (random_n, 1024, 512),
             "prefix": (prefix_groups, 32, 2048, 128, 64), "sharegpt_repeats": sharegpt_repeats}
    try:
        # How many layers' memos hold a tuned cuBLASLt GEMM (kernels/gemm/tuned/), by GEMM name, over all row counts.
        tuned = {name: sum(n for kernels in by_key.values() for kernel, n in kernels.items() if kernel == "cublaslt")
                 for name, by_key in engine.runner.gemm_choice_counts().items()}
        log(f"tuned cuBLASLt GEMMs (layers x row counts): {tuned}")
        return ab_workloads(engine, src, batches, steps, sizes, result={"tuned_cublaslt": tuned})
    finally:
        close(engine)


def part_modes(path: str, src: PromptSource) -> list[dict]:
    rows = []
    for graphs in (True, False):
        for overlap in (True, False):
            engine = make_engine(path, max_running_requests=64, cuda_graph_max_bs=64, disable_cuda_graph=not graphs,
                                 overlap_schedule="auto" if overlap else "off")
            try:
                decode_steps(engine, src, 8, steps=16)
                for b in (1, 64):
                    step = decode_steps(engine, src, b, steps=128)
                    rows.append({"cuda_graph": graphs, "overlap": overlap, "batch": b, "itl_ms": step * 1e3,
                                 "output_tokens_per_s": b / step})
                    log(f"graphs {graphs!s:5} overlap {overlap!s:5} batch {b:3d}: {step * 1e3:7.2f} ms/step")
            finally:
                close(engine)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--parts", nargs="+", default=["decode", "modes", "offline", "overhead", "prefix"],
                   choices=["decode", "modes", "offline", "overhead", "prefix", "ab"])
    p.add_argument("--batches", type=int, nargs="*", default=[1, 8, 32, 64, 128, 256])
    p.add_argument("--sharegpt-requests", type=int, default=1000)
    p.add_argument("--sharegpt-repeats", type=int, default=1, help="ab: ShareGPT-like runs on one engine (the first "
                   "is the figure; the others, each on an emptied radix cache, show one engine's spread)")
    p.add_argument("--random-requests", type=int, default=500)
    p.add_argument("--decode-steps", type=int, default=256, help="ab: measured decode steps per batch size")
    p.add_argument("--prefix-groups", type=int, default=32, help="ab: shared-prefix groups of 32 requests")
    p.add_argument("--engine-args", default="{}", help="JSON of extra server arguments, e.g. '{\"cuda_graph_max_bs\": 512}'")
    p.add_argument("--quant", default="bf16", choices=list(QUANT_FORMATS),
                   help="the weights' (or the KV cache's) format: benchmarks/lib/models.py QUANT_FORMATS")
    p.add_argument("--out", default="benchmarks/results/offline/llama8b_gpu.json")
    args = p.parse_args()
    path, quant_args = quantized_model_dir(args.quant)
    ENGINE_ARGS.update(quant_args)
    ENGINE_ARGS.update(json.loads(args.engine_args))
    from transformers import AutoTokenizer

    src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
    result = {"benchmark": "gpu_llama8b", "model": "Llama-3.1-8B architecture, bf16, dummy weights", "quant": args.quant,
              "engine_args": ENGINE_ARGS,
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "radixlm": sys.modules["radixlm"].__file__, "context_length": CONTEXT_LEN,
              "command": " ".join(["python", *sys.argv])}
    t0 = time.perf_counter()
    parts = {"decode": ("decode", lambda: part_decode(path, src, args.batches)),
             "modes": ("modes", lambda: part_modes(path, src)),
             "offline": ("offline", lambda: part_offline(path, src, args.sharegpt_requests, args.random_requests)),
             "overhead": ("radix_overhead", lambda: part_overhead(path, src, args.random_requests)),
             "prefix": ("shared_prefix", lambda: part_prefix(path, src)),
             "ab": ("ab", lambda: part_ab(path, src, args.batches, args.decode_steps, args.sharegpt_requests,
                                          args.random_requests, args.prefix_groups, args.sharegpt_repeats))}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for name in args.parts:  # each part's result is written as soon as it is measured
        key, run = parts[name]
        result[key] = run()
        result["bench_seconds"] = time.perf_counter() - t0
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out} after {result['bench_seconds']:.0f} s")


if __name__ == "__main__":
    main()
