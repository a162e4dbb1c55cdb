"""Offline throughput on CPU: SmolLM2-135M-Instruct, 64 chat prompts sharing a long system prompt, greedy,
64 new tokens each (EOS ignored so every system does the same work).

Compares, in one run: radixlm with the radix cache on, radixlm with it off, and transformers `generate`
on left-padded batches. Prints a table and writes JSON to benchmarks/results/offline/.

    .venv/bin/python benchmarks/offline/cpu_offline.py [--num-prompts 64] [--hf-batch-size 16] [--threads 2] [--repeats 3]

With --repeats N each system runs N times (alternating) and the median wall time is reported: a shared
2-core VM varies by +-20% from run to run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time

import torch

SYSTEM_PROMPT = (
    "You are Quill, the writing assistant of the city library of Port Alder. You help visitors find books, "
    "plan reading lists, write short summaries and answer questions about the library's services. "
    "The library opens at nine in the morning and closes at eight in the evening from Monday to Friday; on "
    "Saturday it closes at five and on Sunday it is closed. Members may borrow up to twelve items at once "
    "for three weeks, renewable twice online unless another member has placed a hold. Late returns cost "
    "twenty cents a day per item, capped at five dollars. The children's floor holds story time every "
    "Wednesday at ten and Saturday at eleven. The makerspace on the third floor has two 3D printers, a laser "
    "cutter and sewing machines; visitors book them at the front desk after a short safety briefing. "
    "The local history room keeps newspapers back to 1871, maps, photographs and the ship registers of the "
    "harbour; items from that room never leave the building. Study rooms for up to six people can be "
    "reserved for two hours a day. Printing costs ten cents a page in black and white and fifty in colour. "
    "Answer in a friendly, precise tone, in at most three sentences, and say so plainly when you do not "
    "know something rather than guessing. Never invent opening hours, prices or services that are not "
    "listed above. If a question is about something outside the library, answer briefly and helpfully."
)
TOPICS = ["opening hours", "late fees", "the makerspace", "story time", "study rooms", "printing", "the history room",
          "renewals", "holds", "borrowing limits", "Sunday visits", "ship registers", "3D printing", "sewing machines",
          "reading lists", "old newspapers"]
ASKS = ["Can you tell me about {}?", "I have a question on {}.", "What should I know about {}?", "Explain {} to a child."]


def make_prompts(tokenizer, n: int) -> list[str]:
    out = []
    for i in range(n):
        question = ASKS[(i // len(TOPICS)) % len(ASKS)].format(TOPICS[i % len(TOPICS)])
        out.append(tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
            tokenize=False, add_generation_prompt=True))
    return out


def run_radixlm(prompts: list[str], max_new: int, disable_radix_cache: bool) -> dict:
    import radixlm

    engine = radixlm.Engine("default", dtype="float32", disable_radix_cache=disable_radix_cache, random_seed=0)
    try:
        engine.generate("warm up", {"max_new_tokens": 2})
        engine.flush_cache()
        sp = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}
        t0 = time.perf_counter()
        outs = engine.generate(prompts, sp)
        wall = time.perf_counter() - t0
    finally:
        engine.shutdown()
    prompt_tokens = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    return {"wall_s": wall, "output_ids": [o["output_ids"] for o in outs], "prompt_tokens": prompt_tokens,
            "cached_tokens": cached, "output_tokens": sum(len(o["output_ids"]) for o in outs)}


def run_transformers(prompts: list[str], max_new: int, batch_size: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixlm.runtime.model_loader.files import resolve_model_path

    gguf = resolve_model_path("default")
    kw = {"gguf_file": os.path.basename(gguf)}
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), **kw)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), dtype=torch.float32, **kw).eval()
    with torch.inference_mode():
        model.generate(**tok(["warm up"], return_tensors="pt"), max_new_tokens=2, do_sample=False, pad_token_id=tok.pad_token_id)
        outs = []
        t0 = time.perf_counter()
        for i in range(0, len(prompts), batch_size):
            enc = tok(prompts[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
            gen = model.generate(**enc, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id)
            outs += gen[:, enc["input_ids"].shape[1]:].tolist()
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "output_ids": outs, "output_tokens": sum(len(o) for o in outs)}


def in_thread(fn):
    """Runs fn in a fresh thread. Torch work stays off the main thread: once a thread has run an OpenMP
    region, libgomp throttles the other threads' teams (the engine's scheduler thread among them)."""
    out: dict = {}

    def target():
        try:
            out["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            out["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["result"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), os.pardir, "results", "offline",
                                               "cpu_offline.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from radixlm.runtime.model_loader.config import resolve_model_dir
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer

    prompts = make_prompts(get_tokenizer(resolve_model_dir("default")), args.num_prompts)
    hf_name = f"transformers generate (batch {args.hf_batch_size})"
    systems = {
        "radixlm (radix cache on)": lambda: run_radixlm(prompts, args.max_new_tokens, False),
        "radixlm (radix cache off)": lambda: run_radixlm(prompts, args.max_new_tokens, True),
        hf_name: lambda: in_thread(lambda: run_transformers(prompts, args.max_new_tokens, args.hf_batch_size)),
    }
    trials: dict[str, list[dict]] = {name: [] for name in systems}
    for _ in range(args.repeats):
        for name, run in systems.items():
            trials[name].append(run())
    runs = {}
    for name, results in trials.items():
        results.sort(key=lambda r: r["wall_s"])
        runs[name] = {**results[len(results) // 2], "all_wall_s": [round(r["wall_s"], 2) for r in results]}
    hf = runs[hf_name]
    ref = runs["radixlm (radix cache on)"]["output_ids"]
    rows = []
    for name, r in runs.items():
        same = sum(a == b for a, b in zip(r["output_ids"], ref))
        rows.append({
            "system": name, "wall_s": round(r["wall_s"], 2), "output_tok_s": round(r["output_tokens"] / r["wall_s"], 1),
            "speedup_vs_transformers": round(hf["wall_s"] / r["wall_s"], 2),
            "cache_hit_rate": round(r["cached_tokens"] / r["prompt_tokens"], 3) if "cached_tokens" in r else None,
            "outputs_identical_to_radix_on": f"{same}/{len(ref)}", "all_wall_s": r["all_wall_s"],
        })
    print(f"\n{'system':<36} {'wall s':>8} {'out tok/s':>10} {'x transformers':>15} {'hit rate':>9} {'same outputs':>13}")
    for row in rows:
        hit = "-" if row["cache_hit_rate"] is None else f"{row['cache_hit_rate']:.3f}"
        print(f"{row['system']:<36} {row['wall_s']:>8.2f} {row['output_tok_s']:>10.1f} {row['speedup_vs_transformers']:>15.2f} {hit:>9} {row['outputs_identical_to_radix_on']:>13}")
    result = {
        "benchmark": "cpu_offline", "model": "SmolLM2-135M-Instruct (GGUF Q4_1 dequantized, float32)",
        "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens, "threads": args.threads, "repeats": args.repeats,
        "prompt_tokens_total": runs["radixlm (radix cache on)"]["prompt_tokens"],
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv), "rows": rows,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
