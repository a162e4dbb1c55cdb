"""Start-up builds every kernel variant the grouped quantized MoE kernels launch while serving (radixlm's rule: no
Triton build after start-up), checked on the CPU with test_kernel_variants' recorder (the launches' cache keys by the
installed Triton's own binder; nothing runs): quant_moe.warm_up_grouped's keys cover those of passes of any token
count, per format, under expert parallelism too."""
from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from radixlm.runtime.kernels.moe.quant_moe_ref import quantize_experts  # noqa: E402
from tests.runtime.kernels.startup.test_kernel_variants import Recorder, _assert_covered  # noqa: E402


@pytest.mark.parametrize("fmt, static, expert_start, n_local, num_experts", [
    ("fp8_channel", None, 0, 8, 8), ("fp8_tensor", 0.05, 0, 8, 8), ("fp8_block", None, 4, 4, 8),
    ("int4_actorder", None, 0, 8, 8), ("int4", None, 4, 4, 8), ("int8", None, 0, 8, 8)])
def test_quant_moe_launches_while_serving_are_built_by_the_warm_up(monkeypatch, fmt, static, expert_start, n_local,
                                                                   num_experts):
    from radixlm.runtime.kernels.elementwise import fused_kernels as fk
    from radixlm.runtime.kernels.moe import fused_moe as fm
    from radixlm.runtime.kernels.moe import quant_moe as qm
    from radixlm.runtime.kernels.quant import fp8_act, splitk

    rec = Recorder(monkeypatch, {"count": fm._count_kernel, "offsets": fm._offsets_kernel,
                                 "scatter": fm._scatter_kernel, "gemm": qm._quant_grouped_kernel,
                                 "silu": fk._silu_and_mul_kernel, "rows": fp8_act._quant_rows_kernel,
                                 "groups": fp8_act._quant_groups_kernel, "reduce": splitk._reduce_splits_kernel})
    monkeypatch.setattr(qm, "grouped_supported", lambda *a: True)
    k, h, i, dtype = 2, 1024, 128, torch.bfloat16  # K = 1024: the decode config splits K at few tokens
    w13 = quantize_experts(torch.zeros(n_local, 2 * i, h), fmt, group=128, dtype=dtype, static_input=static)
    w2 = quantize_experts(torch.zeros(n_local, h, i), fmt, group=128, dtype=dtype, static_input=static)
    rng = random.Random(5)

    def launch(t):
        ids = torch.tensor([rng.sample(range(num_experts), k) for _ in range(t)], dtype=torch.int32)
        qm.fused_experts_quant(torch.zeros(t, h, dtype=dtype), w13, w2, torch.ones(t, k), ids, expert_start,
                               num_experts)

    n = qm.warm_up_grouped(w13, w2, k, expert_start, num_experts, dtype, "cpu")
    warm = rec.take()
    assert n == len(qm.reachable_variants(fm.TRITON_CHUNK_TOKENS, k, n_local, dtype))
    for t in [1, 2, 3, 7, 8, 16, 64, 65, 100, 200, 300, 511, 513, 1000] + [rng.randrange(1, 1200) for _ in range(6)]:
        launch(t)
    serving = rec.take()
    fp8 = fmt.startswith("fp8")
    assert serving["gemm"] and ("reduce" in serving) and (fp8 == bool(serving.get("rows") or serving.get("groups")))
    _assert_covered(warm, serving)
