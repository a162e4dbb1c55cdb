"""Speculative decoding on workloads with and without repetition, through the offline Engine: each draft source
against speculation off, at a few batch sizes, greedy.

    python benchmarks/speculative/speculative.py [--model default] [--device cpu] [--batches 1 8] [--max-new-tokens 96]
                                     [--algorithms NGRAM] [--workloads ...] [--repeat 2]
                                     [--out benchmarks/results/speculative/speculative_cpu.json]

Workloads (chat prompts, the model's own answers): `quote` (repeat a passage word for word), `edit` (rename an
attribute everywhere in a 26-line class and output the whole code), `restate` (restate an earlier turn of a
conversation), and `story` (free text, no source to copy). Workloads with a history (before each timed run, the
cache is flushed and earlier requests are answered, untimed; the RADIX source drafts from what they left in the
tree): `ask_again` (the same question asked again), `recall` (a chat whose next turn asks for the assistant's earlier
answer again: the answer is in the prompt, and in the tree), and
`other_system` (the same question under another system prompt: the earlier answer is in the tree, in another
context). Reports per workload, batch and algorithm: output tokens/s (--stat: the median or the fastest of the
--rounds x --repeat runs; rounds interleave the engines), its ratio to off (and the fastest runs' ratio), drafts
proposed, draft tokens and those accepted per draft, and how many outputs equal off's.

STANDALONE on an 8B model's passes (GPU; benchmarks/lib/speculative_replay.py), replaying SmolLM2's recorded outputs:

    python benchmarks/speculative/speculative.py --model default --device cuda --batches 1 --workloads quote edit restate story \
        --algorithms --save-ids /tmp/smol_spec_ids.json --out /tmp/smol_spec_record.json   # record (off only)
    python -m benchmarks.lib.speculative_replay default /tmp/t8b /tmp/d1b        # 8B and 1B shapes, SmolLM2's tokenizer
    python benchmarks/speculative/speculative.py --model /tmp/t8b --draft-model /tmp/d1b --load-format dummy --device cuda \
        --dtype bfloat16 --algorithms STANDALONE --batches 1 8 64 256 --workloads quote edit restate story \
        --script-ids /tmp/smol_spec_ids.json --draft-acceptance 0.8 --out benchmarks/results/speculative/speculative_gpu.json

    python benchmarks/speculative/speculative.py --tiny [--model M]      # the same path with tiny shapes on the CPU (records first)

The same with Qwen2.5-Coder-0.5B-Instruct's outputs (it performs `edit`'s rename; SmolLM2 copies the code as it is):
Llama-3.1-8B shapes with Qwen's vocabulary (speculative_replay.RECORDINGS), NGRAM and RADIX need no draft model:

    python benchmarks/speculative/speculative.py --model qwen2.5-coder-0.5b-instruct --device cpu --batches 1 --algorithms NGRAM \
        --repeat 1 --save-ids benchmarks/results/speculative/speculative_qwen_coder_ids_cpu.json \
        --out benchmarks/results/speculative/speculative_qwen_coder_cpu.json    # record (off's outputs) and the CPU figures
    python -m benchmarks.lib.speculative_replay qwen2.5-coder-0.5b-instruct /tmp/qt8b
    python benchmarks/speculative/speculative.py --model /tmp/qt8b --load-format dummy --device cuda --dtype bfloat16 \
        --algorithms NGRAM RADIX --batches 1 8 --workloads quote edit \
        --script-ids benchmarks/results/speculative/speculative_qwen_coder_ids_cpu.json --out speculative_gpu_qwen_coder.json
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib import speculative_replay  # noqa: E402
from benchmarks.lib.speculative_replay import ModelShape  # noqa: E402
from radixlm import Engine  # noqa: E402

PASSAGE = ("The old lighthouse stood at the end of the pier for more than a century. Every evening the keeper climbed "
           "the one hundred and twelve steps, trimmed the wick, polished the lens and watched the ships pass.")
CODE = '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count=1):
        if count <= 0:
            raise ValueError("count must be positive")
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count=1):
        if name not in self.items:
            raise KeyError(name)
        if self.items[name] < count:
            raise ValueError("not enough " + name)
        self.items[name] -= count
        if self.items[name] == 0:
            del self.items[name]

    def total(self):
        return sum(self.items.values())

    def report(self):
        lines = []
        for name in sorted(self.items):
            lines.append(f"{name}: {self.items[name]}")
        return "\\n".join(lines)
'''

QUESTION = "Explain in a few sentences how a lighthouse helps ships at night."


def user(text: str) -> dict:
    return {"role": "user", "content": text}


WORKLOADS = {
    "quote": [f"Repeat the following text exactly, word for word:\n\n{PASSAGE}"],
    "edit": ["Rename `items` to `stock` everywhere in this code. Keep everything else exactly as it is and output "
             f"the whole code.\n\n```python\n{CODE}```"],
    "restate": [f"Earlier you told me: \"{PASSAGE}\" Please say that again, exactly as before."],
    "story": ["Write a short story about a fox who learns to sail."],
}
# name -> (the earlier conversations, answered first; the timed conversation, made from their answers)
HISTORY_WORKLOADS = {
    "ask_again": ([[user(QUESTION)]], lambda answers: [user(QUESTION)]),
    "recall": ([[user(QUESTION)]], lambda answers: [
        user(QUESTION), {"role": "assistant", "content": answers[0]},
        user("Thanks. Please repeat your previous answer exactly, word for word.")]),
    "other_system": ([[{"role": "system", "content": "You are a helpful assistant."}, user(QUESTION)]],
                     lambda answers: [{"role": "system", "content": "You are a knowledgeable, patient teacher."},
                                      user(QUESTION)]),
}
STAT_KEYS = ("ngram_drafts", "radix_drafts", "radix_path_drafts", "radix_kgram_drafts", "model_drafts", "draft_tokens",
             "accepted_draft_tokens", "draft_tokens_cut", "guessed_drafts", "draft_model_kv_passes",
             "draft_model_skipped_passes", "draft_model_catch_up_tokens", "spec_controller_off_steps",
             "spec_controller_on_steps", "spec_controller_explorations")


@contextlib.contextmanager
def drafting_off(engine: Engine):
    """Requests admitted meanwhile get none of the engine's speculative sources (grammar jump-forward stays): off
    measured on the speculative engine itself, its KV pool, graphs and kernels (--paired-off). Swapped between
    generate calls, while the scheduler is idle."""
    drafts = engine.scheduler.drafts
    saved = drafts.sources
    drafts.sources = [s for s in saved if not s.traits.batch_adaptive]
    try:
        yield
    finally:
        drafts.sources = saved


def run(engine: Engine, prompts: list[str], max_new: int) -> tuple[float, list[list[int]], dict]:
    sp = {"temperature": 0, "max_new_tokens": max_new}
    before = dict(engine.scheduler.grammar_stats)
    prefilled = engine.scheduler.stats["prefill_tokens"]
    t0 = time.perf_counter()
    outs = engine.generate(prompts, sp)
    wall = time.perf_counter() - t0
    stats = {k: engine.scheduler.grammar_stats[k] - before.get(k, 0) for k in STAT_KEYS}
    stats["prefill_tokens"] = engine.scheduler.stats["prefill_tokens"] - prefilled
    return wall, [o["output_ids"] for o in outs], stats


def template(engine: Engine, messages: list[dict]) -> str:
    return engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def start(engine: Engine, name: str, max_new: int) -> str:
    """Flushes the cache and, for a workload with a history, answers its earlier conversations (untimed); returns the
    workload's timed prompt."""
    engine.flush_cache()  # every run prefills its prompts (no hit from the last run)
    if name in WORKLOADS:
        return template(engine, [user(WORKLOADS[name][0])])
    earlier, timed = HISTORY_WORKLOADS[name]
    outs = engine.generate([template(engine, m) for m in earlier], {"temperature": 0, "max_new_tokens": max_new})
    return template(engine, timed([o["text"] for o in outs]))


