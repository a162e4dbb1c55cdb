"""The detokenizer's batched decode (model-free: a byte-level BPE trained in memory): one tokenizer call per step gives
every request the text that decoding it alone gives, multi-byte characters and stop strings included; tokenizers
whose decode differs from the Rust decoder's keep the per-request loop; a failing batch falls back per request."""
from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from radixlm.runtime.detokenizer import DecodeState, batch_decoder
from radixlm.runtime.detokenizer_manager import DetokenizerManager
from radixlm.runtime.messages import BatchReqOutput, BatchTokenOutput, DetokenizeInfo, ReqOutput

CORPUS = ["hello world, café ünïcödé 🙂 stop here", "the end . of it , isn't it ? yes 's", "日本語のテキスト"]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(vocab_size=320, special_tokens=["<eos>"],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<eos>", clean_up_tokenization_spaces=False)


def test_fast_path_only_where_it_decodes_alike(tok):
    fast = batch_decoder(tok)
    assert fast.__name__ == "fast"
    rng = random.Random(0)
    seqs = [[rng.randrange(len(tok)) for _ in range(rng.randrange(0, 12))] for _ in range(50)]
    for skip in (True, False):
        assert fast(seqs, skip) == [tok.decode(s, skip_special_tokens=skip) for s in seqs]

    class Custom(PreTrainedTokenizerFast):  # its own decode: not the Rust decoder's output
        def decode(self, ids, skip_special_tokens=False, **kw):
            return super().decode(ids, skip_special_tokens=skip_special_tokens, **kw).upper()

    custom = Custom(tokenizer_object=tok.backend_tokenizer, eos_token="<eos>")
    assert batch_decoder(custom).__name__ == "loop"
    assert batch_decoder(custom)([tok.encode("hello")], True) == ["HELLO"]


def stream(tok, manager: DetokenizerManager | None, stops: list[str], steps: int = 4):
    """Three requests streamed a few tokens per step, then finished; the texts every step (manager None: each
    request decoded alone by DecodeState.update, the reference)."""
    ids = [tok.encode(c) for c in CORPUS]
    infos = [DetokenizeInfo(f"r{i}", [], stop=stops) for i in range(len(ids))]
    alone = {info.rid: DecodeState(tok, info) for info in infos}
    texts = []
    for step in range(steps + 1):
        outs = []
        for info, seq in zip(infos, ids):
            cut = len(seq) * step // steps
            prev = len(seq) * (step - 1) // steps if step else 0
            done = {"type": "length", "length": len(seq)} if step == steps else None
            outs.append(ReqOutput(info.rid, seq[prev:cut] if step else [], done, 0, cut, 0))
        if manager is not None:
            texts.append(manager.handle(BatchTokenOutput(infos if step == 0 else [], BatchReqOutput.of(outs))).texts)
        else:
            texts.append([alone[o.rid].update(o.new_output_ids, o.finished_reason) for o in outs])
    return texts


@pytest.mark.parametrize("stops", [[], ["stop", "?"]])
def test_batched_step_gives_each_request_its_own_text(tok, stops):
    manager = DetokenizerManager(tok)
    got = stream(tok, manager, stops)
    assert got == stream(tok, None, stops)
    assert got[-1] == CORPUS and not manager.states


def test_a_failing_batch_falls_back_to_one_request_at_a_time(tok):
    manager = DetokenizerManager(tok)

    def broken(seqs, skip):
        raise RuntimeError("decoder failed")

    manager.decode_batch = broken
    assert stream(tok, manager, []) == stream(tok, None, [])
