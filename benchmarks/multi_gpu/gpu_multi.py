"""Tensor and expert parallelism on the GPUs of one host: issue 24's table, parts chosen with --parts.

  correctness  Llama-3.1-8B shapes (dummy weights, the Llama-3.1 tokenizer, text prompts), float32 and bf16: TP=2
               greedy outputs against TP=1 (dummy weights are the same model under every layout); the first
               divergence with both layouts' top-2 logit gaps there
  tp           Llama-3.1-8B bf16: TP=1, TP=2 with NCCL only, TP=2 with the symmetric-memory all-reduce: decode step at
               each --batches size against the per-GPU floor (weight bytes + KV read / copy bandwidth measured in this
               run), the ShareGPT-like offline workload, and a host-timer profile of rank 0's decode step (its
               scheduler work and its wait for the device: which of the two bounds the step)
  big          Llama-3.1-70B shapes, bf16, TP=2: decode step against the floor, ShareGPT-like offline throughput
  big_fp8      the same shapes in online FP8 on one GPU (the bf16 model, 141 GB, does not fit one H200; the FP8
               one loads only because the build never holds the float weights: quantization/modules.py)
  moe          Mixtral-8x7B shapes, bf16, TP=2 and EP=2: decode step against the floor, ShareGPT-like offline
  allreduce    all-reduce latency, bf16, 8 KiB to 8 MiB (--sizes-kib) over --world-size GPUs: NCCL eager and in a
               CUDA graph, symmetric-memory one-shot and two-shot in a graph (benchmarks/lib/allreduce.py), each
               sum checked

Every engine is the offline Engine (rank 0 on its thread, rank 1 in a process), each in a process of its own (a hung
teardown cannot stop the run: benchmarks/lib/isolated.py). Greedy; EOS ignored.

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    python benchmarks/multi_gpu/gpu_multi.py --parts correctness tp --out $OUT/multi.json
    python benchmarks/multi_gpu/gpu_multi.py --parts allreduce --out $OUT/allreduce.json
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib import allreduce, moe  # noqa: E402
from benchmarks.lib.engine import close, decode_steps, greedy, log, make_engine, measure_copy_bandwidth  # noqa: E402
from benchmarks.lib.engine import model_bytes, offline_run  # noqa: E402
from benchmarks.lib.isolated import isolated  # noqa: E402
from benchmarks.lib.models import model_dir  # noqa: E402
from benchmarks.lib.profiling import step_kernels, step_profile  # noqa: E402
from radixlm.bench.datasets import PromptSource, sharegpt_like_dataset  # noqa: E402

LLAMA_70B = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                 num_key_value_heads=8)
MIXTRAL_8X7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                    max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    bos_token_id=1, eos_token_id=2)
PROMPTS = [
    "The history of the printing press begins",
    "Write a short poem about the sea at night.",
    "def fibonacci(n):",
    "Explain why the sky is blue in two sentences.",
    "List three uses of a paperclip:",
    "In 1969, the first humans",
    "Translate to French: I would like a cup of coffee.",
    "The quick brown fox",
]


def llama70b_dir(path8b: str) -> str:
    out = Path(path8b).parent / "llama-3.1-70b-dummy"
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(path8b).iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copyfile(f, out / f.name)
    config = json.loads((Path(path8b) / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **LLAMA_70B}, indent=2))
    return str(out)


def mixtral_dir() -> str:
    from transformers import MixtralConfig

    config = MixtralConfig(**MIXTRAL_8X7B)
    config.architectures = ["MixtralForCausalLM"]
    return moe.dummy_model_dir("mixtral-8x7b-dummy", config)


# ------------------------------------------------------------------------------------------------------ correctness
def greedy_run(path: str, dtype: str, tp: int, n_out: int, kw: dict) -> list[dict]:
    from radixlm import Engine

    engine = Engine(path, load_format="dummy", dtype=dtype, device="cuda", context_length=1024, random_seed=0,
                    tp_size=tp, cuda_graph_max_bs=8, mem_fraction_static=0.8, **kw)
    try:
        outs = engine.generate(PROMPTS, sampling_params=greedy(n_out), return_logprob=True, top_logprobs_num=2)
    finally:
        close(engine)
    return [{"ids": o["output_ids"], "top2": [[t[0] for t in pos[:2]] for pos in o["meta_info"]["output_top_logprobs"]]}
            for o in outs]


def part_correctness(path: str, n_out: int, engine_args: dict, save: Callable[[dict], None]) -> dict:
    result = {"engine_args": engine_args}
    for dtype in ("float32", "bfloat16"):
        ref = isolated(greedy_run, path, dtype, 1, n_out, {}, timeout_s=240)
        tp2 = isolated(greedy_run, path, dtype, 2, n_out, engine_args, timeout_s=240)
        rows = []
        for prompt, a, b in zip(PROMPTS, ref, tp2):
            first = next((i for i, (x, y) in enumerate(zip(a["ids"], b["ids"])) if x != y), None)
            row = {"prompt": prompt, "identical": first is None, "tokens": len(a["ids"])}
            if first is not None:
                row.update({"first_divergence": first, "tp1_token": a["ids"][first], "tp2_token": b["ids"][first],
                            "tp1_top2_logit_gap": a["top2"][first][0] - a["top2"][first][1],
                            "tp2_top2_logit_gap": b["top2"][first][0] - b["top2"][first][1]})
            rows.append(row)
        same = sum(r["identical"] for r in rows)
        tokens_same = sum(r.get("first_divergence", r["tokens"]) for r in rows)
        result[dtype] = {"identical_sequences": same, "sequences": len(rows),
                         "tokens_before_first_divergence": tokens_same, "tokens": sum(r["tokens"] for r in rows),
                         "rows": rows}
        log(f"correctness {dtype}: {same}/{len(rows)} sequences identical, "
            f"{tokens_same}/{sum(r['tokens'] for r in rows)} tokens before the first divergence")
        for r in rows:
            if not r["identical"]:
                log(f"   diverges at {r['first_divergence']}: top-2 logit gap TP1 {r['tp1_top2_logit_gap']:.4f}, "
                    f"TP2 {r['tp2_top2_logit_gap']:.4f}  ({r['prompt'][:40]!r})")
        save(result)
    return result


# ------------------------------------------------------------------------------------------------------------- speed
def decode_table(engine, src: PromptSource, bw: float, batches: list[int], steps: int) -> list[dict]:
    weight_bytes, _, _ = model_bytes(engine)  # this rank's
    kv_per_token = engine.runner.kv_bytes_per_token()
    decode_steps(engine, src, 8, steps=16)  # warm-up
    rows = []
    for b in batches:
        step = decode_steps(engine, src, b, steps=steps)
        floor = (weight_bytes + b * (512 + steps / 2) * kv_per_token) / bw
        rows.append({"batch": b, "step_ms": step * 1e3, "floor_ms": floor * 1e3, "ratio_to_floor": step / floor,
                     "output_tokens_per_s": b / step})
        log(f"   decode batch {b:4d}: {step * 1e3:7.2f} ms/step, floor {floor * 1e3:6.2f} ms, {step / floor:5.2f}x floor")
    return rows


def prompt_source(path: str) -> PromptSource:
    from transformers import AutoTokenizer

    return PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))


def speed_run(path: str, bw: float, name: str, batches: list[int], steps: int, sharegpt_n: int,
              profile_batches: list[int], kw: dict):
    """Yields its row after the measurements and again with rank 0's kernel profile (torch.profiler has crashed
    this process on nvidia-h200-x2 before: the row measured so far survives that)."""
    log(f"{name}: {kw}")
    src = prompt_source(path)
    t0 = time.perf_counter()
    engine = make_engine(path, max_running_requests=max(batches), **kw)
    row = {"engine_args": kw, "startup_s": time.perf_counter() - t0}
    try:
        row["decode"] = decode_table(engine, src, bw, batches, steps)
        if sharegpt_n:
            row["sharegpt_like"] = offline_run(engine, sharegpt_like_dataset(src, sharegpt_n, seed=1), name,
                                               mfu=False)
        if profile_batches:
            row["profile"] = [step_profile(engine, src, b) for b in profile_batches]
            for p in row["profile"]:
                log(f"   host profile batch {p['batch']}: wall {p['wall_us']:.0f} us/step, scheduler host work "
                    f"{p['host_busy_us']:.0f} us, waiting for the device {p['wait_for_device_us']:.0f} us")
            yield dict(row)
            row["kernels"] = []
            for b in profile_batches:
                k = step_kernels(engine, src, b, 32, top=12)
                row["kernels"].append(k)
                log(f"   kernels batch {b}: wall {k['wall_us_per_step']:.0f} us/step, rank 0 device busy "
                    f"{k['gpu_busy_us_per_step']:.0f} us in {k['launches_per_step']:.0f} launches")
                for kk in k["kernels"][:8]:
                    log(f"      {kk['us_per_step']:8.1f} us  x{kk['launches_per_step']:5.1f}  {kk['name'][:90]}")
    finally:
        close(engine)
    yield row


TP_CONFIGS = {"tp1": {}, "tp2_nccl": {"tp_size": 2, "disable_custom_all_reduce": True},
              "tp2_unfused": {"tp_size": 2, "disable_allreduce_fusion": True}, "tp2": {"tp_size": 2}}


def part_tp(path: str, bw: float, batches: list[int], steps: int, sharegpt_n: int,
            profile_batches: list[int], configs: list[str], save: Callable[[dict], None]) -> dict:
    runs = {}
    for name, kw in TP_CONFIGS.items():
        if name not in configs:
            continue
        t0 = time.perf_counter()
        try:  # a config that fails or hangs loses only its own row
            runs[name] = isolated(speed_run, path, bw, name, batches, steps, sharegpt_n, profile_batches, kw,
                                  timeout_s=300)
        except Exception as e:  # noqa: BLE001 - recorded in the results
            log(f"{name} failed: {e}")
            runs[name] = {"error": str(e)[-2000:]}
        runs[name]["wall_s"] = time.perf_counter() - t0
        save({"runs": runs})  # a run cut short by its caller's timeout keeps the configs measured so far
    ok = [c for c in runs if "error" not in runs[c]]
    ratios = {}
    for name in [c for c in ("tp2_nccl", "tp2_unfused", "tp2") if c in ok and "tp1" in ok]:
        ratios[name] = {
            "step_over_tp1": {str(b["batch"]): b["step_ms"] / a["step_ms"]
                              for a, b in zip(runs["tp1"]["decode"], runs[name]["decode"])},
            "sharegpt_throughput_over_tp1": (runs[name]["sharegpt_like"]["output_tokens_per_s"]
                                             / runs["tp1"]["sharegpt_like"]["output_tokens_per_s"]) if sharegpt_n else None,
        }
        log(f"{name} / tp1: step {ratios[name]['step_over_tp1']}, sharegpt {ratios[name]['sharegpt_throughput_over_tp1']}")
    return {"runs": runs, "ratios": ratios,
            "targets": "batch-1 step <= 0.65x TP=1; batch-256 decode throughput >= 1.6x TP=1 (step <= 0.625x)"}


BIG_RUNS = {"big": ("llama-70b tp2", {"tp_size": 2}, 360),
            "big_fp8": ("llama-70b fp8 tp1", {"quantization": "fp8"}, 420)}


def part_big(path8b: str, bw: float, sharegpt_n: int, run: str = "big") -> dict:
    name, kw, timeout_s = BIG_RUNS[run]
    return isolated(speed_run, llama70b_dir(path8b), bw, name, [1, 32], 64, sharegpt_n, [],
                    {**kw, "cuda_graph_max_bs": 64, "mem_fraction_static": 0.92}, timeout_s=timeout_s)


def moe_decode(path: str, kw: dict, bw: float, batches: list[int]) -> dict:
    moe.ENGINE_ARGS.update(kw)
    return moe.part_decode(path, "cuda", "bfloat16", 4096, prompt_source(path), bw, batches, 256, 64)


def moe_offline(path: str, kw: dict, sharegpt_n: int) -> dict:
    moe.ENGINE_ARGS.update(kw)
    return moe.part_offline(path, "cuda", "bfloat16", 4096, prompt_source(path), sharegpt_n, 0, 0, 0)


def part_moe(bw: float, batches: list[int], sharegpt_n: int, save: Callable[[dict], None]) -> dict:
    """Each engine in a process of its own: a second TP engine in one process hung setting up its group."""
    path = mixtral_dir()
    result = {}
    for name, kw in (("tp2", {"tp_size": 2}), ("ep2", {"tp_size": 2, "ep_size": 2})):
        result[name] = {}
        for what, fn, args in (("decode", moe_decode, (bw, batches)), ("offline", moe_offline, (sharegpt_n,))):
            log(f"mixtral {name} {what}")
            t0 = time.perf_counter()
            try:
                result[name][what] = isolated(fn, path, kw, *args, timeout_s=200)
            except Exception as e:  # noqa: BLE001 - recorded in the results
                log(f"mixtral {name} {what} failed: {e}")
                result[name][what] = {"error": str(e)[-2000:]}
            result[name][what]["wall_s"] = time.perf_counter() - t0
            save(result)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["correctness", "tp"],
                   choices=["correctness", "tp", "big", "big_fp8", "moe", "allreduce"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    p.add_argument("--decode-steps", type=int, default=128)
    p.add_argument("--correctness-tokens", type=int, default=48)
    p.add_argument("--sharegpt-requests", type=int, default=500)
    p.add_argument("--big-sharegpt-requests", type=int, default=200)
    p.add_argument("--tp-configs", nargs="+", default=list(TP_CONFIGS), choices=list(TP_CONFIGS))
    p.add_argument("--profile-batches", type=int, nargs="*", default=[1, 256],
                   help="tp: host-timer profile of the decode step at these batch sizes")
    p.add_argument("--correctness-engine-args", default="{}", help="JSON of extra server arguments for correctness")
    p.add_argument("--world-size", type=int, default=torch.cuda.device_count(), help="allreduce: GPUs")
    p.add_argument("--sizes-kib", type=int, nargs="+", default=[8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
                   help="allreduce: tensor sizes")
    p.add_argument("--out", default="benchmarks/results/multi_gpu/multi_gpu.json")
    args = p.parse_args()
    path = model_dir()
    result = {"benchmark": "gpu_multi", "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
              "torch": torch.__version__, "command": " ".join(["python", *sys.argv])}
    bw = 0.0
    if set(args.parts) - {"allreduce"}:  # the all-reduce table alone needs no copy bandwidth
        bw = measure_copy_bandwidth()
        result["copy_bandwidth_TBps"] = bw / 1e12
        log(f"copy bandwidth {bw / 1e12:.2f} TB/s (read + write), {torch.cuda.device_count()} x "
            f"{torch.cuda.get_device_name()}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def saver(name: str) -> Callable[[dict], None]:
        def save(partial: dict) -> None:
            result[name] = {**partial, "partial": True}
            out.write_text(json.dumps(result, indent=2) + "\n")
        return save

    parts = {
        "correctness": lambda: part_correctness(path, args.correctness_tokens,
                                                json.loads(args.correctness_engine_args), saver("correctness")),
        "tp": lambda: part_tp(path, bw, args.batches, args.decode_steps, args.sharegpt_requests,
                              args.profile_batches, args.tp_configs, saver("tp")),
        "big": lambda: part_big(path, bw, args.big_sharegpt_requests),
        "big_fp8": lambda: part_big(path, bw, args.big_sharegpt_requests, "big_fp8"),
        "moe": lambda: part_moe(bw, args.batches, args.sharegpt_requests, saver("moe")),
        "allreduce": lambda: allreduce.measure(args.world_size, args.sizes_kib, out.with_suffix(".allreduce.json")),
    }
    t0 = time.perf_counter()
    for name in args.parts:  # each part is written as soon as it is measured; a failed part does not stop the rest
        log(f"part {name}")
        try:
            result[name] = parts[name]()
        except Exception as e:  # noqa: BLE001 - recorded in the results
            import traceback

            traceback.print_exc()
            result[name] = {"error": f"{type(e).__name__}: {e}"}
        result["bench_seconds"] = time.perf_counter() - t0
        out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {out} after {result['bench_seconds']:.0f} s")


if __name__ == "__main__":
    main()
