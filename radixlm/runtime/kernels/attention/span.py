"""The online-softmax walk over a span of one request's KV that the decode kernels share (decode.py's stage 1,
shared_prefix.py's prefix stage), with its products as written or transposed (_block, _block_t)."""
from __future__ import annotations

import functools

import triton
import triton.language as tl


@triton.jit
def _gather(Buf, slots, kvh, stride_bs, stride_h, offs_d, n_mask, d_mask):
    return tl.load(Buf + slots[:, None] * stride_bs + kvh * stride_h + offs_d[None, :],
                   mask=n_mask[:, None] & d_mask[None, :], other=0.0)


def _cvt_asm(src: str, bf16: bool) -> str:
    """Inline PTX for 4 packed float8 values (one 32-bit register) to 4 halves (two): the hardware's packed
    cvt.rn.f16x2.{e4m3,e5m2}x2 (sm_89+), then for bf16 four cvt.rn.bf16.f16 (exact: every float8 value is a bf16
    value)."""
    to_bf16 = "".join(f"cvt.rn.bf16.f16 a{i}, a{i};\n" for i in range(4)) if bf16 else ""
    return ("{\n.reg .b16 lo, hi, a0, a1, a2, a3;\n.reg .b32 h0, h1;\nmov.b32 {lo, hi}, $2;\n"
            f"cvt.rn.f16x2.{src}x2 h0, lo;\ncvt.rn.f16x2.{src}x2 h1, hi;\n"
            "mov.b32 {a0, a1}, h0;\nmov.b32 {a2, a3}, h1;\n" + to_bf16
            + "mov.b32 $0, {a0, a1};\nmov.b32 $1, {a2, a3};\n}")


# e4m3 widened by moving its bits into a half (kv_widen_bits): the half reads the value times 2^-8 (exponent bias 15
# against 7; e4m3's subnormals land on the half's subnormals, exactly). The kernel folds 2^8 into its scales.
E4M3_BITS_FACTOR = 256.0


def _bits_asm(src: str) -> str:
    """Inline PTX for 4 packed float8 values to 4 halves with integer instructions only (no conversion unit): two byte
    permutes put bytes 0,1 and 2,3 in the high bytes of two half pairs; e5m2 is then a half (its top byte), e4m3
    moves its exponent and mantissa one bit down under the sign (value times 2^-8: E4M3_BITS_FACTOR)."""
    if src == "e5m2":
        return "prmt.b32 $0, $2, 0, 0x1404;\nprmt.b32 $1, $2, 0, 0x3424;"
    return ("{\n.reg .b32 w0, w1, t0, t1;\nprmt.b32 w0, $2, 0, 0x1404;\nprmt.b32 w1, $2, 0, 0x3424;\n"
            "and.b32 t0, w0, 0x7F007F00;\nand.b32 t1, w1, 0x7F007F00;\nshr.b32 t0, t0, 1;\nshr.b32 t1, t1, 1;\n"
            "and.b32 w0, w0, 0x80008000;\nand.b32 w1, w1, 0x80008000;\nor.b32 $0, w0, t0;\nor.b32 $1, w1, t1;\n}")


def _mixed_asm(src: str) -> str:
    """Inline PTX for 4 packed float8 values to 4 halves, half of them by each unit: elements 0,1 by the packed cvt,
    2,3 by _bits_asm's bit moves (e4m3: then times 2^8, exact, on the half pipe). e5m2 takes _bits_asm whole (its
    bit moves are a byte permute)."""
    if src == "e5m2":
        return _bits_asm(src)
    return ("{\n.reg .b16 lo, hi;\n.reg .b32 w, t, c;\nmov.b32 {lo, hi}, $2;\ncvt.rn.f16x2.e4m3x2 $0, lo;\n"
            "prmt.b32 w, $2, 0, 0x3424;\nand.b32 t, w, 0x7F007F00;\nshr.b32 t, t, 1;\nand.b32 w, w, 0x80008000;\n"
            "or.b32 w, w, t;\nmov.b32 c, 0x5C005C00;\nmul.rn.f16x2 $1, w, c;\n}")


