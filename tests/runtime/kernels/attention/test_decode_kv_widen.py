"""A float8 pool widened to halves for the decode kernel's dots (decode_splits.KvWiden): F16 (the packed cvt to
halves, a bfloat16 query cast to float16 once) and F16_BITS (integer bit moves; e4m3 read as value * 2^-8, 2^8
folded into the scales). The bit moves against every float8 value, the kernel against a dense reference under
TRITON_INTERPRET=1 (a subprocess: halves and bfloat16 queries, e4m3 and e5m2, split, DIRECT and chunked), and the
inline PTX built for sm_90 on the CPU: the loop widens with the packed cvt alone (F16) or without the conversion
unit (F16_BITS), where the query-dtype path also converts every half to bf16."""
from __future__ import annotations

import collections
import re

import pytest
import torch

from tests.runtime.kernels.attention.test_decode_attn_variants import make_case, reference
from tests.runtime.kernels.quant.test_int4_mma import _bundled_ptxas, _sass
from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "kv widen cases passed"
FLOAT8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@pytest.mark.parametrize("src", ["e4m3", "e5m2"])
def test_bit_moves_give_every_float8_value_as_a_half(src):
    from radixlm.runtime.kernels.attention.span import E4M3_BITS_FACTOR, kv_widen_bits

    factor = E4M3_BITS_FACTOR if src == "e4m3" else 1.0
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(FLOAT8[src]).float()
    got = []
    for first in range(0, 256, 4):  # four different bytes a word: the order of the halves is checked too
        lo, hi = kv_widen_bits(first | (first + 1) << 8 | (first + 2) << 16 | (first + 3) << 24, src)
        got += [(w >> s) & 0xFFFF for w in (lo, hi) for s in (0, 16)]
    halves = torch.tensor(got, dtype=torch.int32).to(torch.int16).view(torch.float16).float() * factor
    finite = values.isfinite()
    assert finite.sum() >= 248  # e4m3: two NaN codes; e5m2: two infinities and six NaN codes
    assert torch.equal(halves[finite], values[finite])


def test_widening_choices_and_their_scales():
    from radixlm.runtime.kernels.attention.decode_splits import DecodeKernelConfig, KvWiden
    from radixlm.runtime.kernels.attention.span import kv_convert_asm, kv_widen_factor, kv_widen_query_dtype

    e4m3, e5m2, bf16 = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16
    assert kv_widen_query_dtype(e4m3, bf16, KvWiden.F16) == torch.float16
    assert kv_widen_query_dtype(e4m3, bf16, KvWiden.QUERY) == bf16
    assert kv_widen_query_dtype(bf16, bf16, KvWiden.F16) == bf16  # a model-dtype pool: nothing to widen
    assert kv_widen_query_dtype(e4m3, torch.float32, KvWiden.F16) == torch.float32
    assert kv_widen_factor(e4m3, bf16, KvWiden.F16_BITS) == 256.0
    assert kv_widen_factor(e5m2, bf16, KvWiden.F16_BITS) == 1.0
    assert kv_widen_factor(e4m3, torch.float32, KvWiden.F16_BITS) == 1.0  # float32 queries take the plain cast
    assert kv_widen_factor(e4m3, bf16, KvWiden.F16) == 1.0
    # Without inline PTX (the CPU, the interpreter): the bit moves in Triton, or the plain cast.
    assert kv_convert_asm(e4m3, bf16, "cpu", KvWiden.F16_BITS) == "bits_e4m3"
    assert kv_convert_asm(e5m2, torch.float16, "cpu", KvWiden.F16_BITS) == "bits_e5m2"
    assert kv_convert_asm(e4m3, bf16, "cpu", KvWiden.F16) == kv_convert_asm(e4m3, bf16, "cpu", KvWiden.F16_MIXED) == ""
    assert kv_convert_asm(e4m3, torch.float32, "cpu", KvWiden.F16_BITS) == ""
    with pytest.raises(ValueError, match="needs inline_cvt"):
        DecodeKernelConfig(64, widen=KvWiden.F16, inline_cvt=False)
    with pytest.raises(ValueError, match="KvWiden"):
        DecodeKernelConfig(64, widen="f16")


def run_cases(device: str) -> None:
    from radixlm.runtime.cache.kv_quant import quantize_kv
    from radixlm.runtime.kernels.attention.decode import decode_attention
    from radixlm.runtime.kernels.attention.decode_splits import DecodeKernelConfig, KvWiden

    cases = [  # (pool, query dtype, splits, chunked, lens)
        ("e4m3", torch.bfloat16, 1, False, [3, 150]),
        ("e4m3", torch.float16, 3, False, [1, 130]),
        ("e5m2", torch.bfloat16, None, True, [70, 200]),
    ]
    for i, (src, q_dtype, splits, chunked, lens) in enumerate(cases):
        q, k, v, rt, rows, seq_lens = make_case(2, 8, 2, 16, 0, 1, torch.float32, device, seed=90 + i, lens=lens)
        # Keys up to ~100 and small values: the e4m3 bit moves' subnormal halves are reached.
        k8, v8 = quantize_kv(k * 40, 0.5, FLOAT8[src]), quantize_kv(v * 0.02, 2.0, FLOAT8[src])
        q = q.to(q_dtype)
        want = reference(q, k8.float() * 0.5, v8.float() * 2.0, rt, rows, seq_lens, 0.05)
        block_n, prefetch = ((64, 1), (128, 0))[i % 2]  # the prefetching walk, and Triton's pipeline at 128
        outs = {}
        for widen in (KvWiden.F16, KvWiden.F16_BITS):
            config = DecodeKernelConfig(block_n, 4, 1 if prefetch else 2, prefetch, widen=widen)
            got = decode_attention(q, k8, v8, rt, rows, seq_lens, 0.05, int(seq_lens.max()), splits,
                                   chunked=chunked, k_scale=0.5, v_scale=2.0, config=config)
            assert got.dtype == q_dtype and got.shape == q.shape
            torch.testing.assert_close(got.float(), want, atol=2e-2 * want.abs().max().item(), rtol=2e-2,
                                       msg=lambda m: f"case {i} {widen}: {m}")
            outs[widen] = got.float()
        # The same halves (2^8 is exact); the interpreter's float32 matmul may sum them in another order.
        torch.testing.assert_close(outs[KvWiden.F16_BITS], outs[KvWiden.F16], rtol=1e-2,
                                   atol=1e-3 * want.abs().max().item())
    print(MARKER)


