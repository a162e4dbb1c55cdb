"""Qwen3-30B-A3B (bf16, dummy weights) on one GPU through the offline Engine: the MoE table of issue 22, parts chosen
with --parts:

  kernel   one layer's experts (128 experts, top-8, hidden 2048, moe_intermediate 768): the fused Triton path against
           the torch path at several token counts; time, the bytes of the experts the tokens touch / copy bandwidth
           as the floor, and the largest difference between the two paths
  decode   decode step time at batch 1, 32, 256 ((t_{steps+1} - t_1) / steps, fresh random prompts) against the floor:
           the bytes read per step (every weight but the embedding table, but of each layer's experts only those
           the batch is expected to touch under uniform routing, E * (1 - (1 - k/E)^batch), plus the KV cache read)
           / the device-to-device copy bandwidth measured in this run
  offline  offline throughput: ShareGPT-like and random prompts (token ids), output and total tokens/s

    python benchmarks/offline/gpu_moe.py --out $OUT/moe_gpu.json
    python benchmarks/offline/gpu_moe.py --tiny --out /tmp/moe_tiny.json     # the same logic on the CPU, a tiny config

The model directory (config written with transformers' Qwen3MoeConfig, a word-level tokenizer t0..t{V-1}: prompts
are token ids, nothing is downloaded) is made under $RADIXLM_CACHE_DIR or ~/.cache/radixlm. Greedy, EOS ignored.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.moe import ENGINE_ARGS, dummy_model_dir, part_decode, part_offline, run_parts  # noqa: E402
from radixlm.bench.datasets import PromptSource  # noqa: E402
from radixlm.runtime.kernels.moe import fused_experts, select_experts  # noqa: E402
from radixlm.runtime.kernels.moe.fused_moe import fused_experts_torch  # noqa: E402

QWEN3_30B_A3B = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
    norm_topk_prob=True, max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
    bos_token_id=151643, eos_token_id=151645,
)
TINY = dict(
    vocab_size=1024, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=16, num_experts_per_tok=4,
    norm_topk_prob=True, max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
    bos_token_id=0, eos_token_id=1,
)
H100_BF16_DENSE_TFLOPS = 989.4


def log(*a) -> None:
    print(*a, flush=True)


def model_dir(tiny: bool) -> str:
    from transformers import Qwen3MoeConfig

    shapes = TINY if tiny else QWEN3_30B_A3B
    config = Qwen3MoeConfig(**shapes)
    config.architectures = ["Qwen3MoeForCausalLM"]
    return dummy_model_dir("qwen3-moe-tiny-dummy" if tiny else "qwen3-30b-a3b-dummy", config)


class Clock:
    """Wall time of fn on the device: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def per_call_s(self, fn, reps: int, warmup: int = 3) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / reps
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps


def measure_copy_bandwidth(device: str, nbytes: int) -> float:
    """Copy bandwidth in bytes/s, counting the bytes read and the bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    sec = Clock(device).per_call_s(lambda: dst.copy_(src), reps=20)
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return 2 * nbytes / sec


# ------------------------------------------------------------------------------------------------------------ kernel
# Candidate tiles for --tune: (block_m, block_n, block_k, num_warps, num_stages).
TUNE_CONFIGS = [(16, 32, 128, 4, 4), (16, 64, 128, 4, 4), (16, 64, 256, 4, 3), (16, 128, 128, 4, 4),
                (32, 64, 128, 4, 4), (32, 128, 64, 4, 4), (64, 64, 64, 4, 4), (64, 128, 64, 4, 3),
                (64, 128, 64, 8, 4), (128, 128, 64, 8, 3), (64, 256, 64, 8, 3), (128, 256, 64, 8, 3)]


def graph_time_s(fn, clock: "Clock", reps: int) -> float:
    """Device time of fn replayed from a CUDA graph (as decode runs it): no host launch overhead. Capturing also
    checks that fn never syncs with the host."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return clock.per_call_s(graph.replay, reps)


