"""--enable-deterministic-inference through the offline Engine, on a tiny random-weight Llama on the CPU (float32 and
bfloat16): one prompt's tokens and logprobs are exactly those it gets alone, inside batches of other prompts of
other lengths, with and without a radix-cache hit (co-requests sharing its prefix, and its own prompt cached), and
with its prompt prefilled in small chunks. Without the flag, a batch changes its float32 logprobs in their last bits
(the reference attention pads each pass's keys to its longest sequence, and SDPA's causal and masked paths sum in
other orders)."""
from __future__ import annotations

import pytest
import torch

import radixlm
from tests.runtime.models.tiny import save_tiny
from tests.runtime.scheduler.conftest import TINY_LLAMA

TARGET = [(7 * j) % 500 + 3 for j in range(140)]  # two KV splits and a part
PARAMS = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    """Random weights of a scale that carries a last-bit change in attention through to the logprobs (the dummy
    loader's tiny weights round most of them away)."""
    from transformers import LlamaConfig

    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("tiny-llama-determ")
    save_tiny(LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "architectures"}), d)
    return str(d)


def co_requests(seed: int, n: int) -> list[list[int]]:
    """n prompts of 5-120 tokens; every third starts with a part of TARGET (a radix hit for one or the other)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(3, 500, (int(torch.randint(5, 120, (1,), generator=g)),), generator=g).tolist()
        if i % 3 == 0:
            ids = TARGET[: int(torch.randint(20, 140, (1,), generator=g))] + ids[:30]
        out.append(ids)
    return out


def target_in(engine: radixlm.Engine, others: list[list[int]], at: int) -> tuple[list[int], list[float], int]:
    """TARGET's (output ids, output logprobs, cached tokens) generated at index `at` of a batch with `others`."""
    batch = others[:at] + [TARGET] + others[at:]
    outs = engine.generate(input_ids=batch, sampling_params=PARAMS, return_logprob=True)
    meta = outs[at]["meta_info"]
    return outs[at]["output_ids"], [lp for lp, *_ in meta["output_token_logprobs"]], meta["cached_tokens"]


def engine(tiny_dir: str, dtype: str, deterministic: bool = True, **kwargs) -> radixlm.Engine:
    return radixlm.Engine(tiny_dir, dtype=dtype, device="cpu", random_seed=0,
                          max_total_tokens=8192, enable_deterministic_inference=deterministic, **kwargs)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_prompt_gets_the_same_tokens_and_logprobs_in_any_batch(tiny_dir, dtype):
    # Prompts go in chunks of 48 tokens of the pass's budget: TARGET alone at 0/48/96, elsewhere where its
    # co-requests and its cached prefix leave them.
    e = engine(tiny_dir, dtype, chunked_prefill_size=48)
    try:
        alone = target_in(e, [], 0)
        assert alone[2] == 0 and len(alone[0]) == 6
        cases = {}
        e.flush_cache()
        cases["batch of 8, flushed"] = target_in(e, co_requests(1, 7), 3)
        cases["batch of 16, its prompt cached"] = target_in(e, co_requests(2, 15), 11)
        e.flush_cache()
        e.generate(input_ids=TARGET[:100], sampling_params={"temperature": 0, "max_new_tokens": 1})
        cases["batch of 6, 100 tokens cached"] = target_in(e, co_requests(3, 5), 2)
    finally:
        e.shutdown()
    assert cases["batch of 16, its prompt cached"][2] >= 130 and cases["batch of 6, 100 tokens cached"][2] == 100
    for name, (ids, logprobs, _) in cases.items():
        assert ids == alone[0], name
        assert logprobs == alone[1], name  # exact: float equality, not closeness


def test_without_the_flag_the_batch_changes_the_logprobs(tiny_dir):
    e = engine(tiny_dir, "float32", deterministic=False, chunked_prefill_size=48)
    try:
        alone = target_in(e, [], 0)
        e.flush_cache()
        batched = [target_in(e, co_requests(1, 7), 3), target_in(e, co_requests(2, 15), 11)]
    finally:
        e.shutdown()
    assert any(logprobs != alone[1] for _, logprobs, _ in batched)
