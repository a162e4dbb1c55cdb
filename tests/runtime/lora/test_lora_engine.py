"""Multi-LoRA through the offline Engine on tiny random Llama and Qwen2 checkpoints (float32, CPU), each adapter made
with PEFT (random non-zero A and B): greedy outputs equal the PEFT-merged transformers model's token for token, alone
and in a batch mixing adapters and the base model; the radix cache shares KV within an adapter and never across;
adapters load and unload while requests run and none is lost; bad input is refused."""
from __future__ import annotations

import json
import threading

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config

import radixlm
from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
from tests.runtime.lora.tiny_adapters import make_adapter
from tests.runtime.models.tiny import hf_greedy, random_prompts, save_tiny

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
NEW = 8
SP = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
# name -> (seed, rank, alpha, targets, rsLoRA): partial fused projections (q and v without k; gate without up) too.
ADAPTERS = {
    "a0": (1, 8, 16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], False),
    "a1": (2, 4, 8, ["q_proj", "v_proj"], False),
    "a2": (3, 16, 8, ["o_proj", "gate_proj", "down_proj"], True),
    "a3": (4, 8, 32, ["k_proj", "up_proj", "down_proj"], False),
    "a4": (5, 2, 4, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], False),
}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The base checkpoint, five adapters, and references: {name or None: greedy tokens per prompt}."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lora-llama")
    hf = save_tiny(LlamaConfig(**COMMON), root / "base", seed=0)
    prompts = random_prompts(0, [5, 9], COMMON["vocab_size"])
    refs = {None: [t for t, _ in hf_greedy(hf, prompts, [], NEW)]}
    for name, (seed, r, alpha, targets, rs) in ADAPTERS.items():
        merged = make_adapter(hf, root / name, seed, r, alpha, targets, rs)
        refs[name] = [t for t, _ in hf_greedy(merged, prompts, [], NEW)]
    assert len({tuple(map(tuple, v)) for v in refs.values()}) == len(refs)  # every adapter changes the answers
    engine = radixlm.Engine(str(root / "base"), dtype="float32", device="cpu", max_total_tokens=2048,
                            lora_paths=[f"{n}={root / n}" for n in ("a0", "a1", "a2")] + [
                                json.dumps({"lora_name": "a3", "lora_path": str(root / "a3"), "pinned": True})],
                            max_loras_per_batch=4, max_lora_rank=16, max_loaded_loras=6, chunked_prefill_size=16,
                            enable_integrity_check=True)
    yield engine, root, prompts, refs, hf
    engine.shutdown()


def _ids(outs) -> list[list[int]]:
    return [o["output_ids"] for o in outs]


def test_greedy_equals_the_peft_merged_model(llama):
    engine, _, prompts, refs, _ = llama
    for name in (None, "a0", "a1", "a2", "a3"):
        assert _ids(engine.generate(input_ids=prompts, sampling_params=SP, lora_path=name)) == refs[name], name


def test_a_batch_mixing_four_adapters_and_the_base_equals_each_alone(llama):
    engine, _, prompts, refs, _ = llama
    names = ["a2", None, "a0", "a3", "a1", "a0"]
    batch = [prompts[i % 2] for i in range(len(names))]
    outs = engine.generate(input_ids=batch, sampling_params=SP, lora_path=names)
    assert _ids(outs) == [refs[n][i % 2] for i, n in enumerate(names)]


def test_decode_graphs_replay_any_mix_of_adapters(llama):
    """CUDA-graph decode under --enable-lora, through the graph runner's eager stand-in (use_graphs=False: the same
    padded passes over the same static buffers, the LoRA rows in the graph form): mixes of four adapters and the
    base model, padded rows among them, equal the PEFT-merged models; a batch of base rows alone replays the base
    model's pass (no LoRA table filled) and equals the base model."""
    engine, _, prompts, refs, _ = llama
    runner = engine.runner
    graphs = CudaGraphRunner(runner, 8, use_graphs=False)
    mixes: list[tuple[int, ...]] = []
    replay = graphs.replay

    def recording(fb):
        mixes.append(None if fb.lora is None else fb.lora.host_row_slots)
        return replay(fb)

    graphs.replay = recording
    names = ["a2", None, "a0", "a3", "a1", "a0", None]  # 7 rows: padded to the graph of 8
    runner.graph_runner = graphs
    try:
        outs = engine.generate(input_ids=[prompts[i % 2] for i in range(len(names))], sampling_params=SP,
                               lora_path=names)
        assert sum(m is not None and len(m) == 7 and len(set(m)) == 5 for m in mixes) >= NEW - 1  # replayed
        mixes.clear()
        filled = graphs.lora_inputs.table.clone()
        base = engine.generate(input_ids=prompts, sampling_params=SP)
    finally:
        runner.graph_runner = None
    assert _ids(outs) == [refs[n][i % 2] for i, n in enumerate(names)]
    assert _ids(base) == refs[None] and len(mixes) >= NEW - 1 and set(mixes) == {None}
    assert torch.equal(graphs.lora_inputs.table, filled)  # base passes fill nothing


