"""The FP8 few-row kernel (kernels/quant/fp8_gemv.py) with the skinny kernel's fused steps: the prologue (RMSNorm, with
the residual add, or SiLU-and-mul) in its loads and the qkv GEMM's rotary epilogue on its output, against the step's
module, then the same kernel, then the rotation and the KV store (on the CPU under TRITON_INTERPRET=1 in a
subprocess; on CUDA compiled, also through fp8_linear's dispatch with a tuned table); and which calls may fuse."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlm.runtime.kernels.quant import reference as ref
from radixlm.runtime.kernels.quant.fp8_gemv import Fp8GemvConfig
from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "fp8 gemv fusion cases passed"


def _close(got: torch.Tensor, want: torch.Tensor, tol: float, where: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (where, got.shape, want.shape, got.dtype, want.dtype)
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tol * want.float().abs().max().item(), (where, err, want.float().abs().max().item())


def _prologue(kind: str, k: int, dtype: torch.dtype, device: str, g: torch.Generator):
    from radixlm.runtime.layers.activation import SiluAndMul
    from radixlm.runtime.layers.norm import RMSNorm

    if kind == "silu":
        return SiluAndMul().prologue(), 2 * k
    norm = RMSNorm(k, 1e-5).to(device)
    norm.weight.data = (1 + 0.1 * torch.randn(k, generator=g)).to(device, dtype)
    res = torch.randn(1, k, generator=g).to(device, dtype) if kind == "add" else None
    return norm.prologue(res), k


def prologue_cases(device: str) -> None:
    """Fused against the step's module then the kernel: equal up to the norm's sum order (every program sums the
    row itself, as the skinny kernel does), the new residual bit for bit."""
    from radixlm.runtime.kernels.quant.fp8_gemv import fp8_gemv_linear

    g = torch.Generator().manual_seed(0)
    # (the interpreter rounds float32 to bfloat16 toward zero, the GPU to nearest: bfloat16 is compiled-only)
    dtypes = (torch.float32, torch.float16) if device == "cpu" else (torch.bfloat16, torch.float16)
    cases = [("norm", 64, None, Fp8GemvConfig(8, 64, 1, 1, 1)), ("add", 128, None, Fp8GemvConfig(8, 64, 2, 1, 1)),
             ("silu", 192, None, Fp8GemvConfig(8, 128, 1, 1, 1)), ("add", 128, (16, 32), Fp8GemvConfig(8, 32, 1, 1, 1))]
    if device != "cpu":
        cases.append(("add", 4096, (128, 128), Fp8GemvConfig(8, 512, 1, 2, 1)))
    for i, (kind, k, block, cfg) in enumerate(cases):
        for dtype in dtypes:
            n = 32
            q, s = ref.quant_fp8(torch.randn(n, k, generator=g) * 0.05, block=block, per_channel=block is None)
            q, s = q.to(device), s.to(device)
            pro, width = _prologue(kind, k, dtype, device, g)
            x = torch.randn(1, width, generator=g).to(device, dtype)
            bias = torch.randn(n, generator=g).to(device, dtype) if i % 2 else None
            unfused = dataclasses.replace(pro)
            want = fp8_gemv_linear(unfused.apply(x), q, s, block, bias, cfg)
            got = fp8_gemv_linear(x, q, s, block, bias, cfg, pro)
            where = f"case {i} ({kind}, {dtype}, blocks {block}, {cfg})"
            _close(got, want, 1e-5 if dtype == torch.float32 else 2e-2, where)
            if kind == "add":
                assert torch.equal(pro.residual_out, unfused.residual_out), where


def epilogue_cases(device: str) -> None:
    """The rotation and the KV store on the kernel's output, bit for bit as the rotary embedding and set_kv_buffer
    after the same kernel without them; with an add-and-norm prologue in the same launch, and block weights."""
    from radixlm.runtime.cache.memory_pool import TokenToKVPool
    from radixlm.runtime.kernels.gemm.epilogue import RotaryStore
    from radixlm.runtime.kernels.quant.fp8_gemv import fp8_gemv_linear
    from radixlm.runtime.layers.rotary import get_rope

    g = torch.Generator().manual_seed(1)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    hq, hkv, head_dim, k = 2, 1, 64, 64
    n = (hq + 2 * hkv) * head_dim
    for i, (block, cfg, pro_kind) in enumerate(((None, Fp8GemvConfig(8, 64, 1, 1, 1), None),
                                                ((64, 32), Fp8GemvConfig(16, 32, 1, 1, 1), "add"))):
        q8, s = ref.quant_fp8(torch.randn(n, k, generator=g) * 0.1, block=block, per_channel=block is None)
        q8, s = q8.to(device), s.to(device)
        pro, _ = _prologue(pro_kind, k, dtype, device, g) if pro_kind else (None, k)
        x = torch.randn(1, k, generator=g).to(device, dtype)
        rope = get_rope(head_dim, 8192, 500000.0)
        pos = torch.tensor([1234 + i], device=device)
        loc = torch.tensor([3], device=device)
        pools = [TokenToKVPool(8, 1, dtype, 1, hkv, head_dim, device) for _ in range(2)]
        epi = RotaryStore(rope, pos, loc, pools[0].k_buffer[0], pools[0].v_buffer[0], hq * head_dim, hkv * head_dim)
        plain = fp8_gemv_linear(x, q8, s, block, None, cfg, dataclasses.replace(pro) if pro else None)
        q, k_, v = plain.clone().split([hq * head_dim, hkv * head_dim, hkv * head_dim], dim=-1)
        q, k_ = rope(pos, q, k_)
        pools[1].set_kv_buffer(0, loc, k_, v)
        got = fp8_gemv_linear(x, q8, s, block, None, cfg, pro, epi)
        where = f"epilogue case {i} (blocks {block}, {cfg}, prologue {pro_kind})"
        assert epi.applied, where
        assert torch.equal(got, torch.cat([q, k_, v], dim=-1)), where
        assert torch.equal(pools[0].k_buffer[0], pools[1].k_buffer[0]), where
        assert torch.equal(pools[0].v_buffer[0], pools[1].v_buffer[0]), where


def run_cases(device: str = "cpu") -> None:
    prologue_cases(device)
    epilogue_cases(device)
    print(MARKER)


@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs triton's interpreter, no CUDA")
def test_fused_steps_equal_the_unfused_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=300)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs an FP8-capable GPU")
def test_fused_steps_equal_the_unfused_cuda():
    run_cases("cuda")


def test_which_calls_fuse():
    """One row, a step reading its inputs in place, no pending rank sum; the epilogue only unsplit and with column
    blocks that tile a head, each head in one block row."""
    from radixlm.runtime.kernels.quant.fp8_gemv import epilogue_tiles, fp8_gemv_linear, takes_prologue

    g = torch.Generator().manual_seed(2)
    pro, _ = _prologue("add", 64, torch.bfloat16, "cpu", g)
    assert takes_prologue(pro, torch.zeros(1, 64, dtype=torch.bfloat16))
    assert not takes_prologue(pro, torch.zeros(2, 64, dtype=torch.bfloat16))
    assert not takes_prologue(pro, torch.zeros(1, 64, dtype=torch.float16))  # the residual's dtype is not x's
    assert not takes_prologue(pro, torch.zeros(1, 65, dtype=torch.bfloat16)[:, 1:])  # not word-aligned
    pro.reduce = object()
    assert not takes_prologue(pro, torch.zeros(1, 64, dtype=torch.bfloat16))
    silu, _ = _prologue("silu", 64, torch.bfloat16, "cpu", g)
    assert takes_prologue(silu, torch.zeros(1, 128, dtype=torch.bfloat16))
    assert epilogue_tiles(4096, None, 128, Fp8GemvConfig(8, 512, 1, 2, 1))
    assert not epilogue_tiles(4096, None, 128, Fp8GemvConfig(8, 512, 2, 2, 1))  # split K: no whole sums
    assert not epilogue_tiles(4096, None, 64, Fp8GemvConfig(128, 512, 1, 2, 1))  # wider than a head
    assert not epilogue_tiles(4096, (64, 128), 128, Fp8GemvConfig(8, 512, 1, 2, 1))  # a head over two block rows
    assert epilogue_tiles(4096, (128, 128), 128, Fp8GemvConfig(8, 512, 1, 2, 1))
    q, s = ref.quant_fp8(torch.randn(32, 64), per_channel=True)
    with pytest.raises(ValueError, match="fuses a ADD_RMSNORM step"):
        fp8_gemv_linear(torch.zeros(2, 64, dtype=torch.bfloat16), q, s, None, None, Fp8GemvConfig(8, 64, 1, 1, 1),
                        _prologue("add", 64, torch.bfloat16, "cpu", g)[0])


def test_tuned_fused_asks_the_table_for_the_steps_fused(monkeypatch):
    """The whole fusion first (prologue and rotary), then the prologue alone; the epilogue alone only without a
    prologue; nothing fused without an entry."""
    from radixlm.runtime.kernels.quant import fp8_gemm, quant_tuned

    asked, have = [], {}

    def lookup(device, kind, n, k, m, group=0, step=""):
        asked.append((kind, n, k, m, group, step))
        return have.get(step)

    monkeypatch.setattr(quant_tuned, "lookup", lookup)
    g = torch.Generator().manual_seed(3)
    w, _ = ref.quant_fp8(torch.randn(32, 64, generator=g), per_channel=True)
    pro, _ = _prologue("add", 64, torch.bfloat16, "cpu", g)
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    assert fp8_gemm.tuned_fused(x, w, None, pro, None) is None
    assert asked == [("fp8_channel", 32, 64, 1, 0, "add_rmsnorm")]
    have["add_rmsnorm"] = Fp8GemvConfig(8, 64, 1, 1, 1)
    cfg, got_pro, epi = fp8_gemm.tuned_fused(x, w, None, pro, None)
    assert cfg == have["add_rmsnorm"] and got_pro is pro and epi is None
    asked.clear()
    silu, _ = _prologue("silu", 64, torch.bfloat16, "cpu", g)
    assert fp8_gemm.tuned_fused(torch.zeros(1, 128, dtype=torch.bfloat16), w, (16, 32), silu, None) is None
    assert asked == [("fp8_block", 32, 64, 1, 32, "silu_mul")]
    assert fp8_gemm.tuned_fused(torch.zeros(2, 64, dtype=torch.bfloat16), w, None, pro, None) is None  # two rows


def test_the_tables_step_entries_parse_and_bad_ones_are_refused():
    from radixlm.runtime.kernels.quant import quant_tuned

    cfg = {"block_n": 8, "block_k": 512, "split_k": 1, "num_warps": 2, "num_stages": 1}
    entry = {"kernel": "fp8_channel", "n": 6144, "k": 4096, "rows": 1, "group": 0, "step": "add_rmsnorm+rotary",
             "config": cfg}
    table = quant_tuned.parse([entry, {**entry, "step": "", "config": {**cfg, "block_n": 16}}])
    assert quant_tuned.lookup_in(table, "fp8_channel", 6144, 4096, 1, 0, "add_rmsnorm+rotary").block_n == 8
    assert quant_tuned.lookup_in(table, "fp8_channel", 6144, 4096, 1).block_n == 16
    assert quant_tuned.lookup_in(table, "fp8_channel", 6144, 4096, 1, 0, "rotary") is None
    for bad in ({**entry, "step": "norm"}, {**entry, "rows": 2}, {**entry, "kernel": "w4a16", "group": 128}):
        with pytest.raises(ValueError, match="bad quant_gemv tuned entry"):
            quant_tuned.parse([bad])


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs an FP8-capable GPU")
def test_dispatch_fuses_where_the_table_says_cuda(monkeypatch):
    """fp8_linear at one row through a tuned table: the qkv launch with its add-and-norm and rotary fused (the
    residual, the rotated output and the KV as unfused), gate_up with none fused (no entry): the step runs first."""
    from radixlm.runtime.cache.memory_pool import TokenToKVPool
    from radixlm.runtime.kernels import quant
    from radixlm.runtime.kernels.gemm.epilogue import RotaryStore
    from radixlm.runtime.kernels.quant import quant_tuned
    from radixlm.runtime.layers.rotary import get_rope

    n, k, hq, hkv, d = 768, 512, 4, 1, 128
    plain = {"block_n": 8, "block_k": 256, "split_k": 1, "num_warps": 2, "num_stages": 1}
    entries = [{"kernel": "fp8_channel", "n": n, "k": k, "rows": 1, "group": 0, "config": plain},
               {"kernel": "fp8_channel", "n": n, "k": k, "rows": 1, "group": 0, "step": "add_rmsnorm+rotary",
                "config": {**plain, "block_n": 16, "num_warps": 4}}]
    monkeypatch.setattr(quant_tuned, "_table", lambda name: quant_tuned.parse(entries))
    g = torch.Generator().manual_seed(4)
    q8, s = (t.cuda() for t in ref.quant_fp8(torch.randn(n, k, generator=g) * 0.05, per_channel=True))
    pro, _ = _prologue("add", k, torch.bfloat16, "cuda", g)
    x = torch.randn(1, k, generator=g).cuda().bfloat16()
    pools = [TokenToKVPool(8, 1, torch.bfloat16, 1, hkv, d, "cuda") for _ in range(2)]
    rope = get_rope(d, 8192, 500000.0)
    pos, loc = torch.tensor([321], device="cuda"), torch.tensor([5], device="cuda")
    epis = [RotaryStore(rope, pos, loc, p.k_buffer[0], p.v_buffer[0], hq * d, hkv * d) for p in pools]
    unfused = dataclasses.replace(pro)
    want = quant.fp8_linear(unfused.apply(x), q8, s)
    epis[1].unfused(want)
    got = quant.fp8_linear(x, q8, s, prologue=pro, epilogue=epis[0])
    assert epis[0].applied
    _close(got, want, 2e-2, "fused qkv")
    assert torch.equal(pro.residual_out, unfused.residual_out)
    for fused_buf, unfused_buf in ((pools[0].k_buffer[0], pools[1].k_buffer[0]),
                                   (pools[0].v_buffer[0], pools[1].v_buffer[0])):
        _close(fused_buf[5], unfused_buf[5], 2e-2, "the stored k and v")
    entries.pop()  # no fused entry: the step runs first, the epilogue is left to the caller
    pro2, again_pro = dataclasses.replace(pro, residual_out=None), dataclasses.replace(pro, residual_out=None)
    epi = dataclasses.replace(epis[0], applied=False)
    again = quant.fp8_linear(x, q8, s, prologue=pro2, epilogue=epi)
    assert not epi.applied and torch.equal(pro2.residual_out, unfused.residual_out)
    assert torch.equal(again, quant.fp8_linear(again_pro.apply(x), q8, s))


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton 3.7+ with its bundled ptxas")
@pytest.mark.parametrize("pro, epi, pdl", [(2, True, True), (1, True, False), (3, False, True)])
def test_the_fused_kernel_builds_for_sm90(pro, epi, pdl):
    """The launches the tuned table can name (the qkv GEMM's add-and-norm or norm with the rotary epilogue, and
    SiLU-and-mul) pass ptxas for sm_90 with the packed e4m3 conversion (Triton's bundled tools, no GPU): the new
    residual stored as words by program column 0, the rotation's K store to a bf16 pool; with PDL (kernels/pdl.py),
    the wait for the previous kernel and the release of the next."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixlm.runtime.kernels.quant import fp8_gemv

    ptrs = {"X": "*i64", "W": "*i32", "WS": "*fp32", "Bias": "*bf16", "Y": "*bf16", "NW": "*i64", "R": "*i64",
            "RO": "*i64", "Pos": "*i64", "CosSin": "*fp32", "Loc": "*i64", "KBuf": "*bf16", "VBuf": "*bf16"}
    ints = ("M", "N", "K", "stride_xm", "stride_wn", "stride_wsn", "stride_wsk", "stride_ym", "stride_ys",
            "tiles_per_split")
    floats = ("eps",)
    epi_ints = ("n_q", "n_kv", "stride_cs", "stride_kb", "stride_vb")
    consts = dict(ROWS=1, BLOCKWISE=False, GROUP_N=1, GROUP_K=1, HAS_BIAS=False, SPLIT=False, EVEN_K=True, EVEN_N=True,
                  XKIND=0, BLOCK_N=8, BLOCK_K=512, CVT=fp8_gemv.F32_CVT, PRO=pro, EPI=epi, HEAD_DIM=128 if epi else 0,
                  NORM_WORDS=1024, PDL=pdl)
    sig = {**ptrs, **{n: "i32" for n in ints}, **{n: "fp32" for n in floats}, **{n: "i32" for n in epi_ints},
           "k_scale": "fp32", "v_scale": "fp32", **{n: "constexpr" for n in consts}}
    aligned = [i for i, n in enumerate(sig) if n in ptrs and n not in ("X", "Pos", "Loc")]
    src = ASTSource(fp8_gemv._fp8_gemv_kernel, sig, constexprs=consts,
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 2, "num_stages": 1}).asm["ptx"]
    assert "cvt.rn.f16x2.e4m3x2" in ptx
    assert ("st.global.b64" in ptx or "st.global.v2.b64" in ptx or "st.global.u64" in ptx) == (pro == 2)
    assert ("griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx) == pdl


if __name__ == "__main__":
    run_cases()
