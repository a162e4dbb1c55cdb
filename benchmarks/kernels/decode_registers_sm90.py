"""Stage 1 of the decode kernel (decode._decode_stage1, one split: DIRECT) built offline for sm_90, per launch config
(decode_splits.DECODE_VARIANTS) and pool dtype, at Llama-3.1-8B's heads (32 query, 8 kv, 128 dims): registers per
thread, shared memory, spilled stores, byte-wide shared loads and the programs one SM holds. No GPU: triton.compile on
a GPUTarget and the cuobjdump Triton ships.

    python benchmarks/kernels/decode_registers_sm90.py [--variants NAME,...]

The figures in decode_splits.py came from Triton 3.6 (the GPU machine's; `pip install triton==3.6.0` in a side venv
whose .pth adds this one's site-packages); another Triton version builds other code."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from radixlm.runtime.kernels.attention import decode  # noqa: E402
from radixlm.runtime.kernels.attention.decode_splits import DECODE_VARIANTS  # noqa: E402
from radixlm.runtime.kernels.attention.span import _cvt_asm  # noqa: E402

POOLS = {"bf16": None, "fp8e4nv": "e4m3", "fp8e5": "e5m2"}
ALIGNED = {"Q", "K_buf", "V_buf", "Req_to_token", "O", "stride_qb", "stride_qh", "stride_kbs", "stride_kh",
           "stride_vbs", "stride_vh", "stride_rt", "stride_ob", "stride_oh"}  # what a serving launch specializes


def build(pool: str, config):
    fn = decode._decode_stage1
    consts = {"Row_starts": None, "Work": None, "Mid_o": None, "Mid_lse": None, "GROUP": 4, "HEAD_DIM": 128,
              "BLOCK_D": 128, "BLOCK_H": 16, "BLOCK_N": config.block_n, "PRECISION": "tf32", "HAS_ROW_STARTS": False,
              "DIRECT": True, "CHUNKED": False, "PREFETCH": config.prefetch,
              "KV_CVT": _cvt_asm(POOLS[pool], True) if POOLS[pool] and config.inline_cvt else ""}
    ptrs = {"Q": "bf16", "K_buf": pool, "V_buf": pool, "Req_to_token": "i64", "Req_pool_indices": "i64",
            "Seq_lens": "i64", "O": "bf16"}
    sig = {n: "constexpr" if n in consts else "*" + ptrs[n] if n in ptrs else
           "fp32" if n in ("sm_scale", "v_scale") else "i32" for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in ALIGNED}
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.maxnreg:
        options["maxnreg"] = config.maxnreg
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(DECODE_VARIANTS))
    args = ap.parse_args()
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    print(f"triton {triton.__version__}; sm_90; programs/SM by registers (64K) and shared memory (227K)")
    for name in args.variants.split(","):
        config = DECODE_VARIANTS[name]
        cells = []
        for pool in POOLS:
            k = build(pool, config)
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(k.asm["cubin"])
                f.flush()
                usage = subprocess.run([tools / "cuobjdump", "--dump-resource-usage", f.name], capture_output=True,
                                       text=True).stdout
                sass = subprocess.run([tools / "cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
            regs = int(re.search(r"REG:(\d+)", usage).group(1))
            smem = k.metadata.shared
            per_sm = min(65536 // (-(-regs // 8) * 8 * 32 * config.num_warps), 232448 // (smem + 1024))
            cells.append(f"{pool} {regs} regs {smem // 1024}K smem {per_sm}/SM spills {sass.count('STL')} "
                         f"byte-lds {k.asm['ptx'].count('ld.shared.b8')}")
        print(f"{name:<11} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
