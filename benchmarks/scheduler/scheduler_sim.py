"""Model-free scheduling studies on the CPU, one per --kind (each kind's options: `--kind K --help`).

--kind host-queue: the scheduler's host time per step with a queue of hundreds of requests: the real Scheduler (radix
cache, policy, PrefillAdder, planner, sampler, output processing) over a runner whose forward pass returns zero
logits at once (greedy picks token 0; EOS is ignored, so every request runs to its max_new_tokens). All of a
workload's requests are submitted before the first step, as the offline runs of peer-anchors.md do. Workloads
(../shared/reference/peer-anchors.md shapes, random token ids from a 128,256-id vocabulary), each with `queue`
requests: sharegpt-like (lognormal lengths, seed 1), random 1024/512, generated-shared-prefix (32 groups, 2048-token
prefix + 128-token question, 64 out, shuffled; queue / 32 questions per group). Batch up to 256 requests, chunked
prefill 8192 and mixed decode rows up to 512 rows as on CUDA, overlap on, a 400,000-token pool (about Llama-3.1-8B's
on an H100). Phases are inclusive (a phase contains those it calls); the table gives microseconds per step, medians
over --repeat runs; `host` is the step minus the null forward.

--kind retraction: retractions under radixlm's admission rule. Replays the GPU "random 1024/512" workload at full
scale (500 requests submitted at once, 1024 random prompt tokens, 512 output tokens, greedy, EOS ignored; a 400k-token
KV pool, the H100's for Llama-3.1-8B) and counts what the scheduler does: passes by kind, retractions, tokens
prefilled and recomputed, decode batch sizes. The runner (benchmarks/lib/null_runner.py) computes nothing -- every
row's next token is one constant -- so a run takes seconds. CUDA's defaults are set where the CPU's differ
(chunked_prefill_size 8192, overlap on, CUDA-graph rows 1024, max_running_requests min(pool // 2, 4096)). A setting
(--sweep) is 'knob=value,...' over the existing ServerArgs in KNOBS, plus start_ratio: new_token_ratio at the first
step -- 'init' (a fresh engine, the default), 'min' (the floor: an engine that ran a long workload before, as
benchmarks/offline/gpu_llama8b.py's ab_workloads does; until the scheduler reset it on idle, nothing did) or a number;
budget_use: the share of max_new_tokens that earlier workloads' requests used, as admission learned it (an engine that
ran the side-by-side's ShareGPT-like workload first: 1.0).

--kind schedules: would another schedule finish ShareGPT-like sooner (issue 20)? A pass-by-pass model of the peer
workload (seed 1, all 1000 requests at once) under several admission schedules, priced by a cost model of one H100
pass: GEMMs max(weight read, rows x 2 x 6.98e9 FLOPs / 700 TFLOP/s) (a row: a prompt token or a decode row); prefill
attention by the sum of squared prompt lengths in the pass (10.8 ms for a pass of the workload's mean); decode
attention by context read at 3 TB/s (128 KiB a position), plus a per-row cost and a per-pass cost. Schedules:
`chunked` (what serving does: prompts first in passes of up to --chunk tokens, then decode; `mix` adds the running
requests' decode rows to every prefill pass; `max_running` caps the running requests) and `budget` (Sarathi-like:
every pass carries every running request's decode row and fills up to --budget rows with prompt chunks). `order`:
fcfs, or lof (the largest max_new_tokens first: here the exact output lengths). The model prices the served schedule
~8% under its measured 16.3 s (its constants are rough): compare schedules with each other, not with runs.

    python benchmarks/scheduler/scheduler_sim.py --kind host-queue --queues 1000,128 --repeat 3 \\
        --out benchmarks/results/scheduler/host_queue_cpu.json
    python benchmarks/scheduler/scheduler_sim.py --kind host-queue --workloads random --queues 64,256 --repeat 5 \\
        [--speculative NGRAM]        # speculation configured at batches the batch rule keeps from drafting
    .venv/bin/python benchmarks/scheduler/scheduler_sim.py --kind retraction
    .venv/bin/python benchmarks/scheduler/scheduler_sim.py --kind retraction --sweep "" start_ratio=min \\
        start_ratio=min,max_running_requests=250
    .venv/bin/python benchmarks/scheduler/scheduler_sim.py --kind retraction --pool-tokens 50000 --input-len 128 \\
        --output-len 64 --out sim.json
    python benchmarks/scheduler/scheduler_sim.py --kind schedules [--out F]
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib import host_queue, retraction, schedule_model  # noqa: E402
from benchmarks.lib.kinds import parse_kind  # noqa: E402
from benchmarks.lib.null_runner import GRAPH_ROWS  # noqa: E402
from radixlm.runtime.scheduler import policy as policy_module  # noqa: E402

SCRIPT = "benchmarks/scheduler/scheduler_sim.py"


class Kind(str, Enum):
    HOST_QUEUE = "host-queue"
    RETRACTION = "retraction"
    SCHEDULES = "schedules"


def host_queue_args(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--workloads", default="sharegpt,random,shared-prefix")
    p.add_argument("--queues", default="1000,128", help="requests submitted at once, per workload")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--max-total-tokens", type=int, default=400_000)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--policy", default="lpm")
    p.add_argument("--lpm-fallback", type=int, default=policy_module.LPM_FALLBACK_QUEUE_LEN,
                   help="waiting requests above which LPM orders as FCFS (SGLang's 128)")
    p.add_argument("--speculative", default=None, choices=["NGRAM", "RADIX", "NGRAM_RADIX"],
                   help="--speculative-algorithm (sources without a model); batches over --speculative-max-batch-rows "
                        "/ 2 draft nothing, so their host time should be off's")
    p.add_argument("--out", default=None)


def retraction_args(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--num-requests", type=int, default=500)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("--pool-tokens", type=int, default=400_000)
    p.add_argument("--graph-rows", type=int, default=GRAPH_ROWS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", nargs="*", default=[""], help="settings to run, each 'knob=value,knob=value' "
                   "('' = defaults); knobs: " + ", ".join(retraction.KNOBS))
    p.add_argument("--out", default=None, help="write the results (and this command line) as JSON")


def schedules_args(p: argparse._ArgumentGroup) -> None:
    p.add_argument("--out", default=None, help="also write the table as JSON")


def run_host_queue(args: argparse.Namespace, argv: list[str]) -> list[dict]:
    torch.set_num_threads(1)
    policy_module.LPM_FALLBACK_QUEUE_LEN = args.lpm_fallback
    rows = []
    for name in args.workloads.split(","):
        for n in map(int, args.queues.split(",")):
            rows.append(host_queue.median_run([host_queue.run_once(args, name, n) for _ in range(args.repeat)]))
            print(f"{name}/{n}: host {rows[-1]['us_per_step']['host']:.0f} us/step over {rows[-1]['steps']} steps",
                  file=sys.stderr)
    print(host_queue.table(rows))
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        Path(args.out).write_text(json.dumps({"command": " ".join(["python", SCRIPT, *argv]), "commit": commit,
                                              "rows": rows}, indent=2))
    return rows


def run_retraction(args: argparse.Namespace, argv: list[str]) -> list[tuple[str, dict[str, Any]]]:
    results: list[tuple[str, dict[str, Any]]] = []
    for spec in args.sweep:
        cfg = retraction.SimConfig(args.num_requests, args.input_len, args.output_len, args.pool_tokens,
                                   args.graph_rows, args.seed, retraction.parse_knobs(spec))
        results.append((spec or "default", retraction.run(cfg)))
        table = retraction.table(results)
        print(table.splitlines()[-1] if len(results) > 1 else table, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": f".venv/bin/python {SCRIPT} " + shlex.join(argv),
                       "runs": [{"setting": n, **r} for n, r in results]}, f, indent=1)
    return results


def run_schedules(args: argparse.Namespace, argv: list[str]) -> list[dict]:
    m = schedule_model.Model()
    out_tokens = sum(m.outs)
    rows = []
    base = None
    for name, run in schedule_model.cases(m):
        s = run()
        base = base or s
        rows.append({"schedule": name, "model_s": s, "output_tok_s": out_tokens / s, "vs_served": base / s})
        print(f"{name:38s} {s:6.2f} s  {out_tokens / s:8,.0f} out tok/s  x{base / s:.3f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"benchmark": "sharegpt_schedules", "rows": rows}, indent=1))
    return rows


KINDS = {Kind.HOST_QUEUE: (host_queue_args, run_host_queue), Kind.RETRACTION: (retraction_args, run_retraction),
         Kind.SCHEDULES: (schedules_args, run_schedules)}


def main(argv: list[str] | None = None) -> Any:
    """The kind's result: host-queue and schedules their rows, retraction its (setting, counts) pairs."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_kind(__doc__, {k: add for k, (add, _) in KINDS.items()}, None, argv)
    return KINDS[args.kind][1](args, argv)


if __name__ == "__main__":
    main()
