"""INT4 checkpoints on 2 gloo ranks equal 1 rank (float32, to rounding): the column-parallel slices of packed
outputs, the row-parallel slices of codes with every group kept (act-order, one group per channel), experts split by
the intermediate dim and whole experts per rank; and dummy weights in each format (drawn whole, quantized, sliced:
every layout holds the same model)."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.distributed.parallel import SINGLE
from tests.runtime.distributed.harness import run_ranks
from tests.runtime.quantization.int4_checkpoints import Int4Spec
from tests.runtime.quantization.test_int4_models import VOCAB, make_int4

MOE = "-moe-"
CASES = {
    "gptq-llama-actorder-asym": ("llama", Int4Spec("gptq", 16, sym=False, act_order=True)),
    "awq-qwen2-g-1": ("qwen2", Int4Spec("awq", -1)),
    "ct-llama-asym": ("llama", Int4Spec("compressed-tensors", 16, sym=False)),
    "gptq-moe-mixtral-actorder": ("mixtral", Int4Spec("gptq", 16, sym=True, act_order=True)),
    "awq-moe-qwen2": ("qwen2_moe", Int4Spec("awq", 16)),
}


def _logits(parallel, dirs: dict[str, str], ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each checkpoint's last hidden states, loaded and dummy; the MoE ones also with whole experts per rank."""
    import dataclasses

    import tests.runtime.models.conftest as dense
    from radixlm.runtime.model_loader.config import ModelConfig
    from radixlm.runtime.model_loader.loader import load_model

    torch.set_num_threads(1)
    layouts = {"": parallel, ", ep": dataclasses.replace(parallel, ep_size=parallel.tp_size)}
    out = {}
    for name, path in dirs.items():
        for suffix, par in layouts.items():
            if suffix and MOE not in name:
                continue
            for fmt in ("auto", "dummy"):
                model = load_model(ModelConfig.from_path(path, dtype="float32"), load_format=fmt, parallel=par)
                fb = dense.dense_forward_batch(ids)
                with torch.inference_mode():
                    out[f"{name}, {fmt}{suffix}"] = model(fb.input_ids, fb.positions, fb)
    return out


@pytest.fixture(scope="module")
def int4_dirs(tmp_path_factory):
    return {name: str(make_int4(tmp_path_factory.mktemp(name), kind, spec, seed=7)[0])
            for name, (kind, spec) in CASES.items()}


def test_two_ranks_equal_one(int4_dirs):
    ids = torch.randint(0, VOCAB, (13,), generator=torch.Generator().manual_seed(4))
    ref = _logits(SINGLE, int4_dirs, ids)
    assert len(ref) == 2 * len(CASES) + 2 * sum(MOE in n for n in CASES)
    for rank, got in enumerate(run_ranks(2, _logits, int4_dirs, ids)):
        for key, want in ref.items():
            assert torch.isfinite(want).all()
            torch.testing.assert_close(got[key], want, rtol=1e-4, atol=1e-4, msg=lambda m: f"{key}, rank {rank}: {m}")
