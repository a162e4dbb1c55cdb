"""The W4A16 tensor-core kernel's candidates (w4a16_mma_sweep.CANDIDATES) compiled for sm_90 on the CPU, no GPU needed:
per config its shared memory, register spills and the K loop's SASS instructions a weight (a thread's share of one
BLOCK_N x BLOCK_K tile), with Triton's bundled ptxas and nvdisasm. What a device call cannot be spent on: a config
that does not build, spills or runs out of shared memory shows here first.

    python benchmarks/kernels/w4a16_mma_sass.py                  # every candidate (~2 min on 2 cores)
    python benchmarks/kernels/w4a16_mma_sass.py --bucket 16 --out /tmp/sass.json
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.kernels.w4a16_mma_sweep import CANDIDATES  # noqa: E402
from radixlm.runtime.kernels.quant import int4_mma  # noqa: E402

_INT_ARGS = ("M", "N", "K", "group_size", "stride_xm", "stride_qk", "stride_sg", "stride_ym", "stride_ys",
             "k_tiles_per_split")
_ALIGNED = (0, 1, 2, 3, 4, 5, 8, 10, 11, 12, 13)  # pointers, K and the row strides: multiples of 16 at the 8B shapes


def compile_sm90(cfg: int4_mma.Int4MmaConfig, split: bool = False):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {"X": "*bf16", "QW": "*i32", "S": "*bf16", "Z": "*bf16", "Bias": "*bf16", "Y": "*fp32" if split else "*bf16",
           **{name: "i32" for name in _INT_ARGS}}
    consts = dict(HAS_BIAS=False, SPLIT=split, EVEN_K=True, GROUPS=1, X_MODE=int4_mma._XMODE[cfg.x_load],
                  BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, MAGIC_BITS=0x4300, MAGIC=128.0,
                  HALF=True, ASM=1 if cfg.asm else 0)
    sig.update({name: "constexpr" for name in consts})
    src = ASTSource(int4_mma._w4a16_mma_kernel, sig, constexprs=consts,
                    attrs={(i,): [["tt.divisibility", 16]] for i in _ALIGNED})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def sass_of(cubin: bytes) -> list[str]:
    import triton

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(nvdisasm), "-c", f.name], capture_output=True, text=True, check=True).stdout.split(
            "\n")


def loop_opcodes(lines: list[str]) -> collections.Counter:
    """The opcodes of the longest backward branch's span (the K loop)."""
    ins, labels = [], {}
    for line in lines:
        label = re.match(r"^\s*\.(L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(ins)
            continue
        m = re.match(r"^\s+/\*[0-9a-f]+\*/\s+(.*?);", line)
        if m:
            ins.append(m.group(1))
    best = (0, -1)
    for i, text in enumerate(ins):
        target = re.search(r"BRA\s+\W*(L_x_\d+)", text)
        if target and labels.get(target.group(1), i) < i and i - labels[target.group(1)] > best[1] - best[0]:
            best = (labels[target.group(1)], i)
    return collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
                               for t in ins[best[0]:best[1] + 1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bucket", type=int, nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    for bucket in args.bucket:
        for bm, bn, bk, warps, stages, load, asm in CANDIDATES[bucket]:
            cfg = int4_mma.Int4MmaConfig(bm, bn, bk, warps, stages, 0, load, asm)
            row = {"bucket": bucket, "config": {**cfg.__dict__, "x_load": load.value}}
            try:
                kernel = compile_sm90(cfg)
                lines = sass_of(kernel.asm["cubin"])
                ops = loop_opcodes(lines)
                weights = bn * bk / (32 * warps)
                spills = sum(bool(re.search(r"\b(LDL|STL)\b", x)) for x in lines)
                row.update(shared=kernel.metadata.shared, spills=spills,
                           loop=sum(ops.values()), per_weight=round(sum(ops.values()) / weights, 2),
                           top=dict(ops.most_common(8)))
            except Exception as e:  # noqa: BLE001 - reported per config
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
