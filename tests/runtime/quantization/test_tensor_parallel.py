"""Quantized models on 2 gloo ranks equal 1 rank (float32, to rounding): FP8 per-tensor with static activation
scales, per-channel, block scales, online FP8, compressed-tensors FP8 and W8A8-INT8, ModelOpt FP8, dense and MoE (the
intermediate dim split, and whole experts per rank), loaded from their checkpoints by each rank, and with dummy
weights (drawn whole and sliced: every layout holds the same model)."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.distributed.parallel import SINGLE
from tests.runtime.distributed.harness import run_ranks
from tests.runtime.quantization import fp8_checkpoints as fp8
from tests.runtime.quantization.ct_checkpoints import quantize_ct, scheme
from tests.runtime.quantization.helpers import dense_config, moe_config, quantize_saved, tiny_float

PER_TENSOR_STATIC = (lambda n, w: fp8.per_tensor(n, w, static=True), {"quant_method": "fp8",
                                                                      "activation_scheme": "static"})
BLOCK = (fp8.block(16, 16), {"quant_method": "fp8", "weight_block_size": [16, 16]})
PER_CHANNEL = (fp8.per_channel, {"quant_method": "w8a8_fp8"})
MODELOPT_CHANNEL = (fp8.per_channel, {"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"})


def _rank(parallel, cases, ids):
    from tests.runtime.models.conftest import dense_forward_batch
    from tests.runtime.quantization.helpers import load

    torch.set_num_threads(1)
    out = {}
    for name, (path, flag, load_format) in cases.items():
        model, _ = load(path, flag, load_format, parallel)
        fb = dense_forward_batch(ids)
        with torch.inference_mode():
            out[name] = model(fb.input_ids, fb.positions, fb)
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def make(name, config, fmt, flag=None, load_format="auto", ct=None):
        path = tmp_path_factory.mktemp(name)
        tiny_float(path, config, seed=7)
        if fmt is not None:
            quantize_saved(path, *fmt)
        if ct is not None:
            fmt = "int-quantized" if ct.weights.type == "int" else "float-quantized"
            quantize_ct(path, {"group_0": ct}, fmt, ignore=["lm_head"])
        made[name] = (str(path), flag, load_format)

    make("llama per-tensor static", dense_config("llama"), PER_TENSOR_STATIC)
    make("qwen2 per-channel", dense_config("qwen2"), PER_CHANNEL)
    make("llama block", dense_config("llama"), BLOCK)
    make("llama online", dense_config("llama"), None, flag="fp8")
    make("llama block, dummy", dense_config("llama"), BLOCK, load_format="dummy")
    make("mixtral per-tensor static", moe_config("mixtral"), PER_TENSOR_STATIC)
    make("qwen2-moe block", moe_config("qwen2_moe"), BLOCK)
    make("mixtral online, dummy", moe_config("mixtral"), None, flag="fp8", load_format="dummy")
    make("llama compressed-tensors static", dense_config("llama"), None, ct=scheme("FP8"))
    make("qwen2-moe compressed-tensors block", moe_config("qwen2_moe"), None, ct=scheme("FP8_BLOCK", block=(16, 16)))
    make("mixtral compressed-tensors int8", moe_config("mixtral"), None, ct=scheme("W8A8"))
    make("mixtral modelopt per-channel", moe_config("mixtral"), MODELOPT_CHANNEL)
    return made


@pytest.mark.parametrize("ep_size", [1, 2])
def test_two_ranks_equal_one(ep_size, checkpoints):
    torch.set_num_threads(1)
    cases = checkpoints if ep_size == 1 else {k: v for k, v in checkpoints.items() if "mixtral" in k or "moe" in k}
    ids = torch.randint(0, 97, (13,), generator=torch.Generator().manual_seed(2))
    ref = _rank(SINGLE, cases, ids)
    for rank, got in enumerate(run_ranks(2, _rank, cases, ids, ep_size=ep_size)):
        for name in cases:
            torch.testing.assert_close(got[name], ref[name], rtol=1e-4, atol=1e-4,
                                       msg=lambda m: f"{name}, rank {rank}: {m}")
