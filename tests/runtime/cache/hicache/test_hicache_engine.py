"""The hierarchical cache under the real scheduler and a tiny random-weight Llama (float32, CPU) with a device pool a
few prompts fill: a prefix evicted from the device is served from the host pool, and with the file backend from
disk to a second Engine; outputs equal the uncached run's; the accounting check (both tiers) passes after every step,
through retraction and aborts."""
from __future__ import annotations

import json

import pytest
import torch

import radixlm
from radixlm.runtime.cache.hicache.storage import STORAGE_DIR_ENV
from tests.runtime.models.tiny import word_tokenizer
from tests.runtime.scheduler.conftest import TINY_LLAMA, make_scheduler, request, run_all

GREEDY = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("hicache-llama")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    word_tokenizer(d, TINY_LLAMA["vocab_size"])
    return str(d)


def prompt(seed: int, n: int = 90) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, TINY_LLAMA["vocab_size"], (n,), generator=g).tolist()


def engine(model_dir: str, **kw) -> "radixlm.Engine":
    return radixlm.Engine(model_dir, load_format="dummy", dtype="float32", device="cpu", max_total_tokens=256,
                          enable_integrity_check=True, random_seed=0, enable_hierarchical_cache=True,
                          chunked_prefill_size=-1, **kw)


def run(eng, ids: list[int]) -> tuple[list[int], int]:
    out = eng.generate(input_ids=ids, sampling_params=GREEDY)
    return out["output_ids"], out["meta_info"]["cached_tokens"]


def test_a_prefix_evicted_from_the_device_is_served_from_host(model_dir):
    eng = engine(model_dir)
    try:
        first, cached = run(eng, prompt(0))
        assert cached == 0
        for seed in (1, 2, 3):  # 3 x 96 tokens through a 256-token pool: prompt 0 leaves the device
            run(eng, prompt(seed))
        again, cached = run(eng, prompt(0))
        assert cached == 89 and again == first
    finally:
        eng.shutdown()


def test_file_storage_serves_a_restarted_engine(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(STORAGE_DIR_ENV, str(tmp_path))
    kw = dict(hicache_storage_backend="file", hicache_storage_prefetch_policy="wait_complete")
    eng = engine(model_dir, **kw)
    try:
        first, _ = run(eng, prompt(4))
        assert eng.flush_cache()  # clears both tiers, waits for the storage writes
        assert len(list(tmp_path.glob("*.kv"))) == 1  # 96 tokens: one whole 64-token page
    finally:
        eng.shutdown()
    eng = engine(model_dir, **kw)
    try:
        again, cached = run(eng, prompt(4))
        assert cached == 64 and again == first
    finally:
        eng.shutdown()


@pytest.mark.parametrize("policy", ["write_back", "write_through_selective"])
def test_accounting_holds_through_retraction_and_aborts(model_dir, policy):
    sched = make_scheduler(model_dir, max_total_tokens=192, chunked_prefill_size=-1, schedule_conservativeness=0.05,
                           enable_hierarchical_cache=True, hicache_write_policy=policy)
    ps = [prompt(10 + i, 40) for i in range(4)]
    for i, p in enumerate(ps):
        sched.add_request(request(f"a{i}", p, max_new_tokens=24))
    first = run_all(sched)
    assert sched.stats["retractions"] > 0
    for i, p in enumerate(ps):  # again, two aborted mid-decode: host hits come back, what they held is freed
        sched.add_request(request(f"b{i}", p, max_new_tokens=24))
    for _ in range(4):
        sched.step()
    sched.abort_requests(["b1", "b3"])
    second = run_all(sched)
    for i in (0, 2):
        assert second[f"b{i}"]["output_ids"] == first[f"a{i}"]["output_ids"]
    assert sum(second[f"b{i}"]["cached_tokens"] for i in (0, 2)) > 0
    if policy == "write_back":  # (selective copies nothing hit once)
        assert sched.tree_cache.tier_stats()["host_loaded_tokens"] > 0
    sched.check_memory()
    assert sched.flush_cache()
    assert sched.tree_cache.host_size() == 0


def test_a_deepseek_latent_prefix_evicted_from_the_device_is_served_from_host(tmp_path):
    """The host pool over MLA's latent KV pool (one buffer per layer): a tiny DeepSeek-V2-Lite, dummy weights."""
    from tests.runtime.models.test_deepseek import VOCAB, configs
    from tests.runtime.models.tiny import ARCH

    config = configs()["v2-lite"]
    config.architectures = [ARCH[config.model_type]]
    config.save_pretrained(tmp_path)
    word_tokenizer(tmp_path, VOCAB)
    eng = engine(str(tmp_path))
    try:
        ids = [[t % (VOCAB - 1) + 1 for t in prompt(seed)] for seed in range(4)]
        first, _ = run(eng, ids[0])
        for other in ids[1:]:  # 3 x 96 tokens through a 256-token pool: prompt 0 leaves the device
            run(eng, other)
        again, cached = run(eng, ids[0])
        stats = eng.scheduler.tree_cache.tier_stats()
    finally:
        eng.shutdown()
    assert cached == 89 and again == first
    assert stats["host_loaded_tokens"] >= 89 and stats["host_h2d_copies"] >= 1
