"""benchmarks/lib/lora.py's dummy adapters load as PEFT adapters of the model they are made for."""
from __future__ import annotations

import json

import torch

from benchmarks.lib.lora import ALL_TARGETS, write_dummy_adapter
from radixlm.runtime.args.choices import LORA_TARGET_MODULES
from radixlm.runtime.lora.adapter import HostAdapter


def test_dummy_adapter_reads_back(tmp_path):
    config = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    path = write_dummy_adapter(str(tmp_path), str(tmp_path / "a"), rank=4, dtype="float32")
    adapter = HostAdapter.read("id", "a", path, 2, torch.float32, LORA_TARGET_MODULES, 16)
    assert adapter.rank == 4 and adapter.config.target_modules == ALL_TARGETS and len(adapter.weights) == 14
    a, b = adapter.weights[(1, "k_proj")]
    assert a.shape == (4, 32) and b.shape == (16, 4)
