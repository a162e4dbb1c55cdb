"""The engine side of the Llama-3.1-8B benchmarks (bf16, dummy weights): one engine with the defaults, the peer
measurement of a decode step ((t257 - t1) / 256 over fresh prompts), an offline workload's throughput and pass counts,
and the workloads of peer-anchors.md on one engine (ab_workloads: the side-by-side's and an A/B's)."""
from __future__ import annotations

import gc
import time
from types import SimpleNamespace

import torch

from radixlm import Engine
from radixlm.bench.datasets import PromptSource, generated_shared_prefix_dataset, random_dataset
from radixlm.bench.datasets import sharegpt_like_dataset

H100_BF16_DENSE_TFLOPS = 989.4
CONTEXT_LEN = 4096


def log(*a) -> None:
    print(*a, flush=True)


def measure_copy_bandwidth(nbytes: int = 2 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting the bytes read and the bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    torch.cuda.synchronize()
    bw = 2 * nbytes * reps / (time.perf_counter() - t0)
    del src, dst
    torch.cuda.empty_cache()
    return bw


ENGINE_ARGS: dict = {}  # --engine-args: extra ServerArgs for every engine of the run


def make_engine(path: str, **kw) -> Engine:
    gc.collect()
    torch.cuda.empty_cache()
    kw = {**ENGINE_ARGS, **kw}
    kw.setdefault("mem_fraction_static", 0.85)
    return Engine(path, load_format="dummy", dtype="bfloat16", device="cuda", context_length=CONTEXT_LEN,
                  random_seed=0, **kw)


def force_choices(forced: dict[str, str]) -> None:
    """Start-up takes the given kernel (a gemm.GemmKernel name: skinny, skinny_mma, cublas) for these 8B GEMMs' weight
    shapes (gpu_timing.SHAPES) at every choice key where it may run, instead of measuring: what a choice at one or two
    rows costs the other batch sizes' steps."""
    from benchmarks.lib.gpu_timing import SHAPES
    from radixlm.runtime.kernels.gemm import dispatch as gemm

    by_shape = {SHAPES[name]: gemm.GemmKernel[kind.upper()] for name, kind in forced.items()}
    measure = gemm._fastest

    def fastest(kernels, x, weight, *rest):
        kernel = by_shape.get(tuple(weight.shape))
        if kernel is None or (kernel not in kernels and kernel is not gemm.GemmKernel.CUBLAS):
            return measure(kernels, x, weight, *rest)
        return kernel

    gemm._fastest = fastest


def close(engine: Engine, timeout_s: float = 120.0) -> None:
    """engine.shutdown() (releases the model, the KV pool and the graphs), given up on after timeout_s: a
    tensor-parallel shutdown hung on GPUs (2026-11-25), and a benchmark must still report what it measured."""
    import threading

    t = threading.Thread(target=engine.shutdown, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        log(f"engine shutdown still running after {timeout_s:.0f} s: left behind")


def greedy(n_out: int) -> dict:
    return {"temperature": 0, "max_new_tokens": n_out, "ignore_eos": True}


def timed(engine: Engine, prompts: list[list[int]], params) -> tuple[float, list[dict]]:
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    return time.perf_counter() - t0, outs


def model_bytes(engine: Engine) -> tuple[int, int, int]:
    """(bytes read per decode step for weights: all but the embedding table, non-embedding parameter count,
    lm_head parameter count)."""
    model = engine.runner.model
    embed = model.model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    n_params = sum(p.numel() for p in model.parameters()) - embed.numel()
    return total - embed.numel() * embed.element_size(), n_params, model.lm_head.weight.numel()


def decode_steps(engine: Engine, src: PromptSource, batch: int, prompt_len: int = 512, steps: int = 256) -> float:
    """Seconds per decode step at `batch`: fresh prompts for each run, so nothing is served from the radix cache."""
    # Untimed first: a new prefill shape may compile a kernel variant, which must not land in either timed run.
    timed(engine, [src.ids(prompt_len) for _ in range(batch)], greedy(2))
    t1, _ = timed(engine, [src.ids(prompt_len) for _ in range(batch)], greedy(1))
    tn, _ = timed(engine, [src.ids(prompt_len) for _ in range(batch)], greedy(steps + 1))
    return (tn - t1) / steps


def flops(n_params: int, lm_head: int, layers: int, q_width: int, lens: list[tuple[int, int, int]]) -> float:
    """Forward FLOPs computed for requests (input, cached, output): 2 x non-embedding params per computed token (the
    lm_head only for the tokens that sample), plus attention 4 x layers x q_width x position per computed token.
    Tokens served from the radix cache cost nothing."""
    dense = sum(2 * (n_params - lm_head) * (i - c + o) + 2 * lm_head * o for i, c, o in lens)
    attn = sum(4 * layers * q_width * ((i + o) * (i + o - 1) // 2 - c * (c - 1) // 2) for i, c, o in lens)
    return float(dense + attn)


def offline_run(engine: Engine, reqs, name: str, mfu: bool = True) -> dict:
    """One offline workload: throughput and pass counts (and MFU by the dense-model formula, unless mfu=False)."""
    prompts = [r.input_ids for r in reqs]
    params = [greedy(r.output_len) for r in reqs]
    before = dict(engine.scheduler.stats)
    wall, outs = timed(engine, prompts, params)
    steps = {k: engine.scheduler.stats[k] - before[k]
             for k in ("prefill_batches", "decode_batches", "mixed_batches", "retractions")}
    n_out = sum(o["meta_info"]["completion_tokens"] for o in outs)
    n_in = sum(len(p) for p in prompts)
    row = {"workload": name, "requests": len(reqs), "input_tokens": n_in, "output_tokens": n_out, "wall_s": wall,
           "output_tokens_per_s": n_out / wall, "total_tokens_per_s": (n_in + n_out) / wall,
           "request_per_s": len(reqs) / wall, **steps}
    shown = ""
    if mfu:
        _, n_params, lm_head = model_bytes(engine)
        cfg = engine.model_config
        f = flops(n_params, lm_head, cfg.num_layers, cfg.num_heads * cfg.head_dim,
                  [(len(p), o["meta_info"]["cached_tokens"], o["meta_info"]["completion_tokens"])
                   for p, o in zip(prompts, outs)])
        row["mfu"] = f / wall / (H100_BF16_DENSE_TFLOPS * 1e12)
        shown = f", MFU {row['mfu']:.1%}"
    log(f"{name}: {len(reqs)} requests in {wall:6.1f} s, {row['output_tokens_per_s']:8.0f} out tok/s, "
        f"{row['total_tokens_per_s']:8.0f} total tok/s{shown}, {steps}")
    return row


# The peer-anchors.md workloads: decode prompt length; ShareGPT-like (requests, max input, max output); random
# (requests, input, output); generated-shared-prefix (groups, per group, prefix, question, output).
PEER_SIZES = {"prompt_len": 512, "sharegpt": (1000, 2048, 1024), "random": (500, 1024, 512),
              "prefix": (32, 32, 2048, 128, 64)}


def ab_workloads(engine: Engine, src: PromptSource, batches: list[int], steps: int, sizes: dict, mfu: bool = True,
                 result: dict | None = None, checkpoint=lambda: None) -> dict:
    """The decode table, ShareGPT-like, random and generated-shared-prefix on one engine, in that order (datasets
    drawn from src as each starts); each into `result` as measured, checkpoint() after each. A workload sized 0 (no
    batches, no requests, no groups) is skipped: an A/B may measure one workload many times."""
    result = {} if result is None else result
    decode_steps(engine, src, 8, sizes["prompt_len"], steps=16)  # warm-up
    if batches:
        result["decode"] = []
    for b in batches:
        step = decode_steps(engine, src, b, sizes["prompt_len"], steps=steps)
        result["decode"].append({"batch": b, "step_ms": step * 1e3, "output_tokens_per_s": b / step})
        log(f"decode batch {b:4d}: {step * 1e3:7.2f} ms/step")
    checkpoint()
    n, max_in, max_out = sizes["sharegpt"]
    if n:
        reqs = sharegpt_like_dataset(src, n, seed=1, max_input_len=max_in, max_output_len=max_out)
        result["sharegpt_like"] = offline_run(engine, reqs, "sharegpt-like", mfu)
        # sizes["sharegpt_repeats"]: the same requests again on an emptied radix cache, each run apart (how much
        # one engine's runs vary, against the variation between engines); the first run stays the figure.
        for i in range(1, sizes.get("sharegpt_repeats", 1)):
            engine.flush_cache()
            result.setdefault("sharegpt_like_repeats", []).append(offline_run(engine, reqs, f"sharegpt-like #{i + 1}",
                                                                             mfu))
        checkpoint()
    if sizes["random"][0]:
        result["random_1024_512"] = offline_run(engine, random_dataset(src, *sizes["random"], 1.0), "random-1024-512",
                                                mfu)
        checkpoint()
    if not sizes["prefix"][0]:
        return result
    reqs = generated_shared_prefix_dataset(src, *sizes["prefix"], seed=2)
    stats0 = dict(engine.scheduler.stats)
    row = offline_run(engine, reqs, "generated-shared-prefix", mfu)
    st = engine.scheduler.stats
    row["hit_rate"] = (st["cached_tokens"] - stats0["cached_tokens"]) / max(st["prompt_tokens"] - stats0["prompt_tokens"], 1)
    result["shared_prefix"] = row
    checkpoint()
    return result


def sharegpt_lengths(seed: int = 1, n: int = 1000) -> tuple[list[int], list[int]]:
    """(input lengths, output lengths) of ShareGPT-like, drawn as the benchmark draws them (ids are not needed)."""
    src = SimpleNamespace(ids=lambda k: k, request=lambda n_in, n_out: (n_in, n_out))
    reqs = sharegpt_like_dataset(src, n, seed)
    return [r[0] for r in reqs], [r[1] for r in reqs]
