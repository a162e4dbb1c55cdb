"""DeepSeek-V2-Lite (bf16, dummy weights) on one GPU through the offline Engine: issue 51's table, parts chosen with
--parts:

  decode   decode step time at batch 1, 32, 256 ((t_{steps+1} - t_1) / steps, fresh random prompts) against the floor:
           the bytes one step reads -- every weight but the embedding table (attention, the dense first layer, shared
           experts, routers, lm_head), of each MoE layer's 64 experts only those the batch is expected to touch
           under uniform top-6 routing, E * (1 - (1 - k/E)^batch), and the latent KV read (27 layers x (512 + 64)
           values per token) -- over the device-to-device copy bandwidth measured in this run
  offline  offline throughput: ShareGPT-like, and generated-shared-prefix (32 groups x 32 requests, a 2048-token
           prefix each; the radix-cache hit rate reported), output and total tokens/s; the engine's KV pool
  kv       KV bytes per token and tokens per GiB: the MLA latent pool's layout against Llama-3.1-8B's (GQA, 8 KV
           heads of 128, 32 layers), in bf16 and fp8
  plan     DeepSeek-V3 (671B) on 8 GPUs, FP8 block weights, TP=8 (EP=8 holds the same bytes): the weights one rank
           holds (the model built on the meta device, as radixlm would shard it), the latent KV per token (replicated
           on every rank) and the tokens and requests the rest of an H200 holds (arithmetic: nothing runs)

    python benchmarks/offline/gpu_deepseek.py --out $OUT/deepseek_v2_lite_gpu.json
    python benchmarks/offline/gpu_deepseek.py --tiny --out /tmp/deepseek_tiny.json   # the same logic on the CPU
    python benchmarks/offline/gpu_deepseek.py --model v3-fp8 --parts decode offline --out $OUT/deepseek_v3_fp8.json

The model directory (config written with transformers' DeepseekV2Config, a word-level tokenizer t0..t{V-1}: prompts
are token ids, nothing is downloaded) is made under $RADIXLM_CACHE_DIR or ~/.cache/radixlm. Greedy, EOS ignored.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.engine import PEER_SIZES, close, log, measure_copy_bandwidth, offline_run  # noqa: E402
from benchmarks.lib.moe import ENGINE_ARGS, dummy_model_dir, make_engine, part_decode, run_parts  # noqa: E402
from radixlm.bench.datasets import (  # noqa: E402
    PromptSource, generated_shared_prefix_dataset, random_dataset, sharegpt_like_dataset,
)
from radixlm.runtime.cache.kv_pool import KVLayout  # noqa: E402

YARN_V2 = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
           "mscale": 0.707, "mscale_all_dim": 0.707}
# DeepSeek-V2-Lite's config.json (15.7B parameters, 2.4B active).
V2_LITE = dict(
    vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=27,
    num_attention_heads=16, num_key_value_heads=16, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
    first_k_dense_replace=1, moe_layer_freq=1, kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128,
    qk_rope_head_dim=64, v_head_dim=128, topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
    routed_scaling_factor=1.0, scoring_func="softmax", max_position_embeddings=163840, rope_theta=10000.0,
    rope_scaling=YARN_V2, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=100000, eos_token_id=100001,
)
TINY = dict(V2_LITE, vocab_size=1024, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=16,
            num_experts_per_tok=4,
            kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, max_position_embeddings=8192,
            rope_scaling=dict(YARN_V2, factor=4, original_max_position_embeddings=2048), bos_token_id=0,
            eos_token_id=1)
# DeepSeek-V3's config.json (671B parameters; its MTP layer is not counted) with its FP8 block quantization.
V3 = dict(
    vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
    num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256, num_experts_per_tok=8,
    routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128,
    v_head_dim=128, n_group=8, topk_group=4, first_k_dense_replace=3, moe_layer_freq=1, norm_topk_prob=True,
    num_nextn_predict_layers=1, max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_scaling=dict(YARN_V2, mscale=1.0, mscale_all_dim=1.0),
    quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                         "weight_block_size": [128, 128]},
)
H200_TOTAL_BYTES = 143_771 << 20  # nvidia-smi's memory.total of an H200 (MiB)
GPU_MEM_FRACTION = 0.85  # radixlm's default --mem-fraction-static on CUDA
RUNTIME_BYTES = 3 << 30  # CUDA context, NCCL buffers, request table (estimate: not measured for this model)
PLAN_CONTEXTS = (2048, 8192, 32768)


# V3's layer shapes and FP8 blocks with 5 layers (3 dense, 2 MoE: 22.7 GB of weights) for one GPU: its FP8 MLA path
# (the fused q_a | kv_a blocks, kv_b_proj dequantized at load) and experts; and the same tiny, blocks of 16.
V3_FP8_FEW = dict(V3, num_hidden_layers=5, num_nextn_predict_layers=0)
TINY_V3_FP8 = dict(V3, vocab_size=1024, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                   num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
                   n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, q_lora_rank=64,
                   kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                   num_nextn_predict_layers=0, max_position_embeddings=8192,
                   rope_scaling=dict(YARN_V2, factor=4, original_max_position_embeddings=2048, mscale=1.0,
                                     mscale_all_dim=1.0),
                   quantization_config=dict(V3["quantization_config"], weight_block_size=[16, 16]))
MODELS = {"v2-lite": ("DeepseekV2", V2_LITE, TINY), "v3-fp8": ("DeepseekV3", V3_FP8_FEW, TINY_V3_FP8)}


def model_dir(tiny: bool, model: str = "v2-lite") -> str:
    import transformers

    arch, shapes, tiny_shapes = MODELS[model]
    config = getattr(transformers, f"{arch}Config")(**(tiny_shapes if tiny else shapes))
    config.architectures = [f"{arch}ForCausalLM"]
    name = "deepseek-v2-lite" if model == "v2-lite" else "deepseek-v3-fp8-5-layers"
    return dummy_model_dir(f"{name}-tiny-dummy" if tiny else f"{name}-dummy", config)


def copy_bandwidth(device: str) -> float:
    """Bytes/s read + written by a device-to-device copy (a small CPU copy for --tiny)."""
    if device == "cuda":
        return measure_copy_bandwidth()
    src = torch.empty(64 << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    t0 = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    return 2 * src.numel() * 5 / (time.perf_counter() - t0)


def pool_info(engine) -> dict:
    runner = engine.runner
    pool_bytes = runner.token_to_kv_pool.mem_bytes()
    return {"layout": runner.kv_layout.describe(), "pool_tokens": runner.max_total_num_tokens,
            "pool_GiB": pool_bytes / 2**30, "tokens_per_GiB": 2**30 / runner.kv_bytes_per_token()}


def part_offline(path: str, device: str, dtype: str, context_len: int, src: PromptSource, sharegpt_n: int,
                 prefix: tuple[int, int, int, int, int]) -> dict:
    engine = make_engine(path, device, dtype, context_len)
    try:
        result = {"kv_pool": pool_info(engine)}
        offline_run(engine, random_dataset(src, 16, 64, 8, 1.0), "warm-up", mfu=False)
        if sharegpt_n:
            reqs = sharegpt_like_dataset(src, sharegpt_n, seed=1, max_input_len=min(2048, context_len // 2),
                                         max_output_len=min(1024, context_len // 2))
            result["sharegpt_like"] = offline_run(engine, reqs, "sharegpt-like", mfu=False)
        if prefix[0]:
            stats0 = dict(engine.scheduler.stats)
            row = offline_run(engine, generated_shared_prefix_dataset(src, *prefix, seed=2), "shared-prefix", mfu=False)
            st = engine.scheduler.stats
            row["hit_rate"] = ((st["cached_tokens"] - stats0.get("cached_tokens", 0))
                               / max(st["prompt_tokens"] - stats0.get("prompt_tokens", 0), 1))
            row["groups"], row["per_group"], row["prefix_len"], row["question_len"], row["output_len"] = prefix
            result["shared_prefix"] = row
            log(f"shared-prefix hit rate {row['hit_rate']:.1%}")
        return result
    finally:
        close(engine)


def part_profile(path: str, device: str, dtype: str, context_len: int, src: PromptSource, batches: list[int],
                 steps: int) -> dict:
    """Where each decode step's time goes: device time per kernel (torch.profiler) and the idle gap, per batch size."""
    from benchmarks.lib.profiling import step_kernels

    engine = make_engine(path, device, dtype, context_len)
    try:
        offline_run(engine, random_dataset(src, 8, 64, 8, 1.0), "warm-up", mfu=False)
        rows = []
        for b in batches:
            row = step_kernels(engine, src, b, steps, top=16)
            rows.append(row)
            log(f"profile batch {b}: wall {row['wall_us_per_step']:8.1f} us/step, GPU busy "
                f"{row['gpu_busy_us_per_step']:8.1f} us, idle {row['idle_us_per_step']:7.1f} us, "
                f"{row['launches_per_step']:.0f} launches")
            for k in row["kernels"]:
                log(f"   {k['us_per_step']:8.1f} us  x{k['launches_per_step']:5.1f}  {k['name'][:100]}")
        return {"rows": rows}
    finally:
        close(engine)


