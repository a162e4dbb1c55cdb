"""The paper's JSON-decoding workload: extract fields from a passage into a schema given as a JSON schema or a
regex, with jump-forward off / fast / exact, through the offline Engine (one engine per mode, same prompts).

    python benchmarks/grammar/json_decoding.py [--model default] [--num-prompts 64] [--constraint json_schema|regex]
                                       [--max-running 16] [--device cpu] [--repeat 1]
                                       [--modes off,fast,exact[,off:always,exact:nomix,...]]
                                       [--phases] [--out benchmarks/results/grammar/json_decoding_cpu.json]

A mode is a jump-forward mode, optionally with ":always" (fill every grammar mask, --grammar-mask always, instead of
on demand) and ":nomix" (--mixed-chunk off).
Reports per mode: wall time, output tokens/s, requests/s, mean latency, forward passes, grammar masks filled per
output token, exact-mode draft acceptance, and whether each mode reproduced `off` token for token; plus grammar
compile time (cold: tokenizer preprocessing + compile; cached) and the bitmask fill time per generated token.

The scheduler's host work alone, without the model (--skip-model): each forward pass returns scripted logits (the
next token of a recorded run's output, one-hot), so outputs are the recorded ones in every mode (`off` replays them;
`exact` drafts and verifies against them) and what varies between modes and trees is the scheduler's own work; on a
GPU that work, not the model, bounds a small model's throughput (results/grammar/json_decoding_gpu_log.txt):

    python benchmarks/grammar/json_decoding.py --num-prompts 512 --max-running 32 --constraint regex --modes off \
        --save-ids ids.json                                  # record (the real model, on the CPU)
    python benchmarks/grammar/json_decoding.py --script-ids ids.json --skip-model --constraint regex --max-running 32 \
        --dtype float32 --max-total-tokens 131072 --phases [--modes off,exact] [--repeat 3]

Scripted logits cost a memset of (rows, vocab) floats; the grammar's top-k and argmax over them run on the CPU too
(on a GPU they are kernel launches): those phases ("model forward", "grammar masks prepare", "sampler") are not host
overhead here."""
from __future__ import annotations

import argparse
import json
import os
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.json_workload import REGEX, SCHEMA, passages, run_mode  # noqa: E402

def grammar_costs(args, sample_ids: list[list[int]]) -> dict:
    """Compile time cold (vocabulary preprocessing + compile) and cached; bitmask fill time per token, replaying
    generated outputs through a matcher."""
    import xgrammar as xgr

    from radixlm.runtime.grammar.spec import GrammarSpec
    from radixlm.runtime.grammar.xgrammar_backend import XGrammarBackend
    from radixlm.runtime.model_loader.config import ModelConfig
    from radixlm.runtime.model_loader.tokenizer import get_tokenizer

    cfg = ModelConfig.from_path(args.model, dtype="float32", device="cpu")
    tok = get_tokenizer(cfg.model_path)
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA)) if args.constraint == "json_schema" else GrammarSpec("regex", REGEX)
    t0 = time.perf_counter()
    backend = XGrammarBackend(tok, cfg.vocab_size, sorted(cfg.eos_token_ids))
    t1 = time.perf_counter()
    compiled = backend.compile(spec)
    t2 = time.perf_counter()
    backend.compile(spec)  # xgrammar's own cache; radixlm's GrammarCache is in front of it in the server
    t3 = time.perf_counter()
    bitmask = backend.allocate_bitmask(1)
    fill_times = []
    for ids in sample_ids:
        m = backend.new_matcher(compiled)
        for t in ids:
            s = time.perf_counter()
            m.fill_bitmask(bitmask, 0)
            fill_times.append(time.perf_counter() - s)
            if not m.accept_token(t):
                break
    logits = torch.randn(1, cfg.vocab_size)
    s = time.perf_counter()
    for _ in range(100):
        xgr.apply_token_bitmask_inplace(logits, bitmask)
    apply_us = (time.perf_counter() - s) / 100 * 1e6
    return {"tokenizer_preprocess_s": t1 - t0, "compile_cold_s": t2 - t1, "compile_cached_s": t3 - t2,
            "mask_fill_us_per_token_mean": statistics.mean(fill_times) * 1e6,
            "mask_fill_us_per_token_p99": sorted(fill_times)[int(0.99 * (len(fill_times) - 1))] * 1e6,
            "mask_apply_us_per_row_cpu": apply_us, "tokens_replayed": len(fill_times)}


MAX_DIFFERENCES_KEPT = 8


