"""Weight updates without a restart on the offline Engine (a tiny random Llama saved twice with different seeds, and
once with another MLP width): from disk, from tensors and from a trainer process broadcasting over a gloo group; the
outputs become transformers' greedy answers of the new weights token for token, the radix cache is flushed, an update
that does not fit is refused with the old weights still serving, and requests in flight finish (or are aborted)
first."""
from __future__ import annotations

import copy
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig

import radixlm
from radixlm.runtime.kernels.gemm import cpu_gemm
from tests.runtime.models.tiny import hf_greedy, save_tiny
from tests.runtime.scheduler.conftest import TINY_LLAMA

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [100, 200, 300], [41, 42]]
NEW = 8
SP = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}


def _config(**over) -> LlamaConfig:
    return LlamaConfig(**{**{k: v for k, v in TINY_LLAMA.items() if k != "architectures"}, **over})


TRAINER = """
import sys
from safetensors.torch import load_file
from radixlm.runtime.distributed.weight_sync import join_weights_update_group
port, path = int(sys.argv[1]), sys.argv[2]
group = join_weights_update_group("127.0.0.1", port, rank=0, world_size=2, backend="gloo", timeout_s=180)
for name, tensor in sorted(load_file(path).items()):
    group.broadcast(tensor.contiguous())
sys.stdin.readline()  # the engine has left the group (the store this rank hosts outlives its clients)
group.destroy()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Checkpoints A and B (same shapes, other weights) with transformers' models, and C: A with a narrower MLP."""
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("weights")
    hf = {name: save_tiny(_config(), root / name, seed) for name, seed in (("A", 0), ("B", 1))}
    (root / "C").mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(root / "A" / f, root / "C" / f)
    narrow = {n: t[:, :96].contiguous() if n.endswith("down_proj.weight") else t
              for n, t in load_file(root / "A" / "model.safetensors").items()}
    save_file(narrow, root / "C" / "model.safetensors")
    return {"dir": {n: str(root / n) for n in ("A", "B", "C")}, "hf": hf}


def greedy(hf) -> list[list[int]]:
    return [ids for ids, _ in hf_greedy(hf, PROMPTS, frozenset(), NEW)]


@pytest.fixture(scope="module")
def trainer(ckpts):
    """The trainer process of the broadcast test (rank 0 of a gloo group), started with the module so that its
    interpreter and torch load while the other tests run; it waits for the engine to join."""
    port = _free_port()
    path = os.path.join(ckpts["dir"]["B"], "model.safetensors")
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(port), path], stdin=subprocess.PIPE)
    yield proc, port, path
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def engine(ckpts, trainer):
    e = radixlm.Engine(ckpts["dir"]["A"], dtype="float32", device="cpu", random_seed=0, max_total_tokens=2048,
                       enable_integrity_check=True, enable_memory_saver=True)
    yield e
    e.shutdown()


@pytest.fixture
def on_a(engine, ckpts):
    """The module's engine, serving A again after the test."""
    yield engine
    assert engine.update_weights_from_disk(ckpts["dir"]["A"])[0]


def outputs(engine) -> list[list[int]]:
    return [r["output_ids"] for r in engine.generate(input_ids=PROMPTS, sampling_params=SP)]


def test_update_from_disk_serves_the_new_weights(on_a, ckpts):
    engine = on_a
    assert outputs(engine) == greedy(ckpts["hf"]["A"])
    ok, message = engine.update_weights_from_disk(ckpts["dir"]["B"], weight_version="step-1")
    assert ok, message
    assert engine.get_weight_version() == "step-1"
    again = engine.generate(input_ids=PROMPTS[0], sampling_params=SP)
    assert again["meta_info"]["cached_tokens"] == 0  # the old weights' KV was flushed with the cache
    assert outputs(engine) == greedy(ckpts["hf"]["B"])
    assert engine.update_weights_from_disk(ckpts["dir"]["A"])[0]
    assert engine.get_weight_version() == "2"  # without a weight_version: the number of updates
    assert outputs(engine) == greedy(ckpts["hf"]["A"])


def test_an_update_that_does_not_fit_is_refused_and_the_old_weights_serve(engine, ckpts):
    before = outputs(engine)
    version = engine.get_weight_version()
    layer = engine.runner.model.model.layers[0].mlp.gate_up_proj
    up, packed = layer.dense_weight().clone(), layer.packed_weight
    refusals = {
        "shape": engine.update_weights_from_disk(ckpts["dir"]["C"]),
        "does not exist": engine.update_weights_from_disk(ckpts["dir"]["A"] + "-missing"),
        "load_format": engine.update_weights_from_disk(ckpts["dir"]["B"], load_format="dummy"),
        "rows": engine.update_weights_from_tensor([("model.layers.0.mlp.up_proj.weight", torch.ones(3, 64)),
                                                   ("model.norm.weight", torch.zeros(64))]),
        "does not have": engine.update_weights_from_tensor([("model.layers.0.mlp.up.weight", torch.ones(3, 64))]),
        "quantized": engine.update_weights_from_tensor([("model.norm.weight", torch.ones(64, dtype=torch.int8))]),
    }
    for expected, (ok, message) in refusals.items():
        assert not ok and expected in message and "old weights keep serving" in message, (expected, message)
    assert torch.equal(layer.dense_weight(), up)  # nothing written (the norm of the second refusal either)
    assert layer.packed_weight is packed and cpu_gemm.is_placeholder(layer.weight)  # refused: never unpacked
    assert outputs(engine) == before and engine.get_weight_version() == version


