"""sampling_params.thinking_budget through the offline Engine (a tiny random Llama served with the qwen3 reasoning
parser; its word-level tokenizer has `<think>` and `</think>` as tokens 10 and 11): a prompt that leaves the
reasoning block open gets exactly N greedy reasoning tokens, the end tag, then the greedy continuation; a prompt whose
block is closed is generated as without a budget."""
from __future__ import annotations

import json

import pytest
import torch

import radixlm
from tests.runtime.scheduler.conftest import TINY_LLAMA

START, END = 10, 11


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("tiny-llama-think")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    vocab = {f"t{i}": i for i in range(TINY_LLAMA["vocab_size"])}
    vocab.update({"<think>": START, "</think>": END})
    del vocab[f"t{START}"], vocab[f"t{END}"]
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(d)
    e = radixlm.Engine(str(d), load_format="dummy", dtype="float32", device="cpu", random_seed=0,
                       max_total_tokens=2048, reasoning_parser="qwen3")
    yield e
    e.shutdown()


def test_the_end_tag_is_forced_after_n_reasoning_tokens(engine):
    sp = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    prompt = [(13 * j) % 500 + 20 for j in range(15)] + [START]
    free = engine.generate(input_ids=prompt, sampling_params=sp)["output_ids"]
    n = next(n for n in (4, 3, 2, 1) if END not in free[:n])
    out = engine.generate(input_ids=prompt, sampling_params={**sp, "thinking_budget": n})["output_ids"]
    assert out[:n] == free[:n] and out[n] == END
    # After the tag, the model's own greedy answer to what it was given.
    cont = engine.generate(input_ids=prompt + out[: n + 1], sampling_params={**sp, "max_new_tokens": 12 - n - 1})
    assert out[n + 1 :] == cont["output_ids"]
    closed = prompt + [END]  # the block closed in the prompt: nothing to budget
    assert (engine.generate(input_ids=closed, sampling_params={**sp, "thinking_budget": 1})["output_ids"]
            == engine.generate(input_ids=closed, sampling_params=sp)["output_ids"])
    with pytest.raises(ValueError, match="thinking_budget must be >= 1"):
        engine.generate(input_ids=prompt, sampling_params={**sp, "thinking_budget": 0})
