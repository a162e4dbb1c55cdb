"""Mixture-of-experts on 2 gloo ranks equals 1 rank (float32, to rounding), with the intermediate dim split over the
ranks (ep_size 1) and with whole experts per rank (ep_size 2): the FusedMoE layer alone, and tiny Mixtral and
Qwen2-MoE models (shared expert, a dense layer) loaded from safetensors by each rank, and the same models with dummy
weights (drawn whole and sliced by each rank: every layout holds the same model)."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.distributed.parallel import SINGLE
from radixlm.runtime.layers.moe import FusedMoE
from tests.runtime.distributed.harness import run_ranks
from tests.runtime.models.test_moe_parity import COMMON
from tests.runtime.models.tiny import save_tiny

NUM_EXPERTS, TOP_K, HIDDEN, INTER, TOKENS = 8, 3, 32, 24, 13


def _layer_weights():
    g = torch.Generator().manual_seed(0)
    return {"gate": torch.randn(NUM_EXPERTS, INTER, HIDDEN, generator=g) * 0.2,
            "up": torch.randn(NUM_EXPERTS, INTER, HIDDEN, generator=g) * 0.2,
            "down": torch.randn(NUM_EXPERTS, HIDDEN, INTER, generator=g) * 0.2,
            "x": torch.randn(TOKENS, HIDDEN, generator=g), "logits": torch.randn(TOKENS, NUM_EXPERTS, generator=g)}


def _layer(parallel, w):
    moe = FusedMoE(NUM_EXPERTS, TOP_K, HIDDEN, INTER, renormalize=True, parallel=parallel)
    loaded = set()
    for e in range(NUM_EXPERTS):
        for part, pname in (("gate", "w13_weight"), ("up", "w13_weight"), ("down", "w2_weight")):
            moe.load_weight(pname, getattr(moe, pname), w[part][e], (e, part))
            loaded.add((pname, (e, part)))
    held = {(p, s) for p in ("w13_weight", "w2_weight") for s in moe.weight_shards(p)}
    assert held <= loaded
    return moe(w["x"], w["logits"]), (moe.num_local_experts, moe.local_intermediate)


def _dense_helpers():
    """tests/runtime/models/conftest.py's dense attention (the ranks are fresh processes: no fixtures there)."""
    import tests.runtime.models.conftest as mod

    return mod


def _models(parallel, model_dirs, ids):
    from transformers import AutoConfig

    from radixlm.runtime.model_loader.loader import (initialize_dummy_weights, safetensors_files,
                                                     safetensors_weights_iterator)
    from radixlm.runtime.models.registry import get_model_class

    dense = _dense_helpers()
    out = {}
    for name, path in model_dirs.items():
        config = AutoConfig.from_pretrained(path)
        for key, load in ((name, lambda m: m.load_weights(safetensors_weights_iterator(safetensors_files(path)))),
                          (f"{name}, dummy weights", initialize_dummy_weights)):
            model = get_model_class(config.architectures[0])(config, parallel).eval()
            load(model)
            fb = dense.dense_forward_batch(ids)
            with torch.inference_mode():
                out[key] = model(fb.input_ids, fb.positions, fb)
    return out


def _rank(parallel, w, model_dirs, ids):
    return _layer(parallel, w), _models(parallel, model_dirs, ids)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from transformers import MixtralConfig, Qwen2MoeConfig

    common = {**COMMON, "hidden_size": HIDDEN, "num_hidden_layers": 2}
    configs = {
        "mixtral": MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2),
        "qwen2-moe": Qwen2MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                    shared_expert_intermediate_size=24, mlp_only_layers=[0]),
    }
    dirs = {}
    for name, config in configs.items():
        path = tmp_path_factory.mktemp(name)
        save_tiny(config, path, seed=3)
        dirs[name] = str(path)
    return dirs


@pytest.mark.parametrize("ep_size", [1, 2])
def test_two_ranks_equal_one(ep_size, tiny_models):
    torch.set_num_threads(1)
    w = _layer_weights()
    ids = torch.randint(0, 211, (19,), generator=torch.Generator().manual_seed(4))
    (ref_out, _), ref_models = _rank(SINGLE, w, tiny_models, ids)
    results = run_ranks(2, _rank, w, tiny_models, ids, ep_size=ep_size)
    for rank, ((out, held), models) in enumerate(results):
        assert held == ((NUM_EXPERTS, INTER // 2) if ep_size == 1 else (NUM_EXPERTS // 2, INTER))
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
        for name, ref in ref_models.items():
            torch.testing.assert_close(models[name], ref, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}, rank {rank}: {m}")
