"""Fused elementwise kernels for CUDA (Triton): RMSNorm with the residual add, SiLU-and-mul, and the rotary
embedding. Each rounds to the activation dtype exactly where the Hugging Face reference does (the residual sum,
the normalised value, silu(gate), each product of the rotation), so bf16 outputs match the unfused torch ops
except for the order of the float32 sum in the norm's mean. Imported only on CUDA."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from radixlm.runtime.kernels.numerics import div_rn_f32
from radixlm.runtime.kernels.pdl import pdl_options, pdl_wait


@triton.jit
def rmsnorm_row(X, R, W, ResOut, row, stride_x, stride_r, stride_ro, n_cols, eps, offs, mask,
                HAS_RESIDUAL: tl.constexpr):
    """weight * norm(x (+ residual)) of one whole row, in float32 before its final rounding; with a residual, x +
    residual (rounded to x's dtype) stored at ResOut."""
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = (x.to(tl.float32) + tl.load(R + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(ResOut + row * stride_ro + offs, x, mask=mask)
    return norm_values(x, W, offs, mask, n_cols, eps)


@triton.jit
def norm_values(x, W, offs, mask, n_cols, eps):
    """weight * norm(x) of a whole row x in its dtype (masked lanes 0), in float32 before its final rounding; the
    normalised value rounded to x's dtype first, as the reference rounds it."""
    h = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    normed = (h * inv).to(x.dtype).to(tl.float32)
    return tl.load(W + offs, mask=mask, other=0.0).to(tl.float32) * normed


@triton.jit
def silu_mul(g, u):
    """silu(g) * u in float32, before its final rounding: g in its dtype (silu(g) rounded to it), u in float32."""
    gf = g.to(tl.float32)
    return (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32) * u


@triton.jit
def _rmsnorm_kernel(X, R, W, Out, ResOut, stride_x, stride_r, stride_o, stride_ro, n_cols, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    y = rmsnorm_row(X, R, W, ResOut, row, stride_x, stride_r, stride_ro, n_cols, eps, offs, mask, HAS_RESIDUAL)
    tl.store(Out + row * stride_o + offs, y.to(Out.dtype.element_ty), mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float,
            residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x, residual: (T, H). Without residual: weight * norm(x). With it: (weight * norm(x + residual), x + residual)."""
    n, h = x.shape
    out = torch.empty(n, h, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    res_out = torch.empty_like(x) if residual is not None else out
    if n:
        r = residual if residual is not None else x
        _rmsnorm_kernel[(n,)](x, r, weight, out, res_out, x.stride(0), r.stride(0), out.stride(0), res_out.stride(0),
                              h, eps, HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(h),
                              num_warps=rmsnorm_warps(h), **pdl_options(x.device, n))
    return out if residual is None else (out, res_out)


def rmsnorm_warps(h: int) -> int:
    """The norm's launch width for rows of h: a kernel that must give its bits (rmsnorm_row) launches the same, since
    the warps set the order of the float32 sum."""
    return 4 if h <= 2048 else 8


@triton.jit
def _silu_and_mul_kernel(X, Out, stride_x, stride_o, d, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    g = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    u = tl.load(X + row * stride_x + d + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_o + offs, silu_mul(g, u).to(Out.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: (T, 2d) = [gate | up] -> silu(gate) * up, (T, d)."""
    n, two_d = x.shape
    d = two_d // 2
    out = torch.empty(n, d, dtype=x.dtype, device=x.device)
    if n:
        block = 1024
        _silu_and_mul_kernel[(n, triton.cdiv(d, block))](x, out, x.stride(0), out.stride(0), d, BLOCK=block,
                                                         num_warps=4, **pdl_options(x.device, n))
    return out


# Triton's interpreter (CPU tests) has no libdevice (and fuses nothing): a plain product there.
_COMPILED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def _product(a, b, ROUNDED: tl.constexpr):
    if ROUNDED:
        if _COMPILED:
            p = libdevice.mul_rn(a, b)  # rounded on its own: never fused into the add that follows
        else:
            p = a * b
    else:
        p = a * b
    return p


@triton.jit
def rotate_halves(x1, x2, cos, sin, ROUNDED: tl.constexpr):
    """The neox rotation of a head's halves (x1, x2) in their dtype, in the reference's order: rot * cos +
    rotate_half(rot) * sin, every product and the sum rounded to the dtype. ROUNDED: the products are rounded on
    their own, for kernels compiled with fp fusion (which would turn a product and sum into one fused multiply-add);
    a kernel compiled without fusion passes False."""
    dt = x1.dtype
    c = cos.to(dt).to(tl.float32)
    s = sin.to(dt).to(tl.float32)
    a1 = x1.to(tl.float32)
    a2 = x2.to(tl.float32)
    o1 = (_product(a1, c, ROUNDED).to(dt).to(tl.float32) + _product(-a2, s, ROUNDED).to(dt).to(tl.float32)).to(dt)
    o2 = (_product(a2, c, ROUNDED).to(dt).to(tl.float32) + _product(a1, s, ROUNDED).to(dt).to(tl.float32)).to(dt)
    return o1, o2


@triton.jit
def kv_cache_value(x, scale, Buf):
    """x as the KV pool Buf stores it: a cast, or for a float8 pool x / scale (float32, correctly rounded) saturated
    to the format's largest finite value, then cast (cache/kv_quant.py quantize_kv is the reference)."""
    ty = Buf.dtype.element_ty
    if ty == tl.float8e4nv or ty == tl.float8e5:
        xf = x.to(tl.float32)
        if scale != 1.0:  # a unit scale (no checkpoint scales: the usual pool) skips the division
            xf = div_rn_f32(xf, scale)
        limit: tl.constexpr = 448.0 if ty == tl.float8e4nv else 57344.0
        y = tl.clamp(xf, -limit, limit).to(ty)
    else:
        y = x.to(ty)
    return y


# Positions and slots are index vectors: not specialized on their alignment (see decode_attention.INDEX_ARGS).
@triton.jit(do_not_specialize_on_alignment=["Pos", "Loc"])
def _rotary_kernel(Pos, CosSin, Q, K, V, Loc, KBuf, VBuf, stride_q, stride_k, stride_v, stride_cs, stride_kb,
                   stride_vb, num_q_heads, num_k_heads, k_scale, v_scale, HEAD_SIZE: tl.constexpr, HALF: tl.constexpr,
                   BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr, STORE: tl.constexpr):
    tok = tl.program_id(0)
    which = tl.program_id(1)  # 0: the token's q heads; 1: its k heads (and with STORE the k and v stores)
    pos = tl.load(Pos + tok)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    cos = tl.load(CosSin + pos * stride_cs + offs_d, mask=d_mask, other=0.0)
    sin = tl.load(CosSin + pos * stride_cs + HALF + offs_d, mask=d_mask, other=0.0)
    offs_h = tl.arange(0, BLOCK_H)
    if which == 0:
        base = Q + tok * stride_q
        heads = num_q_heads
    else:
        base = K + tok * stride_k
        heads = num_k_heads
    if STORE:
        slot = tl.load(Loc + tok).to(tl.int64)
    for h0 in range(0, heads, BLOCK_H):
        h = h0 + offs_h
        m = (h < heads)[:, None] & d_mask[None, :]
        within = h[:, None] * HEAD_SIZE + offs_d[None, :]
        ptr = base + within
        x1 = tl.load(ptr, mask=m, other=0.0)
        x2 = tl.load(ptr + HALF, mask=m, other=0.0)
        o1, o2 = rotate_halves(x1, x2, cos[None, :], sin[None, :], False)  # (launched without fp fusion)
        tl.store(ptr, o1, mask=m)
        tl.store(ptr + HALF, o2, mask=m)
        if STORE and which == 1:
            kb = KBuf + slot * stride_kb + within
            tl.store(kb, kv_cache_value(o1, k_scale, KBuf), mask=m)
            tl.store(kb + HALF, kv_cache_value(o2, k_scale, KBuf), mask=m)
    if STORE and which == 1:  # v: whole heads, as _store_kv_kernel copies them
        offs_full = tl.arange(0, 2 * BLOCK_HALF)
        for h0 in range(0, num_k_heads, BLOCK_H):
            h = h0 + offs_h
            within = h[:, None] * HEAD_SIZE + offs_full[None, :]
            m = (h < num_k_heads)[:, None] & (offs_full < HEAD_SIZE)[None, :]
            v = tl.load(V + tok * stride_v + within, mask=m)
            tl.store(VBuf + slot * stride_vb + within, kv_cache_value(v, v_scale, VBuf), mask=m)


def rotary_(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
            head_size: int, store: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
            k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """In place, neox layout over the whole head (rotary_dim == head_size). q: (T, Hq * head_size), k likewise;
    cos_sin_cache: (max_pos, head_size) float32 [cos | sin]. store: (v, loc, k_buf, v_buf): also k_buf[loc] = the
    rotated k and v_buf[loc] = v, in the same launch (as store_kv would after it; k_scale and v_scale: a float8
    pool's)."""
    n = positions.shape[0]
    if n == 0:
        return
    half = head_size // 2
    q_heads, k_heads = q.shape[1] // head_size, k.shape[1] // head_size
    v, loc, k_buf, v_buf = store if store is not None else (k, positions, k, k)
    # All heads of a token in one or two iterations: the launch and the loads' latency, not the arithmetic, are what
    # cost here. Two programs a token (q; k with the stores) run the two halves of that latency side by side.
    block_h = min(triton.next_power_of_2(max(q_heads, k_heads)), max(1, 4096 // triton.next_power_of_2(half)))
    _rotary_kernel[(n, 2)](positions, cos_sin_cache, q, k, v, loc, k_buf, v_buf, q.stride(0), k.stride(0),
                           v.stride(0), cos_sin_cache.stride(0), k_buf.stride(0), v_buf.stride(0), q_heads, k_heads,
                           float(k_scale), float(v_scale), HEAD_SIZE=head_size, HALF=half,
                           BLOCK_HALF=triton.next_power_of_2(half), BLOCK_H=block_h,
                           STORE=store is not None, num_warps=4,
                           enable_fp_fusion=False)  # a fused multiply-add would skip the reference's roundings


@triton.jit(do_not_specialize_on_alignment=["Loc"])  # (see _rotary_kernel)
def _store_kv_kernel(K, V, Loc, KBuf, VBuf, stride_k, stride_v, stride_kb, stride_vb, width, k_scale, v_scale,
                     BLOCK: tl.constexpr):
    tok = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < width
    slot = tl.load(Loc + tok)
    k = tl.load(K + tok * stride_k + offs, mask=mask)
    v = tl.load(V + tok * stride_v + offs, mask=mask)
    tl.store(KBuf + slot * stride_kb + offs, kv_cache_value(k, k_scale, KBuf), mask=mask)
    tl.store(VBuf + slot * stride_vb + offs, kv_cache_value(v, v_scale, VBuf), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
             scales=None) -> None:
    """k_buf[loc] = k and v_buf[loc] = v in one launch. k, v: (T, Hkv * D) rows with any row stride (views of the
    fused qkv output); k_buf, v_buf: (slots, Hkv, D) contiguous; scales: a float8 pool's layer scales
    (cache.kv_quant.KVScales)."""
    n = loc.shape[0]
    if n == 0:
        return
    width = k_buf.shape[1] * k_buf.shape[2]
    block = min(1024, triton.next_power_of_2(width))
    k_scale, v_scale = (scales.k_scale, scales.v_scale) if scales is not None else (1.0, 1.0)
    _store_kv_kernel[(n, triton.cdiv(width, block))](k, v, loc, k_buf, v_buf, k.stride(0), v.stride(0),
                                                     k_buf.stride(0), v_buf.stride(0), width, float(k_scale),
                                                     float(v_scale), BLOCK=block, num_warps=4)
