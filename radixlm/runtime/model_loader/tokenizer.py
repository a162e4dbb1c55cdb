"""Tokenizer for a model path (alias, GGUF file or HF directory)."""
from __future__ import annotations

import logging

from radixlm.runtime.model_loader.files import ModelLoadError

logger = logging.getLogger(__name__)


def get_tokenizer(model_path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    from radixlm.runtime.model_loader.config import resolve_model_dir

    model_dir = resolve_model_dir(model_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise ModelLoadError(f"cannot load a tokenizer from {model_dir}: {type(e).__name__}: {e}") from e
    if getattr(tokenizer, "chat_template", None) is None:
        logger.warning("tokenizer in %s has no chat template; chat requests will fail", model_dir)
    return tokenizer