def part_kernel(shapes: dict, device: str, dtype: torch.dtype, bw: float, token_counts: list[int],
                triton_ok: bool, tune: bool) -> dict:
    from radixlm.runtime.kernels.moe.fused_moe import GemmConfig, fused_experts_triton, pick_config

    e, k, h, i = shapes["num_experts"], shapes["num_experts_per_tok"], shapes["hidden_size"], shapes["moe_intermediate_size"]
    g = torch.Generator(device=device).manual_seed(0)
    w13 = (torch.randn(e, 2 * i, h, device=device, generator=g) * h**-0.5).to(dtype)
    w2 = (torch.randn(e, h, i, device=device, generator=g) * i**-0.5).to(dtype)
    expert_bytes = (w13[0].numel() + w2[0].numel()) * w13.element_size()
    clock = Clock(device)
    cuda = device == "cuda"
    rows = []
    for t in token_counts:
        x = torch.randn(t, h, device=device, generator=g).to(dtype)
        weights, ids = select_experts(torch.randn(t, e, device=device, generator=g), k, renormalize=True)
        touched = int(torch.unique(ids).numel())
        reps = max(5, min(200, 8000 // max(t, 1))) if cuda else 3
        row = {"tokens": t, "experts_touched": touched, "floor_us": touched * expert_bytes / bw * 1e6,
               "gflop": 2 * t * k * 3 * h * i / 1e9}
        row["torch_us"] = clock.per_call_s(lambda: fused_experts_torch(x, w13, w2, weights, ids), reps) * 1e6
        if triton_ok:
            cfg = pick_config(t * k, e, dtype)
            row["config"] = list(vars(cfg).values())
            fused = lambda: fused_experts(x, w13, w2, weights, ids, use_triton=True)  # noqa: E731
            row["fused_eager_us"] = clock.per_call_s(fused, reps) * 1e6
            # The engine replays decode from CUDA graphs: the kernel's own time is the graph's.
            row["fused_us"] = graph_time_s(fused, clock, reps) * 1e6 if cuda else row["fused_eager_us"]
            ref = fused_experts_torch(x, w13, w2, weights, ids).float()
            got = fused().float()
            row["max_abs_diff"] = float((got - ref).abs().max())
            row["ref_max_abs"] = float(ref.abs().max())
            row["speedup"] = row["torch_us"] / row["fused_us"]
            row["fused_over_floor"] = row["fused_us"] / row["floor_us"]
            row["fused_tflops"] = row["gflop"] / row["fused_us"] * 1e3  # GFLOP per us -> TFLOP/s
            if tune and cuda:
                tuned = {}
                for c in TUNE_CONFIGS:
                    gc_ = GemmConfig(*c)
                    try:
                        tuned[str(c)] = graph_time_s(
                            lambda: fused_experts_triton(x, w13, w2, weights, ids, config=gc_), clock, reps) * 1e6
                    except Exception as ex:  # noqa: BLE001 - a tile that does not fit (shared memory) is skipped
                        tuned[str(c)] = f"failed: {type(ex).__name__}"
                row["tuned_us"] = tuned
                best = min((v, c) for c, v in tuned.items() if isinstance(v, float))
                row["best_config"], row["best_us"] = best[1], best[0]
                log(f"   tune {t} tokens: best {best[1]} {best[0]:.1f} us; "
                    + ", ".join(f"{c} {v:.0f}" if isinstance(v, float) else f"{c} {v}" for c, v in tuned.items()))
        rows.append(row)
        fused_txt = (f"fused {row['fused_us']:8.1f} us (eager {row['fused_eager_us']:8.1f}; {row['fused_over_floor']:5.2f}x "
                     f"floor, {row['fused_tflops']:6.1f} TFLOP/s, diff {row['max_abs_diff']:.1e})  " if triton_ok else "")
        log(f"experts, {t:5d} tokens ({touched:3d} experts): {fused_txt}torch {row['torch_us']:9.1f} us, "
            f"floor {row['floor_us']:8.1f} us")
    del w13, w2
    if cuda:
        torch.cuda.empty_cache()
    return {"experts": e, "top_k": k, "hidden": h, "moe_intermediate": i, "dtype": str(dtype),
            "expert_bytes": expert_bytes, "triton": triton_ok, "rows": rows,
            "fused_us_is": "CUDA-graph replay (device time)" if cuda else "eager"}


def print_table(result: dict) -> None:
    log("\n| part | setting | ours | floor / reference | ratio |")
    log("| --- | --- | --- | --- | --- |")
    log(f"| bandwidth | copy, read + write | {result['copy_bandwidth_GBps']:.0f} GB/s | | |")
    for r in result.get("kernel", {}).get("rows", []):
        if "fused_us" in r:
            log(f"| experts | {r['tokens']} tokens, fused vs torch | {r['fused_us']:.1f} us | torch {r['torch_us']:.1f} us, "
                f"floor {r['floor_us']:.1f} us | {r['speedup']:.2f}x faster, {r['fused_over_floor']:.2f}x floor |")
        else:
            log(f"| experts | {r['tokens']} tokens, torch | {r['torch_us']:.1f} us | floor {r['floor_us']:.1f} us | |")
    for r in result.get("decode", {}).get("rows", []):
        log(f"| decode | batch {r['batch']} | {r['step_ms']:.2f} ms/step | floor {r['floor_ms']:.2f} ms | "
            f"{r['ratio_to_floor']:.2f}x floor |")
    for name, r in result.get("offline", {}).items():
        log(f"| offline | {name}, {r['requests']} requests | {r['output_tokens_per_s']:.0f} out tok/s | "
            f"{r['total_tokens_per_s']:.0f} total tok/s | |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["kernel", "decode", "offline"], choices=["kernel", "decode", "offline"])
    p.add_argument("--tiny", action="store_true", help="a tiny Qwen3-MoE config on the CPU (float32): checks the logic")
    p.add_argument("--batches", type=int, nargs="+", default=None, help="decode batch sizes (default 1 32 256)")
    p.add_argument("--prompt-len", type=int, default=None, help="decode: prompt tokens per request (default 256)")
    p.add_argument("--decode-steps", type=int, default=None, help="decode: measured steps (default 128)")
    p.add_argument("--kernel-tokens", type=int, nargs="+", default=None,
                   help="kernel: token counts (default 1 8 32 64 128 256 512 1024 4096)")
    p.add_argument("--tune", action="store_true", help="kernel: also time every tile of TUNE_CONFIGS")
    p.add_argument("--sharegpt-requests", type=int, default=None, help="offline: ShareGPT-like requests (default 500)")
    p.add_argument("--random-requests", type=int, default=None, help="offline: random requests (default 256)")
    p.add_argument("--random-input", type=int, default=1024)
    p.add_argument("--random-output", type=int, default=256)
    p.add_argument("--context-length", type=int, default=4096)
    p.add_argument("--engine-args", default="{}", help="JSON of extra server arguments")
    p.add_argument("--out", default="benchmarks/results/offline/moe_gpu.json")
    args = p.parse_args()
    ENGINE_ARGS.update(json.loads(args.engine_args))
    tiny = args.tiny
    device = "cpu" if tiny else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device: run with --tiny on the CPU")
    dtype_name, dtype = ("float32", torch.float32) if tiny else ("bfloat16", torch.bfloat16)
    batches = args.batches or ([1, 4, 16] if tiny else [1, 32, 256])
    prompt_len = args.prompt_len or (32 if tiny else 256)
    steps = args.decode_steps or (8 if tiny else 128)
    kernel_tokens = args.kernel_tokens or ([1, 4, 16, 64] if tiny else [1, 8, 32, 64, 128, 256, 512, 1024, 4096])
    sharegpt_n = args.sharegpt_requests if args.sharegpt_requests is not None else (16 if tiny else 500)
    random_n = args.random_requests if args.random_requests is not None else (8 if tiny else 256)
    random_in, random_out = (64, 16) if tiny and args.random_input == 1024 else (args.random_input, args.random_output)
    context_len = min(args.context_length, 1024) if tiny else args.context_length
    shapes = TINY if tiny else QWEN3_30B_A3B
    # The fused kernel needs CUDA, or Triton's interpreter (TRITON_INTERPRET=1, slow) on the CPU.
    triton_ok = device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"

    path = model_dir(tiny)
    from transformers import AutoTokenizer

    src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
    result = {"benchmark": "gpu_moe", "model": f"Qwen3-MoE {'tiny' if tiny else '30B-A3B'} shapes, {dtype_name}, dummy weights",
              "shapes": shapes, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "radixlm": sys.modules["radixlm"].__file__, "engine_args": ENGINE_ARGS,
              "command": " ".join(["python", *sys.argv])}
    t0 = time.perf_counter()
    bw = measure_copy_bandwidth(device, (2 << 30) if device == "cuda" else (64 << 20))
    result["copy_bandwidth_GBps"] = bw / 1e9
    log(f"copy bandwidth {bw / 1e9:.0f} GB/s (read + write)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = {
        "kernel": lambda: part_kernel(shapes, device, dtype, bw, kernel_tokens, triton_ok, args.tune),
        "decode": lambda: part_decode(path, device, dtype_name, context_len, src, bw, batches, prompt_len, steps),
        "offline": lambda: part_offline(path, device, dtype_name, context_len, src, sharegpt_n, random_n, random_in,
                                        random_out),
    }
    run_parts(parts, args.parts, result, out, t0)
    print_table(result)
    log(f"wrote {out} after {result['bench_seconds']:.0f} s")


if __name__ == "__main__":
    main()
