"""The decode LoRA kernels' launch parameters (kernels/lora/config.py): bounds, the K split and expand chunk they give
at Llama-3.1-8B's shapes, a GPU model's tuned table read back; and the padded table's bounds (lora/blocks.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from radixlm.runtime.kernels.lora import config as lora_config
from radixlm.runtime.kernels.lora.config import LoraDecodeConfig
from radixlm.runtime.lora.blocks import PaddedLayout, max_blocks


def test_config_bounds():
    for bad in (dict(block_m=8), dict(expand_block_n=96), dict(splits=0), dict(splits=33), dict(expand_programs=0),
                dict(min_split_k=200)):
        with pytest.raises(ValueError):
            LoraDecodeConfig(**bad)


def test_split_and_chunk_at_llama8b_shapes():
    c = LoraDecodeConfig()
    assert c.split_k(4096) == 256 and c.split_k(14336) == 896  # 16 splits of whole BLOCK_K tiles
    assert LoraDecodeConfig(splits=4).split_k(4096) == 1024 and c.split_k(300) == 256  # at least min_split_k
    blocks = max_blocks(64, 32, c.block_m)  # 64 rows over 32 adapters: 36 blocks reserved
    assert blocks == 36
    assert c.tiles_per_program(28672, blocks) == 7 and c.tiles_per_program(4096, blocks) == 1
    assert LoraDecodeConfig(expand_programs=1).tiles_per_program(6144, 2) == 48  # never past the tiles there are


def test_tuned_table_is_read_back(tmp_path, monkeypatch):
    path = tmp_path / "lora_decode_gpu.json"
    monkeypatch.setattr(lora_config, "table_path", lambda name: path)
    lora_config.tuned_config.cache_clear()
    try:
        assert lora_config.tuned_config("Some GPU") == LoraDecodeConfig()  # no table: the defaults
        lora_config.tuned_config.cache_clear()
        path.write_text(json.dumps({"config": LoraDecodeConfig(splits=8, expand_programs=264).as_dict()}))
        assert lora_config.tuned_config("Some GPU") == LoraDecodeConfig(splits=8, expand_programs=264)
    finally:
        lora_config.tuned_config.cache_clear()
    assert lora_config.config_for("cpu") == LoraDecodeConfig()


def test_padded_layout_bounds():
    layout = PaddedLayout(8, max_blocks(8, 2, 16), 16)
    t = layout.table([1, -1, 1, 0])
    slots, block_slots, block_rows = layout.fields(t, 4, layout.blocks_cap)
    assert slots.tolist() == [1, -1, 1, 0] and block_slots.tolist() == [0, 1, -1]
    assert np.array_equal(block_rows.reshape(-1, 16)[:, :3], [[3, -1, -1], [0, 2, -1], [-1, -1, -1]])
    with pytest.raises(ValueError, match="exceed"):
        layout.table([0] * 9)
    with pytest.raises(ValueError, match="too few"):
        PaddedLayout(40, 2, 16).table([0] * 40)
    with pytest.raises(ValueError, match="multiple"):
        PaddedLayout(8, 2, 6)