def engine_facts(engine: Engine) -> dict:
    """What an engine sized at start-up (a round's engine that runs slower than its twin: same sizes?)."""
    runner, graphs = engine.runner, engine.runner.graph_runner
    return {"kv_tokens": runner.max_total_num_tokens, "cuda_graph_max_bs": graphs.max_bs if graphs else 0,
            "max_running_requests": runner.max_running_requests}


def paired(args: argparse.Namespace, algo: str | None) -> bool:
    """--paired-off for a source without state of its own beside the requests' (a draft model's KV would lag)."""
    return args.paired_off and algo in ("NGRAM", "RADIX")


def engine_for(args, algo: str | None) -> Engine:
    draft = {"speculative_draft_model_path": args.draft_model} if algo == "STANDALONE" else {}
    if args.measure_window is not None:
        draft["speculative_measure_window"] = args.measure_window
    return Engine(args.model, device=args.device, dtype=args.dtype, random_seed=0, load_format=args.load_format,
                  speculative_algorithm=algo, speculative_num_draft_tokens=args.num_draft_tokens, **draft)


def record(args) -> dict[str, list[int]]:
    """The target's own greedy outputs of each workload's prompt (--tiny: what the replay then plays)."""
    engine = engine_for(args, None)
    try:
        prompts = [template(engine, [user(WORKLOADS[name][0])]) for name in args.workloads]
        outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": args.max_new_tokens})
        return {name: o["output_ids"] for name, o in zip(args.workloads, outs)}
    finally:
        engine.shutdown()