def part_kv(shapes: dict) -> dict:
    """Per token, over all layers: the latent pool of these shapes against Llama-3.1-8B's MHA pool."""
    llama = json.loads((Path(__file__).resolve().parents[1] / "models" / "llama-3.1-8b" / "config.json").read_text())
    rows = {}
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        name = "bf16" if dtype is torch.bfloat16 else "fp8"
        mla = KVLayout.mla(shapes["num_hidden_layers"], dtype, shapes["kv_lora_rank"], shapes["qk_rope_head_dim"])
        mha = KVLayout.mha(llama["num_hidden_layers"], dtype, llama["num_key_value_heads"],
                           llama["hidden_size"] // llama["num_attention_heads"])
        rows[name] = {"deepseek_bytes_per_token": mla.bytes_per_token, "llama8b_bytes_per_token": mha.bytes_per_token,
                      "deepseek_tokens_per_GiB": 2**30 / mla.bytes_per_token,
                      "llama8b_tokens_per_GiB": 2**30 / mha.bytes_per_token,
                      "ratio": mha.bytes_per_token / mla.bytes_per_token}
        log(f"KV {name}: DeepSeek {mla.bytes_per_token} B/token "
            f"({rows[name]['deepseek_tokens_per_GiB']:.0f} tokens/GiB)"
            f", Llama-3.1-8B {mha.bytes_per_token} B/token ({rows[name]['llama8b_tokens_per_GiB']:.0f} tokens/GiB): "
            f"{rows[name]['ratio']:.2f}x the tokens")
    return rows


def part_plan(gpus: int = 8) -> dict:
    """DeepSeek-V3 at TP=gpus in FP8 blocks: one rank's weights as radixlm builds them (meta device), then the pool."""
    from transformers import DeepseekV3Config

    from radixlm.runtime.distributed.parallel import Parallel
    from radixlm.runtime.model_loader.loader import _default_dtype
    from radixlm.runtime.models.deepseek_v2 import DeepseekV3ForCausalLM
    from radixlm.runtime.quantization import quant_config_from, quantize_modules
    from radixlm.runtime.quantization.modules import DequantizedAtLoad

    config = DeepseekV3Config(**V3)
    with torch.device("meta"), _default_dtype(torch.bfloat16):
        model = DeepseekV3ForCausalLM(config, Parallel(tp_rank=0, tp_size=gpus, ep_size=gpus))
        quantize_modules(model, quant_config_from(config, None))
        for module in model.modules():  # kv_b_proj as loaded: dequantized to bf16 (DequantizedAtLoad)
            if isinstance(getattr(module, "quant_method", None), DequantizedAtLoad):
                module.quant_method.process_weights_after_loading(module)
    parts: dict[str, int] = {}
    for name, p in model.named_parameters():
        kind = ("routed_experts" if ".experts." in name else "embed_lm_head" if "embed" in name or "lm_head" in name
                else "router" if ".gate." in name else "attention" if ".self_attn." in name else "dense_and_shared_mlp"
                if ".mlp." in name else "norms")
        parts[kind] = parts.get(kind, 0) + p.numel() * p.element_size()
    weights = sum(parts.values())
    kv_bf16 = KVLayout.mla(V3["num_hidden_layers"], torch.bfloat16, V3["kv_lora_rank"], V3["qk_rope_head_dim"])
    kv_fp8 = KVLayout.mla(V3["num_hidden_layers"], torch.float8_e4m3fn, V3["kv_lora_rank"], V3["qk_rope_head_dim"])
    pool = H200_TOTAL_BYTES * GPU_MEM_FRACTION - weights - RUNTIME_BYTES
    plan = {"gpus": gpus, "tp_size": gpus, "ep_size": gpus, "weights_per_gpu_bytes": weights,
            "weights_per_gpu_by_part": parts, "gpu_total_bytes": H200_TOTAL_BYTES,
            "mem_fraction_static": GPU_MEM_FRACTION,
            "runtime_bytes_estimate": RUNTIME_BYTES, "kv_pool_bytes_per_gpu": pool, "contexts": {}}
    for name, layout in (("bf16", kv_bf16), ("fp8", kv_fp8)):
        tokens = int(pool // layout.bytes_per_token)
        plan["contexts"][name] = {"kv_bytes_per_token": layout.bytes_per_token, "pool_tokens": tokens,
                                  "requests_at": {c: tokens // c for c in PLAN_CONTEXTS}}
    log(f"671B plan, {gpus} GPUs TP={gpus}: weights {weights / 1e9:.2f} GB ({weights / 2**30:.2f} GiB) per GPU "
        f"({', '.join(f'{k} {v / 1e9:.2f} GB' for k, v in parts.items())}); KV pool {pool / 2**30:.1f} GiB per GPU: "
        + "; ".join(f"{n} {c['kv_bytes_per_token']} B/token, {c['pool_tokens']} tokens, requests at "
                    + ", ".join(f"{k}: {v}" for k, v in c["requests_at"].items()) for n, c in plan["contexts"].items()))
    return plan


def print_table(result: dict) -> None:
    log("\n| part | setting | ours | floor / reference | ratio |")
    log("| --- | --- | --- | --- | --- |")
    if result["copy_bandwidth_GBps"]:
        log(f"| bandwidth | copy, read + write | {result['copy_bandwidth_GBps']:.0f} GB/s | | |")
    for r in result.get("decode", {}).get("rows", []):
        log(f"| decode | batch {r['batch']} | {r['step_ms']:.2f} ms/step | floor {r['floor_ms']:.2f} ms | "
            f"{r['ratio_to_floor']:.2f}x floor |")
    for name in ("sharegpt_like", "shared_prefix"):
        r = result.get("offline", {}).get(name)
        if r:
            hit = f", hit rate {r['hit_rate']:.0%}" if "hit_rate" in r else ""
            log(f"| offline | {name}, {r['requests']} requests | {r['output_tokens_per_s']:.0f} out tok/s | "
                f"{r['total_tokens_per_s']:.0f} total tok/s{hit} | |")
    for name, r in result.get("kv", {}).items():
        log(f"| KV {name} | tokens per GiB | {r['deepseek_tokens_per_GiB']:.0f} | Llama-3.1-8B "
            f"{r['llama8b_tokens_per_GiB']:.0f} | {r['ratio']:.2f}x |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parts_all = ["decode", "offline", "kv", "plan", "profile"]
    p.add_argument("--parts", nargs="+", default=parts_all, choices=parts_all)
    p.add_argument("--tiny", action="store_true",
                   help="a tiny config of the model on the CPU (float32): checks the logic")
    p.add_argument("--model", default="v2-lite", choices=list(MODELS),
                   help="v2-lite: DeepSeek-V2-Lite in bf16; v3-fp8: V3's shapes in FP8 blocks, 5 layers")
    p.add_argument("--batches", type=int, nargs="+", default=None, help="decode batch sizes (default 1 32 256)")
    p.add_argument("--prompt-len", type=int, default=None, help="decode: prompt tokens per request (default 512)")
    p.add_argument("--decode-steps", type=int, default=None, help="decode: measured steps (default 128)")
    p.add_argument("--sharegpt-requests", type=int, default=None, help="offline: ShareGPT-like requests (default 500)")
    p.add_argument("--prefix-groups", type=int, default=None, help="offline: shared-prefix groups (default 32)")
    p.add_argument("--context-length", type=int, default=4096)
    p.add_argument("--engine-args", default="{}", help="JSON of extra server arguments")
    p.add_argument("--out", default="benchmarks/results/offline/deepseek_v2_lite_gpu.json")
    args = p.parse_args()
    ENGINE_ARGS.update(json.loads(args.engine_args))
    tiny = args.tiny
    device = "cpu" if tiny else "cuda"
    needs_gpu = {"decode", "offline", "profile"} & set(args.parts)
    if needs_gpu and device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device: run with --tiny on the CPU")
    dtype = "float32" if tiny else "bfloat16"
    batches = args.batches or ([1, 4, 16] if tiny else [1, 32, 256])
    prompt_len = args.prompt_len or (32 if tiny else PEER_SIZES["prompt_len"])
    steps = args.decode_steps or (8 if tiny else 128)
    sharegpt_n = args.sharegpt_requests if args.sharegpt_requests is not None else (16 if tiny else 500)
    groups, per_group, prefix_len, question_len, output_len = PEER_SIZES["prefix"]
    if args.prefix_groups is not None:
        groups = args.prefix_groups
    prefix = (2, 4, 64, 8, 4) if tiny and args.prefix_groups is None else (groups, per_group, prefix_len,
                                                                           question_len, output_len)
    context_len = min(args.context_length, 1024) if tiny else args.context_length
    arch, full_shapes, tiny_shapes = MODELS[args.model]
    shapes = tiny_shapes if tiny else full_shapes
    described = "DeepSeek-V2-Lite" if args.model == "v2-lite" else "DeepSeek-V3 (5 layers, FP8 blocks)"
    result = {"benchmark": "gpu_deepseek",
              "model": f"{described} {'tiny ' if tiny else ''}shapes, {dtype}, dummy weights", "shapes": shapes,
              "device": torch.cuda.get_device_name() if device == "cuda" and needs_gpu else "cpu",
              "torch": torch.__version__, "engine_args": ENGINE_ARGS, "command": " ".join(["python", *sys.argv])}
    t0 = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    bw = 0.0
    if needs_gpu:
        bw = copy_bandwidth(device)
        log(f"copy bandwidth {bw / 1e9:.0f} GB/s (read + write)")
    result["copy_bandwidth_GBps"] = bw / 1e9
    path = model_dir(tiny, args.model) if needs_gpu else ""
    src = None
    if needs_gpu:
        from transformers import AutoTokenizer

        src = PromptSource(AutoTokenizer.from_pretrained(path), random.Random(0))
    parts = {
        "decode": lambda: part_decode(path, device, dtype, context_len, src, bw, batches, prompt_len, steps),
        "offline": lambda: part_offline(path, device, dtype, context_len, src, sharegpt_n, prefix),
        "profile": lambda: part_profile(path, device, dtype, context_len, src, batches, min(steps, 32)),
        "kv": lambda: part_kv(shapes),
        "plan": part_plan,
    }
    run_parts(parts, args.parts, result, out, t0)
    print_table(result)
    log(f"wrote {out} after {result['bench_seconds']:.0f} s")


if __name__ == "__main__":
    main()
