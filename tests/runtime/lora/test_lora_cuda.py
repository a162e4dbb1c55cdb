"""Multi-LoRA on CUDA (skipped without a GPU): CUDA-graph decode with adapters (one capture, the graph form)
equals eager passes (the eager form: blocks of 64) token for token in float32, for mixes of four adapters (ranks 4
to 16, partial fused projections) and the base model over batches that replay graphs of several sizes, padded; and no
Triton kernel is built after start-up with adapters in use (benchmarks/startup/compile_count_gpu.py --configs lora).
Adapters from benchmarks/lib/lora.py (no peft needed on the GPU machine); the CPU tests hold the PEFT comparisons."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

import radixlm
from benchmarks.lib.lora import write_dummy_adapter
from tests.runtime.models.tiny import random_prompts, save_tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

COMMON = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
NEW = 10
SP = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
ADAPTERS = {"a0": (16, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
            "a1": (4, ("q_proj", "v_proj")), "a2": (8, ("o_proj", "down_proj")),
            "a3": (16, ("k_proj", "up_proj", "gate_proj"))}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-cuda")
    save_tiny(LlamaConfig(**COMMON), root / "base", seed=0)
    for i, (name, (rank, targets)) in enumerate(ADAPTERS.items()):
        write_dummy_adapter(str(root / "base"), str(root / name), rank=rank, alpha=2.0 * rank, seed=i,
                            targets=targets, dtype="float32", b_scale=0.5)
    return root, random_prompts(0, [5, 9, 14], COMMON["vocab_size"])


def test_cuda_graph_decode_with_adapters_equals_eager(tiny):
    root, prompts = tiny
    names = ["a2", None, "a0", "a3", "a1", "a0", None, "a1", "a3", "a2", "a0"]
    batch = [prompts[i % 3] for i in range(len(names))]
    common = dict(dtype="float32", device="cuda", max_total_tokens=4096, max_loras_per_batch=4, max_lora_rank=16,
                  lora_paths=[f"{n}={root / n}" for n in ADAPTERS], cuda_graph_max_bs=8)
    outs = {}
    for graphs in (True, False):
        with radixlm.Engine(str(root / "base"), disable_cuda_graph=not graphs, **common) as engine:
            assert (engine.runner.graph_runner is not None) == graphs
            assert not graphs or engine.runner.graph_runner.lora_inputs is not None
            runs = [engine.generate(input_ids=batch, sampling_params=SP, lora_path=names)]  # 11 rows: eager past 8
            # Graphs of 1, 4 and 8 rows, padded; a batch of one adapter; the base model alone
            for n in (1, 3, 6):
                runs.append(engine.generate(input_ids=batch[:n], sampling_params=SP, lora_path=names[:n]))
            runs.append(engine.generate(input_ids=batch[:5], sampling_params=SP, lora_path=["a0"] * 5))
            runs.append(engine.generate(input_ids=batch[:2], sampling_params=SP))
            outs[graphs] = [[o["output_ids"] for o in run] for run in runs]
    assert outs[True] == outs[False]
    first = outs[True][0]
    assert first[0] != first[3] and first[1] != first[4]  # the adapters change the answers (prompts 0 and 1)
    assert outs[True][4][1] != first[1]  # a0 on prompt 1 is not the base model's answer


def test_cuda_no_triton_compile_after_start_up_with_adapters(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    out = tmp_path / "compile_count.json"
    proc = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "startup" / "compile_count_gpu.py"), "--model", "tiny",
         "--dtype", "bfloat16", "--scale", "tiny", "--engine-args", json.dumps({"cuda_graph_max_bs": 64}),
         "--out", str(out), "--configs", "lora"], cwd=repo, capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert "error" not in row, row.get("error")
    assert row["compiles_at_startup"] > 0
    assert row["compiles_after_startup"] == 0, row["compiled_after_startup"]