def kv_widen_bits(word: int, src: str) -> tuple[int, int]:
    """_bits_asm on one 32-bit word (4 float8 bytes, element 0 lowest), in Python: the two half pairs it writes
    (element 0 in the low half of the first). The tests check every byte value against the float8 value through it."""
    b = [(word >> (8 * i)) & 0xFF for i in range(4)]
    pairs = [(b[1] << 24) | (b[0] << 8), (b[3] << 24) | (b[2] << 8)]  # prmt 0x1404, 0x3424
    if src == "e4m3":
        pairs = [(w & 0x80008000) | ((w & 0x7F007F00) >> 1) for w in pairs]
    return pairs[0], pairs[1]


def kv_widen_factor(kv_dtype, q_dtype, widen) -> float:
    """What the kernel multiplies its scales by for a pool widened as `widen` (decode_splits.KvWiden) for a query
    of q_dtype: E4M3_BITS_FACTOR where kv_convert_asm widens e4m3 by its bits, else 1."""
    import torch

    from radixlm.runtime.kernels.attention.decode_splits import KvWiden

    halves = kv_widen_query_dtype(kv_dtype, q_dtype, widen) == torch.float16
    return E4M3_BITS_FACTOR if halves and widen == KvWiden.F16_BITS and kv_dtype == torch.float8_e4m3fn else 1.0


def kv_widen_query_dtype(kv_dtype, q_dtype, widen):
    """The dtype the kernel's dots take: float16 where a float8 pool is widened to halves (KvWiden.F16, F16_BITS) for
    a bfloat16 or float16 query, else the query's."""
    import torch

    from radixlm.runtime.kernels.attention.decode_splits import KvWiden

    if (widen != KvWiden.QUERY and kv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
            and q_dtype in (torch.bfloat16, torch.float16)):
        return torch.float16
    return q_dtype


@functools.lru_cache(maxsize=None)  # per launch of the eager passes: the device's capability read once
def kv_convert_asm(kv_dtype, q_dtype, device, widen=None) -> str:
    """The KV_CVT constexpr of a launch: the inline conversion of a float8 pool on CUDA to a bf16/fp16 query's dtype
    (the packed cvt needs sm_89, cvt.bf16.f16 sm_90), else "" (a plain cast: model-dtype pools, float32 queries, older
    GPUs, the interpreter).

    Why not the plain cast: Triton moves the float8 tile's layout change (to the tensor-core operand layout) ahead of
    the cast, to move fewer bytes through shared memory; for V (read transposed) that becomes byte-wide shared loads,
    and the kernel needed 183 registers (2 programs per SM) against bf16's 96 (sm_90, Triton 3.6). The inline
    conversion is opaque (not pure) to that rewrite, so the tile converts where it was loaded, packed, and takes bf16's
    path from there (128 registers).

    widen (decode_splits.KvWiden; None: QUERY): F16 converts to halves whatever the query (the packed cvt alone, no
    cvt.bf16.f16; the kernel's dots run in float16: kv_widen_query_dtype); F16_BITS widens with integer instructions
    (_bits_asm) on CUDA, and where no inline PTX runs (the interpreter) with the same bit moves in Triton
    ("bits_e4m3" / "bits_e5m2"); F16_MIXED splits each word between the two (_mixed_asm; the plain cast off CUDA)."""
    import torch

    from radixlm.runtime.kernels.attention.decode_splits import KvWiden

    src = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}.get(kv_dtype)
    device = torch.device(device)
    widen = KvWiden.QUERY if widen is None else KvWiden(widen)
    dot_dtype = kv_widen_query_dtype(kv_dtype, q_dtype, widen)
    if src is None or dot_dtype not in (torch.bfloat16, torch.float16):
        return ""
    cuda = device.type == "cuda"
    if widen == KvWiden.F16_BITS and dot_dtype == torch.float16:
        return _bits_asm(src) if cuda else f"bits_{src}"
    if widen == KvWiden.F16_MIXED and dot_dtype == torch.float16 and cuda:
        return _mixed_asm(src)
    if not cuda or torch.cuda.get_device_capability(device) < ((9, 0) if dot_dtype == torch.bfloat16 else (8, 9)):
        return ""
    return _cvt_asm(src, dot_dtype == torch.bfloat16)


