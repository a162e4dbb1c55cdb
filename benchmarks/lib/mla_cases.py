"""The MLA decode kernel's benchmark cases (benchmarks/kernels/mla_decode.py): a pool of latents per (model, batch,
context), the float32 torch reference, graph-replay timing over distinct requests, the per-stage profile, and the
sweep's summary (the config with the least geometric-mean time, per model and overall)."""
from __future__ import annotations

import math
import time

import torch

from radixlm.runtime.kernels.attention.mla import MlaDecodeConfig, mla_decode

SM_SCALE = 192 ** -0.5  # 1/sqrt(qk_nope_head_dim + qk_rope_head_dim), as DeepSeek's attention (mscale aside)
COPY_BYTES = 400_000_000  # latents read per graph replay at least
MAX_COPIES = 128
TOLERANCE = 2e-2


def log(*a) -> None:
    print(*a, flush=True)


class Case:
    """One (model, batch, context): a pool of `copies` x batch requests of `context` latents each."""

    def __init__(self, model: str, heads: int, bs: int, ctx: int, rank: int, rope: int, device: str, dry: bool,
                 kv_dtype: torch.dtype | None):
        self.model, self.heads, self.bs, self.ctx, self.rank, self.rope = model, heads, bs, ctx, rank, rope
        self.device = device
        width = rank + rope
        dtype = torch.float32 if dry else torch.bfloat16  # the interpreter computes bfloat16 wrongly
        kv_dtype = kv_dtype or dtype
        self.kv_scale = 1.0 if kv_dtype == dtype else 0.5
        self.bytes = bs * ctx * width * kv_dtype.itemsize
        self.copies = 1 if dry else max(1, min(MAX_COPIES, -(-COPY_BYTES // self.bytes)))
        rows = self.copies * bs
        self.kv = torch.empty(rows * ctx + 1, 1, width, device=device, dtype=kv_dtype)
        g = torch.Generator(device=device).manual_seed(bs * 7 + ctx + heads)
        step = 1 << 24
        for i in range(0, self.kv.shape[0], step // width):
            part = self.kv[i : i + step // width]
            part.copy_(torch.randn(part.shape, generator=g, device=device))
        self.req_to_token = (torch.arange(rows * ctx, device=device, dtype=torch.int64) + 1).view(rows, ctx)
        self.rows = [torch.arange(bs, device=device) + i * bs for i in range(self.copies)]
        self.seq_lens = torch.full((bs,), ctx, device=device, dtype=torch.int64)
        self.q = torch.randn(bs, heads, width, generator=g, device=device).to(dtype)
        self.out = torch.empty(bs, heads, rank, device=device, dtype=dtype)
        self.check_rows = sorted({0, bs // 2, bs - 1})
        self.ref = torch.stack([self.reference(b) for b in self.check_rows])

    def reference(self, b: int) -> torch.Tensor:
        keys = self.kv[self.req_to_token[self.rows[0][b]], 0].float() * self.kv_scale  # (ctx, R + P)
        p = (self.q[b].float() @ keys.T * SM_SCALE).softmax(-1)
        return p @ keys[:, : self.rank]

    def call(self, i: int, config: MlaDecodeConfig, splits: int) -> torch.Tensor:
        return mla_decode(self.q, self.kv, self.req_to_token, self.rows[i], self.seq_lens, SM_SCALE, self.out,
                          num_kv_splits=splits, kv_scale=self.kv_scale, config=config)

    def error(self, config: MlaDecodeConfig, splits: int) -> float:
        got = self.call(0, config, splits)[self.check_rows].float()
        return ((got - self.ref).abs().max() / self.ref.abs().max().clamp_min(1e-6)).item()

    def time_us(self, config: MlaDecodeConfig, splits: int, reps: int) -> float:
        return time_us(lambda i: self.call(i, config, splits), self.copies, reps, self.device != "cuda")


def time_us(call, copies: int, reps: int, dry: bool) -> float:
    """Microseconds a call: CUDA-graph replays of `copies` calls (call(i): copy i's requests); a dry run's wall clock
    over `reps` calls."""
    if dry:
        t0 = time.perf_counter()
        for _ in range(reps):
            call(0)
        return (time.perf_counter() - t0) / reps * 1e6
    from benchmarks.lib.gpu_timing import quick_us

    torch.cuda.synchronize()
    return quick_us(call, copies, reps)


def kernel_us(case: Case, config: MlaDecodeConfig, splits: int, calls: int = 8) -> dict[str, float]:
    """Device microseconds per call of each kernel (stage 1, stage 2) under torch.profiler, eager calls over distinct
    requests: where a call's time goes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            case.call(i % case.copies, config, splits)
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if "_mla_decode" in e.key:
            total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
            out[e.key] = total / calls
    return out


def summarize(cells: list[dict]) -> dict:
    """Per model and overall: the config (at its split rule) with the least geometric-mean time over the cases that
    every such config ran in, against the default's; and per case the fastest valid cell."""
    out: dict = {"per_case": [], "per_model": {}}
    cases = sorted({(c["model"], c["batch"], c["context"]) for c in cells})
    for key in cases:
        mine = [c for c in cells if (c["model"], c["batch"], c["context"]) == key and c["valid"]]
        default = next((c for c in mine if c["default"] and c["auto_splits"]), None)
        best = min(mine, key=lambda c: c["us"], default=None)
        if best is not None:
            out["per_case"].append({"model": key[0], "batch": key[1], "context": key[2],
                                    "default_us": default and default["us"], "floor_us": best["floor_us"],
                                    "best": f"{best['config']}@{best['splits']}", "best_us": best["us"],
                                    "default_x_floor": default and default["x_floor"], "best_x_floor": best["x_floor"],
                                    "default_kernels_us": default and default["kernels_us"]})
    for model in sorted({c["model"] for c in cells}) + ["all"]:
        auto = [c for c in cells if c["auto_splits"] and c["valid"] and model in ("all", c["model"])]
        keys = {(c["model"], c["batch"], c["context"]) for c in auto}
        by_config: dict[str, dict] = {}
        for c in auto:
            by_config.setdefault(c["config"], {})[(c["model"], c["batch"], c["context"])] = c["us"]
        full = {n: t for n, t in by_config.items() if set(t) == keys}
        if not full:
            continue
        gmean = {n: math.exp(sum(math.log(v) for v in t.values()) / len(t)) for n, t in full.items()}
        pick = min(gmean, key=gmean.get)
        defaults = {c["config"] for c in auto if c["default"]}
        held = gmean.get(defaults.pop(), math.nan) if len(defaults) == 1 else math.nan
        out["per_model"][model] = {"pick": pick, "gmean_us": gmean, "default_over_pick": held / gmean[pick],
                                   "cases": len(keys)}
    return out
