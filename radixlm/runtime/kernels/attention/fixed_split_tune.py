"""The batch-invariant attention's launch sweep (fixed_split_config.py): on one model's attention shape (Llama-3.1-8B's
by default), every allowed (sub-tiles, prefill stages) pair is timed on a 4,000-token prompt's prefill and every
allowed decode stage count on decode passes of 64 and 256 rows, one layer's launches as CUDA-graph replays after an L2
eviction (gemm/dispatch.py's timing). Before it is timed, each candidate's outputs are compared bit for bit with the
default configuration's (the prompt's rows and the decode rows) and a sample of the prompt's rows is run again as
decode rows (one-row tiles, the candidate's decode stages) against its own prefill: no choice may change a row's bits,
so a candidate that does is rejected (and would mean the kernel's invariance argument is broken). The fastest of the
others are written to this GPU model's table (tuned/fixed_split_<GPU>.json), which fixed_split_config.config_for reads.

    python -m radixlm.runtime.kernels.attention.fixed_split_tune --budget-s 35 --out $OUT --install

Without CUDA (TRITON_INTERPRET=1: a dry run) the shape is tiny, the candidates fewer and the "timing" wall time."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from radixlm.runtime.kernels.attention.fixed_split import row_tiles, span_launches
from radixlm.runtime.kernels.attention.fixed_split_config import (
    ALLOWED_STAGES, ALLOWED_SUB_TILES, FixedSplitConfig, default_config, table_path)
from radixlm.runtime.kernels.tune_cli import parse_tune_args, write_tune_outputs


@dataclass(frozen=True)
class SweepShape:
    """The attention shape and the passes the sweep times."""

    heads: int
    kv_heads: int
    head_dim: int
    prefill_rows: int
    decode_batches: tuple[int, ...]
    decode_keys: tuple[int, int]  # each decode row's key count, uniform in [lo, hi]
    check_rows: int  # the prompt's rows run again as decode rows

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


LLAMA_8B = SweepShape(32, 8, 128, 4000, (64, 256), (256, 1024), 64)
TINY = SweepShape(4, 2, 32, 40, (3,), (20, 70), 6)


class Passes:
    """One prompt's prefill and the decode batches over one KV pool, and each candidate's launches of them."""

    def __init__(self, shape: SweepShape, dtype: torch.dtype, device: torch.device, seed: int = 0):
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.shape = shape
        lens = [torch.randint(shape.decode_keys[0], shape.decode_keys[1] + 1, (b,), generator=g).tolist()
                for b in shape.decode_batches]
        reqs = 1 + sum(len(x) for x in lens)
        slots = shape.prefill_rows + sum(sum(x) for x in lens)
        width = max(shape.prefill_rows, shape.decode_keys[1])
        gd = torch.Generator(device=device).manual_seed(seed)  # the pool is large: drawn where it lives
        self.k_buf = torch.randn(slots, shape.kv_heads, shape.head_dim, generator=gd, device=device).to(dtype)
        self.v_buf = torch.randn(slots, shape.kv_heads, shape.head_dim, generator=gd, device=device).to(dtype)
        req_to_token = torch.zeros(reqs, width, dtype=torch.int64)
        free = torch.randperm(slots, generator=g)  # scattered slots, as a pool's after some serving
        req_to_token[0, : shape.prefill_rows] = free[: shape.prefill_rows]
        at, req = shape.prefill_rows, 1
        self.decode = []  # (q, row_req, positions) per batch
        for batch in lens:
            for n in batch:
                req_to_token[req, :n] = free[at : at + n]
                at, req = at + n, req + 1
            first = req - len(batch)
            self.decode.append((torch.randn(len(batch), shape.heads, shape.head_dim, generator=g).to(dtype).to(device),
                                torch.arange(first, req, dtype=torch.int64).to(device),
                                torch.tensor(batch, dtype=torch.int64).sub(1).to(device)))
        self.req_to_token = req_to_token.to(device)
        self.prefill = (torch.randn(shape.prefill_rows, shape.heads, shape.head_dim, generator=g).to(dtype).to(device),
                        torch.zeros(shape.prefill_rows, dtype=torch.int64, device=device),
                        torch.arange(shape.prefill_rows, dtype=torch.int64, device=device))
        picks = torch.linspace(0, shape.prefill_rows - 1, shape.check_rows).round().long().unique()
        self.check = picks.to(device)
        self.scale = shape.head_dim**-0.5

    def _attend(self, q, row_req, positions, launches, out):
        from radixlm.runtime.kernels.attention import fixed_split_attention

        for starts, counts, sub, stages in launches:
            fixed_split_attention(q, self.k_buf, self.v_buf, self.req_to_token, row_req, positions, self.scale,
                                  tiles=(starts, counts), sub_tiles=sub, out=out, num_stages=stages)
        return out

    def prefill_run(self, cfg: FixedSplitConfig):
        """A callable running the prompt's prefill launches (spans of one request) into one output, and it."""
        q, row_req, positions = self.prefill
        dev = q.device
        launches = [(torch.tensor(x.starts, dtype=torch.int32, device=dev),
                     torch.tensor(x.counts, dtype=torch.int32, device=dev), x.sub_tiles, x.num_stages)
                    for x in span_launches([q.shape[0]], self.shape.group, self.shape.head_dim, [0], cfg)]
        out = torch.empty_like(q)
        return (lambda: self._attend(q, row_req, positions, launches, out)), out

    def decode_run(self, i: int, stages: int):
        q, row_req, positions = self.decode[i]
        starts, counts = row_tiles(q.shape[0], q.device)
        out = torch.empty_like(q)
        return (lambda: self._attend(q, row_req, positions, [(starts, counts, 1, stages)], out)), out

    def prefill_rows_as_decode(self, stages: int) -> torch.Tensor:
        """The sampled prompt rows, each a decode row of its own."""
        q, row_req, positions = self.prefill
        idx = self.check
        starts, counts = row_tiles(idx.shape[0], q.device)
        out = torch.empty_like(q[idx])
        return self._attend(q[idx].contiguous(), row_req[idx], positions[idx], [(starts, counts, 1, stages)], out)


