"""Greedy outputs of radixlm on the GPU against transformers on the same GPU, SmolLM2-135M-Instruct (its GGUF,
dequantized once), in bfloat16 and float32: the share of prompts whose tokens all match and the mean length of the
common prefix. Both sides run the default CUDA setup of each library (ours: Triton attention, CUDA graphs,
overlap scheduling).

    python benchmarks/offline/gpu_correctness.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out $OUT/gpu_correctness.json
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

TOPICS = ["the moon", "a lighthouse", "bread", "volcanoes", "chess", "rain", "a violin", "bees", "glaciers", "trains",
          "tea", "owls", "the desert", "coral reefs", "a clock", "paper"]


def _prompts(tokenizer, n: int) -> list[list[int]]:
    msgs = [[{"role": "user", "content": f"Write two sentences about {TOPICS[i % len(TOPICS)]}."}] for i in range(n)]
    return [list(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False))
            for m in msgs]


def hf_greedy(model_dir: str, dtype: torch.dtype, prompts: list[list[int]], max_new: int,
              pad_token_id: int = 0) -> list[list[int]]:
    """transformers' greedy tokens on the GPU, one prompt at a time, exactly max_new of them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).cuda().eval()
    out = []
    with torch.inference_mode():
        for ids in prompts:
            gen = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=max_new, min_new_tokens=max_new,
                                 do_sample=False, pad_token_id=pad_token_id)
            out.append(gen[0, len(ids):].tolist())
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return out


def _ours(model_dir: str, dtype: str, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    from radixlm import Engine

    engine = Engine(model_dir, device="cuda", dtype=dtype, max_total_tokens=65536)
    try:
        # As hf_greedy's min_new_tokens: the end-of-text token is masked until max_new tokens are out (with
        # ignore_eos it would not be masked, as in vLLM, and could be chosen).
        outs = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": max_new,
                                                                   "min_new_tokens": max_new})
        return [o["output_ids"] for o in outs]
    finally:
        engine.shutdown()
        gc.collect()
        torch.cuda.empty_cache()


def hf_gaps(model_dir: str, dtype: torch.dtype, prompts: list[list[int]], ref: list[list[int]],
            got: list[list[int]]) -> list[float | None]:
    """Where the outputs first differ: transformers' logit of its own token minus its logit of ours, at that
    position (teacher-forced on the common prefix). A gap near zero is a near-tie that rounding can flip."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).cuda().eval()
    gaps: list[float | None] = []
    with torch.inference_mode():
        for ids, a, b in zip(prompts, ref, got):
            k = _common_prefix(a, b)
            if k == min(len(a), len(b)):
                gaps.append(None)
                continue
            logits = model(torch.tensor([ids + a[:k]], device="cuda")).logits[0, -1].float()
            gaps.append(float(logits[a[k]] - logits[b[k]]))
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return gaps


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def compare(gguf: str, num_prompts: int = 16, max_new_tokens: int = 32) -> dict:
    from transformers import AutoTokenizer

    from radixlm.runtime.model_loader.gguf import convert_gguf

    model_dir = convert_gguf(gguf)
    prompts = _prompts(AutoTokenizer.from_pretrained(model_dir), num_prompts)
    report = {"model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized)", "num_prompts": num_prompts,
              "max_new_tokens": max_new_tokens, "gpu": torch.cuda.get_device_name()}
    for name, dt in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        ref = hf_greedy(model_dir, dt, prompts, max_new_tokens)
        got = _ours(model_dir, name, prompts, max_new_tokens)
        prefix = [_common_prefix(a, b) for a, b in zip(got, ref)]
        report[name] = {
            "exact_match_rate": sum(a == b for a, b in zip(got, ref)) / num_prompts,
            "mean_common_prefix_tokens": sum(prefix) / num_prompts,
            "token_match_rate": sum(prefix) / (num_prompts * max_new_tokens),
            "first_divergence": [p if p < max_new_tokens else None for p in prefix],
            "logit_gap_at_divergence": hf_gaps(model_dir, dt, prompts, ref, got),
        }
    return report


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", required=True)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--out", default="benchmarks/results/offline/gpu_correctness.json")
    args = p.parse_args()
    report = compare(args.gguf, args.num_prompts, args.max_new_tokens)
    report["command"] = " ".join(["python", *sys.argv])
    for name in ("bfloat16", "float32"):
        r = report[name]
        gaps = [g for g in r["logit_gap_at_divergence"] if g is not None]
        print(f"{name:9} prompts fully matching {r['exact_match_rate']:.0%}, tokens before the first divergence "
              f"{r['token_match_rate']:.1%} (mean {r['mean_common_prefix_tokens']:.1f} of {args.max_new_tokens}); "
              f"transformers' logit gap where they part: max {max(gaps, default=0):.2e}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
