"""Deterministic mode's kernels: a row's output is bit-identical whatever the other rows of the call are and however
many there are. The batch-invariant GEMM (gemm/batch_invariant.py: row blocks on the CPU, the Triton kernel under
TRITON_INTERPRET=1) and the fixed-split attention (attention/fixed_split.py: the torch implementation, and the
Triton kernel under the interpreter), each also against a plain float reference. One interpreter subprocess runs
both Triton kernels."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "batch-invariant kernel cases passed"


def gemm_cases(linear, dtypes: tuple[torch.dtype, ...],
               shapes: tuple[tuple[int, int, bool], ...] = ((80, 96, False), (130, 200, True))) -> None:
    """linear(x, w, bias) -> y. Row 0 alone, then at other positions among other rows in calls of other sizes (past
    a CPU row block and a Triton BLOCK_M)."""
    g = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        for n, k, with_bias in shapes:
            w = (torch.randn(n, k, generator=g) * k**-0.5).to(dtype)
            b = torch.randn(n, generator=g).to(dtype) if with_bias else None
            row = torch.randn(1, k, generator=g).to(dtype)
            alone = linear(row, w, b)
            ref = row.float() @ w.float().T + (b.float() if with_bias else 0)
            torch.testing.assert_close(alone.float(), ref, rtol=2e-2, atol=2e-2)
            for m, at in ((2, 1), (17, 9), (70, 66)):
                x = torch.randn(m, k, generator=g).to(dtype)
                x[at] = row[0]
                assert torch.equal(linear(x, w, b)[at], alone[0]), (dtype, n, k, m, at)


def attention_case(attend, dtype: torch.dtype, first: int = 0) -> None:
    """attend(q, k_buf, v_buf, req_to_token, row_req, positions, scale) -> (T, H, D). Request A's row at position 90
    (a split and a part) computed alone, as the last row of A's prefill from position `first` (0: the whole prompt,
    else an extend over a cached prefix), and among other requests' rows; against SDPA over the same keys."""
    g = torch.Generator().manual_seed(1)
    h, hkv, d, slots = 4, 2, 32, 400
    k_buf = torch.randn(slots, hkv, d, generator=g).to(dtype)
    v_buf = torch.randn(slots, hkv, d, generator=g).to(dtype)
    req_to_token = torch.zeros(3, 160, dtype=torch.int64)
    req_to_token[0, :91] = torch.randperm(slots, generator=g)[:91] + 0  # A: scattered slots
    req_to_token[1, :150] = torch.arange(150) + 200
    req_to_token[2, :40] = torch.arange(40) + 10
    q_a = torch.randn(91, h, d, generator=g).to(dtype)
    scale = d**-0.5

    def rows(reqs, positions, q):
        return attend(q, k_buf, v_buf, req_to_token, torch.tensor(reqs), torch.tensor(positions), scale)

    alone = rows([0], [90], q_a[90:])
    prefill = rows([0] * (91 - first), list(range(first, 91)), q_a[first:])
    others = torch.randn(14, h, d, generator=g).to(dtype)
    mixed_q = torch.cat([others[:10], q_a[90:], others[10:]])
    mixed = rows([1] * 10 + [0] + [2] * 4, list(range(140, 150)) + [90] + list(range(36, 40)), mixed_q)
    assert torch.equal(prefill[-1], alone[0]) and torch.equal(mixed[10], alone[0])
    kv = req_to_token[0, :91]
    keys = k_buf[kv].float().transpose(0, 1).repeat_interleave(h // hkv, 0)  # (H, 91, D)
    values = v_buf[kv].float().transpose(0, 1).repeat_interleave(h // hkv, 0)
    ref = F.scaled_dot_product_attention(q_a[90:].float().transpose(0, 1), keys, values, scale=scale)  # (H, 1, D)
    torch.testing.assert_close(alone[0].float(), ref[:, 0], rtol=2e-2, atol=2e-2)


def tiled(attend, launches: bool = False, config=None):
    """attend (the Triton kernel) given tiles: each run of rows of one request in tiles of rows_per_tile rows
    (fixed_split.span_tiles); launches: the backend's, runs of up to rows_per_tile rows one sub-tile a program in
    one launch, the longer ones sub_tiles(head dim) a program in another, longest first (fixed_split.span_launches),
    into one output; config: a launch table entry (fixed_split_config) instead of the default."""
    import itertools

    from radixlm.runtime.kernels.attention.fixed_split import TileLaunch, rows_per_tile, span_launches, span_tiles

    def run(q, k_buf, v_buf, req_to_token, row_req, positions, scale):
        spans = [len(list(g)) for _, g in itertools.groupby(row_req.tolist())]
        group = q.shape[1] // k_buf.shape[1]
        if launches:
            prefix = positions[torch.tensor([0, *spans]).cumsum(0)[:-1]].tolist()
            cut = span_launches(spans, group, q.shape[2], prefix, config)
        else:
            cut = [TileLaunch(*span_tiles(spans, rows_per_tile(group)), 1)]
        out = torch.full_like(q, float("nan"))
        for launch in cut:
            tiles = (torch.tensor(launch.starts, dtype=torch.int32, device=q.device),
                     torch.tensor(launch.counts, dtype=torch.int32, device=q.device))
            out = attend(q, k_buf, v_buf, req_to_token, row_req, positions, scale, tiles=tiles,
                         sub_tiles=launch.sub_tiles, out=out, num_stages=launch.num_stages)  # a copy on CUDA
        return out

    return run


def test_attention_tiles_are_a_requests_rows_cut_by_the_group():
    from radixlm.runtime.kernels.attention.fixed_split import (
        MAX_SUB_TILES, TileLaunch, rows_per_tile, span_launches, span_tiles, sub_tiles)

    assert [rows_per_tile(g) for g in (1, 2, 3, 4, 8, 16, 32)] == [16, 8, 4, 4, 2, 1, 1]
    assert span_tiles([6, 1, 0, 9], 4) == ([0, 4, 6, 7, 11, 15], [4, 2, 1, 4, 4, 1])
    # Longest walk first (prefix + the tile's last row), ties in row order.
    assert span_tiles([6, 1, 0, 9], 4, [0, 30, 5, 2]) == ([6, 15, 11, 4, 7, 0], [1, 1, 4, 2, 4, 4])
    assert sub_tiles(128) == MAX_SUB_TILES == 4 and sub_tiles(256) == 2
    # Requests of up to one sub-tile's rows (4 for groups of 4) one sub-tile a program, longer ones 4 (16 rows).
    short, long = span_launches([1, 20, 4, 5, 1], 4, 128, [50, 0, 7, 3, 60])
    assert short == TileLaunch([30, 0, 21], [1, 1, 4], 1)  # their last rows see 61, 51 and 11 keys
    assert long == TileLaunch([17, 1, 25], [4, 16, 5], 4)  # 20, 16 and 8
    assert span_launches([1, 1], 4, 128) == [TileLaunch([0, 1], [1, 1], 1)] and span_launches([0], 4, 128) == []
    for bad in (lambda: rows_per_tile(0), lambda: span_tiles([3], 2, [0, 1]), lambda: sub_tiles(0)):
        with pytest.raises(ValueError):
            bad()


def test_attention_launch_config_is_the_shapes_alone_and_validated(tmp_path, monkeypatch):
    from radixlm.runtime.kernels.attention import fixed_split_config as fc
    from radixlm.runtime.kernels.attention.fixed_split import TileLaunch, span_launches
    from radixlm.runtime.kernels.attention.fixed_split_tune import best_config

    assert fc.default_config(128) == fc.FixedSplitConfig(4, 3, 3) and fc.default_config(256).sub_tiles == 2
    cfg = fc.FixedSplitConfig(sub_tiles=2, prefill_stages=4, decode_stages=4)
    # The table's sub-tiles and stages reach the launches: a 20-row request in programs of 2 x 4 rows.
    short, long = span_launches([1, 20], 4, 128, [50, 0], cfg)
    assert short == TileLaunch([0], [1], 1, 4) and long == TileLaunch([17, 9, 1], [4, 8, 8], 2, 4)
    for bad in ({"sub_tiles": 3}, {"sub_tiles": 4, "prefill_stages": 1}, {"sub_tiles": 4, "decode_stages": 5}):
        with pytest.raises(ValueError):
            fc.FixedSplitConfig(**bad)
    entry = {"head_dim": 128, "group": 4, "dtype": "bfloat16", "config": cfg.as_dict()}
    assert fc.parse_table([entry]) == {(128, 4, "bfloat16"): cfg}
    with pytest.raises(ValueError):
        fc.parse_table([{**entry, "config": {"sub_tiles": 8}}])
    for path in fc.TUNED_DIR.glob("fixed_split_*.json"):  # every committed table parses
        fc.parse_table(__import__("json").loads(path.read_text())["entries"])
    # Off CUDA the default, whatever a table says.
    monkeypatch.setattr(fc, "TUNED_DIR", tmp_path)
    assert fc.config_for(128, 4, torch.bfloat16, torch.device("cpu")) == fc.default_config(128)
    # The sweep's pick: the fastest prefill pair and decode stages; nothing when a candidate changed bits.
    result = {"prefill": [{"sub_tiles": 4, "prefill_stages": 3, "us": 9.0}, {"sub_tiles": 2, "prefill_stages": 4,
                                                                            "us": 7.0}],
              "decode": [{"decode_stages": 3, "us": {64: 2.0, 256: 5.0}}, {"decode_stages": 4, "us": {64: 1.0,
                                                                                                  256: 6.5}}],
              "rejected": [], "errors": []}
    assert best_config(result) == fc.FixedSplitConfig(2, 4, 3)
    assert best_config({**result, "rejected": [{"decode_stages": 4}]}) is None


def test_cpu_gemm_rows_are_batch_invariant():
    from radixlm.runtime.kernels.gemm.batch_invariant import cpu_linear

    gemm_cases(lambda x, w, b: cpu_linear(x, w, b, None), (torch.float32, torch.bfloat16))


def test_torch_fixed_split_attention_rows_are_batch_invariant():
    from radixlm.runtime.kernels.attention import fixed_split_attention_torch

    for dtype in (torch.float32, torch.bfloat16):
        attention_case(fixed_split_attention_torch, dtype)


def test_the_memo_takes_no_choice():
    from radixlm.runtime.kernels.gemm import BatchInvariantMemo

    with pytest.raises(TypeError):
        BatchInvariantMemo()[1] = "cublas"


def test_gemm_config_is_the_weights_alone_and_validated():
    from radixlm.runtime.kernels.gemm.batch_invariant_mm import (
        DEFAULT_NARROW, DEFAULT_WIDE, BatchInvariantConfig, aligned_rows, config_for, parse_table,
    )

    cpu = torch.device("cpu")
    assert config_for(6144, 4096, torch.bfloat16, cpu) == DEFAULT_NARROW
    assert config_for(128256, 4096, torch.bfloat16, cpu) == DEFAULT_WIDE
    entry = {"n": 6144, "k": 4096, "dtype": "bfloat16", "config": {"block_n": 128, "block_k": 64, "num_warps": 8,
                                                                    "num_stages": 3, "group_m": 4}}
    assert parse_table([entry]) == {(6144, 4096, "bfloat16"): BatchInvariantConfig(128, 64, 8, 3, 4)}
    x = torch.randn(9 * 97 + 1)[1:].view(9, 97)  # at an unaligned address: copied before the kernel reads it
    aligned = aligned_rows(x)
    assert aligned is not x and aligned.data_ptr() % 16 == 0 and torch.equal(aligned, x)
    assert aligned_rows(aligned) is aligned
    for bad in ({"block_n": 96}, {"num_warps": 2}, {"num_stages": 0}, {"group_m": 0}, {"block_m": 32}, {"split_k": 0},
                {"splits": 2}):
        with pytest.raises(ValueError, match="bad batch_invariant tuned entry"):
            parse_table([{**entry, "config": {**entry["config"], **bad}}])


def test_committed_gemm_tables_parse():
    """Each GPU model's table (kernels/gemm/tuned/batch_invariant_*.json, written by batch_invariant_tune) names valid
    configurations."""
    import json
    from pathlib import Path

    from radixlm.runtime.kernels.gemm import batch_invariant_mm

    for path in sorted((Path(batch_invariant_mm.__file__).parent / "tuned").glob("batch_invariant_*.json")):
        entries = json.loads(path.read_text())["entries"]
        assert len(batch_invariant_mm.parse_table(entries)) == len(entries), path


def test_tuning_sweep_rejects_a_config_whose_rows_change_with_m():
    from radixlm.runtime.kernels.gemm.batch_invariant import cpu_linear
    from radixlm.runtime.kernels.gemm.batch_invariant_tune import (
        DEFAULT_NARROW, DEFAULT_WIDE, SMEM_LIMIT, candidates, invariance_failures,
    )

    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(3)) / 8
    invariant = lambda x, w: cpu_linear(x, w, None, None)  # noqa: E731
    assert invariance_failures(invariant, w) == []
    # A kernel whose result depends on the call's row count (as a per-M choice would), and one that is wrong.
    assert invariance_failures(lambda x, w: invariant(x, w) + (x.shape[0] < 100) * 1e-6, w) == [1, 7, 64]
    assert invariance_failures(lambda x, w: invariant(x, w) * 2, w) == [-1]
    found = candidates()
    assert found[:2] == [DEFAULT_NARROW, DEFAULT_WIDE] and len(set(found)) == len(found) > 20
    assert all(c.smem_bytes() <= SMEM_LIMIT for c in found)
    # The split-K-free few-row family (narrow tiles, deep pipelines) runs ahead of the grid, within the budget's reach.
    few_rows = [c for c in found[:40] if c.split_k == 1 and c.block_n <= 32 and c.num_stages >= 5]
    assert len(few_rows) >= 3 and any(c.block_n == 16 for c in few_rows)


def _compile_for_hopper(fn, signature: dict[str, str], constexprs: dict[str, object], aligned: tuple[str, ...],
                        num_warps: int, num_stages: int):
    """fn built for sm_90 by Triton's own compiler and ptxas, no GPU needed (skips where this Triton has no CUDA
    backend); `aligned`: the arguments the launcher would mark 16-divisible."""
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        names = list(signature)
        src = ASTSource(fn=fn, signature=signature, constexprs={(names.index(n),): v for n, v in constexprs.items()},
                        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
        return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    except (ImportError, RuntimeError, FileNotFoundError) as e:  # no nvidia backend or ptxas here
        pytest.skip(f"cannot build for sm_90 here: {e}")


def test_gemm_reads_its_input_with_pipelined_vector_copies_on_hopper():
    """The input A is specialised on alignment: its tiles go to shared memory by 16-byte cp.async like B's (with A's
    alignment unknown, Triton 3.9 loaded it by 2-byte ld.global, outside the pipeline)."""
    from radixlm.runtime.kernels.gemm.batch_invariant_mm import _batch_invariant_mm_kernel

    sig = {"A": "*bf16", "B": "*bf16", "C": "*bf16", "Bias": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           "K_SPLIT": "i32", "stride_am": "i32", "stride_ak": "constexpr", "stride_bn": "i32", "stride_bk": "constexpr",
           "stride_cs": "i32", "stride_cm": "i32", "stride_cn": "constexpr", "HAS_BIAS": "constexpr",
           "EVEN_K": "constexpr", "PARTIAL": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
           "BLOCK_K": "constexpr", "GROUP_M": "constexpr"}
    consts = {"stride_ak": 1, "stride_bk": 1, "stride_cn": 1, "HAS_BIAS": False, "EVEN_K": True, "PARTIAL": False,
              "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}
    aligned = ("A", "B", "C", "Bias", "N", "K", "K_SPLIT", "stride_am", "stride_bn", "stride_cm")
    ptx = _compile_for_hopper(_batch_invariant_mm_kernel, sig, consts, aligned, 4, 3).asm["ptx"]
    assert "ld.global.b16" not in ptx and ptx.count("cp.async.cg.shared.global") >= 16 and "wgmma" in ptx


def _sass_ops(cubin: bytes, ops: tuple[str, ...]) -> dict[str, int] | None:
    """How many of each SASS opcode (its name up to the first dot) the cubin holds, by Triton's nvdisasm; None
    where this Triton ships none."""
    import os
    import re
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    if not os.access(tool, os.X_OK):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    names = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text, re.M)
    return {op: names.count(op) for op in ops}


def test_attention_kernel_builds_for_hopper_with_one_sub_tile_math_per_row():
    """Llama-3.1-8B's shapes (groups of 4, head dim 128; 4 rows x 4 heads in one 16-row MMA tile), built for every
    launch configuration a table may choose (fixed_split_config: each allowed sub-tile count x each allowed stage
    count): mma.sync on 16-row tiles in all (no wgmma: a larger dot), every dot and reduction in the same layouts as
    the decode build (one sub-tile, the default stages), and each floating-point instruction exactly sub-tiles times
    as often (no multiply-add fused in one build and not the other)."""
    import re

    from radixlm.runtime.kernels.attention.fixed_split_config import ALLOWED_STAGES, ALLOWED_SUB_TILES
    from radixlm.runtime.kernels.attention.fixed_split_kernel import (
        NUM_STAGES, NUM_WARPS, _fixed_split_attention_kernel)

    sig = {"Q": "*bf16", "K_buf": "*bf16", "V_buf": "*bf16", "Req_to_token": "*i64", "Row_req": "*i64",
           "Positions": "*i64", "Tile_start": "*i32", "Tile_rows": "*i32", "Out": "*bf16", "scale": "fp32",
           "v_scale": "fp32", "num_kv_heads": "i32",
           **{f"stride_{n}": "i32" for n in ("qt", "qh", "kb", "kh", "vb", "vh", "ot", "oh", "r2t")},
           **{n: "constexpr" for n in ("GROUP", "GROUP_P2", "ROWS", "SUB", "HEAD_DIM", "BLOCK_D", "BLOCK_N")}}
    aligned = ("Q", "K_buf", "V_buf", "Req_to_token", "Out", *[n for n in sig if n.startswith("stride_")])
    fp_ops = ("HMMA", "FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "SHFL", "FSEL")

    def build(sub: int, stages: int):
        consts = {"GROUP": 4, "GROUP_P2": 4, "ROWS": 4, "SUB": sub, "HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_N": 64}
        k = _compile_for_hopper(_fixed_split_attention_kernel, sig, consts, aligned, NUM_WARPS, stages)
        ttgir = k.asm["ttgir"]
        dots = [d.split(" loc(")[0] for d in re.findall(r"tt\.dot [^:]*: (.*)", ttgir)]
        reduced = [r for r in re.findall(r"\}\) : \((tensor<[^)]*)\)", ttgir) if "xf32" in r]
        assert "wgmma" not in k.asm["ptx"] and "mma.sync" in k.asm["ptx"] and "cp.async" in k.asm["ptx"], (sub, stages)
        return set(re.findall(r"#mma\d* = .*", ttgir)), dots, reduced, _sass_ops(k.asm["cubin"], fp_ops)

    mma1, dots1, red1, ops1 = build(1, NUM_STAGES)
    assert len(mma1) == 1 and len(dots1) == 2
    for sub, stages in itertools.product(ALLOWED_SUB_TILES, ALLOWED_STAGES):
        if (sub, stages) == (1, NUM_STAGES):
            continue
        mma, dots, red, ops = build(sub, stages)
        assert mma == mma1 and sorted(dots) == sorted(dots1 * sub) and sorted(red) == sorted(red1 * sub), (sub, stages)
        if ops1 is not None:
            # MUFU also holds the tile index's integer division, once in each build.
            assert {op: n - (op == "MUFU") for op, n in ops.items()} == {
                op: sub * (n - (op == "MUFU")) for op, n in ops1.items()}, (sub, stages, ops1, ops)


@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs triton's interpreter, no CUDA")
def test_triton_kernels_rows_are_batch_invariant_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=600)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_kernels_rows_are_batch_invariant_cuda():
    from radixlm.runtime.kernels.attention import fixed_split_attention
    from radixlm.runtime.kernels.gemm.batch_invariant_mm import matmul

    def move(t):
        return t.cuda() if isinstance(t, torch.Tensor) else tuple(map(move, t)) if isinstance(t, tuple) else t

    def on_cuda(fn):
        return lambda *a, **kw: fn(*map(move, a), **{k: move(v) for k, v in kw.items()}).cpu()

    gemm_cases(on_cuda(matmul), (torch.bfloat16, torch.float16))
    attention_case(on_cuda(fixed_split_attention), torch.bfloat16)
    attention_case(tiled(on_cuda(fixed_split_attention)), torch.bfloat16)
    attention_case(tiled(on_cuda(fixed_split_attention), launches=True), torch.bfloat16)
    attention_case(tiled(on_cuda(fixed_split_attention), launches=True), torch.bfloat16, first=61)
    from radixlm.runtime.kernels.attention.fixed_split_config import FixedSplitConfig

    for cfg in (FixedSplitConfig(2, 4, 4), FixedSplitConfig(1, 3, 4)):
        attention_case(tiled(on_cuda(fixed_split_attention), launches=True, config=cfg), torch.bfloat16, first=61)


if __name__ == "__main__":
    from radixlm.runtime.kernels.attention import fixed_split_attention
    from radixlm.runtime.kernels.gemm.batch_invariant_mm import matmul

    from radixlm.runtime.kernels.gemm.batch_invariant_mm import BatchInvariantConfig

    gemm_cases(matmul, (torch.float32,), shapes=((130, 200, True),))
    # Table entries' tiles: a narrow one whose K steps do not divide K (200), one of 128 rows, one in 3 K parts.
    for cfg in (BatchInvariantConfig(block_n=32, block_k=32, num_warps=4, num_stages=2),
                BatchInvariantConfig(block_n=16, block_k=64, num_warps=4, num_stages=2, block_m=128),
                BatchInvariantConfig(block_n=32, block_k=32, num_warps=4, num_stages=2, split_k=3)):
        gemm_cases(lambda x, w, b: matmul(x, w, b, cfg), (torch.float32,), shapes=((40, 200, False),))
    x = torch.randn(9 * 97 + 1, dtype=torch.float32)[1:].view(9, 97)  # rows at an unaligned address and stride
    w = torch.randn(40, 97)
    assert torch.equal(matmul(x, w), matmul(x.clone(), w))
    attention_case(fixed_split_attention, torch.float32, first=84)
    attention_case(tiled(fixed_split_attention), torch.float32, first=61)  # an extend of 30 rows: tiles of 8
    # The backend's launches: programs of 4 sub-tiles of 8 rows for the prompt (tiles of 32: row 90 in the last
    # sub-tile of the last), for the extend (one tile of 30 rows, its last sub-tile 6) and for the 10 rows beside A's
    # in the mixed call (A's row and the 4 others one sub-tile a program, in a second launch).
    attention_case(tiled(fixed_split_attention, launches=True), torch.float32)
    attention_case(tiled(fixed_split_attention, launches=True), torch.float32, first=61)
    # The launch sweep's bit checks pass the kernel: a prompt in programs of 2 sub-tiles gives the default's (4) rows,
    # and the prompt's rows run again as decode rows equal its prefill's.
    from radixlm.runtime.kernels.attention.fixed_split_tune import TINY, Passes, sweep

    found = sweep(Passes(TINY, torch.float32, torch.device("cpu")), [(2, 4)], [], budget_s=60)
    assert not found["rejected"] and not found["errors"] and len(found["prefill"]) == 2, found
    print(MARKER)