def replay(engine: Engine, args, recorded: dict[str, list[int]]) -> None:
    names = [n for n in args.workloads if n in recorded]
    speculative_replay.install(engine, [template(engine, [user(WORKLOADS[n][0])]) for n in names],
                               [recorded[n] for n in names], args.draft_acceptance)


def tiny(args) -> None:
    """--tiny: a tiny random target and draft model with --model's tokenizer (the recording model's), on the CPU."""
    import tempfile

    root = tempfile.mkdtemp(prefix="speculative-tiny-")
    recording_model = args.model
    args.model = speculative_replay.shaped(recording_model, f"{root}/target", ModelShape.TINY)
    args.draft_model = speculative_replay.shaped(recording_model, f"{root}/draft", ModelShape.TINY_DRAFT)
    args.load_format, args.device, args.dtype = "dummy", "cpu", "float32"
    args.algorithms = args.algorithms or ["STANDALONE"]
    args.workloads = [n for n in args.workloads if n in WORKLOADS]


def copy_bandwidth(device: str) -> float | None:
    """Device-to-device copy bandwidth (bytes/s, read + written; benchmarks/lib/engine.py's measure), taken before
    any engine holds the memory; None on a CPU."""
    if not device.startswith("cuda"):
        return None
    from benchmarks.lib.engine import measure_copy_bandwidth

    return measure_copy_bandwidth()


