"""compressed-tensors W4A16 checkpoints made by the library itself (its W4A16 / W4A16_ASYM presets, its
calculate_qparams and pack-quantized compressor), dense and MoE: radixlm's greedy tokens equal transformers' on the
library's decompressed weights (float32, CPU). The real model (SmolLM2-135M): test_real_model.py."""
from __future__ import annotations

import pytest

from tests.runtime.quantization.ct_checkpoints import quantize_ct, scheme
from tests.runtime.quantization.helpers import assert_greedy_matches, dense_config, moe_config, tiny_float

PACKED = "pack-quantized"
MOE_IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$", "re:.*shared_expert_gate$"]
SCHEMES = {
    "w4a16-group": lambda: scheme("W4A16", group_size=32),
    "w4a16-asym-group": lambda: scheme("W4A16_ASYM", group_size=16),
    "w4a16-channel": lambda: scheme("W4A16", strategy="channel", group_size=None),
}


@pytest.mark.parametrize("name, kind", [("w4a16-group", "llama"), ("w4a16-asym-group", "qwen2"),
                                        ("w4a16-channel", "llama"), ("w4a16-asym-group", "mixtral"),
                                        ("w4a16-group", "qwen2_moe")])
def test_library_made_w4a16(name, kind, tmp_path):
    config = moe_config(kind) if kind in ("mixtral", "qwen2_moe") else dense_config(kind)
    tiny_float(tmp_path / "m", config, seed=21)
    hf = quantize_ct(tmp_path / "m", {"group_0": SCHEMES[name]()}, PACKED,
                     ignore=MOE_IGNORE if kind in ("mixtral", "qwen2_moe") else ["lm_head"])
    assert_greedy_matches(tmp_path / "m", hf)
