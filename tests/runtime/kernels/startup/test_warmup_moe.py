"""Start-up's MoE warm-up (kernels/startup/warmup.py warm_up_moe) with quantized experts: a method with grouped kernels
(kernels.moe.quant_moe) warms those, once per distinct layer, without dequantizing; a layer the grouped kernels do not
take (grouped_experts None) warms the float kernel on its dequantized experts. On the CPU (the device check forced)
with the launches recorded."""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from tests.runtime.quantization.test_moe_grouped import _layer, _methods


def test_warm_up_moe_builds_the_grouped_kernels_of_quantized_experts(monkeypatch):
    from radixlm.runtime.kernels.moe import quant_moe
    from radixlm.runtime.kernels.startup import warmup

    methods = _methods()
    fp8, int4, int8 = methods["fp8 block"], methods["gptq act-order"], methods["int8"]
    layers = [_layer(fp8, seed=0), _layer(fp8, seed=1), _layer(int4), _layer(int8)]
    grouped, float_runs, dequantized = [], [], []
    monkeypatch.setattr(quant_moe, "grouped_supported", lambda *a: True)
    monkeypatch.setattr(quant_moe, "warm_up_grouped", lambda *a, **kw: grouped.append(a))
    monkeypatch.setattr(warmup, "fused_experts_triton", lambda *a, **kw: float_runs.append(kw["config"]))
    monkeypatch.setattr(type(int8), "grouped_experts", lambda *a: None)  # as on a GPU the kernels do not take
    real = type(int8).dequantized
    monkeypatch.setattr(type(int8), "dequantized", lambda *a: dequantized.append(a[2]) or real(*a))
    runner = SimpleNamespace(model=nn.ModuleList(layers), device="cpu",
                             model_config=SimpleNamespace(dtype=torch.bfloat16))
    warmup.warm_up_moe(runner)
    # The two FP8 layers alike build once; the INT4 layer its own (act-order perms): the experts as loaded.
    assert len(grouped) == 2
    (w13, w2, top_k, start, num, dtype, device), (i13, *_rest) = grouped
    assert w13.weight is layers[0].w13_weight and w13.block == (32, 32) and w2.scale is layers[0].w2_weight_scale
    assert (top_k, start, num, dtype) == (2, 0, 4, torch.bfloat16) and i13.perm is not None
    # The INT8 layer without grouped kernels: the float kernel on its dequantized experts, every reachable config.
    assert dequantized == ["w13", "w2"] and float_runs