if __name__ == "__main__":
    run_cases("cpu")


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter, 3.7 or later")
def test_widened_decode_matches_reference_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=300)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_widened_decode_matches_reference_cuda():
    run_cases("cuda")


def _loop_ops(widen: str, src: str = "e4m3", swapped: bool = False, block_h: int = 16) -> collections.Counter:
    """Stage 1 built for sm_90 (Llama-3.1-8B heads, 128-position blocks, prefetching walk; swapped: the transposed
    walk, span._block_t, Triton's pipeline over 2 stages; block_h query rows a program): the SASS opcodes of its
    longest loop (the walk over blocks)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixlm.runtime.kernels.attention import decode
    from radixlm.runtime.kernels.attention.decode_splits import KvWiden
    from radixlm.runtime.kernels.attention.span import _bits_asm, _cvt_asm, _mixed_asm

    widen = KvWiden(widen)
    cvt = {KvWiden.F16_BITS: _bits_asm(src), KvWiden.F16_MIXED: _mixed_asm(src)}.get(
        widen, _cvt_asm(src, widen == KvWiden.QUERY))
    kv = {"e4m3": "*fp8e4nv", "e5m2": "*fp8e5"}[src]
    ptrs = {"Q": "*bf16", "K_buf": kv, "V_buf": kv, "Req_to_token": "*i64", "Req_pool_indices": "*i64",
            "Seq_lens": "*i64", "Row_starts": "*i64", "Work": "*i32", "Mid_o": "*fp32", "Mid_lse": "*fp32",
            "O": "*bf16"}
    ints = ["stride_qb", "stride_qh", "stride_kbs", "stride_kh", "stride_vbs", "stride_vh", "stride_rt", "stride_mob",
            "stride_moh", "stride_mos", "stride_mlb", "stride_mlh", "stride_ob", "stride_oh", "num_splits"]
    consts = dict(GROUP=4, HEAD_DIM=128, BLOCK_D=128, BLOCK_H=block_h, BLOCK_N=128, PRECISION="tf32",
                  HAS_ROW_STARTS=False, DIRECT=True, CHUNKED=False, PREFETCH=0 if swapped else 1, KV_CVT=cvt,
                  Q_F16=widen != KvWiden.QUERY and not swapped, SWAPPED=swapped,
                  Q_FP8=swapped and widen == KvWiden.F16 and src == "e4m3", PDL=True)  # as sm_90 launches it
    sig = {**ptrs, "sm_scale": "fp32", "v_scale": "fp32", **{n: "i32" for n in ints},
           **{n: "constexpr" for n in consts}}
    names = list(sig)
    aligned = [names.index(n) for n in [*ptrs, *ints[:7], "stride_ob", "stride_oh"]]
    kernel = triton.compile(ASTSource(decode._decode_stage1, sig, constexprs=consts,
                                      attrs={(i,): [["tt.divisibility", 16]] for i in aligned}),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": 4, "num_stages": 2 if swapped else 1})
    labels, ops = {}, []
    for line in _sass(kernel.asm["cubin"]):
        if m := re.match(r"\s*(\.L_x_\d+):", line):
            labels[m.group(1)] = len(ops)
        elif m := re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)", line):
            ops.append((m.group(1), m.group(2)))
    loop: list[str] = []
    for end, (op, rest) in enumerate(ops):
        back = re.search(r"`\((\.L_x_\d+)\)", rest) if op.startswith("BRA") else None
        if back and labels.get(back.group(1), end + 1) <= end and end + 1 - labels[back.group(1)] > len(loop):
            loop = [o for o, _ in ops[labels[back.group(1)]:end + 1]]
    return collections.Counter(loop)


@pytest.mark.skipif(not _bundled_ptxas(), reason="needs Triton's bundled ptxas")
def test_widening_to_halves_takes_fewer_conversions_sm90():
    query, f16, bits, mixed = (_loop_ops(w) for w in ("query", "f16", "f16_bits", "f16_mixed"))
    # Per thread and block: 128 positions x 128 dims of K and of V over 128 threads, two elements a packed cvt.
    assert query["F2FP.F16.E4M3.UNPACK_B"] == f16["F2FP.F16.E4M3.UNPACK_B"] == 128
    assert query["F2F.BF16.F16"] == 256 and f16["F2F.BF16.F16"] == 0
    assert not any(op.startswith(("F2F.", "F2FP.F16.E4M3")) for op in bits) and bits["PRMT"] >= 128
    assert mixed["F2FP.F16.E4M3.UNPACK_B"] == 64 and mixed["HMUL2"] == 64 and mixed["F2F.BF16.F16"] == 0
    assert sum(f16.values()) < 0.75 * sum(query.values())
