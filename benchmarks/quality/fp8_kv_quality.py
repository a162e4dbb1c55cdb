"""FP8 KV cache quality: greedy decoding of a fixed prompt set with the model-dtype cache (--kv-cache-dtype auto, the
reference) against fp8_e4m3 and fp8_e5m2, same model, same weights. Reports per cache dtype:

- free-running: the share of output positions whose greedy token equals the reference's (position by position), how
  many prompts' outputs are identical, where the first divergence falls, and the mean |delta logprob| of the chosen
  token at the positions before a prompt's first divergence (where both runs saw the same tokens);
- teacher-forced: the reference's prompt + output fed to the fp8 engine as one prompt (its prefill stores the KV in
  float8 and reads it back for every position): the share of output positions where the fp8 model's argmax is the
  reference's token, and the mean and max |delta logprob| of the reference's tokens.

    python benchmarks/quality/fp8_kv_quality.py [--model-path default] [--device cpu] [--dtype bfloat16] \
        [--max-new-tokens 32] [--out benchmarks/results/quality/fp8_kv_quality_smollm2_cpu.json]

On a GPU: --device cuda (SmolLM2 by default, any --model-path; llama-3.1-8b-dummy takes the 8B shapes with dummy
weights, whose near-flat logits make the figures a stress test rather than a quality measure). On the CPU,
--kv-dtypes fp8_e4m3_q8 adds e4m3 with the decode's query rounded to e4m3 per row as well (the CUDA decode kernel's
FP8 query, emulated: fp8_query_decode, kv_quant.e4m3_query_rows). Prints a table and writes JSON (--out; default
$OUT/fp8_kv_quality.json where OUT is set, else the results folder)."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from radixlm import Engine  # noqa: E402

KV_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
FP8_QUERY = "fp8_e4m3_q8"  # --kv-dtypes: e4m3 with the decode's query in e4m3 too (CPU: fp8_query_decode)
PASSAGE = (
    "The lighthouse at Cape Verran was built in 1874 after three ships were lost on the reef in a single winter. "
    "Its first keeper, Ada Morrow, kept a log of every vessel that passed, the weather at each watch and the oil "
    "burned each night. The tower is forty-one metres tall, painted in red and white bands, and its lens, made in "
    "Paris, throws a beam that can be seen twenty-two nautical miles out to sea. In 1931 the lamp was electrified; "
    "in 1989 the station was automated and the last keeper left. Today the keeper's cottage is a small museum that "
    "shows the logbooks, a model of the reef and the brass foghorn that sounded every thirty seconds in fog. "
)
PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paper clip:",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Translate to French: 'The library opens at nine in the morning.'",
    "Q: What is 17 times 23?\nA:",
    "Once upon a time, in a village at the edge of a forest,",
    "The three primary colors are",
    "Give me a recipe for a simple tomato soup.",
    "What are the main differences between a virus and a bacterium?",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    PASSAGE + "\nQuestion: When was the lighthouse automated, and what is the cottage used for today?\nAnswer:",
    PASSAGE * 2 + "\nSummarize the history of the lighthouse in three sentences.\n",
    PASSAGE * 3 + "\nWho was the first keeper and what did she record?\nAnswer:",
    "Continue the sequence: 2, 4, 8, 16, 32,",
]


def log(*a) -> None:
    print(*a, flush=True)


def resolve_model(path: str) -> tuple[str, str]:
    """(model path, load format): llama-3.1-8b-dummy is the benchmarks' 8B directory with dummy weights."""
    if path == "llama-3.1-8b-dummy":
        from benchmarks.lib.models import model_dir

        return model_dir(), "dummy"
    return path, "auto"


@contextlib.contextmanager
def fp8_query_decode():
    """The CUDA decode kernel's FP8 query (decode.fp8_query: a swapped walk over an e4m3 pool) emulated by the
    CPU backend's decode: each (token, head) row of q rounded to e4m3 at amax / 448 and read back in float32, the
    attention then in float32 against the float8 K and V. Prefill (teacher-forced) is not touched, as on the GPU."""
    from radixlm.runtime.cache.kv_quant import e4m3_query_rows
    from radixlm.runtime.layers.attention.torch_native import TorchNativeAttnBackend

    plain = TorchNativeAttnBackend.forward_decode

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id).dtype != torch.float8_e4m3fn:
            return plain(self, q, k, v, layer, forward_batch, save_kv_cache)
        q8 = e4m3_query_rows(q.reshape(-1, layer.head_dim)).reshape(q.shape)
        return plain(self, q8, k, v, layer, forward_batch, save_kv_cache).to(q.dtype)

    TorchNativeAttnBackend.forward_decode = forward_decode
    try:
        yield
    finally:
        TorchNativeAttnBackend.forward_decode = plain


