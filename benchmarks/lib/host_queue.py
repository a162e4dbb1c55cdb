"""The scheduler's host time per step with a queue of hundreds of requests, without a model (benchmarks/scheduler/
scheduler_sim.py --kind host-queue): the real Scheduler over lib/null_runner.py's runner, its phases timed by
lib/phases.py's PhaseTimer; medians over runs and the table."""
from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from benchmarks.lib.null_runner import NullRunner
from benchmarks.lib.phases import PhaseTimer
from radixlm.bench.datasets import PromptSource, generated_shared_prefix_dataset, random_dataset
from radixlm.bench.datasets import sharegpt_like_dataset
from radixlm.runtime.args import ServerArgs
from radixlm.runtime.messages import TokenizedGenerateReqInput
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.spec.factory import DraftFactory

LOGITS_VOCAB = 256  # the null pass's logits width (the sampler's cost is not the subject)
PROMPT_VOCAB = 128_256  # Llama-3's vocabulary: prompts' ids, so that random prompts rarely share a first token
CONTEXT_LEN = 4096


class IdTokenizer:
    """What PromptSource needs of a tokenizer to draw token ids (no text is made)."""

    vocab_size = PROMPT_VOCAB
    all_special_ids: list[int] = []

    def decode(self, ids: list[int]) -> str:
        return ""


