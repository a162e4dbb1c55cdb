"""The LoRA decode kernels' sweep (kernels/lora/decode.py's LoraDecodeConfig): the LoRA kernels of one decode step
of Llama-3.1-8B (32 layers x qkv, o, gate_up, down; rank 16, bf16, every layer its own A and B: the bytes a step
really reads), `--adapters` adapters spread round robin over the rows, at batch 8, 64 and 256, each step captured in
a CUDA graph and timed by its replays; the old graph path (kernels/lora/gather.py over blocks of 16 rows, what graph
decode ran before) is timed beside it. Every candidate is first checked against the old path on layer 0; the best by
the sum over the batches is written to $OUT and, with --install, to this GPU model's table
(kernels/gemm/tuned/lora_decode_<GPU>.json), which the runtime's graph decode reads (kernels/lora/config.py).

    python benchmarks/kernels/lora_decode_sweep.py --budget-s 80 --out $OUT/lora_decode_sweep.json --install

Without CUDA (TRITON_INTERPRET=1: a dry run) the shapes are tiny, two layers, three candidates, and the "timing" is
one call's wall time."""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixlm.runtime.kernels.lora.config import LoraDecodeConfig, table_path  # noqa: E402

# (name, the fused parts' output sizes, K): Llama-3.1-8B's adapted layers, and tiny ones for the dry run
LLAMA8B = (("qkv_proj", (4096, 1024, 1024), 4096), ("o_proj", (4096,), 4096),
           ("gate_up_proj", (14336, 14336), 4096), ("down_proj", (4096,), 14336))
TINY = (("qkv_proj", (64, 32, 32), 64), ("o_proj", (64,), 64), ("gate_up_proj", (96, 96), 64),
        ("down_proj", (64,), 96))
BATCHES = (8, 64, 256)
REPLAYS = 20
D = LoraDecodeConfig()
# Most promising first (a budget cuts the list): the defaults, then what changes no kernel (the expand's grid), then
# one knob at a time.
CANDIDATES = (
    D,
    dataclasses.replace(D, expand_programs=264),
    dataclasses.replace(D, expand_programs=4096),
    dataclasses.replace(D, expand_block_n=256),
    dataclasses.replace(D, expand_block_n=512, expand_programs=264),
    dataclasses.replace(D, splits=8),
    dataclasses.replace(D, expand_stages=2, shrink_stages=2),
    dataclasses.replace(D, shrink_block_k=256),
    dataclasses.replace(D, expand_block_n=256, expand_warps=8),
    dataclasses.replace(D, splits=4, shrink_stages=4),
    dataclasses.replace(D, block_m=32),
)
TINY_CANDIDATES = (
    LoraDecodeConfig(min_split_k=64, shrink_block_k=32, expand_block_n=32),
    LoraDecodeConfig(min_split_k=64, shrink_block_k=32, expand_block_n=32, expand_programs=1),
    LoraDecodeConfig(splits=2, min_split_k=32, shrink_block_k=32, expand_block_n=16),
)


@dataclass
class Module:
    parts: tuple[int, ...]
    x: torch.Tensor  # (max rows, K)
    a: torch.Tensor  # (slots, parts * rank, K)
    b: torch.Tensor  # (slots, N, parts * rank): timing reads only the diagonal blocks, whatever the rest holds
    out: torch.Tensor  # (max rows, N)


def build(shapes, layers: int, slots: int, rank: int, rows: int, device, dtype) -> list[Module]:
    mods = []
    for _ in range(layers):
        for _, parts, k in shapes:
            w, n = len(parts) * rank, sum(parts)
            mods.append(Module(parts, torch.randn(rows, k, device=device).to(dtype),
                               (torch.randn(slots, w, k, device=device) / k**0.5).to(dtype),
                               torch.randn(slots, n, w, device=device).to(dtype),
                               torch.zeros(rows, n, device=device, dtype=dtype)))
    return mods


def step(mods: list[Module], rows: int, slots: list[int], scalings: torch.Tensor, config: LoraDecodeConfig | None):
    """The step's LoRA kernels as graph decode runs them: the new path (config), or the old one (None). Returns the
    function to capture (its tables built and filled first, as a replay's are)."""
    from radixlm.runtime.kernels import lora as k

    if config is None:
        from radixlm.runtime.lora.blocks import TableLayout, max_blocks

        layout = TableLayout(rows, max_blocks(rows, scalings.shape[0], k.GATHER_BLOCK_ROWS))
        table = torch.from_numpy(layout.table(slots, k.GATHER_BLOCK_ROWS)).to(scalings.device)
        _, sorted_rows, *blocks = layout.fields(table, rows, layout.blocks_cap)

        def run():
            for m in mods:
                k.gather_lora_add(m.out[:rows], m.x[:rows], m.a, m.b, sorted_rows, *blocks, scalings,
                                  k.GATHER_BLOCK_ROWS, m.parts)
        return run

    from radixlm.runtime.lora.graph import LoraGraphInputs

    inputs = LoraGraphInputs(rows, scalings.shape[0], scalings, scalings.device, config)
    inputs.fill(slots)
    p = inputs.info(rows).padded

    def run():
        for m in mods:
            k.decode_lora_add(m.out[:rows], m.x[:rows], m.a, m.b, p.block_slots, p.block_rows, scalings, m.parts,
                              config)
    return run