def test_update_from_tensors_whole_and_partial(on_a, ckpts):
    engine, hf_a, hf_b = on_a, ckpts["hf"]["A"], ckpts["hf"]["B"]
    ok, message = engine.update_weights_from_tensor(list(hf_b.state_dict().items()))
    assert ok, message
    assert outputs(engine) == greedy(hf_b)
    # One of the stacked projections (k, a shard of qkv_proj) and the head, through the layers' own loaders.
    names = ["model.layers.1.self_attn.k_proj.weight", "lm_head.weight"]
    mixed = copy.deepcopy(hf_b)
    with torch.no_grad():
        for name in names:
            mixed.get_parameter(name).copy_(hf_a.get_parameter(name))
    assert engine.update_weights_from_tensor([(n, hf_a.get_parameter(n).detach()) for n in names])[0]
    assert outputs(engine) == greedy(mixed)


def test_requests_in_flight_finish_first_or_are_aborted(on_a, ckpts):
    engine = on_a
    long_sp = {**SP, "max_new_tokens": 48}
    expected = engine.generate(input_ids=PROMPTS[1], sampling_params=long_sp)["output_ids"]
    stream = engine.generate(input_ids=PROMPTS[1], sampling_params=long_sp, stream=True)
    next(stream)  # running now
    weights_b = list(ckpts["hf"]["B"].state_dict().items())
    assert engine.update_weights_from_tensor(weights_b)[0]
    *_, last = stream
    assert last["output_ids"] == expected  # finished on the old weights before the update
    assert engine.update_weights_from_disk(ckpts["dir"]["A"])[0]
    stream = engine.generate(input_ids=PROMPTS[1], sampling_params={**long_sp, "max_new_tokens": 400}, stream=True)
    next(stream)
    assert engine.update_weights_from_tensor(weights_b, abort_all_requests=True)[0]
    *_, last = stream
    assert last["meta_info"]["finish_reason"]["type"] == "abort" and len(last["output_ids"]) < 400
    assert outputs(engine) == greedy(ckpts["hf"]["B"])


def test_a_trainer_process_broadcasts_new_weights_over_gloo(on_a, ckpts, trainer):
    """The trainer (rank 0, another process) broadcasts B's tensors in name order; the engine joins as rank 1."""
    from safetensors import safe_open

    engine, (proc, port, path) = on_a, trainer
    with safe_open(path, "pt") as f:
        metas = sorted((n, str(f.get_slice(n).get_dtype()), f.get_slice(n).get_shape()) for n in f.keys())
    dtypes = {"F32": "float32"}
    assert not engine.update_weights_from_distributed(["lm_head.weight"], ["float32"], [[512, 64]])[0]  # no group
    ok, message = engine.init_weights_update_group("127.0.0.1", port, rank_offset=1, world_size=2,
                                                   backend="gloo")
    assert ok, message
    ok, message = engine.update_weights_from_distributed([n for n, _, _ in metas], [dtypes[d] for _, d, _ in metas],
                                                         [s for _, _, s in metas], weight_version="trained")
    assert ok, message
    assert engine.destroy_weights_update_group()[0]
    proc.communicate(b"done\n", timeout=60)
    assert proc.returncode == 0
    assert outputs(engine) == greedy(ckpts["hf"]["B"]) and engine.get_weight_version() == "trained"
    assert not engine.destroy_weights_update_group()[0]
    assert not engine.init_weights_update_group("127.0.0.1", port, rank_offset=0, world_size=2, backend="gloo")[0]
    assert not engine.init_weights_update_group("127.0.0.1", port, rank_offset=1, world_size=2, backend="nccl")[0]


def test_released_memory_comes_back_with_identical_outputs(engine, ckpts):
    before = outputs(engine)
    pool, weight = engine.runner.token_to_kv_pool, engine.runner.model.model.embed_tokens.weight
    assert engine.release_memory_occupation()[0]
    assert pool.k_buffer[0].numel() == 0 and weight.numel() == 0 and engine.runner.last_hidden is None
    refused = engine.generate(input_ids=PROMPTS[0], sampling_params=SP)["meta_info"]["finish_reason"]
    assert refused["type"] == "abort" and refused["status_code"] == 503
    ok, message = engine.update_weights_from_disk(ckpts["dir"]["B"])
    assert not ok and "released" in message
    assert engine.resume_memory_occupation(["weights"])[0] and weight.numel() > 0
    assert engine.resume_memory_occupation(["kv_cache"])[0] and pool.k_buffer[0].numel() > 0
    assert outputs(engine) == before
    assert engine.release_memory_occupation(["kv_cache"])[0] and weight.numel() > 0
    assert engine.resume_memory_occupation()[0]
    assert outputs(engine) == before
    assert cpu_gemm.is_placeholder(engine.runner.model.model.layers[0].mlp.down_proj.weight)
    ok, message = engine.release_memory_occupation(["gpu"])
    assert not ok and "unknown memory tag" in message