def workload(name: str, n: int) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) of n requests shaped as peer-anchors.md's workload `name`."""
    src = PromptSource(IdTokenizer(), random.Random(0))
    if name == "sharegpt":
        reqs = sharegpt_like_dataset(src, n, seed=1)
    elif name == "random":
        reqs = random_dataset(src, n, 1024, 512, 1.0)
    elif name == "shared-prefix":
        reqs = generated_shared_prefix_dataset(src, 32, -(-n // 32), 2048, 128, 64, seed=2)[:n]
    else:
        raise SystemExit(f"unknown workload {name!r}")
    return [(r.input_ids, r.output_len) for r in reqs]


def make_scheduler(args: argparse.Namespace) -> Scheduler:
    sargs = ServerArgs(model_path="null-model", device="cpu", random_seed=0, max_total_tokens=args.max_total_tokens,
                       max_running_requests=args.max_running, chunked_prefill_size=8192, overlap_schedule="on",
                       schedule_policy=args.policy, page_size=args.page_size,
                       speculative_algorithm=getattr(args, "speculative", None))
    runner = NullRunner(args.max_total_tokens, args.page_size, args.max_running, CONTEXT_LEN, LOGITS_VOCAB)
    return Scheduler(sargs, runner, tokenizer=None, eos_token_ids=frozenset(), drafts=DraftFactory.load(sargs, runner))


def phases(s: Scheduler) -> list[tuple[str, object, str, bool]]:
    """(label, object, method, on the instance); outer phases first."""
    tree = s.tree_cache
    return [
        ("step", s, "step", True),
        ("  admission (admit_new)", s.admission, "admit_new", True),
        ("    policy order (calc_priority)", s.policy, "calc_priority", True),
        ("    prefix match (init_next_round_input)", Req, "init_next_round_input", False),
        ("  mix in running", s.admission, "mixed_in", True),
        ("  update running", s.admission, "update_running", True),
        ("  planning (plan)", s.planner, "plan", True),
        ("  launch (batch + sampling)", s, "launch_batch", True),
        ("    null forward", s.runner, "forward", True),
        ("  result processing", s.results, "process_batch_result", True),
        ("drafts: propose", s.drafts, "propose", True),
        ("drafts: fit_batch + flush + on_launch", s.drafts, "fit_batch", True),
        ("drafts: fit_batch + flush + on_launch", s.drafts, "flush", True),
        ("drafts: fit_batch + flush + on_launch", s.drafts, "on_launch", True),
        ("tree: match_prefix", tree, "match_prefix", True),
        ("tree: match_unchanged", tree, "match_unchanged", True),
        ("tree: insert", tree, "_insert", True),
        ("tree: evict", tree, "evict", True),
        ("tree: lock + unlock", tree, "lock", True),
        ("tree: lock + unlock", tree, "unlock", True),
        ("tree: cache_finished", tree, "cache_finished", True),
        ("tree: cache_unfinished", tree, "cache_unfinished", True),
    ]


def run_once(args: argparse.Namespace, name: str, n: int) -> dict:
    s = make_scheduler(args)
    for i, (ids, n_out) in enumerate(workload(name, n)):
        sp = SamplingParams(max_new_tokens=n_out, temperature=0.0, ignore_eos=True)
        sp.normalize()
        s.add_request(TokenizedGenerateReqInput(rid=str(i), input_ids=ids, sampling_params=sp))
    timer = PhaseTimer()
    for label, obj, method, instance in phases(s):
        timer._wrap(obj, method, label, instance)
    gc.collect()
    gc.freeze()  # as build_scheduler does after start-up
    gc.callbacks.append(timer._gc)
    steps: list[float] = []
    finished = 0
    t0 = time.perf_counter()
    try:
        while not s.is_idle():
            t = time.perf_counter()
            finished += sum(o.finished_reason is not None for o in s.step())
            steps.append(time.perf_counter() - t)
    finally:
        timer.detach()
        gc.unfreeze()
    wall = time.perf_counter() - t0
    if finished != n:
        raise SystemExit(f"{name}: {finished} of {n} requests finished")
    k = len(steps)
    us = {label: 1e6 * v["seconds"] / k for label, v in timer.as_dict().items()}
    calls = {label: v["calls"] / k for label, v in timer.as_dict().items()}
    us["host"] = us["step"] - us.get("null forward", 0.0)
    steps.sort()
    return {"workload": name, "requests": n, "steps": k, "passes": s.runner.passes, "wall_s": wall,
            "us_per_step": us, "calls_per_step": calls, "step_us_p50": 1e6 * steps[k // 2],
            "step_us_p99": 1e6 * steps[min(k - 1, k * 99 // 100)], "step_us_max": 1e6 * steps[-1],
            "prefill_batches": s.stats["prefill_batches"], "prefill_tokens": s.stats["prefill_tokens"],
            "cached_tokens": s.stats["cached_tokens"], "prompt_tokens": s.stats["prompt_tokens"]}


def median_run(runs: list[dict]) -> dict:
    """Per-phase medians over runs (the counts are the same in every run: scheduling is deterministic)."""
    out = dict(runs[0])
    for key in ("wall_s", "step_us_p50", "step_us_p99", "step_us_max"):
        out[key] = statistics.median(r[key] for r in runs)
    out["us_per_step"] = {label: statistics.median(r["us_per_step"].get(label, 0.0) for r in runs)
                          for label in runs[0]["us_per_step"]}
    out["runs_host_us"] = [r["us_per_step"]["host"] for r in runs]
    return out


def table(rows: list[dict]) -> str:
    labels = [p[0] for p in phases(make_scheduler(argparse.Namespace(
        max_total_tokens=64, max_running=1, policy="lpm", page_size=1)))]
    labels = list(dict.fromkeys(["host"] + labels))
    heads = [f"{r['workload']}/{r['requests']}" for r in rows]
    lines = [f"{'us per step (median)':42}" + "".join(f"{h:>20}" for h in heads)]
    lines.append(f"{'steps':42}" + "".join(f"{r['steps']:>20d}" for r in rows))
    for label in labels:
        key = label.strip()  # PhaseTimer.as_dict's keys
        cells = "".join(f"{r['us_per_step'].get(key, 0.0):>12.0f} ({r['calls_per_step'].get(key, 0.0):5.1f})"
                        for r in rows)
        lines.append(f"{label:42}{cells}")
    lines.append(f"{'step p50 / p99 (us)':42}" + "".join(f"{r['step_us_p50']:>11.0f} /{r['step_us_p99']:>6.0f}"
                                                          for r in rows))
    lines.append(f"{'wall s':42}" + "".join(f"{r['wall_s']:>20.2f}" for r in rows))
    lines.append(f"{'prefill tokens computed':42}" + "".join(f"{r['prefill_tokens']:>20d}" for r in rows))
    return "\n".join(lines) + "\n(calls per step in parentheses)"
