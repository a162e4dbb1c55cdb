"""Start-up's tuned cuBLASLt GEMMs: this GPU model's tables (kernels/gemm/tuned/, written by
benchmarks/kernels/cublaslt_tune.py) installed in the layers' GEMM choice memos (gemm.linear), each entry first
checked on the layer's own weight to give the same bits as torch's GEMM, so that no token changes.

FP8 layers (float8_e4m3fn weights with per-channel or per-tensor scales and dynamic per-token activations: the
kernels.quant fp8_scaled_linear path) take the FP8 table's entries (cublaslt_fp8_<GPU>.json). Those may split K, so
they are checked against torch._scaled_mm to within FP8_CLOSE (bit for bit where the entry says identical) and to give
the same bits at a second call."""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from radixlm.runtime.kernels.gemm import cublaslt
from radixlm.runtime.kernels.gemm.skinny_mma import MMA_MAX_M

logger = logging.getLogger(__name__)

FP8_CLOSE = 2e-3  # relative to the output's norm: benchmarks/kernels/cublaslt_tune.py's acceptance
_FP8 = torch.float8_e4m3fn


def load_tables(device: torch.device) -> list[dict]:
    """This GPU model's entries: 16-bit GEMMs', then FP8 ones'."""
    name = torch.cuda.get_device_name(device)
    return cublaslt.load_table(name) + cublaslt.load_table(name, "cublaslt_fp8")


def _fp8_operands(holder) -> tuple[torch.Tensor, torch.Tensor] | None:
    """An FP8 layer's (weight, (N,) float32 scale) where its GEMM is the row-wise scaled one, else None."""
    scale = getattr(holder, "weight_scale", None)
    if (scale is None or getattr(holder, "weight_block", None) is not None
            or getattr(holder, "input_scale", None) is not None):
        return None
    n = holder.weight.shape[0]
    return holder.weight, scale.to(torch.float32).reshape(-1).expand(n).contiguous()


def _same_as_torch(gemm: cublaslt.LtGemm, holder, entry: dict, device: torch.device) -> bool:
    """Whether the configured GEMM gives torch's result on the layer's own weight (16-bit: the same bits; FP8:
    torch._scaled_mm's to FP8_CLOSE, or its bits where the entry says identical, and its own bits again)."""
    x = torch.randn(gemm.m, gemm.k, device=device, dtype=torch.bfloat16 if gemm.dtype == _FP8 else gemm.dtype)
    if gemm.dtype != _FP8:
        return torch.equal(gemm(x, holder.weight), F.linear(x, holder.weight))
    from radixlm.runtime.kernels.quant.fp8_act import quant_fp8_per_token

    weight, w_scale = _fp8_operands(holder)
    q, s = quant_fp8_per_token(x)
    ref = torch._scaled_mm(q, weight.t(), s, w_scale.reshape(1, -1), out_dtype=torch.bfloat16).float()
    out = gemm(q, weight, None, s.reshape(-1), w_scale)
    if not torch.equal(out, gemm(q, weight, None, s.reshape(-1), w_scale)):
        return False
    if entry.get("identical", False):
        return torch.equal(out.float(), ref)
    return ((out.float() - ref).norm() / ref.norm()).item() < FP8_CLOSE


def install(holders: list[tuple[str, object]], device: torch.device, table: list[dict] | None = None) -> int:
    """holders: (name, holder) of the GEMM choice memos (ModelRunner.gemm_holders); those with a weight and no bias
    take the table's entries for their shape (a memo shared by layers once). table: this GPU model's (default).
    Returns how many entries were installed."""
    if table is None:
        table = load_tables(device)
    entries: dict[tuple, list[dict]] = {}
    for entry in table:
        entries.setdefault((entry["n"], entry["k"], entry["dtype"]), []).append(entry)
    lt, installed, rejected = None, 0, []
    for _, holder in holders:
        weight, choices = getattr(holder, "weight", None), holder.gemm_choices
        if weight is None or getattr(holder, "bias", None) is not None or not weight.is_contiguous():
            continue
        if weight.dtype == _FP8 and _fp8_operands(holder) is None:
            continue
        n, k = weight.shape
        for entry in entries.get((n, k, str(weight.dtype).removeprefix("torch.")), []):
            m = entry["m"]
            if m <= MMA_MAX_M or isinstance(choices.get(m), cublaslt.LtGemm):
                continue
            lt = lt or cublaslt.CublasLt(device)
            workspace = entry.get("workspace", 0)  # bytes this configuration needs (own buffer: graphs replay it)
            fp8 = weight.dtype == _FP8
            gemm = cublaslt.LtGemm(lt, m, n, k, weight.dtype,
                                   torch.empty(workspace, dtype=torch.uint8, device=device) if workspace else None,
                                   out_dtype=torch.bfloat16 if fp8 else None,
                                   scales=cublaslt.LtScale.ROW if fp8 else cublaslt.LtScale.NONE)
            algo = cublaslt.configured(gemm, entry["config"])
            if algo is not None:
                gemm.candidates = [algo]
                if _same_as_torch(gemm, holder, entry, device):
                    choices[m] = gemm
                    installed += 1
                    continue
            rejected.append((n, k, m))
    if rejected:
        logger.warning("tuned cuBLASLt GEMMs not taken (not accepted here or not the same as torch's): %s",
                       rejected)
    return installed
