"""Would another schedule finish ShareGPT-like sooner (issue 20)? A pass-by-pass model of the peer workload (seed 1,
all 1000 requests at once) under several admission schedules, priced by a cost model of one H100 pass:

  GEMMs    max(weight read, rows x 2 x 6.98e9 FLOPs / 700 TFLOP/s) (a row: a prompt token or a decode row)
  prefill  attention by the sum of squared prompt lengths in the pass (10.8 ms for a pass of the workload's mean)
  decode   attention by context read at 3 TB/s (128 KiB a position), plus a per-row cost and a per-pass cost

Schedules: `chunked` (what serving does: prompts first in passes of up to --chunk tokens, then decode; `mix` adds
the running requests' decode rows to every prefill pass; `max_running` caps the running requests) and `budget`
(Sarathi-like: every pass carries every running request's decode row and fills up to --budget rows with prompt
chunks). `order`: fcfs, or lof (the largest max_new_tokens first: here the exact output lengths).

The model prices the served schedule ~8% under its measured 16.3 s (its constants are rough): compare schedules
with each other, not with runs.

    python benchmarks/scheduler/sharegpt_schedules.py
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.lib.engine import sharegpt_lengths as lengths  # noqa: E402

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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None, help="also write the table as JSON")
    args = p.parse_args()
    m = Model()
    cases = [("chunked 8192 (served)", lambda: m.chunked()),
             ("chunked 8192, mixed", lambda: m.chunked(mix=True)),
             ("chunked 2048, mixed", lambda: m.chunked(2048, mix=True)),
             ("chunked 8192, <= 768 running, mixed", lambda: m.chunked(mix=True, max_running=768)),
             ("chunked 8192, <= 512 running", lambda: m.chunked(max_running=512)),
             ("chunked 8192, lof", lambda: m.chunked(order="lof")),
             ("chunked 8192, mixed, lof", lambda: m.chunked(mix=True, order="lof"))]
    cases += [(f"budget {b}, {o}", lambda b=b, o=o: m.budget(b, o)) for b in (256, 512, 1024, 2048)
              for o in ("fcfs", "lof")]
    out_tokens = sum(m.outs)
    rows = []
    base = None
    for name, run in cases:
        s = run()
        base = base or s
        rows.append({"schedule": name, "model_s": s, "output_tok_s": out_tokens / s, "vs_served": base / s})
        print(f"{name:38s} {s:6.2f} s  {out_tokens / s:8,.0f} out tok/s  x{base / s:.3f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"benchmark": "sharegpt_schedules", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
