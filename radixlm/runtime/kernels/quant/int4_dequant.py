"""W4A16 at many rows (prefill, large decode batches): dequantize the INT4 weight (reference.py's layout) into a bf16 /
fp16 (N, K) scratch with one Triton kernel, then the dense GEMM (F.linear: cuBLAS, bf16's own kernel). Past a few
hundred rows the GEMM is bound by the tensor cores, not by the weight's bytes, and the tile kernels that dequantize
inside their K loop (int4_gemm.py, int4_mma.py) repeat the dequantization per row tile at well under the tensor cores'
rate; here it runs once per call (reads K N / 2 bytes, writes 2 K N) and the GEMM runs at bf16's speed.

The dequantization is reference.dequant_int4's: (q - z) * s in float32, rounded once to the output dtype (q - z exact:
the nibble or-ed into the float 2^23's mantissa, minus 2^23 + z, as int4_gemm.py does), so F.linear on the scratch is
reference.int4_linear's result up to the GEMM's summation order. Act-order: x's channels are gathered by perm first
(the weight stays in its stored order), as the tile kernels do.

Which path a GEMM takes (int4_gemm.int4_linear_cuda): this path from min_rows rows, per weight shape and group size
from this GPU model's tuned table (quant_tuned.py, kind "w4a16_dequant"; min_rows null: never), DEFAULT_MIN_ROWS
without an entry. The scratch (DequantScratch): one buffer per device, grown to the largest layer by start-up's
warm-up (dispatch.int4_warmup_rows runs every layer at its min_rows) and reused by every layer in stream order. In a
CUDA-graph capture the path runs only if the buffer is already large enough (no allocation inside a capture); once a
capture has used it the buffer is never replaced (a graph holds its address), and a larger layer then gets a
temporary of its own."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from radixlm.runtime.kernels.quant import tiles
from radixlm.runtime.kernels.quant.reference import INT4_PACK

DEFAULT_MIN_ROWS = 512
DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # the scratch's (float32: the interpreter tests)


@dataclass(frozen=True)
class DequantConfig:
    """The dequantization kernel's tile: BLOCK_N output channels by BLOCK_KP words (8 BLOCK_KP input channels)."""

    block_n: int = 64
    block_kp: int = 16
    num_warps: int = 4

    def __post_init__(self):
        for name in ("block_n", "block_kp", "num_warps"):
            v = getattr(self, name)
            if v <= 0 or v & (v - 1):
                raise ValueError(f"DequantConfig.{name} must be a power of two, got {v}")
        if not 8 <= self.block_n <= 512 or not 1 <= self.block_kp <= 128 or self.num_warps > 16:
            raise ValueError(f"DequantConfig: block_n in 8..512, block_kp in 1..128, num_warps <= 16, got {self}")


@dataclass(frozen=True)
class DequantChoice:
    """One weight shape's path choice: the dequantize-then-GEMM path from min_rows rows (None: never)."""

    min_rows: int | None = DEFAULT_MIN_ROWS
    config: DequantConfig = DequantConfig()

    def __post_init__(self):
        if self.min_rows is not None and self.min_rows < 1:
            raise ValueError(f"DequantChoice.min_rows must be >= 1 or None (never), got {self.min_rows}")

    def takes(self, rows: int) -> bool:
        return self.min_rows is not None and rows >= self.min_rows


DEFAULT_CHOICE = DequantChoice()


def choice_for(device: torch.device, n: int, k: int, group_size: int) -> DequantChoice:
    """The table's choice for this GEMM on this device's GPU model, else DEFAULT_CHOICE."""
    from radixlm.runtime.kernels.quant import quant_tuned

    return quant_tuned.lookup_dequant(device, n, k, group_size) or DEFAULT_CHOICE