def bandwidth_floor(engine: Engine, bw: float | None) -> dict:
    """Batch-1 plain decoding's ceiling: every weight but the embedding table read once per token, at the copy
    bandwidth bw (None on a CPU: no floor)."""
    model = engine.runner.model
    embed = model.model.embed_tokens.weight
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) - embed.numel() * embed.element_size()
    floor = {"weight_bytes_per_step": weight_bytes, "copy_bandwidth_TBps": None if bw is None else bw / 1e12,
             "floor_ms_batch1": None if bw is None else weight_bytes / bw * 1e3,
             "floor_tokens_per_s_batch1": None if bw is None else bw / weight_bytes}
    if bw is not None:
        print(f"batch-1 floor: {weight_bytes / 1e9:.2f} GB of weights at {bw / 1e12:.2f} TB/s: "
              f"{floor['floor_ms_batch1']:.2f} ms/token, {floor['floor_tokens_per_s_batch1']:.1f} tokens/s",
              flush=True)
    return floor


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--algorithms", nargs="*", default=None, help="default: NGRAM (--tiny: STANDALONE); none: off only")
    p.add_argument("--draft-model", default=None, help="STANDALONE's draft model (speculative_draft_model_path)")
    p.add_argument("--load-format", default="auto", help="dummy: random weights (a model directory with no weights)")
    p.add_argument("--save-ids", default=None, help="write off's first output per workload here (JSON)")
    p.add_argument("--script-ids", default=None,
                   help="replay these outputs (--save-ids of a run with the same tokenizer; workloads without a "
                        "history): the passes run, their tokens are the recording's (speculative_replay.py)")
    p.add_argument("--draft-acceptance", type=float, default=0.8,
                   help="with a replay: each draft model token is the recorded one with this probability")
    p.add_argument("--tiny", action="store_true", help="tiny random target and draft, CPU (records, then replays)")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=[*WORKLOADS, *HISTORY_WORKLOADS])
    p.add_argument("--num-draft-tokens", type=int, default=5,
                   help="--speculative-num-draft-tokens as SGLang counts it: the verified root token included, so up "
                        "to N - 1 drafted tokens per step (default 5: 4 drafted, as the earlier results ran)")
    p.add_argument("--measure-window", type=int, default=None,
                   help="--speculative-measure-window of every engine (default: the server's; 0: no draft controller)")
    p.add_argument("--repeat", type=int, default=2, help="timed runs in a row per engine and round")
    p.add_argument("--rounds", type=int, default=1,
                   help="passes over every algorithm (an engine each): on a shared machine, another load (or an "
                        "engine's own state) then rarely covers every run of one algorithm")
    p.add_argument("--stat", choices=["median", "best"], default="best",
                   help="which of a key's --rounds x --repeat runs gives its row (median: by wall time)")
    p.add_argument("--paired-off", action="store_true",
                   help="NGRAM / RADIX engines also time each run with drafting off on the same engine, right after "
                        "it (rows 'off@ALGO'; column 'paired': the algorithm over them): fresh engines' speeds "
                        "differ by up to +-10%% at batch 64-256 on a GPU, more than the effect measured there")
    p.add_argument("--floor", action="store_true",
                   help="the batch-1 bandwidth floor in the same run (CUDA): the target's weight bytes read per step "
                        "over the device-to-device copy bandwidth measured here, as tokens/s; batch-1 rows get "
                        "their ratio to it")
    p.add_argument("--out", default=None,
                   help="default: benchmarks/results/speculative/speculative_cpu.json (--tiny: speculative_tiny_cpu.json)")
    args = p.parse_args(argv)
    recorded = json.loads(Path(args.script_ids).read_text()) if args.script_ids else None
    args.out = args.out or f"benchmarks/results/speculative/speculative{'_tiny' if args.tiny else ''}_cpu.json"
    if args.tiny:
        tiny(args)
        recorded = record(args)
    if args.algorithms is None:
        args.algorithms = ["NGRAM"]
    if recorded is not None and any(n not in recorded for n in args.workloads):
        raise SystemExit(f"no recorded output for {[n for n in args.workloads if n not in recorded]}")
    floor, bw = None, copy_bandwidth(args.device) if args.floor else None
    runs: dict[tuple[str, int, str], list[tuple[float, list[list[int]], dict]]] = {}
    timed_prompts: dict[str, str] = {}  # (greedy: the earlier answers are the same for every algorithm)
    engines: list[dict] = []  # per engine (round, algorithm): what it sized at start-up
    for rnd in range(args.rounds):
        for algo in [None, *args.algorithms]:
            engine = engine_for(args, algo)
            engines.append({"round": rnd + 1, "algorithm": algo or "off", **engine_facts(engine)})
            if recorded is not None:
                replay(engine, args, recorded)
            if args.floor and floor is None:
                floor = bandwidth_floor(engine, bw)
            try:
                for name in args.workloads:
                    for b in args.batches:
                        if name not in timed_prompts:
                            timed_prompts[name] = start(engine, name, args.max_new_tokens)
                        engine.flush_cache()
                        run(engine, [timed_prompts[name]] * b, 8)  # warm-up of this shape
                        for _ in range(args.repeat):
                            prompts = [start(engine, name, args.max_new_tokens)] * b
                            runs.setdefault((name, b, algo or "off"), []).append(
                                run(engine, prompts, args.max_new_tokens))
                            if paired(args, algo):
                                with drafting_off(engine):
                                    # start() again: else the off run's prompt is a cache hit that its speculative
                                    # twin had to prefill
                                    prompts = [start(engine, name, args.max_new_tokens)] * b
                                    runs.setdefault((name, b, f"off@{algo}"), []).append(
                                        run(engine, prompts, args.max_new_tokens))
            finally:
                engine.shutdown()
                del engine
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()  # the next engine sizes its KV pool from the free memory
    rows = []
    for (name, b, algo), measured in runs.items():
        got = sorted(measured, key=lambda g: g[0])
        wall, ids, stats = got[(len(got) - 1) // 2] if args.stat == "median" else got[0]
        n_out = sum(len(x) for x in ids)
        # runs_wall_s in the order measured: round 1's repeats, then round 2's, ... (each round a fresh engine)
        rows.append({"workload": name, "batch": b, "algorithm": algo, "wall_s": wall, "output_tokens": n_out,
                     "output_tokens_per_s": n_out / wall, "best_output_tokens_per_s": n_out / got[0][0],
                     "runs_wall_s": [g[0] for g in measured],
                     "runs_prefill_tokens": [g[2]["prefill_tokens"] for g in measured], **stats, "_ids": ids})
    off = {(r["workload"], r["batch"]): r for r in rows if r["algorithm"] == "off"}
    by_key = {(r["workload"], r["batch"], r["algorithm"]): r for r in rows}
    print(f"{'workload':12} {'batch':>5} {'algorithm':11} {'tok/s':>8} {'vs off':>7} {'best':>5} {'spread':>6} "
          f"{'drafts':>7} {'accept/draft':>12} {'same':>5} {'paired':>6}")
    for r in rows:
        base = off[(r["workload"], r["batch"])]
        r["speedup_vs_off"] = r["output_tokens_per_s"] / base["output_tokens_per_s"]
        twin = by_key.get((r["workload"], r["batch"], f"off@{r['algorithm']}"))
        # Runs paired one to one on one engine: the median of the per-pair ratios.
        r["speedup_vs_paired_off"] = statistics.median(
            t / w for t, w in zip(twin["runs_wall_s"], r["runs_wall_s"])) if twin else None
        r["best_speedup_vs_off"] = r["best_output_tokens_per_s"] / base["best_output_tokens_per_s"]
        r["wall_spread"] = (max(r["runs_wall_s"]) - min(r["runs_wall_s"])) / statistics.median(r["runs_wall_s"])
        r["identical_to_off"] = sum(a == b for a, b in zip(r["_ids"], base["_ids"]))
        drafts = r["ngram_drafts"] + r["radix_drafts"] + r["model_drafts"]
        r["accepted_per_draft"] = r["accepted_draft_tokens"] / drafts if drafts else None
        if floor is not None and floor["floor_tokens_per_s_batch1"] and r["batch"] == 1:
            r["ratio_to_floor_tokens_per_s"] = r["output_tokens_per_s"] / floor["floor_tokens_per_s_batch1"]
        acc = f"{r['accepted_per_draft']:.2f}" if drafts else ""
        pair = f"{r['speedup_vs_paired_off']:.2f}" if r["speedup_vs_paired_off"] else ""
        print(f"{r['workload']:12} {r['batch']:5d} {r['algorithm']:11} {r['output_tokens_per_s']:8.1f} "
              f"{r['speedup_vs_off']:7.2f} {r['best_speedup_vs_off']:5.2f} {r['wall_spread']:6.2f} {drafts:7d} "
              f"{acc:>12} {r['identical_to_off']:5d} {pair:>6}")
    result = {"benchmark": "speculative", "model": args.model, "device": args.device,
              "machine": {"cpu_count": torch.get_num_threads(), "platform": platform.platform()},
              "command": " ".join(["python", *sys.argv]),
              "settings": {"max_new_tokens": args.max_new_tokens, "num_draft_tokens": args.num_draft_tokens,
                           "num_draft_tokens_counts": "the verified root token too (SGLang's convention)",
                           "repeat": args.repeat, "rounds": args.rounds, "measure_window": args.measure_window,
                           "paired_off": args.paired_off,
                           "stat": args.stat, "defaults": "speculative_max_batch_rows=64, "
                           "speculative_radix_match_window_size=4, ngram windows 2..4"},
              "draft_model": args.draft_model, "load_format": args.load_format, "bandwidth_floor": floor,
              "engines": engines,
              "replay": None if recorded is None else {"script_ids": args.script_ids or "recorded (--tiny)",
                                                       "draft_acceptance": args.draft_acceptance},
              "rows": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]}
    if args.save_ids:
        first = {name: runs[(name, args.batches[0], "off")][0][1][0] for name in args.workloads}
        Path(args.save_ids).write_text(json.dumps(first))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return result["rows"]


if __name__ == "__main__":
    main()
