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
