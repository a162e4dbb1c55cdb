"""The qkv GEMM's epilogue (layers/epilogue.py: rotary embedding and KV store in the skinny kernel) against the
skinny GEMM followed by the rotary kernel with its store, at one row, Llama-3.1-8B's qkv shape (32 + 8 + 8 heads of
128, K 4096), bf16, ADD_RMSNORM prologue as in a decoder layer. Per autotune config and autotuned: CUDA-graph replays
over distinct weight copies (benchmarks/gemv_sweep.graph_us), and how many outputs (q, k, v columns) and stored KV
elements differ between the two paths at the same config.

    python benchmarks/epilogue_probe.py --out $OUT/epilogue_probe.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemv_sweep import graph_us, write_cells  # noqa: E402
from radixlm.runtime.cache.memory_pool import TokenToKVPool  # noqa: E402
from radixlm.runtime.layers import skinny_gemm  # noqa: E402
from radixlm.runtime.layers.epilogue import RotaryStore  # noqa: E402
from radixlm.runtime.layers.norm import RMSNorm  # noqa: E402
from radixlm.runtime.layers.prologue import Prologue, PrologueKind  # noqa: E402
from radixlm.runtime.layers.rotary import get_rope  # noqa: E402
from tests.runtime.layers.test_skinny_epilogue import _launch  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="epilogue_probe.json")
    args = p.parse_args()
    t0 = time.perf_counter()
    dev, dt = "cuda", torch.bfloat16
    hq, hkv, d, k = 32, 8, 128, 4096
    n = (hq + 2 * hkv) * d
    copies = 12
    ws = [torch.randn(n, k, device=dev, dtype=dt) * k**-0.5 for _ in range(copies)]
    x = torch.randn(1, k, device=dev, dtype=dt) * 2
    res = torch.randn(1, k, device=dev, dtype=dt)
    norm = RMSNorm(k, 1e-5).to(dev, dt)
    norm.weight.data.normal_(1.0, 0.1)
    rope = get_rope(d, 131072, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    pos, loc = torch.tensor([700], device=dev), torch.tensor([9], device=dev)
    pools = [TokenToKVPool(64, 1, dt, 1, hkv, d, dev) for _ in range(2)]
    epi = RotaryStore(rope, pos, loc, pools[0].k_buffer[0], pools[0].v_buffer[0], hq * d, hkv * d)
    r_out = torch.empty_like(res)
    pro_args = (norm.weight, res, r_out, 1e-5, res.stride(0))
    split = [hq * d, hkv * d, hkv * d]

    def unfused(y):
        q, kk, v = y.split(split, dim=-1)
        rope.rotate_and_store_(pos, q, kk, v, loc, pools[1].k_buffer[0], pools[1].v_buffer[0])
        return y

    cells = []
    for cfg in [dict(c.all_kwargs()) for c in skinny_gemm._CONFIGS] + [None]:
        if cfg is None:  # autotuned, as gemm.linear runs it
            plain = lambda i: unfused(skinny_gemm.skinny_linear(x, ws[i], None, Prologue(  # noqa: E731
                PrologueKind.ADD_RMSNORM, norm, res)))
            fused = lambda i: skinny_gemm.skinny_linear(x, ws[i], None,  # noqa: E731
                                                        Prologue(PrologueKind.ADD_RMSNORM, norm, res), epi)
        else:
            plain = lambda i, c=cfg: unfused(_launch(x, ws[i], None, 2, None, c, dt, pro_args))  # noqa: E731
            fused = lambda i, c=cfg: _launch(x, ws[i], None, 2, epi, c, dt, pro_args)  # noqa: E731
        y_ref, y = plain(0), fused(0)
        differ = [int((a != b).sum()) for a, b in zip(y.split(split, dim=-1), y_ref.split(split, dim=-1))]
        cell = {"config": cfg or "autotuned", "q_k_v_outputs_differing": differ,
                "k_store_differing": int((pools[0].k_buffer[0][9] != pools[1].k_buffer[0][9]).sum()),
                "v_store_differing": int((pools[0].v_buffer[0][9] != pools[1].v_buffer[0][9]).sum()),
                "unfused_us": graph_us(plain, copies), "fused_us": graph_us(fused, copies)}
        cell["gain_us"] = cell["unfused_us"] - cell["fused_us"]
        print(f"{str(cfg or 'autotuned'):90s} unfused {cell['unfused_us']:6.1f} us, fused {cell['fused_us']:6.1f} "
              f"(gain {cell['gain_us']:+.1f}); q/k/v differing {differ}, stores {cell['k_store_differing']}/"
              f"{cell['v_store_differing']}", flush=True)
        cells.append(cell)
        write_cells(args.out, "epilogue_probe", cells)
    print(f"wrote {args.out} after {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
