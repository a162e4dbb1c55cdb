"""A tiny random-weight Llama driven through the real Scheduler, one step at a time (no threads)."""
from __future__ import annotations

import json

import pytest
import torch

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.messages import TokenizedGenerateReqInput
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.spec.factory import DraftFactory

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2,
}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(d)


def make_scheduler(model_dir: str, **kwargs) -> Scheduler:
    kwargs.setdefault("max_total_tokens", 4096)
    # Drafting where the sources propose (the tests count drafts): the controller, timing steps, would vary it.
    kwargs.setdefault("speculative_measure_window", 0)
    args = ServerArgs(model_path=model_dir, load_format="dummy", dtype="float32", device="cpu",
                      enable_integrity_check=True, random_seed=0, **kwargs)
    config = ModelConfig.from_path(model_dir, dtype="float32", device="cpu", load_format="dummy")
    runner = ModelRunner(args, config, "cpu")
    return Scheduler(args, runner, tokenizer=None, eos_token_ids=frozenset(), drafts=DraftFactory.load(args, runner))


def request(rid: str, ids: list[int], max_new_tokens: int = 4, **kw) -> TokenizedGenerateReqInput:
    sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    sp.normalize()
    return TokenizedGenerateReqInput(rid=rid, input_ids=ids, sampling_params=sp, **kw)


def run_all(sched: Scheduler, max_steps: int = 10_000, step=None) -> dict:
    """Steps (sched.step, or `step`) until idle; returns rid -> {'output_ids', 'cached_tokens', 'finish_reason', ...}."""
    results: dict = {}
    for _ in range(max_steps):
        if sched.is_idle():
            return results
        for out in (step or sched.step)():
            r = results.setdefault(out.rid, {"output_ids": []})
            r["output_ids"] += out.new_output_ids
            r.update(cached_tokens=out.cached_tokens, finish_reason=out.finished_reason,
                     num_retractions=out.num_retractions, prompt_tokens=out.prompt_tokens)
    raise AssertionError("scheduler did not become idle")
