"""The grouped quantized MoE kernels (kernels/moe/quant_moe.py) against the dequantizing reference (quant_moe_ref.py)
on small shapes, on the CPU under TRITON_INTERPRET=1 in a subprocess: FP8 per tensor / per channel / blocks weight-only
and w8a8 (per token, static scale, per token group), INT8, INT4 with and without act-order; the decode and large-tile
configs, K split and not, an expert-parallel rank, K and N past a tile, float32 and float16 (the interpreter's
bfloat16 dots are wrong: bfloat16 runs in the CUDA tests)."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "quant moe cases passed"


def run_cases() -> None:
    from radixlm.runtime.kernels.moe.fused_moe import GemmConfig
    from radixlm.runtime.kernels.moe.quant_moe import fused_experts_quant
    from radixlm.runtime.kernels.moe.quant_moe_ref import fused_experts_quant_reference, quantize_experts
    from tests.runtime.kernels.moe.quant_moe_cases import rel_err, routed_problem
    from tests.runtime.kernels.quant.test_quant_kernels_interpreted import patch_interpreter_fp8_rounding

    patch_interpreter_fp8_rounding()
    decode, large = GemmConfig(16, 32, 32, 4, 2), GemmConfig(32, 64, 32, 4, 2)
    # fmt, dtype, w8a8, static input scale, config, split
    cases = [
        ("fp8_tensor", torch.float32, False, None, decode, False),
        ("fp8_channel", torch.float32, False, None, decode, True),
        ("fp8_block", torch.float32, False, None, large, None),
        ("fp8_block", torch.float16, False, None, decode, True),
        ("fp8_channel", torch.float16, True, None, large, None),
        ("fp8_tensor", torch.float16, True, 0.05, decode, True),
        ("fp8_block", torch.float16, True, None, large, None),
        ("int8", torch.float32, False, None, decode, None),
        ("int4", torch.float32, False, None, decode, True),
        ("int4", torch.float16, False, None, large, None),
        ("int4_actorder", torch.float16, False, None, decode, True),
        ("int4", torch.float16, False, None, GemmConfig(64, 32, 32, 4, 2), None),
        ("int4_actorder", torch.float32, False, None, large, False),
    ]
    # t, e, k, h, i, expert_start, n_local, num_experts: K and N past a tile; one rank of two under expert parallelism
    shapes = [(5, 8, 2, 96, 48, 0, 8, None), (7, 8, 3, 64, 32, 4, 4, 8)]
    for n, (fmt, dtype, w8a8, static, cfg, split) in enumerate(cases):
        for t, e, k, h, i, start, n_local, num_experts in shapes:
            x, w13f, w2f, weights, ids = routed_problem(t, e, k, h, i, dtype, num_experts, seed=n)
            w13f, w2f = w13f[start : start + n_local], w2f[start : start + n_local]
            w13 = quantize_experts(w13f, fmt, (32, 32), 16, dtype, static, seed=n)
            w2 = quantize_experts(w2f, fmt, (32, 32), 16, dtype, static, seed=n + 1)
            got = fused_experts_quant(x, w13, w2, weights, ids, start, num_experts, cfg, w8a8, split)
            want = fused_experts_quant_reference(x, w13, w2, weights, ids, start, w8a8)
            assert got.dtype == dtype and got.shape == want.shape
            tol = 1e-4 if dtype == torch.float32 else 1e-2
            err = rel_err(got, want)
            assert err <= tol, f"{fmt} {dtype} w8a8={w8a8} {cfg} split={split} shape {(t, e, k, h, i, start)}: {err}"
            if w8a8:  # and within FP8's rounding of the activations of the weight-only reference
                assert rel_err(got, fused_experts_quant_reference(x, w13, w2, weights, ids, start)) < 0.1
    from radixlm.runtime.kernels.moe import quant_moe
    from radixlm.runtime.kernels.moe.quant_experts import W8A8_MIN_PAIRS_PER_EXPERT

    # The codes as 16-bit floats (INT4_FOLD, off by default) where a config has at most INT4_FOLD_MAX_BLOCK_M rows.
    x, w13f, w2f, weights, ids = routed_problem(5, 8, 2, 96, 48, torch.float16, seed=3)
    w13, w2 = (quantize_experts(w, "int4", (32, 32), 16, torch.float16, None, seed=s) for s, w in enumerate((w13f, w2f)))
    old, quant_moe.INT4_FOLD_MAX_BLOCK_M = quant_moe.INT4_FOLD_MAX_BLOCK_M, 32
    try:
        err = rel_err(fused_experts_quant(x, w13, w2, weights, ids, 0, None, decode, False, True),
                      fused_experts_quant_reference(x, w13, w2, weights, ids, 0, False))
    finally:
        quant_moe.INT4_FOLD_MAX_BLOCK_M = old
    assert err <= 1e-2, ("int4 fold", err)
    # The pass's own choices (config, w8a8 past W8A8_MIN_PAIRS_PER_EXPERT pairs an expert, split) at 1 and 120 tokens.
    for t in (1, 120):
        x, w13f, w2f, weights, ids = routed_problem(t, 4, 2, 64, 32, torch.float16, seed=t)
        w13, w2 = (quantize_experts(w, "fp8_channel") for w in (w13f, w2f))
        w8a8 = t * 2 / 4 > W8A8_MIN_PAIRS_PER_EXPERT
        err = rel_err(fused_experts_quant(x, w13, w2, weights, ids),
                      fused_experts_quant_reference(x, w13, w2, weights, ids, 0, w8a8))
        assert err <= 1e-2, (t, err)
    # Token chunks of a long prefill give the unchunked result; no tokens, no launch.
    x, w13f, w2f, weights, ids = routed_problem(11, 4, 2, 64, 32, torch.float32, seed=7)
    w13, w2 = (quantize_experts(w, "int4", group=16) for w in (w13f, w2f))
    whole = fused_experts_quant(x, w13, w2, weights, ids)
    old, quant_moe.TRITON_CHUNK_TOKENS = quant_moe.TRITON_CHUNK_TOKENS, 4
    try:
        torch.testing.assert_close(fused_experts_quant(x, w13, w2, weights, ids), whole, rtol=1e-6, atol=1e-6)
    finally:
        quant_moe.TRITON_CHUNK_TOKENS = old
    assert fused_experts_quant(x[:0], w13, w2, weights[:0], ids[:0]).shape == (0, 64)
    print(MARKER)


def test_bad_experts_are_refused():
    """Shapes and layouts are checked before any launch (on the CPU, no interpreter needed)."""
    from radixlm.runtime.kernels.moe.quant_moe import Int4Experts, ScaledExperts, fused_experts_quant
    from radixlm.runtime.kernels.moe.quant_moe_ref import quantize_experts
    from tests.runtime.kernels.moe.quant_moe_cases import routed_problem

    x, w13f, w2f, weights, ids = routed_problem(3, 4, 2, 64, 32, torch.float32)
    w13, w2 = quantize_experts(w13f, "fp8_channel"), quantize_experts(w2f, "fp8_channel")
    with pytest.raises(ValueError, match="shapes do not agree"):
        fused_experts_quant(x[:, :32], w13, w2, weights, ids)
    with pytest.raises(ValueError, match="scale"):
        fused_experts_quant(x, ScaledExperts(w13.weight, w13.scale[:, :5]), w2, weights, ids)
    with pytest.raises(ValueError, match="float8_e4m3fn or int8"):
        fused_experts_quant(x, ScaledExperts(w13.weight.float(), w13.scale), w2, weights, ids)
    with pytest.raises(ValueError, match="block scales"):
        fused_experts_quant(x, ScaledExperts(w13.weight, w13.scale, (32, 24)), w2, weights, ids)
    i13, i2 = quantize_experts(w13f, "int4", group=16), quantize_experts(w2f, "int4", group=16)
    with pytest.raises(ValueError, match="zeros"):
        fused_experts_quant(x, Int4Experts(i13.qweight, i13.scales, i13.zeros[:, :1], 16), i2, weights, ids)
    with pytest.raises(ValueError, match="perm"):
        fused_experts_quant(x, Int4Experts(i13.qweight, i13.scales, i13.zeros, 16, torch.zeros(4, 3)), i2, weights,
                            ids)
    with pytest.raises(ValueError, match="topk_ids"):
        fused_experts_quant(x, i13, i2, weights, ids[:2])


@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs triton's interpreter, no CUDA")
def test_quant_moe_kernels_match_the_reference_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=300)


if __name__ == "__main__":
    torch.set_num_threads(1)
    run_cases()