def time_us(fn, cuda: bool) -> float:
    """Median microseconds of one call: CUDA-graph replays on CUDA, one call's wall time elsewhere."""
    fn()
    if not cuda:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPLAYS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def layer0(mods: list[Module], n: int, rows: int, slots, scalings, config) -> list[torch.Tensor]:
    """Layer 0's outputs (from zeros) by one path."""
    for m in mods[:n]:
        m.out.zero_()
    step(mods[:n], rows, slots, scalings, config)()
    return [m.out[:rows].float().clone() for m in mods[:n]]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--adapters", type=int, default=32)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--layers", type=int, default=None, help="default: 32 (Llama-3.1-8B), 2 in the dry run")
    p.add_argument("--budget-s", type=float, default=80.0, help="no new candidate after this many seconds")
    p.add_argument("--out", required=True)
    p.add_argument("--install", action="store_true", help="write the best to this GPU model's tuned table")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    t0 = time.monotonic()
    shapes, dtype, cands = (LLAMA8B, torch.bfloat16, CANDIDATES) if cuda else (TINY, torch.float32, TINY_CANDIDATES)
    batches = BATCHES if cuda else (4, 8)
    layers = args.layers or (32 if cuda else 2)
    device = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    mods = build(shapes, layers, args.adapters, args.rank, max(batches), device, dtype)
    scalings = torch.full((args.adapters,), 2.0, device=device)
    mix = {bs: [i % args.adapters for i in range(bs)] for bs in batches}
    gpu = torch.cuda.get_device_name() if cuda else platform.processor() or "cpu"
    result = {"benchmark": "lora_decode_sweep", "gpu": gpu, "torch": torch.__version__,
              "command": " ".join(["python", *sys.argv]), "adapters": args.adapters, "rank": args.rank,
              "layers": layers, "batches": list(batches), "old_us": {}, "candidates": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.write_text(json.dumps(result, indent=2) + "\n")

    for bs in batches:
        result["old_us"][str(bs)] = time_us(step(mods, bs, mix[bs], scalings, None), cuda)
    print(f"old path (gather.py, blocks of 16): {result['old_us']}", flush=True)
    check_rows = batches[len(batches) // 2]
    want = layer0(mods, len(shapes), check_rows, mix[check_rows], scalings, None)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for config in cands:
        if time.monotonic() - t0 > args.budget_s:
            print(f"budget spent: {len(result['candidates'])} of {len(cands)} candidates timed", flush=True)
            break
        row = {"config": config.as_dict()}
        try:
            got = layer0(mods, len(shapes), check_rows, mix[check_rows], scalings, config)
            err = max(((g - w).abs().max() / w.abs().max().clamp(min=1e-6)).item() for g, w in zip(got, want))
            row["max_rel_err_vs_old"] = err
            if err > tol:
                raise AssertionError(f"differs from the old path by {err:.2e} (relative) on layer 0")
            row["us"] = {str(bs): time_us(step(mods, bs, mix[bs], scalings, config), cuda) for bs in batches}
            row["score_us"] = sum(row["us"].values())
        except Exception as e:  # noqa: BLE001 - a candidate that fails to build or to match is recorded, not chosen
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        result["candidates"].append(row)
        print(json.dumps(row), flush=True)
        save()
    ok = [r for r in result["candidates"] if "score_us" in r]
    if not ok:
        raise SystemExit("no candidate passed")
    best = min(ok, key=lambda r: r["score_us"])
    result["best"] = best
    result["old_score_us"] = sum(result["old_us"].values())
    # The tuned table's contents (--install writes them; to commit them from this JSON elsewhere:
    # kernels/gemm/tuned/lora_decode_<GPU>.json, kernels/lora/config.py's table_path)
    result["table"] = {"gpu": gpu, "torch": torch.__version__, "command": result["command"],
                       "config": best["config"], "us": best["us"], "old_us": result["old_us"]}
    save()
    print(f"best: {best['config']} {best['us']} (old path {result['old_us']})", flush=True)
    if args.install:
        if not cuda:
            raise SystemExit("--install needs CUDA (the table is per GPU model)")
        path = table_path(gpu)
        path.write_text(json.dumps(result["table"], indent=1) + "\n")
        print(f"installed {path}", flush=True)


if __name__ == "__main__":
    main()
