"""The scheduler's host work on the hierarchical cache's multi-turn workload, without a model
(benchmarks/serving/hicache_multiturn.py --null-runner): the real Scheduler, radix tree and host tier over
lib/null_runner.py's runner, with a KV pool of the GPU run's token counts and layer count (rows of 8 bytes: on CUDA
the host tier's copies are the server's kernels, events and streams; on the CPU they run synchronously and move the
rows), driven by the same request stream as the GPU run (turns round-robin over the clients, --max-parallel in
flight, the next request sent as one finishes). Per configuration
(off, on with write_through, on with write_back): host milliseconds per scheduling round and per request by phase
(inclusive timers: a phase contains those it calls), prefill passes and tokens per pass, how many rounds requests
waited from arrival to admission (hits and misses apart), and optionally cProfile's top functions."""
from __future__ import annotations

import cProfile
import gc
import io
import pstats
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from benchmarks.lib.null_runner import NullRunner
from benchmarks.lib.phases import PhaseTimer
from radixlm.runtime.args import ServerArgs
from radixlm.runtime.cache.memory_pool import TokenToKVPool
from radixlm.runtime.messages import TokenizedGenerateReqInput
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.req import Req
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.spec.factory import DraftFactory

# Llama-3.1-8B's layer count: the per-layer copy calls of a load or backup are host work on the GPU too.
NULL_LAYERS = 32
# One KV row per layer and buffer of this many bf16 values (8 bytes: one int64 word through the copies).
NULL_ROW = (1, 4)
LOGITS_VOCAB = 256
MODES = ("off", "write_through", "write_back")  # hicache off, on with each write policy


@dataclass
class Tracker:
    """Rounds (steps) from each request's arrival to its admission."""

    step: int = 0
    arrived: dict[str, int] = field(default_factory=dict)
    waits: dict[str, int] = field(default_factory=dict)
    blocked_rounds: int = 0  # rounds with requests waiting that admitted none


