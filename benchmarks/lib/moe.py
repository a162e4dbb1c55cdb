"""MoE engines with dummy weights (Qwen3-30B-A3B, Mixtral shapes): a model directory from a transformers config, the
decode step against the bytes of the experts a batch touches, offline throughput, and a run's parts written as they
are measured (offline/gpu_moe.py, offline/gpu_deepseek.py; multi_gpu/gpu_multi.py under expert parallelism)."""
from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path

import torch

from benchmarks.lib.engine import close, decode_steps, log, offline_run
from radixlm import Engine
from radixlm.bench.datasets import PromptSource, random_dataset, sharegpt_like_dataset
from radixlm.runtime.layers.moe import FusedMoE


def dummy_model_dir(name: str, config) -> str:
    """A transformers config and a word-level tokenizer t0..t{V-1} of its vocabulary (the engine wants a tokenizer;
    prompts are token ids) in $RADIXLM_CACHE_DIR/name."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = os.environ.get("RADIXLM_CACHE_DIR", os.path.expanduser("~/.cache/radixlm"))
    out = Path(root) / name
    out.mkdir(parents=True, exist_ok=True)
    config.dtype = "bfloat16"
    config.save_pretrained(out)
    if not (out / "tokenizer.json").exists():
        tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(config.vocab_size)}, unk_token="t0"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token=f"t{config.eos_token_id}",
                                bos_token=f"t{config.bos_token_id}").save_pretrained(out)
    return str(out)


def expected_experts(num_experts: int, top_k: int, batch: int) -> float:
    """Distinct experts a layer reads for `batch` tokens that each pick top_k of num_experts uniformly."""
    return num_experts * (1 - (1 - top_k / num_experts) ** batch)


ENGINE_ARGS: dict = {}


def make_engine(path: str, device: str, dtype: str, context_len: int, **kw) -> Engine:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        kw.setdefault("mem_fraction_static", 0.88)
    kw = {**kw, **ENGINE_ARGS}
    return Engine(path, load_format="dummy", dtype=dtype, device=device, context_length=context_len, random_seed=0, **kw)


def weight_bytes(model) -> dict:
    """Bytes of the weights a decode step reads, split: dense (all but the embedding table and the experts), and per
    expert of each MoE layer."""
    moes = [m for m in model.modules() if isinstance(m, FusedMoE)]
    expert_params = {id(p) for m in moes for p in (m.w13_weight, m.w2_weight)}
    embed = model.model.embed_tokens.weight
    dense = sum(p.numel() * p.element_size() for p in model.parameters()
                if id(p) not in expert_params and p is not embed)
    m = moes[0]
    per_expert = (m.w13_weight[0].numel() + m.w2_weight[0].numel()) * m.w13_weight.element_size()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"dense": dense, "per_expert": per_expert, "moe_layers": len(moes), "num_experts": m.num_experts,
            "local_experts": m.num_local_experts, "top_k": m.top_k, "total": total}


def part_decode(path: str, device: str, dtype: str, context_len: int, src: PromptSource, bw: float,
                batches: list[int], prompt_len: int, steps: int) -> dict:
    engine = make_engine(path, device, dtype, context_len, max_running_requests=max(batches),
                         **({"cuda_graph_max_bs": max(batches)} if device == "cuda" else {}))
    try:
        wb = weight_bytes(engine.runner.model)
        kv_per_token = engine.runner.kv_bytes_per_token()
        decode_steps(engine, src, min(8, max(batches)), prompt_len, steps=min(16, steps))  # warm-up
        rows = []
        for b in batches:
            step = decode_steps(engine, src, b, prompt_len, steps)
            # Under expert parallelism this rank holds local_experts of them (an even share of the touched ones).
            touched = expected_experts(wb["num_experts"], wb["top_k"], b) * wb["local_experts"] / wb["num_experts"]
            active = wb["dense"] + wb["moe_layers"] * touched * wb["per_expert"]
            # The measured steps read on average prompt_len + steps / 2 positions of KV per request.
            kv = b * (prompt_len + steps / 2) * kv_per_token
            floor = (active + kv) / bw
            rows.append({"batch": b, "step_ms": step * 1e3, "floor_ms": floor * 1e3, "ratio_to_floor": step / floor,
                         "expected_experts_per_layer": touched, "active_weight_bytes": active, "kv_bytes": kv,
                         "output_tokens_per_s": b / step})
            log(f"decode batch {b:4d}: {step * 1e3:8.2f} ms/step, floor {floor * 1e3:7.2f} ms "
                f"({active / 1e9:6.2f} GB weights, {touched:5.1f} experts/layer, {kv / 1e9:5.2f} GB KV), "
                f"{step / floor:5.2f}x floor, {b / step:8.0f} tok/s")
        return {"weights": wb, "kv_bytes_per_token": kv_per_token, "prompt_len": prompt_len, "steps": steps,
                "rows": rows}
    finally:
        close(engine)


def part_offline(path: str, device: str, dtype: str, context_len: int, src: PromptSource, sharegpt_n: int,
                 random_n: int, random_in: int, random_out: int) -> dict:
    engine = make_engine(path, device, dtype, context_len)
    try:
        offline_run(engine, random_dataset(src, 16, 64, 8, 1.0), "warm-up", mfu=False)
        result = {}
        if sharegpt_n:
            reqs = sharegpt_like_dataset(src, sharegpt_n, seed=1, max_input_len=min(2048, context_len // 2),
                                         max_output_len=min(1024, context_len // 2))
            result["sharegpt_like"] = offline_run(engine, reqs, "sharegpt-like", mfu=False)
        if random_n:
            result[f"random_{random_in}_{random_out}"] = offline_run(
                engine, random_dataset(src, random_n, random_in, random_out, 1.0), f"random-{random_in}-{random_out}",
                mfu=False)
        return result
    finally:
        close(engine)


def run_parts(parts: dict, names: list[str], result: dict, out: Path, t0: float) -> None:
    """parts[name]() for each name in order, into result[name]; the JSON is written after each (a run stopped at its
    time limit keeps what it measured)."""
    for name in names:
        result[name] = parts[name]()
        result["bench_seconds"] = time.perf_counter() - t0
        out.write_text(json.dumps(result, indent=2) + "\n")
