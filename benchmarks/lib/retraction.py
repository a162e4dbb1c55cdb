"""Retractions under radixlm's admission rule without a model (benchmarks/scheduler/scheduler_sim.py --kind
retraction): the real Scheduler over lib/null_runner.py's runner, its plans and retractions recorded; the settings
(knobs), one run's counts and the table."""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import radixlm.runtime.scheduler.admission as admission
from benchmarks.lib.null_runner import GRAPH_ROWS, NullRunner
from radixlm.runtime.args import ServerArgs, Toggle
from radixlm.runtime.messages import TokenizedGenerateReqInput
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.planner import ScheduleBatch
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.spec.factory import DraftFactory

VOCAB = 1024  # prompt ids start with 8 + the request index: no two of the first 1016 share a prefix
TOKEN = 7  # every row's greedy next token
KNOBS = {"schedule_conservativeness": float, "max_running_requests": int, "chunked_prefill_size": int,
         "max_prefill_tokens": int, "mixed_chunk": str, "overlap_schedule": str,
         "start_ratio": str, "budget_use": float}
SIM_ONLY = ("start_ratio", "budget_use")


@dataclass
class SimConfig:
    num_requests: int = 500
    input_len: int = 1024
    output_len: int = 512
    pool_tokens: int = 400_000
    graph_rows: int = GRAPH_ROWS  # CUDA-graph replay limit (mixed prefill: up to 512 rows)
    seed: int = 0
    knobs: dict[str, Any] = field(default_factory=dict)  # ServerArgs overrides, and start_ratio (below)