def run_engine(args, kv_cache_dtype: str, reference: list[list[int]] | None) -> dict:
    model_path, load_format = resolve_model(args.model_path)
    if kv_cache_dtype == FP8_QUERY:
        with fp8_query_decode():
            return run_engine(args, "fp8_e4m3", reference)
    t0 = time.perf_counter()
    engine = Engine(model_path, load_format=load_format, dtype=args.dtype, device=args.device,
                    kv_cache_dtype=kv_cache_dtype, disable_radix_cache=True, random_seed=0,
                    max_total_tokens=args.max_total_tokens, max_running_requests=args.max_running_requests)
    try:
        prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
        params = {"temperature": 0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
        outs = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        free = [[(lp, tok) for lp, tok, _ in o["meta_info"]["output_token_logprobs"]] for o in outs]
        forced = None
        if reference is not None:
            # Each prompt followed by the reference's output, one prefill: the logprob (and the argmax) at every
            # output position, over float8 KV of the whole sequence.
            seqs = [p + r for p, r in zip(prompts, reference)]
            outs = engine.generate(input_ids=seqs, sampling_params={"temperature": 0, "max_new_tokens": 1},
                                   return_logprob=True, logprob_start_len=[len(p) for p in prompts],
                                   top_logprobs_num=1)
            forced = []
            for o, r in zip(outs, reference):
                lps = o["meta_info"]["input_token_logprobs"][-len(r):]
                tops = o["meta_info"]["input_top_logprobs"][-len(r):]
                forced.append([(lp, top[0][1]) for (lp, _, _), top in zip(lps, tops)])
        info = {"kv_pool_tokens": engine.runner.max_total_num_tokens,
                "kv_pool_dtype": str(engine.runner.token_to_kv_pool.dtype).removeprefix("torch."),
                "prompt_tokens": [len(p) for p in prompts]}
    finally:
        engine.shutdown()
    return {"free": free, "forced": forced, "wall_s": time.perf_counter() - t0, **info}


def compare(ref: list[list[tuple[float, int]]], run: dict) -> dict:
    positions = same = identical = 0
    first_div, free_deltas = [], []
    for r, f in zip(ref, run["free"]):
        div = next((i for i, (a, b) in enumerate(zip(r, f)) if a[1] != b[1]), None)
        identical += div is None
        first_div.append(len(r) if div is None else div)
        same += sum(a[1] == b[1] for a, b in zip(r, f))
        positions += len(r)
        free_deltas += [abs(a[0] - b[0]) for a, b in list(zip(r, f))[: first_div[-1]]]
    forced_match = forced_n = 0
    forced_deltas = []
    for r, f in zip(ref, run["forced"]):
        forced_match += sum(tok == top for (_, tok), (_, top) in zip(r, f))
        forced_n += len(r)
        forced_deltas += [abs(a[0] - b[0]) for a, b in zip(r, f)]
    return {
        "greedy_match_rate": same / positions,
        "identical_outputs": identical,
        "prompts": len(ref),
        "mean_first_divergence": statistics.mean(first_div),
        "mean_abs_dlogprob_free": statistics.mean(free_deltas) if free_deltas else None,
        "teacher_forced_match_rate": forced_match / forced_n,
        "mean_abs_dlogprob_forced": statistics.mean(forced_deltas),
        "max_abs_dlogprob_forced": max(forced_deltas),
        "kv_pool_tokens": run["kv_pool_tokens"],
        "kv_pool_dtype": run["kv_pool_dtype"],
        "wall_s": run["wall_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default="default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", help="the model's dtype, and the reference cache's")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--kv-dtypes", default="fp8_e4m3,fp8_e5m2", help="cache dtypes compared with auto")
    ap.add_argument("--max-total-tokens", type=int, default=1 << 15, help="the same KV pool size for every run")
    ap.add_argument("--max-running-requests", type=int, default=len(PROMPTS))
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out or (os.path.join(os.environ["OUT"], "fp8_kv_quality.json") if os.environ.get("OUT") else
                       str(Path(__file__).resolve().parents[1] / "results" / "quality" / "fp8_kv_quality.json"))
    kinds = [k for k in args.kv_dtypes.split(",") if k]
    unknown = sorted(set(kinds) - {*KV_DTYPES[1:], FP8_QUERY})
    if unknown:
        raise SystemExit(f"--kv-dtypes: unknown {unknown}; choose from {(*KV_DTYPES[1:], FP8_QUERY)}")
    if FP8_QUERY in kinds and args.device != "cpu":
        raise SystemExit(f"--kv-dtypes {FP8_QUERY}: the CPU backend's emulation (on a GPU the decode kernel decides)")
    log(f"reference: {args.model_path} {args.dtype} on {args.device}, cache auto")
    ref_run = run_engine(args, "auto", None)
    reference = [[tok for _, tok in seq] for seq in ref_run["free"]]
    rows = {}
    for kind in kinds:
        log(f"{kind} ...")
        run = run_engine(args, kind, reference)
        rows[kind] = compare(ref_run["free"], run)
    log(f"\n{len(PROMPTS)} prompts x {args.max_new_tokens} greedy tokens, {args.model_path} ({args.dtype}, "
        f"{args.device}); reference: the {args.dtype} cache ({ref_run['kv_pool_tokens']} tokens)")
    head = f"{'kv cache':<12} {'match':>7} {'identical':>9} {'1st div':>8} {'|dlp| free':>10} " \
           f"{'forced match':>12} {'|dlp| forced':>12} {'max':>7}"
    log(head)
    for kind, r in rows.items():
        free = "-" if r["mean_abs_dlogprob_free"] is None else f"{r['mean_abs_dlogprob_free']:.4f}"
        log(f"{kind:<12} {r['greedy_match_rate']:>7.3f} {r['identical_outputs']:>4}/{r['prompts']:<4} "
            f"{r['mean_first_divergence']:>8.1f} {free:>10} {r['teacher_forced_match_rate']:>12.3f} "
            f"{r['mean_abs_dlogprob_forced']:>12.4f} {r['max_abs_dlogprob_forced']:>7.3f}")
    result = {
        "benchmark": "fp8_kv_quality", "command": "python " + " ".join(sys.argv),
        "model": args.model_path, "dtype": args.dtype, "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "host": platform.processor() or platform.machine(), "torch": torch.__version__,
        "prompts": len(PROMPTS), "prompt_tokens": ref_run["prompt_tokens"], "max_new_tokens": args.max_new_tokens,
        "reference": {"kv_cache_dtype": "auto", "kv_pool_dtype": ref_run["kv_pool_dtype"],
                      "wall_s": ref_run["wall_s"]},
        "rows": rows,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
