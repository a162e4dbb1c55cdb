"""Start-up's tuned cuBLASLt GEMMs: this GPU model's table (kernels/gemm/tuned/, written by
benchmarks/kernels/cublaslt_tune.py) installed in the layers' GEMM choice memos (gemm.linear), each entry first
checked on the layer's own weight to give the same bits as torch's GEMM, so that no token changes."""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from radixlm.runtime.kernels.gemm import cublaslt
from radixlm.runtime.kernels.gemm.skinny_mma import MMA_MAX_M

logger = logging.getLogger(__name__)


def install(holders: list[tuple[str, object]], device: torch.device, table: list[dict] | None = None) -> int:
    """holders: (name, holder) of the GEMM choice memos (ModelRunner.gemm_holders); those with a weight and no bias
    take the table's entries for their shape (a memo shared by layers once). table: this GPU model's (default).
    Returns how many entries were installed."""
    if table is None:
        table = cublaslt.load_table(torch.cuda.get_device_name(device))
    entries: dict[tuple, list[dict]] = {}
    for entry in table:
        entries.setdefault((entry["n"], entry["k"], entry["dtype"]), []).append(entry)
    lt, installed, rejected = None, 0, []
    for _, holder in holders:
        weight, choices = getattr(holder, "weight", None), holder.gemm_choices
        if weight is None or getattr(holder, "bias", None) is not None or not weight.is_contiguous():
            continue
        n, k = weight.shape
        for entry in entries.get((n, k, str(weight.dtype).removeprefix("torch.")), []):
            m = entry["m"]
            if m <= MMA_MAX_M or isinstance(choices.get(m), cublaslt.LtGemm):
                continue
            lt = lt or cublaslt.CublasLt(device)
            workspace = entry.get("workspace", 0)  # bytes this configuration needs (own buffer: graphs replay it)
            gemm = cublaslt.LtGemm(lt, m, n, k, weight.dtype,
                                   torch.empty(workspace, dtype=torch.uint8, device=device) if workspace else None)
            algo = cublaslt.configured(gemm, entry["config"])
            if algo is not None:
                gemm.candidates = [algo]
                x = torch.randn(m, k, device=device, dtype=weight.dtype)
                if torch.equal(gemm(x, weight), F.linear(x, weight)):
                    choices[m] = gemm
                    installed += 1
                    continue
            rejected.append((n, k, m))
    if rejected:
        logger.warning("tuned cuBLASLt GEMMs not taken (not accepted here or not bit-identical to torch's): %s",
                       rejected)
    return installed