def test_warm_up_passes_build_the_lora_kernels(llama, monkeypatch):
    """Start-up's dummy passes carry LoRA rows (slot 0, zeros before any swap): the extend passes in the eager
    form, the token-row passes in the graphs' gather form (as on CUDA with the Triton kernels; recorded, not run)."""
    runner = llama[0].runner
    passes = []
    monkeypatch.setattr(runner, "_run", lambda fb, plan: passes.append(fb.lora))
    monkeypatch.setattr(runner.lora.context, "use_triton", True)
    free = [None] * len(runner.lora.slot_ids)
    monkeypatch.setattr(runner.lora, "slot_ids", ["held"] + free[1:])
    with pytest.raises(RuntimeError, match="before any adapter"):
        runner.warm_up_token_rows(3, 1)  # slot 0 would no longer be zeros
    monkeypatch.setattr(runner.lora, "slot_ids", free)
    passes.clear()
    runner.warm_up_extend()
    runner.warm_up_token_rows(3, 1)
    # Each pass twice: without adapter rows (the base model's fused kernels), then with them
    assert passes[::2] == [None] * (len(passes) // 2) and len(passes) % 2 == 0
    lora = passes[1::2]
    assert lora and all(p.uses_lora and not p.static and set(p.host_row_slots) == {0} for p in lora[:-1])
    assert lora[-1].static and lora[-1].row_slots.tolist() == [0, 0, 0]


def test_two_ranks_equal_one_with_adapters(llama):
    """TP=2 over gloo (rank 1 in a spawned process): column-parallel layers hold B's rows of their output slice,
    row-parallel ones A's columns of their input slice; a batch mixing adapters (fused parts left alone by some) and
    the base model equals TP=1's answers, which equal the PEFT-merged models'."""
    _, root, prompts, refs, _ = llama
    names = ["a0", None, "a1", "a2"]
    with radixlm.Engine(str(root / "base"), dtype="float32", device="cpu", max_total_tokens=1024, tp_size=2,
                        lora_paths=[f"{n}={root / n}" for n in ("a0", "a1", "a2")], max_loras_per_batch=3,
                        max_lora_rank=16) as engine:
        outs = engine.generate(input_ids=[prompts[i % 2] for i in range(len(names))], sampling_params=SP,
                               lora_path=names)
    assert _ids(outs) == [refs[n][i % 2] for i, n in enumerate(names)]


def test_radix_cache_shares_within_an_adapter_only(llama):
    engine, *_ = llama
    assert engine.flush_cache()
    prompt = random_prompts(7, [24], COMMON["vocab_size"])[0]
    one = {"temperature": 0, "max_new_tokens": 1}
    cached = lambda name: engine.generate(input_ids=prompt, sampling_params=one, lora_path=name)[
        "meta_info"]["cached_tokens"]
    assert cached("a0") == 0
    assert cached("a0") == len(prompt) - 1  # the same adapter: the whole prompt but its last token
    assert cached("a1") == 0 and cached(None) == 0  # other adapters and the base: nothing shared
    assert cached("a1") == len(prompt) - 1 and cached(None) == len(prompt) - 1


def test_load_and_unload_while_requests_run(llama):
    """A fifth adapter (one more than the slots) is loaded and a running one unloaded while requests of them run:
    every request finishes with its reference answer (the unload waits for a1's);
    the unloaded name is refused at once; loaded again under the same name it shares no KV with its former self."""
    engine, root, prompts, refs, _ = llama
    results: dict[str, list] = {}

    def run(name):
        results[name] = _ids(engine.generate(input_ids=prompts, sampling_params=SP, lora_path=name))

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a0", "a2")]
    for t in threads:
        t.start()
    stream = engine.generate(input_ids=prompts[1], sampling_params={**SP, "max_new_tokens": 48}, lora_path="a1",
                             stream=True)
    chunks = [next(stream)]  # a1's request runs
    assert engine.load_lora_adapter("a4", str(root / "a4")).success
    threads.append(threading.Thread(target=run, args=("a4",)))
    threads[-1].start()
    unloaded = []
    unloader = threading.Thread(target=lambda: unloaded.append(engine.unload_lora_adapter("a1")))
    unloader.start()
    chunks += list(stream)
    unloader.join(30)
    for t in threads:
        t.join(60)
    assert chunks[-1]["output_ids"][:NEW] == refs["a1"][1] and len(chunks[-1]["output_ids"]) == 48
    (out,) = unloaded
    assert out.success and "a1" not in out.loaded_adapters
    assert results == {n: refs[n] for n in ("a0", "a2", "a4")}
    with pytest.raises(ValueError, match="unknown LoRA adapter 'a1'"):
        engine.generate(input_ids=prompts[0], sampling_params=SP, lora_path="a1")
    assert engine.load_lora_adapter("a1", str(root / "a1")).success
    out = engine.generate(input_ids=prompts[1], sampling_params=SP, lora_path="a1")
    assert out["output_ids"] == refs["a1"][1] and out["meta_info"]["cached_tokens"] == 0


def test_bad_adapters_and_names_are_refused(llama, tmp_path):
    engine, root, prompts, _, hf = llama
    for name, path, message in [("x", "/nonexistent", "not a directory"), ("x", str(tmp_path), "lacks")]:
        out = engine.load_lora_adapter(name, path)
        assert not out.success and message in out.error_message and "x" not in out.loaded_adapters
    make_adapter(hf, tmp_path / "r32", seed=9, r=32, targets=["q_proj"])
    out = engine.load_lora_adapter("r32", str(tmp_path / "r32"))
    assert not out.success and "above --max-lora-rank 16" in out.error_message
    with pytest.raises(ValueError, match="loaded already"):
        engine.load_lora_adapter("a0", str(root / "a0"))
    with pytest.raises(ValueError, match="no LoRA adapter named"):
        engine.unload_lora_adapter("nope")
    with pytest.raises(ValueError, match="unknown LoRA adapter"):
        engine.generate(input_ids=prompts, sampling_params=SP, lora_path=["a0", "nope"])
    for i in range(6):  # up to --max-loaded-loras 6, then refused
        out = engine.load_lora_adapter(f"more{i}", str(root / "a0"))
        if not out.success:
            break
    assert not out.success and "--max-loaded-loras" in out.error_message and len(out.loaded_adapters) == 6


def test_priorities_deadlines_and_new_base_weights_with_adapters(llama):
    """Main's features on adapters' requests: priority and timeout_s ride with lora_path, one per prompt; a deadline
    aborts an adapter's request; base weights updated in place keep every adapter's delta on top."""
    engine, _, prompts, refs, hf = llama
    outs = engine.generate(input_ids=prompts, sampling_params=SP, lora_path=["a0", "a2"], priority=[3, -1],
                           timeout_s=[60, 60.0])
    assert _ids(outs) == [refs["a0"][0], refs["a2"][1]]
    out = engine.generate(input_ids=prompts[0], sampling_params={**SP, "max_new_tokens": 480}, lora_path="a2",
                          timeout_s=0.1)
    assert out["meta_info"]["finish_reason"]["type"] == "abort" and len(out["output_ids"]) < 480
    ok, message = engine.update_weights_from_tensor(list(hf.state_dict().items()))
    assert ok, message
    assert _ids(engine.generate(input_ids=prompts, sampling_params=SP, lora_path=["a2", None])) == [
        refs["a2"][0], refs[None][1]]


def test_qwen2_adapter_with_rslora_equals_the_peft_merged_model(tmp_path):
    torch.set_num_threads(1)
    hf = save_tiny(Qwen2Config(**COMMON), tmp_path / "base", seed=3)
    merged = make_adapter(hf, tmp_path / "q", seed=11, r=8, alpha=8, rslora=True)
    prompts = random_prompts(2, [6, 11], COMMON["vocab_size"])
    want = [t for t, _ in hf_greedy(merged, prompts, [], NEW)]
    assert want != [t for t, _ in hf_greedy(hf, prompts, [], NEW)]
    with radixlm.Engine(str(tmp_path / "base"), dtype="float32", device="cpu", max_total_tokens=1024,
                        enable_lora=True, max_lora_rank=8, max_loras_per_batch=1) as engine:
        assert engine.load_lora_adapter("q", str(tmp_path / "q")).success
        assert _ids(engine.generate(input_ids=prompts, sampling_params=SP, lora_path=["q", None])) == [
            want[0], [t for t, _ in hf_greedy(hf, prompts[1:], [], NEW)][0]]