def _differences(base: list[list[int]], other: list[list[int]]) -> list[dict]:
    """Per request whose output differs: where it first differs, and both outputs (benchmarks/divergence.py reads
    them)."""
    out = []
    for i, (a, b) in enumerate(zip(base, other)):
        if a != b:
            at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append({"request": i, "at": at, "base_ids": a, "ids": b})
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="default")
    p.add_argument("--num-prompts", type=int, default=None, help="default 64, or --script-ids' count")
    p.add_argument("--constraint", choices=["json_schema", "regex"], default="json_schema")
    p.add_argument("--max-running", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size (default: sized from memory)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1, help="rounds of all modes; each mode's fastest is kept")
    p.add_argument("--modes", default="off,fast,exact", help="comma-separated; the first is the baseline")
    p.add_argument("--load-format", default="auto", help="dummy: random weights (a model directory with no weights)")
    p.add_argument("--phases", action="store_true", help="time the scheduler's phases (benchmarks/lib/phases.py)")
    p.add_argument("--profile", type=int, default=0,
                   help="also print each mode's N functions of most own time (cProfile of the measured run)")
    p.add_argument("--script-ids", default=None,
                   help="replay these recorded outputs (--save-ids of another run, same tokenizer and prompts): the "
                        "model's passes run, their logits are replaced")
    p.add_argument("--skip-model", action="store_true",
                   help="with --script-ids: the model's passes do not run either, only the scheduler's host work "
                        "(on the CPU: the grammar's top-k and argmax over the scripted logits run there too)")
    p.add_argument("--save-ids", default=None, help="write the first mode's output token ids here (JSON list)")
    p.add_argument("--out", default="benchmarks/results/grammar/json_decoding_cpu.json")
    args = p.parse_args()
    if args.skip_model and not args.script_ids:
        p.error("--skip-model replays --script-ids")
    if args.num_prompts is None:
        args.num_prompts = len(json.loads(Path(args.script_ids).read_text())) if args.script_ids else 64
    if args.num_prompts < 1:
        p.error("--num-prompts: at least 1")
    texts = passages(args.num_prompts, args.seed)
    runs: dict[str, dict] = {}
    modes = args.modes.split(",")
    walls: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.repeat):
        for m in walls:
            r = run_mode(m, args, texts)
            walls[m].append(r["wall_s"])
            if m not in runs or r["wall_s"] < runs[m]["wall_s"]:
                runs[m] = r
    for m, r in runs.items():
        r["wall_s_each_round"] = walls[m]
    off = runs[modes[0]]
    for m in modes[1:]:
        runs[m]["throughput_vs_off"] = runs[m]["output_tokens_per_s"] / off["output_tokens_per_s"]
        runs[m]["speedup_wall_vs_off"] = off["wall_s"] / runs[m]["wall_s"]
        # Rounds alternate modes, so drift of the machine touches every mode alike; medians resist one odd round.
        runs[m]["speedup_median_vs_off"] = statistics.median(walls[modes[0]]) / statistics.median(walls[m])
        runs[m]["identical_to_off"] = sum(a == b for a, b in zip(runs[m]["_ids"], off["_ids"]))
        runs[m]["differs_from_off"] = _differences(off["_ids"], runs[m]["_ids"])[:MAX_DIFFERENCES_KEPT]
    if args.save_ids:
        Path(args.save_ids).write_text(json.dumps(off["_ids"]))
    costs = grammar_costs(args, off["_ids"][:8])
    sample = off["_texts"][0]
    for m, r in runs.items():
        r.pop("_ids")
        r.pop("_texts")
        timer, prof = r.pop("_timer"), r.pop("_profile")
        if prof is not None:
            print(f"cProfile of {m} (its fastest round):")
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
        if timer is not None:
            print(f"phases of {m} (its fastest round; {r['wall_s']:.2f} s wall):")
            print(timer.table(r["wall_s"], r["forward_passes"], r["output_tokens"]))
    result = {
        "benchmark": "json_decoding", "model": args.model, "constraint": args.constraint,
        "num_prompts": args.num_prompts, "max_running_requests": args.max_running, "device": args.device,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None},
        "command": " ".join(["python", *sys.argv]), "runs": runs, "grammar": costs, "sample_output": sample,
    }
    print(f"{'mode':12} {'wall s':>8} {'out tok/s':>10} {'req/s':>7} {'passes':>7} {'masks/tok':>9} "
          f"{'vs ' + modes[0]:>9} {'median':>7} {'same':>5} {'accept':>7}")
    for m, r in runs.items():
        acc = r["exact_acceptance_rate"]
        print(f"{m:12} {r['wall_s']:8.2f} {r['output_tokens_per_s']:10.1f} {r['requests_per_s']:7.2f} {r['forward_passes']:7d} "
              f"{r['masks_filled_per_token']:9.2f} {r.get('throughput_vs_off', 1.0):9.2f} "
              f"{r.get('speedup_median_vs_off', 1.0):7.2f} "
              f"{r.get('identical_to_off', args.num_prompts):>5} {'' if acc is None else f'{acc:.2f}':>7}")
    print(json.dumps(costs, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