@triton.jit
def _like(x, q, KV_CVT: tl.constexpr):
    """x in q's dtype."""
    if KV_CVT == "":
        return x.to(q.dtype)
    elif KV_CVT == "bits_e4m3":  # _bits_asm's bit moves in Triton (no inline PTX): the half of value * 2^-8
        b = x.to(tl.uint8, bitcast=True).to(tl.uint16)
        return (((b & 0x80) << 8) | ((b & 0x7F) << 7)).to(tl.float16, bitcast=True)
    elif KV_CVT == "bits_e5m2":
        return (x.to(tl.uint8, bitcast=True).to(tl.uint16) << 8).to(tl.float16, bitcast=True)
    else:
        return tl.inline_asm_elementwise(KV_CVT, "=r,=r,r", [x], dtype=q.dtype, is_pure=False, pack=4)


@triton.jit
def _block(q, k, v, n_mask, m_i, l_i, acc, sm_scale, PRECISION: tl.constexpr, KV_CVT: tl.constexpr):
    """One block of the online softmax; K and V in q's dtype (_like: a float8 tile converts in the layout it was
    loaded in, before any layout change)."""
    s = tl.dot(q, tl.trans(_like(k, q, KV_CVT)), input_precision=PRECISION).to(tl.float32) * sm_scale
    s = tl.where(n_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), _like(v, q, KV_CVT), input_precision=PRECISION).to(tl.float32)
    l_i = l_i * alpha + tl.sum(p, 1)
    return m_new, l_i, acc


@triton.jit
def _block_t(q, k, v, n_mask, m_i, l_i, acc_t, sm_rows, PRECISION: tl.constexpr, KV_CVT: tl.constexpr):
    """_block with the products transposed (attend_span's SWAPPED): S^T = K Q^T and O^T = V^T P into acc_t (BLOCK_D,
    rows), the block's positions as the products' long side, so Triton (3.9, sm_90) builds both on Hopper's
    warpgroup MMA (M >= 64; the 16-row products of _block run on mma.sync). An e4m3 q (decode.py quantizes it per
    row: decode.fp8_query) meets K as stored on the FP8 warpgroup MMA and P V runs in halves; otherwise K and V in q's
    dtype (_like). sm_rows: each row's softmax scale."""
    if q.dtype.is_fp8():
        s_t = tl.dot(k, tl.trans(q)).to(tl.float32)
        pv = tl.float16
    else:
        s_t = tl.dot(_like(k, q, KV_CVT), tl.trans(q), input_precision=PRECISION).to(tl.float32)
        pv = q.dtype
    s_t = tl.where(n_mask[:, None], s_t * sm_rows[None, :], float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s_t, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s_t - m_new[None, :])
    p_dot = p.to(pv)
    acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(_like(v, p_dot, KV_CVT)), p_dot,
                                            input_precision=PRECISION).to(tl.float32)
    l_i = l_i * alpha + tl.sum(p, 0)
    return m_new, l_i, acc_t


@triton.jit
def _step(q, k, v, n_mask, m_i, l_i, acc, sm_scale, PRECISION: tl.constexpr, KV_CVT: tl.constexpr,
          SWAPPED: tl.constexpr):
    if SWAPPED:
        return _block_t(q, k, v, n_mask, m_i, l_i, acc, sm_scale, PRECISION, KV_CVT)
    else:
        return _block(q, k, v, n_mask, m_i, l_i, acc, sm_scale, PRECISION, KV_CVT)