@triton.jit
def _dequant_int4_kernel(QW, S, Z, W, N, K, group_size, stride_qk, stride_sg, stride_zg, stride_wn,
                         WORD_GROUPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KP: tl.constexpr):
    """W[n, 8 kp + j] = (nibble j of QW[kp, n] - z) * s for a [BLOCK_N, BLOCK_KP] tile of words (loaded along N, where
    the words are contiguous; stored along K). WORD_GROUPS: the group size is a multiple of 8, so the eight channels
    of a word share one scale and zero."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kp = pid_k * BLOCK_KP + tl.arange(0, BLOCK_KP)
    nib = tl.arange(0, 8)
    n_mask = offs_n < N
    mask = n_mask[:, None] & (offs_kp < K // 8)[None, :]
    packed = tl.load(QW + offs_kp[None, :] * stride_qk + offs_n[:, None], mask=mask, other=0)
    q = (packed[:, :, None] >> (nib * 4)[None, None, :]) & 0xF  # [BLOCK_N, BLOCK_KP, 8]
    if WORD_GROUPS:
        g = offs_kp * 8 // group_size
        s = tl.load(S + g[None, :] * stride_sg + offs_n[:, None], mask=mask, other=0.0).to(tl.float32)[:, :, None]
        z = tl.load(Z + g[None, :] * stride_zg + offs_n[:, None], mask=mask, other=0.0).to(tl.float32)[:, :, None]
    else:
        g = (offs_kp[:, None] * 8 + nib[None, :]) // group_size  # [BLOCK_KP, 8]
        mask3 = mask[:, :, None] & (nib >= 0)[None, None, :]
        s = tl.load(S + g[None, :, :] * stride_sg + offs_n[:, None, None], mask=mask3, other=0.0).to(tl.float32)
        z = tl.load(Z + g[None, :, :] * stride_zg + offs_n[:, None, None], mask=mask3, other=0.0).to(tl.float32)
    q_f = (q | 0x4B000000).to(tl.float32, bitcast=True)  # 2^23 + q, exactly
    w = ((q_f - (z + 8388608.0)) * s).to(W.dtype.element_ty)
    w = tl.reshape(w, [BLOCK_N, BLOCK_KP * 8])
    offs_k = pid_k * BLOCK_KP * 8 + tl.arange(0, BLOCK_KP * 8)
    tl.store(W + offs_n[:, None] * stride_wn + offs_k[None, :], w, mask=n_mask[:, None] & (offs_k < K)[None, :])


def dequant_int4_into(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                      out: torch.Tensor, cfg: DequantConfig = DequantConfig()) -> torch.Tensor:
    """reference.dequant_int4(qweight, scales, zeros, group_size, out.dtype) written into out (N, K), which must have
    a unit column stride; qweight, scales and zeros unit column strides (int4_gemm.check_int4's shapes)."""
    kp, n = qweight.shape
    k = kp * INT4_PACK
    if tuple(out.shape) != (n, k) or out.dtype not in DTYPES or out.stride(1) != 1:
        raise ValueError(f"the dequantized INT4 weight is a ({n}, {k}) tensor of {DTYPES} with unit column stride, "
                         f"got {tuple(out.shape)} {out.dtype} strides {out.stride()}")
    if group_size <= 0 or qweight.stride(1) != 1 or scales.stride(1) != 1 or zeros.stride(1) != 1:
        raise ValueError(f"dequant_int4_into: a positive group size and unit column strides, got group {group_size}, "
                         f"strides {qweight.stride()} {scales.stride()} {zeros.stride()}")
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(kp, cfg.block_kp))
    _dequant_int4_kernel[grid](qweight, scales, zeros, out, n, k, group_size, qweight.stride(0), scales.stride(0),
                               zeros.stride(0), out.stride(0), WORD_GROUPS=group_size % INT4_PACK == 0,
                               BLOCK_N=cfg.block_n, BLOCK_KP=cfg.block_kp, num_warps=cfg.num_warps)
    return out


def w4a16_dequant_linear(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                         group_size: int, perm: torch.Tensor | None, bias: torch.Tensor | None, w: torch.Tensor,
                         cfg: DequantConfig = DequantConfig()) -> torch.Tensor:
    """x2 (M, K) @ dequant(qweight).T + bias through w (N, K) in x2's dtype (a scratch: overwritten)."""
    if w.dtype != x2.dtype:
        raise ValueError(f"the scratch's dtype {w.dtype} is not the activation's {x2.dtype}")
    dequant_int4_into(qweight, scales, zeros, group_size, w, cfg)
    if perm is not None:
        x2 = x2.index_select(-1, perm)
    return F.linear(x2, w, bias)


class DequantScratch:
    """One device's dequantization buffer (bytes, viewed as each layer's (N, K) weight)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._buf: torch.Tensor | None = None
        self._captured = False  # a CUDA graph holds the buffer's address: it is never replaced

    @property
    def nbytes(self) -> int:
        return 0 if self._buf is None else self._buf.numel()

    def take(self, n: int, k: int, dtype: torch.dtype, capturing: bool) -> torch.Tensor | None:
        """An (N, K) view of the buffer, grown if needed; None inside a capture where it is too small."""
        need = n * k * dtype.itemsize
        if self._buf is not None and self._buf.numel() >= need:
            self._captured |= capturing
            return self._buf[:need].view(dtype).view(n, k)
        if capturing:
            return None
        if self._captured:
            return torch.empty(n, k, dtype=dtype, device=self.device)
        if self._buf is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the old buffer may still be read on another stream
        self._buf = None
        self._buf = torch.empty(need, dtype=torch.uint8, device=self.device)
        return self._buf.view(dtype).view(n, k)


scratch_for = tiles.per_device(DequantScratch)  # one scratch per device, reused by every layer
