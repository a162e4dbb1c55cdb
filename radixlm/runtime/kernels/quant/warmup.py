"""Start-up's builds of the quantized GEMMs' kernel variants (radixlm's rule: no Triton compile once serving starts).

A quantized GEMM's variants follow its weight (shape, dtype, group or block size, bias, permutation: fixed per layer)
and the row bucket of the call (tiles.ROW_BUCKETS picks the tile config and the K split); the row count itself is
never specialized on. So one call per bucket (tiles.warmup_rows) on a layer's own tensors builds every variant that
layer can launch, however many rows serving gives it. kernels.startup calls warm_up_linear for each quantized layer."""
from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.runtime.kernels.quant.tiles import warmup_rows


def warm_up_linear(apply: Callable[[torch.Tensor], torch.Tensor], in_features: int, dtype: torch.dtype,
                   device: torch.device | str, max_rows: int | None = None, extra_rows: tuple[int, ...] = ()) -> int:
    """Runs apply(x) on zero inputs of each bucket's first row count and of extra_rows (a path chosen by row count
    outside the buckets: dispatch.int4_warmup_rows), up to max_rows rows (the most a pass can have; None: all);
    returns how many calls ran."""
    rows = sorted({m for m in (*warmup_rows(), *extra_rows) if max_rows is None or m <= max_rows})
    for m in rows:
        apply(torch.zeros(m, in_features, dtype=dtype, device=device))
    return len(rows)