@triton.jit
def attend_span(q, K_buf, V_buf, Table, start, end, kvh, sm_scale, v_scale, stride_kbs, stride_kh, stride_vbs,
                stride_vh, offs_d, d_mask, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                PRECISION: tl.constexpr, PREFETCH: tl.constexpr, KV_CVT: tl.constexpr, SWAPPED: tl.constexpr):
    """Attention of q's BLOCK_ROWS query rows to positions [start, end) of one request's table (its req_to_token
    row), K/V of kv head kvh gathered BLOCK_N positions at a time with an online softmax: the normalized output
    and its log-sum-exp (-inf where the span is empty). K and V are read in q's dtype (a float8 pool's converted);
    the pool's scales enter as sm_scale (already times k_scale) and v_scale (times the output).

    PREFETCH: a software pipeline in registers (launch with num_stages=1). Triton's own pipeliner does not overlap
    these gathered loads with the math: it issues block i+1's K/V loads after block i's math and waits for them at
    once (one table round trip and one K/V round trip per block, nothing in flight during the math). Here block
    i+1's K/V loads and block i+2's table entries are issued before block i's math. Same blocks, same order: the
    same numerics as the plain loop.

    SWAPPED: each block by _block_t (the products transposed; sm_scale then (rows,), each row's own)."""
    m_i = tl.full([BLOCK_ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    if SWAPPED:
        acc = tl.zeros([BLOCK_D, BLOCK_ROWS], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_ROWS, BLOCK_D], dtype=tl.float32)
    if PREFETCH == 2:
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        slots = tl.load(Table + offs_n, mask=n_mask, other=0)
        k = _gather(K_buf, slots, kvh, stride_kbs, stride_kh, offs_d, n_mask, d_mask)
        v = _gather(V_buf, slots, kvh, stride_vbs, stride_vh, offs_d, n_mask, d_mask)
        next_mask = offs_n + BLOCK_N < end
        next_slots = tl.load(Table + offs_n + BLOCK_N, mask=next_mask, other=0)
        for n0 in range(start, end, BLOCK_N):
            k_next = _gather(K_buf, next_slots, kvh, stride_kbs, stride_kh, offs_d, next_mask, d_mask)
            v_next = _gather(V_buf, next_slots, kvh, stride_vbs, stride_vh, offs_d, next_mask, d_mask)
            after = n0 + 2 * BLOCK_N + tl.arange(0, BLOCK_N)
            after_mask = after < end
            after_slots = tl.load(Table + after, mask=after_mask, other=0)
            m_i, l_i, acc = _step(q, k, v, n_mask, m_i, l_i, acc, sm_scale, PRECISION, KV_CVT, SWAPPED)
            k, v, n_mask = k_next, v_next, next_mask
            next_slots, next_mask = after_slots, after_mask
    elif PREFETCH == 1:
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        slots = tl.load(Table + offs_n, mask=n_mask, other=0)
        for n0 in range(start, end, BLOCK_N):
            k = _gather(K_buf, slots, kvh, stride_kbs, stride_kh, offs_d, n_mask, d_mask)
            v = _gather(V_buf, slots, kvh, stride_vbs, stride_vh, offs_d, n_mask, d_mask)
            next_n = n0 + BLOCK_N + tl.arange(0, BLOCK_N)
            next_mask = next_n < end
            next_slots = tl.load(Table + next_n, mask=next_mask, other=0)
            m_i, l_i, acc = _step(q, k, v, n_mask, m_i, l_i, acc, sm_scale, PRECISION, KV_CVT, SWAPPED)
            slots, n_mask = next_slots, next_mask
    else:
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_mask = offs_n < end
            slots = tl.load(Table + offs_n, mask=n_mask, other=0)
            k = _gather(K_buf, slots, kvh, stride_kbs, stride_kh, offs_d, n_mask, d_mask)
            v = _gather(V_buf, slots, kvh, stride_vbs, stride_vh, offs_d, n_mask, d_mask)
            m_i, l_i, acc = _step(q, k, v, n_mask, m_i, l_i, acc, sm_scale, PRECISION, KV_CVT, SWAPPED)
    if SWAPPED:
        out = tl.trans(acc / tl.where(l_i > 0, l_i, 1.0)[None, :] * v_scale)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None] * v_scale
    lse = tl.where(end > start, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    return out, lse
