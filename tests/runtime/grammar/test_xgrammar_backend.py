"""XGrammarBackend with SmolLM2's byte-level tokenizer."""
from __future__ import annotations

import pytest

from radixlm.runtime.grammar.spec import GrammarSpec
from radixlm.runtime.grammar.xgrammar_backend import XGrammarBackend
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.files import resolve_model_path
from radixlm.runtime.model_loader.tokenizer import get_tokenizer


@pytest.fixture(scope="module")
def backend_and_tokenizer():
    cfg = ModelConfig.from_path(resolve_model_path("default"), dtype="float32", device="cpu")
    tok = get_tokenizer(cfg.model_path)
    return XGrammarBackend(tok, cfg.vocab_size, sorted(cfg.eos_token_ids)), tok


def test_forced_text_inside_a_character_is_no_jump(backend_and_tokenizer):
    """A token may end inside a UTF-8 character (byte-level BPE); the bytes the grammar then forces are not text.
    Found on the GPU with a model choosing the first byte of U+00A0 inside a `\\s` class: it crashed the scheduler."""
    backend, tok = backend_and_tokenizer
    matcher = backend.new_matcher(backend.compile(GrammarSpec("regex", '"\u00e4bc"')))
    assert matcher.accept_token(tok.encode('"', add_special_tokens=False)[0])
    first_byte = tok.convert_tokens_to_ids("\u00c3")  # byte 0xC3 (the first of U+00E4's two) in GPT-2's byte alphabet
    assert matcher.accept_token(first_byte)
    assert matcher.jump_forward_string() == ""
    whole = backend.new_matcher(backend.compile(GrammarSpec("regex", '"\u00e4bc"')))
    assert whole.jump_forward_string() == '"\u00e4bc"'  # whole characters still jump


def _constrained_req(tok, cfg_vocab, pattern: str, text: str, mode: str = "exact", **sp_kwargs):
    """A jump-forward draft source (its stats in cd.stats) and a request whose grammar accepted `text`."""
    from collections import Counter

    from radixlm.runtime.args import JumpForwardMode
    from radixlm.runtime.grammar.backend import GrammarCache
    from radixlm.runtime.grammar.xgrammar_backend import XGrammarBackend
    from radixlm.runtime.sampling.sampling_params import SamplingParams
    from radixlm.runtime.spec.sources.jump_forward import JumpForwardSource
    from radixlm.runtime.scheduler.grammar_queue import GrammarQueue
    from radixlm.runtime.scheduler.req import Req

    grammars = GrammarQueue(GrammarCache(lambda: XGrammarBackend(tok, cfg_vocab, [2])))
    cd = JumpForwardSource(JumpForwardMode(mode), tok, frozenset({2}), lambda: grammars.backend, Counter())
    sp = SamplingParams(max_new_tokens=32, temperature=0.0, regex=pattern, **sp_kwargs)
    sp.normalize()
    req = Req("r", [1, 2, 3], sp, eos_token_ids=frozenset({2}))
    grammars.add(req)
    req.grammar_future.result(timeout=60)
    grammars.start(req)
    for t in tok.encode(text, add_special_tokens=False):
        assert req.grammar.accept_token(t)
        req.output_ids.append(t)
    return cd, req


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_complete_grammar_allowing_only_stop_ends_without_a_pass(backend_and_tokenizer, mode):
    backend, tok = backend_and_tokenizer
    cd, req = _constrained_req(tok, backend.vocab_size, '\\{"a": [0-9]\\}', '{"a": 7}', mode)
    cd.propose(req)
    assert req.output_ids[-1] == 2 and req.finished_reason.type == "stop" and req.grammar.is_terminated()
    assert cd.stats["stop_jumps"] == 1


@pytest.mark.parametrize("pattern, text, sp", [
    ("ab|abc", "ab", {}),  # complete, but "c" is allowed too: the model decides
    ('\\{"a": [0-9]\\}', '{"a": 7}', {"min_new_tokens": 20}),  # the stop token is masked until 20 tokens
    ('\\{"a": [0-9]\\}', '{"a": 7}', {"return_logprob": True}),  # the stop token's logprob comes from a pass
])
def test_no_stop_jump_when_the_model_still_chooses(backend_and_tokenizer, pattern, text, sp):
    backend, tok = backend_and_tokenizer
    logprob = sp.pop("return_logprob", False)
    cd, req = _constrained_req(tok, backend.vocab_size, pattern, text, **sp)
    req.return_logprob = logprob
    n = len(req.output_ids)
    cd.propose(req)
    assert len(req.output_ids) == n and req.finished_reason is None and cd.stats["stop_jumps"] == 0