def make_scheduler(args, mode: str) -> Scheduler:
    context = args.first_len + args.turns * (args.user_len + args.output_len) + 64
    kw = {}
    if mode != "off":
        kw = dict(enable_hierarchical_cache=True, hicache_ratio=args.hicache_ratio, hicache_write_policy=mode)
    sargs = ServerArgs(model_path="null-model", device="cpu", random_seed=0, max_total_tokens=args.max_total_tokens,
                       chunked_prefill_size=8192, overlap_schedule="on", page_size=args.page_size,
                       enable_integrity_check=args.integrity_check, context_length=context, **kw)
    max_running = min(args.max_total_tokens // 2, 4096)  # CUDA's default
    runner = NullRunner(args.max_total_tokens, args.page_size, max_running, context, LOGITS_VOCAB)
    # On CUDA the host tier's copies are the server's (kernels through the device's view of the pinned pool, events,
    # streams); on the CPU they run synchronously, moving the (tiny) rows.
    runner.token_to_kv_pool = TokenToKVPool(args.max_total_tokens, args.page_size, torch.bfloat16, NULL_LAYERS,
                                            *NULL_ROW, device=args.null_kv_device)
    s = Scheduler(sargs, runner, tokenizer=None, eos_token_ids=frozenset(), drafts=DraftFactory.load(sargs, runner))
    if mode != "off":  # a CPU pool issues each load at once; the server's CUDA rule unless asked for that
        s.tree_cache.defer_loads = not args.per_request_loads
    return s


def phases(s: Scheduler) -> list[tuple[str, object, str, bool]]:
    """(label, object, method, on the instance), outer first; the tree's and host pool's where they exist."""
    tree = s.tree_cache
    out = [
        ("step", s, "step", True),
        ("admission (admit_new)", s.admission, "admit_new", True),
        ("match (init_next_round_input)", Req, "init_next_round_input", False),
        ("match + load (rematch at add_one_req)", Req, "rematch", False),
        ("update running", s.admission, "update_running", True),
        ("planning (plan)", s.planner, "plan", True),
        ("launch", s, "launch_batch", True),
        ("result processing", s.results, "process_batch_result", True),
        ("accounting check", s, "check_memory", True),
        ("tree: match_prefix", tree, "match_prefix", True),
        ("tree: insert", tree, "_insert", True),
        ("tree: cache_finished", tree, "cache_finished", True),
        ("tree: cache_unfinished", tree, "cache_unfinished", True),
        ("tree: lock + unlock", tree, "lock", True),
        ("tree: lock + unlock", tree, "unlock", True),
        ("tree: evict (device)", tree, "evict", True),
    ]
    pool = getattr(tree, "host_pool", None)
    if pool is not None:
        out += [
            ("tree: match_and_load", tree, "match_and_load", True),
            ("tree: load's device alloc (+ eviction)", tree, "_device_alloc", True),
            ("tree: backup planning (_backup)", tree, "_backup", True),
            ("tree: host alloc (+ host eviction)", tree, "_host_alloc", True),
            ("tree: evict_host", tree, "evict_host", True),
            ("host pool: load", pool, "load", True),
            ("host pool: backup (queue)", pool, "backup", True),
            ("host pool: flush (issue backups)", pool, "flush", True),
            ("host pool: poll", pool, "poll", True),
        ]
    return out


def run_mode(args, mode: str, convs, profile: bool = False) -> dict:
    """One configuration over the request stream; the report (see the module's docstring)."""
    torch.set_num_threads(1)  # tiny CPU ops: a second thread only adds wake-ups (8 ms a copy on a busy 2-core box)
    s = make_scheduler(args, mode)
    tracker = Tracker()
    history: list[list[int]] = [[] for _ in convs]
    params = SamplingParams(max_new_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    params.normalize()
    records: dict[str, dict] = {}
    admit = s.admission.admit_new

    def admit_new():
        admitted = admit()
        for r in admitted:
            tracker.waits.setdefault(r.rid, tracker.step - tracker.arrived[r.rid])
        if not admitted and s.waiting_queue:
            tracker.blocked_rounds += 1
        return admitted

    s.admission.admit_new = admit_new
    timer = PhaseTimer()
    for label, obj, method, instance in phases(s):
        timer._wrap(obj, method, label, instance)
    prof = cProfile.Profile() if profile else None
    prefill_s = other_s = 0.0
    prefill_phases: dict[str, float] = {}
    step_s: list[float] = []
    gc.collect()
    gc.freeze()  # as build_scheduler does after start-up
    gc.callbacks.append(timer._gc)
    t0 = time.perf_counter()
    try:
        for turn in range(args.turns):
            todo = deque(range(len(convs)))
            inflight: dict[str, int] = {}
            while todo or inflight:
                while todo and len(inflight) < args.max_parallel:
                    c = todo.popleft()
                    rid = f"{c}-{turn}"
                    ids = history[c] + convs[c][turn]
                    s.add_request(TokenizedGenerateReqInput(rid=rid, input_ids=ids, sampling_params=params))
                    tracker.arrived[rid] = tracker.step
                    inflight[rid] = c
                    records[rid] = {"turn": turn, "prompt_tokens": len(ids), "ids": ids, "output_ids": []}
                tracker.step += 1
                before, prefills = dict(timer.seconds), s.stats["prefill_batches"]
                t = time.perf_counter()
                if prof is not None:
                    prof.enable()
                out = s.step()
                if prof is not None:
                    prof.disable()
                dt = time.perf_counter() - t
                step_s.append(dt)
                if s.stats["prefill_batches"] > prefills:  # the device idles for this round's host work
                    prefill_s += dt
                    for k, v in timer.seconds.items():
                        prefill_phases[k] = prefill_phases.get(k, 0.0) + v - before.get(k, 0.0)
                else:
                    other_s += dt
                for i, rid in enumerate(out.rids):
                    rec = records[rid]
                    rec["output_ids"] += out.new_output_ids[i]
                    if out.finished_reasons[i] is not None:
                        rec["cached_tokens"] = out.cached_tokens[i]
                        history[inflight.pop(rid)] = rec.pop("ids") + rec["output_ids"]
        while not s.is_idle():
            s.step()
    finally:
        timer.detach()
        if timer._gc in gc.callbacks:
            gc.callbacks.remove(timer._gc)
        gc.unfreeze()
    wall = time.perf_counter() - t0
    t = time.perf_counter()
    s.check_memory()  # both tiers' accounting, once, at the end (the loop runs it only when idle)
    check_ms = 1e3 * (time.perf_counter() - t)
    rounds, recs, st = len(step_s), list(records.values()), s.stats
    n = len(recs)
    times = timer.as_dict()
    prefills = st["prefill_batches"]
    hits = [tracker.waits[rid] for rid, r in records.items() if r.get("cached_tokens")]
    misses = [tracker.waits[rid] for rid, r in records.items() if not r.get("cached_tokens")]
    prompt = sum(r["prompt_tokens"] for r in recs)
    cached = sum(r.get("cached_tokens", 0) for r in recs)
    ordered = sorted(step_s)
    report = {
        "mode": mode, "kv_device": str(args.null_kv_device), "requests": n, "rounds": rounds, "wall_s": round(wall, 3),
        "host_ms_per_round": round(1e3 * sum(step_s) / rounds, 4),
        "host_ms_per_request": round(1e3 * sum(step_s) / n, 4),
        "host_s_total": round(sum(step_s), 4),
        # A prefill round's host work runs while the device idles (a wave's first round has no pass in flight).
        "host_s_prefill_rounds": round(prefill_s, 4), "host_s_other_rounds": round(other_s, 4),
        "host_ms_per_prefill_round": round(1e3 * prefill_s / max(1, prefills), 4),
        "step_ms_p50": round(1e3 * ordered[rounds // 2], 4),
        "step_ms_p99": round(1e3 * ordered[min(rounds - 1, rounds * 99 // 100)], 4),
        "step_ms_max": round(1e3 * ordered[-1], 4),
        "phase_ms_per_round": {k: round(1e3 * v["seconds"] / rounds, 4) for k, v in times.items()},
        "phase_ms_per_request": {k: round(1e3 * v["seconds"] / n, 4) for k, v in times.items()},
        "phase_ms_per_prefill_round": {k.strip(): round(1e3 * v / max(1, prefills), 4)
                                       for k, v in prefill_phases.items() if isinstance(k, str) and v > 0},
        "phase_calls": {k: v["calls"] for k, v in times.items()},
        "accounting_check_ms": round(check_ms, 3),
        "prompt_tokens": prompt, "cached_tokens": cached, "hit_rate": round(cached / prompt, 4),
        "prefill_passes": prefills, "prefill_tokens": st["prefill_tokens"],
        "prefill_tokens_per_pass": round(st["prefill_tokens"] / max(1, prefills), 1),
        "decode_passes": st["decode_batches"], "mixed_passes": st["mixed_batches"], "retractions": st["retractions"],
        "wait_rounds_hit_mean": round(statistics.fmean(hits), 3) if hits else None,
        "wait_rounds_hit_max": max(hits) if hits else None,
        "wait_rounds_miss_mean": round(statistics.fmean(misses), 3) if misses else None,
        "wait_rounds_miss_max": max(misses) if misses else None,
        "blocked_rounds": tracker.blocked_rounds,
        "tier_stats": s.tree_cache.tier_stats(),
    }
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.profile_top)
        report["cprofile_tottime"] = [line for line in buf.getvalue().splitlines() if line.strip()]
    return report


def table(runs: list[dict]) -> str:
    """Host ms by phase per round, per request and per prefill round, one column group per configuration."""
    labels = list(dict.fromkeys(k for r in runs for k in r["phase_ms_per_round"]))
    head = "".join(f"{r['mode']:>36}" for r in runs)
    lines = [f"{'host ms: per round / per request / per prefill round':58}{head}"]
    for key in ("host_ms_per_round", "host_ms_per_request", "host_ms_per_prefill_round"):
        lines.append(f"{key:58}" + "".join(f"{r[key]:>36.3f}" for r in runs))
    for label in labels:
        lines.append(f"{label[:58]:58}" + "".join(
            f"{r['phase_ms_per_round'].get(label, 0):>12.3f}{r['phase_ms_per_request'].get(label, 0):>12.3f}"
            f"{r['phase_ms_per_prefill_round'].get(label, 0):>12.3f}" for r in runs))
    for key in ("rounds", "prefill_passes", "prefill_tokens_per_pass", "decode_passes", "hit_rate",
                "wait_rounds_hit_mean", "wait_rounds_miss_mean", "blocked_rounds", "accounting_check_ms"):
        lines.append(f"{key:58}" + "".join(f"{str(r[key]):>36}" for r in runs))
    return "\n".join(lines)
