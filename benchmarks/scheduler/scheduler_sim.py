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
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib import host_queue, retraction  # noqa: E402
from benchmarks.lib.engine import sharegpt_lengths as lengths  # noqa: E402
from benchmarks.lib.kinds import parse_kind  # noqa: E402
from benchmarks.lib.null_runner import GRAPH_ROWS  # noqa: E402
from radixlm.runtime.scheduler import policy as policy_module  # noqa: E402

SCRIPT = "benchmarks/scheduler/scheduler_sim.py"

# --kind schedules: a pass-by-pass model of ShareGPT-like (seed 1, all 1000 requests at once) under admission
# schedules, priced by a cost model of one H100 pass.
WEIGHT_READ_S = 4.98e-3  # 15 GB over 3.01 TB/s
ROW_S = 2 * 6.98e9 / 700e12
KV_S_PER_POSITION = 128 * 1024 / 3.0e12
ELEMENTWISE_S_PER_ROW = 3.2e-6  # norms, rotary, silu: ~26 ms of a 8192-token prefill pass
PASS_S = 0.45e-3
DECODE_PASS_S = 0.3e-3  # sampling and the decode pass's own small kernels


class Model:
    def __init__(self):
        self.ins, self.outs = lengths()
        self.prefill_attn_s = 10.8e-3 / (sum(n * n for n in self.ins) / 24)

    def cost(self, prompt_chunks: list[int], contexts: list[int]) -> float:
        rows = sum(prompt_chunks) + len(contexts)
        return (max(WEIGHT_READ_S, rows * ROW_S) + self.prefill_attn_s * sum(n * n for n in prompt_chunks)
                + KV_S_PER_POSITION * sum(contexts) + ELEMENTWISE_S_PER_ROW * rows + PASS_S
                + (DECODE_PASS_S if not prompt_chunks else 0.0))

    def order(self, how: str) -> list[int]:
        idx = list(range(len(self.ins)))
        return sorted(idx, key=lambda i: -self.outs[i]) if how == "lof" else idx

    def step(self, running: dict[int, list[int]], rows: list[int]) -> None:
        for i in rows:
            running[i][0] += 1
            running[i][1] -= 1
            if running[i][1] <= 0:
                del running[i]

    def chunked(self, chunk: int = 8192, mix: bool = False, order: str = "fcfs", max_running: int = 1 << 30) -> float:
        waiting, running, t = self.order(order), {}, 0.0
        while waiting or running:
            if waiting and len(running) < max_running:
                admitted = [waiting.pop(0)]
                while (waiting and sum(self.ins[i] for i in admitted) + self.ins[waiting[0]] <= chunk
                       and len(running) + len(admitted) < max_running):
                    admitted.append(waiting.pop(0))
                decode = list(running) if mix else []
                t += self.cost([self.ins[i] for i in admitted], [running[i][0] for i in decode])
                self.step(running, decode)
                for i in admitted:
                    running[i] = [self.ins[i] + 1, self.outs[i] - 1]
            else:
                decode = list(running)
                t += self.cost([], [running[i][0] for i in decode])
                self.step(running, decode)
        return t

    def budget(self, budget: int, order: str = "fcfs") -> float:
        waiting = [[i, self.ins[i]] for i in self.order(order)]
        running, t = {}, 0.0
        while waiting or running:
            decode = list(running)
            room, chunks, admitted = budget - len(decode), [], []
            while waiting and room > 0:
                take = min(waiting[0][1], room)
                room -= take
                chunks.append(take)
                waiting[0][1] -= take
                if waiting[0][1] == 0:
                    admitted.append(waiting.pop(0)[0])
            t += self.cost(chunks, [running[i][0] for i in decode])
            self.step(running, decode)
            for i in admitted:
                running[i] = [self.ins[i] + 1, self.outs[i] - 1]
        return t


def cases(m: Model) -> list[tuple[str, Callable[[], float]]]:
    """(name, a call returning the model's seconds) per schedule, the served one first."""
    out = [("chunked 8192 (served)", lambda: m.chunked()),
           ("chunked 8192, mixed", lambda: m.chunked(mix=True)),
           ("chunked 2048, mixed", lambda: m.chunked(2048, mix=True)),
           ("chunked 8192, <= 768 running, mixed", lambda: m.chunked(mix=True, max_running=768)),
           ("chunked 8192, <= 512 running", lambda: m.chunked(max_running=512)),
           ("chunked 8192, lof", lambda: m.chunked(order="lof")),
           ("chunked 8192, mixed, lof", lambda: m.chunked(mix=True, order="lof"))]
    return out + [(f"budget {b}, {o}", lambda b=b, o=o: m.budget(b, o)) for b in (256, 512, 1024, 2048)
                  for o in ("fcfs", "lof")]



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
    m = Model()
    out_tokens = sum(m.outs)
    rows = []
    base = None
    for name, run in cases(m):
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
