"""The offline Engine API on SmolLM2: sampling controls, stops, n > 1, logprobs, streaming, async,
aborts and validation."""
from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time, there was a little"


def test_seeded_sampling_is_reproducible_across_batches(smol_engine):
    sp = {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 24, "sampling_seed": 1234}
    alone = smol_engine.generate(PROMPT, sp)
    in_batch = smol_engine.generate(["Hello", PROMPT, "The weather today"], [{"max_new_tokens": 5}, sp, {"max_new_tokens": 9}])
    assert in_batch[1]["output_ids"] == alone["output_ids"]
    other_seed = smol_engine.generate(PROMPT, {**sp, "sampling_seed": 99})
    assert other_seed["output_ids"] != alone["output_ids"]


def test_top_k_one_equals_greedy(smol_engine):
    greedy = smol_engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 20})
    top1 = smol_engine.generate(PROMPT, {"temperature": 1.3, "top_k": 1, "max_new_tokens": 20})
    assert top1["output_ids"] == greedy["output_ids"]


def test_stop_string_ends_and_is_trimmed(smol_engine):
    full = smol_engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 30})["text"]
    word = full.split()[3]
    out = smol_engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 30, "stop": [word]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert word not in out["text"] and full.startswith(out["text"])
    kept = smol_engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 30, "stop": word, "no_stop_trim": True})
    assert kept["text"].endswith(word) or word in kept["text"]


def test_stop_token_ids_and_min_new_tokens(smol_engine):
    greedy = smol_engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 20})
    stop_tok = greedy["output_ids"][4]
    out = smol_engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 20, "stop_token_ids": [stop_tok]})
    first = greedy["output_ids"].index(stop_tok)
    assert out["output_ids"] == greedy["output_ids"][: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_tok}
    assert out["text"] == smol_engine.tokenizer.decode(greedy["output_ids"][:first])
    # min_new_tokens masks the stop token until the minimum is reached.
    longer = smol_engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 20, "stop_token_ids": [stop_tok], "min_new_tokens": first + 3})
    assert len(longer["output_ids"]) >= first + 3
    assert stop_tok not in longer["output_ids"][: first + 3]


def test_ignore_eos_and_length(smol_engine):
    chat = smol_engine.tokenizer.apply_chat_template([{"role": "user", "content": "Say OK."}], tokenize=False, add_generation_prompt=True)
    stopped = smol_engine.generate(chat, {"temperature": 0, "max_new_tokens": 64})
    assert stopped["meta_info"]["finish_reason"]["type"] == "stop"
    forced = smol_engine.generate(chat, {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True})
    assert forced["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
    assert len(forced["output_ids"]) == 40


def test_n_samples_share_one_prefill(smol_engine):
    prompt = "Write a short story about a dragon who learns to read, in the style of a fairy tale:"
    n_prompt = len(smol_engine.tokenizer.encode(prompt))
    smol_engine.flush_cache()
    before = smol_engine.scheduler.stats["prefill_tokens"]
    outs = smol_engine.generate(prompt, {"temperature": 1.0, "max_new_tokens": 12, "n": 2, "sampling_seed": 5})
    assert isinstance(outs, list) and len(outs) == 2
    assert outs[0]["output_ids"] != outs[1]["output_ids"]  # two different samples (seeded per position, same seed)
    assert all(o["meta_info"]["cached_tokens"] == n_prompt - 1 for o in outs)
    # The prompt once, then one recomputed last token per sample.
    assert smol_engine.scheduler.stats["prefill_tokens"] - before == n_prompt + 2


def test_prompt_logprobs_and_top_logprobs(smol_engine):
    ids = smol_engine.tokenizer.encode(PROMPT)
    out = smol_engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 4}, return_logprob=True,
                               logprob_start_len=0, top_logprobs_num=3, return_text_in_logprobs=True)
    meta = out["meta_info"]
    inp = meta["input_token_logprobs"]
    assert [t for _lp, t, _txt in inp] == ids
    assert inp[0][0] is None and all(lp <= 0 for lp, _t, _x in inp[1:])
    assert len(meta["input_top_logprobs"]) == len(ids) and meta["input_top_logprobs"][0] is None
    assert all(len(top) == 3 for top in meta["input_top_logprobs"][1:])
    for (lp, tok, text), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert top[0][1] == tok and abs(top[0][0] - lp) < 1e-6  # greedy picks the top-1
        assert text == smol_engine.tokenizer.decode([tok])
    # From the middle of the prompt: positions start..end, and the cache may not cover them.
    mid = smol_engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 2}, return_logprob=True, logprob_start_len=3)
    got = mid["meta_info"]["input_token_logprobs"]
    assert [t for _lp, t, _x in got] == ids[3:]
    assert all(abs(a[0] - b[0]) < 1e-4 for a, b in zip(got, inp[3:]))