def test_off_mode_never_jumps_to_stop(backend_and_tokenizer):
    backend, tok = backend_and_tokenizer
    cd, req = _constrained_req(tok, backend.vocab_size, '\\{"a": [0-9]\\}', '{"a": 7}', "off")
    cd.propose(req)
    assert req.finished_reason is None


def _settle_with(cd, req, draft, key, tokens, accepted):
    """The verdict on a draft of `cd`'s: `tokens`, the first `accepted` of them the draft's."""
    from radixlm.runtime.spec.draft import Draft

    cd.learn(req, Draft(list(draft), cd, key), accepted, tokens[accepted])


def test_drafts_learn_the_models_split_of_forced_text(backend_and_tokenizer):
    backend, tok = backend_and_tokenizer
    cd, req = _constrained_req(tok, backend.vocab_size, "x", "")
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    forced, last = '{"name": "', 198
    canonical, _ = cd._forced_tokens(last, forced)
    assert canonical == enc(forced) and enc("{")[0] != canonical[0]  # the canonical split starts with `{"`
    # The model took `{` where the draft had `{"`: later drafts start with `{`, then the rest's own tokens.
    _settle_with(cd, req, canonical, (last, forced), enc("{"), 0)
    assert cd._forced_tokens(last, forced)[0] == enc("{") + enc('"name": "')
    # The model's token reaches past the forced text (forced ` "` then free text merged into one token): the draft
    # ends before it.
    learned = cd._forced_tokens(last, forced)[0]
    beyond = tok.convert_tokens_to_ids('\u0120"$')  # ` "$`: the forced ` "` and the string's first character
    assert tok.decode([beyond]) == ' "$'
    _settle_with(cd, req, learned, (last, forced), learned[:-1] + [beyond], len(learned) - 1)
    assert cd._forced_tokens(last, forced)[0] == learned[:-1]
    assert cd.stats["learned_drafts"] == 2
    # Drafts the model keeps whole teach nothing.
    _settle_with(cd, req, learned[:-1], (last, forced), learned[:-1] + [5], len(learned) - 1)
    assert cd.stats["learned_drafts"] == 2


def test_drafts_alternating_between_two_splits_relearn_without_retokenizing(backend_and_tokenizer, monkeypatch):
    """Requests whose model splits one forced text two ways flip the draft back and forth; each split is worked out
    (decoded and re-encoded) once."""
    backend, tok = backend_and_tokenizer
    cd, req = _constrained_req(tok, backend.vocab_size, "x", "")
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    forced, last = '{"name": "', 198
    canonical = cd._forced_tokens(last, forced)[0]
    by_brace = enc("{") + enc('"name": "')
    calls = []
    real_decode = cd.tokenizer.decode
    monkeypatch.setattr(cd.tokenizer, "decode", lambda ids, **kw: calls.append(ids) or real_decode(ids, **kw))
    for _ in range(3):  # the model takes `{`, then `{"` in the next request, and so on
        _settle_with(cd, req, cd._forced_tokens(last, forced)[0], (last, forced), enc("{"), 0)
        assert cd._forced_tokens(last, forced)[0] == by_brace
        _settle_with(cd, req, by_brace, (last, forced), canonical[:1], 0)
        assert cd._forced_tokens(last, forced)[0][0] == canonical[0]
    assert cd.stats["learned_drafts"] == 6 and cd.stats["distinct_lessons"] == 2
    assert len(calls) == 2  # one decode for each of the two lessons (the model left the draft at its first token)


@pytest.mark.parametrize("seed", range(4))
def test_tensor_bitmask_apply_equals_xgrammars(seed):
    """The CUDA path's bitmask apply (plain tensor operations), run on the CPU against xgrammar's CPU kernel: random
    words, some rows or all, logits wider than the bitmask (padded vocabularies) or not."""
    import random

    import torch
    import xgrammar as xgr

    from radixlm.runtime.grammar.xgrammar_backend import apply_bitmask_with_tensor_ops

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(25):
        n, vocab = rng.randint(1, 6), rng.choice([33, 100, 49152])
        logits = torch.randn(n, vocab + rng.choice([0, 64]), generator=gen)
        bitmask = torch.randint(-2**31, 2**31 - 1, (n, (vocab + 31) // 32), dtype=torch.int32, generator=gen)
        rows = rng.sample(range(n), rng.randint(1, n)) if rng.random() < 0.5 else list(range(rng.randint(1, n)))
        expected, got = logits.clone(), logits.clone()
        xgr.apply_token_bitmask_inplace(expected, bitmask, indices=rows, backend="cpu",
                                        vocab_size=min(logits.shape[-1], bitmask.shape[-1] * 32))
        apply_bitmask_with_tensor_ops(got, bitmask, rows, torch.arange(32, dtype=torch.int32))
        assert torch.equal(got, expected)
