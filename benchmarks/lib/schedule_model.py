"""A pass-by-pass model of ShareGPT-like (seed 1, all 1000 requests at once) under admission schedules, priced by a
cost model of one H100 pass (benchmarks/scheduler/scheduler_sim.py --kind schedules: the cost terms and schedules)."""
from __future__ import annotations

from typing import Callable

from benchmarks.lib.engine import sharegpt_lengths as lengths

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