def build(cfg: SimConfig) -> Scheduler:
    kw: dict[str, Any] = {"chunked_prefill_size": 8192, "overlap_schedule": "on"}  # CUDA's defaults
    kw.update({k: v for k, v in cfg.knobs.items() if k not in SIM_ONLY})
    args = ServerArgs(model_path="fake-model", device="cpu", random_seed=cfg.seed, max_total_tokens=cfg.pool_tokens,
                      speculative_measure_window=0, **kw)
    # ModelRunner's default on CUDA: max_running_requests or min(pool // 2, 4096).
    max_running = args.max_running_requests or max(1, min(cfg.pool_tokens // 2, 4096))
    runner = NullRunner(cfg.pool_tokens, 1, max_running, cfg.input_len + cfg.output_len + 8, VOCAB, TOKEN,
                        cfg.graph_rows)
    sched = Scheduler(args, runner, tokenizer=None, eos_token_ids=frozenset(), drafts=DraftFactory.load(args, runner))
    # start_ratio: 'init' (a fresh engine, or any engine once idle: the scheduler resets the ratio then), 'min' (the
    # floor an earlier workload decayed it to, where nothing reset it on idle, as before), or a number.
    # budget_use: what earlier workloads taught admission (NewTokenRatio.note_finished): the share of max_new_tokens
    # their requests used (1.0: they ran to it, as every workload of the side-by-side does); it holds across idle.
    if "budget_use" in cfg.knobs:
        sched.ratio.budget_use = float(cfg.knobs["budget_use"])
        sched.ratio.reset()
    start = str(cfg.knobs.get("start_ratio", "init"))
    named = {"init": sched.ratio.value, "min": sched.ratio.min}
    sched.ratio.value = named[start] if start in named else float(start)
    return sched


def run(cfg: SimConfig) -> dict[str, Any]:
    """Runs the workload to the end; returns the run's counts (scheduler_sim.py's docstring)."""
    sched = build(cfg)
    start_ratio = sched.ratio.value
    kinds = {"prefill": 0, "decode": 0, "mixed": 0}
    decode_sizes: list[int] = []  # requests per decode pass
    retract_log: list[dict[str, Any]] = []  # one entry per retraction event
    retracted_rids: set[str] = set()
    plan, retract = sched.planner.plan, admission.retract_decode

    def recording_plan(running: list, new_reqs: list, token_buf: Any = None) -> ScheduleBatch:
        batch = plan(running, new_reqs, token_buf)
        kind = "decode" if not new_reqs else "mixed" if running else "prefill"
        kinds[kind] += 1
        if kind == "decode":
            decode_sizes.append(len(batch.reqs))
        return batch

    def recording_retract(running: list, planner: Any, rank: Any = None) -> tuple[list, float]:
        before = len(running)
        out, ratio = retract(running, planner, rank)
        retracted_rids.update(r.rid for r in out)
        retract_log.append({"pass": sum(kinds.values()), "running_before": before, "retracted": len(out),
                            "kv_dropped": sum(len(r.origin_input_ids) + len(r.output_ids) for r in out),
                            "ratio_before": round(sched.ratio.value, 4), "ratio_after": round(ratio, 4)})
        return out, ratio

    sched.planner.plan = recording_plan
    admission.retract_decode = recording_retract
    rng = random.Random(cfg.seed)
    try:
        for i in range(cfg.num_requests):
            sp = SamplingParams(max_new_tokens=cfg.output_len, temperature=0.0, ignore_eos=True)
            sp.normalize()
            ids = [8 + i % (VOCAB - 8)] + [rng.randrange(8, VOCAB) for _ in range(cfg.input_len - 1)]
            sched.add_request(TokenizedGenerateReqInput(rid=str(i), input_ids=ids, sampling_params=sp))
        outputs: dict[str, int] = {}
        finished: dict[str, str] = {}
        t0 = time.perf_counter()
        while not sched.is_idle():
            for out in sched.step():
                outputs[out.rid] = outputs.get(out.rid, 0) + len(out.new_output_ids)
                if out.finished_reason is not None:
                    finished[out.rid] = out.finished_reason.get("type", "?")
        wall = time.perf_counter() - t0
    finally:
        admission.retract_decode = retract
    st = sched.stats
    minimum = cfg.num_requests * cfg.input_len
    recomputed = st["prefill_tokens"] - (minimum - st["cached_tokens"])
    return {
        "config": asdict(cfg),
        "admission": {"start_new_token_ratio": start_ratio, "init_new_token_ratio": sched.ratio.init,
                      "min_new_token_ratio": sched.ratio.min,
                      "new_token_ratio_decay": sched.ratio.decay_step,
                      "max_running_requests": sched.admission.config.max_running_requests,
                      "chunked_prefill_size": sched.admission.config.chunked_prefill_size,
                      "max_prefill_tokens": sched.args.max_prefill_tokens, "overlap": sched.overlap,
                      "mixed_prefill": sched.args.mixed_chunk is not Toggle.OFF},
        "passes": {**kinds, "total": sum(kinds.values())},
        "retractions": st["retractions"],
        "retraction_events": len(retract_log),
        "requests_retracted": len(retracted_rids),  # distinct requests retracted at least once
        "kv_dropped_tokens": sum(e["kv_dropped"] for e in retract_log),
        "prefill_tokens": st["prefill_tokens"],
        "prefill_tokens_min": minimum,
        "first_admission_cached_tokens": st["cached_tokens"],
        # Prefilled beyond each prompt's first computation (prompt tokens the tree held at first admission excepted).
        "recomputed_tokens": recomputed,
        "recomputed_pct": round(100.0 * recomputed / minimum, 2),
        "decode_batch_mean": round(sum(decode_sizes) / max(len(decode_sizes), 1), 1),
        "decode_batch_max": max(decode_sizes, default=0),
        "output_tokens": sum(outputs.values()),
        "finished": len(finished),
        "finished_full": sum(1 for rid, n in outputs.items()
                             if n == cfg.output_len and finished.get(rid) == "length"),
        "retraction_passes": [retract_log[0]["pass"], retract_log[-1]["pass"]] if retract_log else [],
        "retraction_log_head": retract_log[:10],
        "sim_wall_s": round(wall, 2),
    }


def parse_knobs(spec: str) -> dict[str, Any]:
    """'schedule_conservativeness=2,max_running_requests=260' -> typed ServerArgs overrides ('' -> {})."""
    knobs: dict[str, Any] = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in KNOBS:
            raise SystemExit(f"unknown knob {key!r}; one of {sorted(KNOBS)}")
        kind = KNOBS[key]
        knobs[key] = value.strip().lower() in ("1", "true", "yes") if kind is bool else kind(value)
    return knobs


COLUMNS = [("setting", 46), ("pre", 4), ("dec", 5), ("mix", 4), ("retr", 5), ("prefilled", 9), ("recomp", 8),
           ("dropped", 8), ("recomp%", 7), ("dec_bs_mean", 11), ("dec_bs_max", 10), ("ratio start/init/min", 20),
           ("s", 5)]


def row(name: str, r: dict[str, Any]) -> list[str]:
    p, a = r["passes"], r["admission"]
    ratios = f"{a['start_new_token_ratio']:.3f}/{a['init_new_token_ratio']:.2f}/{a['min_new_token_ratio']:.3f}"
    return [name, str(p["prefill"]), str(p["decode"]), str(p["mixed"]), str(r["retractions"]),
            str(r["prefill_tokens"]), str(r["recomputed_tokens"]), str(r["kv_dropped_tokens"]),
            f"{r['recomputed_pct']:.1f}", f"{r['decode_batch_mean']:.1f}", str(r["decode_batch_max"]), ratios,
            f"{r['sim_wall_s']:.0f}"]


def table(results: list[tuple[str, dict[str, Any]]]) -> str:
    lines = [" ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(COLUMNS))]
    for name, r in results:
        cells = row(name, r)
        lines.append(" ".join(c.rjust(w) if i else c.ljust(w) for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS))))
    return "\n".join(lines)
