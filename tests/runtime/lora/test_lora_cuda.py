"""Multi-LoRA on CUDA (skipped without a GPU): CUDA-graph decode with adapters (one capture, the gather kernels)
equals eager passes (the segment kernels) and the PEFT-merged models token for token in float32, for mixes of four
adapters and the base model over batches that replay several graph sizes, padded; and no Triton kernel is built after
start-up with adapters in use (benchmarks/startup/compile_count_gpu.py --configs lora)."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

import radixlm
from tests.runtime.lora.tiny_adapters import ALL, make_adapter
from tests.runtime.models.tiny import hf_greedy, random_prompts, save_tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

COMMON = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
NEW = 10
SP = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
ADAPTERS = {"a0": (1, 16, 16, ALL), "a1": (2, 4, 8, ["q_proj", "v_proj"]), "a2": (3, 8, 8, ["o_proj", "down_proj"]),
            "a3": (4, 16, 32, ["k_proj", "up_proj", "gate_proj"])}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-cuda")
    hf = save_tiny(LlamaConfig(**COMMON), root / "base", seed=0)
    prompts = random_prompts(0, [5, 9, 14], COMMON["vocab_size"])
    refs = {None: [t for t, _ in hf_greedy(hf, prompts, [], NEW)]}
    for name, (seed, r, alpha, targets) in ADAPTERS.items():
        merged = make_adapter(hf, root / name, seed, r, alpha, targets)
        refs[name] = [t for t, _ in hf_greedy(merged, prompts, [], NEW)]
    return root, prompts, refs


def test_cuda_graph_decode_with_adapters_equals_eager_and_peft(tiny):
    root, prompts, refs = tiny
    names = ["a2", None, "a0", "a3", "a1", "a0", None, "a1", "a3", "a2", "a0"]
    batch = [prompts[i % 3] for i in range(len(names))]
    want = [refs[n][i % 3] for i, n in enumerate(names)]
    common = dict(dtype="float32", device="cuda", max_total_tokens=4096, max_loras_per_batch=4, max_lora_rank=16,
                  lora_paths=[f"{n}={root / n}" for n in ADAPTERS], cuda_graph_max_bs=8)
    outs = {}
    for graphs in (True, False):
        with radixlm.Engine(str(root / "base"), disable_cuda_graph=not graphs, **common) as engine:
            assert (engine.runner.graph_runner is not None) == graphs
            if graphs:
                assert engine.runner.graph_runner.lora_inputs is not None
            got = [o["output_ids"] for o in engine.generate(input_ids=batch, sampling_params=SP, lora_path=names)]
            # Batches of 1..11 rows: graphs of 1, 2, 4 and 8 rows (padded), and eager past 8.
            for n in (1, 3, 6):
                alone = engine.generate(input_ids=batch[:n], sampling_params=SP, lora_path=names[:n])
                assert [o["output_ids"] for o in alone] == want[:n], (graphs, n)
            outs[graphs] = got
    assert outs[True] == outs[False] == want


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