def test_streaming_yields_growing_text(smol_engine):
    chunks = list(smol_engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 16}, stream=True))
    final = smol_engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 16})
    assert len(chunks) >= 8
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert texts[-1] == final["text"] and chunks[-1]["output_ids"] == final["output_ids"]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)


def test_stream_interval_reports_every_k_tokens(smol_engine):
    sp = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True, "stream_interval": 4}
    chunks = list(smol_engine.generate(PROMPT, sp, stream=True))
    # The first token at once, then every 4 tokens; the end always.
    assert [len(c["output_ids"]) for c in chunks] == [1, 5, 9, 10]


def test_async_generate_and_stream(smol_engine):
    async def main():
        outs = await asyncio.gather(*(smol_engine.async_generate(p, {"temperature": 0, "max_new_tokens": 8}) for p in ["A", "B", "C"]))
        stream = await smol_engine.async_generate("A", {"temperature": 0, "max_new_tokens": 8}, stream=True)
        chunks = [c async for c in stream]
        return outs, chunks

    outs, chunks = asyncio.run(main())
    assert len(outs) == 3 and chunks[-1]["output_ids"] == outs[0]["output_ids"]


def test_abort_a_stream_midway(smol_engine):
    stream = smol_engine.generate(PROMPT, {"temperature": 0, "max_new_tokens": 200, "ignore_eos": True}, stream=True, rid="to-abort")
    for i, _chunk in enumerate(stream):
        if i == 3:
            smol_engine.abort_request("to-abort")
            break
    stream.close()
    # The engine keeps working and its KV accounting (checked every step) holds.
    out = smol_engine.generate("Hi", {"temperature": 0, "max_new_tokens": 3})
    assert out["meta_info"]["finish_reason"] is not None
    assert smol_engine._error is None


@pytest.mark.parametrize("bad, message", [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"logit_bias": {"99999999": 1.0}}, "logit_bias"),
    ({"bogus": 1}, "bogus"),
    ({"regex": "a+", "json_schema": "{}"}, "Only one of"),
    ({"max_new_tokens": 10**9}, "context length"),
])
def test_invalid_sampling_params_raise_before_scheduling(smol_engine, bad, message):
    with pytest.raises(ValueError, match=message):
        smol_engine.generate(PROMPT, bad)


def test_invalid_inputs_raise(smol_engine):
    with pytest.raises(ValueError, match="empty"):
        smol_engine.generate("")
    with pytest.raises(ValueError, match="input_ids"):
        smol_engine.generate(input_ids=[1, 2, 10**9])
    with pytest.raises(ValueError, match="exactly one"):
        smol_engine.generate()
    with pytest.raises(ValueError, match="logprob_start_len"):
        smol_engine.generate("Hi", return_logprob=True, logprob_start_len=50)


def test_batch_of_input_ids_and_logit_bias(smol_engine):
    target = smol_engine.tokenizer.encode(" banana")[0]
    outs = smol_engine.generate(input_ids=[[1, 2, 3], [4, 5]], sampling_params={"temperature": 0, "max_new_tokens": 3, "logit_bias": {str(target): 100.0}})
    assert [o["output_ids"] for o in outs] == [[target] * 3, [target] * 3]


def test_shutdown_releases_the_model_and_is_idempotent():
    import weakref

    import radixlm

    engine = radixlm.Engine("default", load_format="dummy", max_total_tokens=2048)
    out = engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2, "temperature": 0})
    assert len(out["output_ids"]) == 2
    model = weakref.ref(engine.runner.model)
    engine.shutdown()
    assert engine.runner is None and engine.scheduler is None
    assert model() is None  # nothing else keeps the weights (or, on CUDA, the KV pool and graphs) alive
    engine.shutdown()


def test_a_batch_of_prompts_is_tokenized_as_each_alone(smol_engine):
    prompts = ["Hello", PROMPT, "  leading spaces and ünïcode", "<|im_start|>user\nHi<|im_end|>\n"]
    batch = smol_engine.builder.build(prompts, {"max_new_tokens": 1}).msgs
    alone = [smol_engine.builder.build(p, {"max_new_tokens": 1}).msgs[0] for p in prompts]
    assert [m.input_ids for m in batch] == [m.input_ids for m in alone]