def _time(runs: list, device: torch.device) -> list[float]:
    if device.type == "cuda":
        from radixlm.runtime.kernels.gemm.dispatch import _time_us

        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        words = torch.empty(max(4 * l2, 64 << 20) // 4, dtype=torch.int32, device=device)
        return _time_us(runs, lambda: torch.amax(words))
    out = []
    for run in runs:
        t0 = time.perf_counter()
        run()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def sweep(passes: Passes, prefill_pairs: list[tuple[int, int]], decode_stages: list[int], budget_s: float) -> dict:
    """Every candidate checked against the default's bits, then timed; the default always runs first."""
    t0 = time.perf_counter()
    base = default_config(passes.shape.head_dim)
    run, ref_prefill = passes.prefill_run(base)
    run()
    ref_decode = []
    for i in range(len(passes.decode)):
        run, out = passes.decode_run(i, base.decode_stages)
        run()
        ref_decode.append(out.clone())
    ref_prefill = ref_prefill.clone()
    result = {"prefill": [], "decode": [], "rejected": [], "errors": []}
    first_pair = (base.sub_tiles, base.prefill_stages)
    for sub, stages in [first_pair] + [p for p in prefill_pairs if p != first_pair]:
        if time.perf_counter() - t0 > budget_s and result["prefill"]:
            break
        cfg = FixedSplitConfig(sub, stages, base.decode_stages)
        try:
            run, out = passes.prefill_run(cfg)
            run()
            if not torch.equal(out, ref_prefill):
                result["rejected"].append({"prefill": [sub, stages], "differs_from": "default prefill"})
                continue
            result["prefill"].append({"sub_tiles": sub, "prefill_stages": stages, "us": _time([run], out.device)[0]})
        except Exception as e:  # noqa: BLE001 - a candidate that does not build here (resources) is skipped
            result["errors"].append({"prefill": [sub, stages], "error": f"{type(e).__name__}: {str(e)[:200]}"})
    for stages in [base.decode_stages] + [s for s in decode_stages if s != base.decode_stages]:
        if time.perf_counter() - t0 > budget_s and result["decode"]:
            break
        try:
            runs, same = [], True
            for i in range(len(passes.decode)):
                run, out = passes.decode_run(i, stages)
                run()
                same = same and torch.equal(out, ref_decode[i])
                runs.append(run)
            as_decode = passes.prefill_rows_as_decode(stages)
            same_rows = torch.equal(as_decode, ref_prefill[passes.check])
            if not (same and same_rows):
                result["rejected"].append({"decode_stages": stages, "decode_same": same,
                                           "prefill_rows_same": same_rows})
                continue
            us = _time(runs, passes.k_buf.device)
            result["decode"].append({"decode_stages": stages, "us": dict(zip(passes.shape.decode_batches, us))})
        except Exception as e:  # noqa: BLE001
            result["errors"].append({"decode_stages": stages, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    result["seconds"] = time.perf_counter() - t0
    return result


def best_config(result: dict) -> FixedSplitConfig | None:
    """The fastest prefill pair and decode stages (by the decode batches' summed time); None if either set is empty
    or any candidate was rejected (the default's bits are then in doubt: nothing is installed)."""
    if not result["prefill"] or not result["decode"] or result["rejected"]:
        return None
    p = min(result["prefill"], key=lambda r: r["us"])
    d = min(result["decode"], key=lambda r: sum(r["us"].values()))
    return FixedSplitConfig(p["sub_tiles"], p["prefill_stages"], d["decode_stages"])


def main() -> None:
    run = parse_tune_args(__doc__, 35.0, "kernels/attention/tuned/")
    a, cuda, device, dtype, gpu = run.args, run.cuda, run.device, run.dtype, run.gpu
    shape = LLAMA_8B if cuda else TINY
    # The likeliest first (the budget cuts the tail): fewer spills with 2 sub-tiles, deeper pipelines, then 1.
    pairs = (sorted(itertools.product(ALLOWED_SUB_TILES, ALLOWED_STAGES), key=lambda p: ({2: 0, 4: 1}.get(p[0], 2), p))
             if cuda else [(1, 3), (2, 3)])
    stages = list(ALLOWED_STAGES) if cuda else [4]
    passes = Passes(shape, dtype, device)
    result = sweep(passes, pairs, stages, a.budget_s)
    best = best_config(result)
    import triton

    default = default_config(shape.head_dim)
    default_us = {"prefill": next((r["us"] for r in result["prefill"] if r["sub_tiles"] == default.sub_tiles
                                   and r["prefill_stages"] == default.prefill_stages), None),
                  "decode": next((r["us"] for r in result["decode"] if r["decode_stages"] == default.decode_stages),
                                 None)}
    entries = [] if best is None else [{
        "head_dim": shape.head_dim, "group": shape.group, "dtype": str(dtype).removeprefix("torch."),
        "config": best.as_dict(), "default_us": default_us,
        "us": {"prefill": next(r["us"] for r in result["prefill"] if (r["sub_tiles"], r["prefill_stages"])
                               == (best.sub_tiles, best.prefill_stages)),
               "decode": next(r["us"] for r in result["decode"] if r["decode_stages"] == best.decode_stages)}}]
    table = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
             "command": f"python -m radixlm.runtime.kernels.attention.fixed_split_tune --budget-s {a.budget_s:g}",
             "shape": vars(shape) | {"decode_batches": list(shape.decode_batches)}, "entries": entries}
    path = table_path(gpu)
    out = write_tune_outputs(run, "fixed_split_sweep.json", {"result": result}, table, path, install=best is not None)
    print(f"prefill {len(result['prefill'])} timed, decode {len(result['decode'])} timed, "
          f"{len(result['rejected'])} rejected (bits differ), {len(result['errors'])} failed; best {best} "
          f"(default {default}: {default_us})", flush=True)
    for r in result["prefill"]:
        print(f"  prefill sub_tiles {r['sub_tiles']} stages {r['prefill_stages']}: {r['us']:.1f} us", flush=True)
    for r in result["decode"]:
        print(f"  decode stages {r['decode_stages']}: {r['us']}", flush=True)
    if result["rejected"]:
        print(f"REJECTED (a row's bits changed with the launch): {result['rejected']}", flush=True)
    print(f"wrote {out}/fixed_split_sweep.json and {out}/{path.name} in {result['seconds']:.0f} s", flush=True)
    if result["rejected"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
