"""Tokenizer for a model path (alias, GGUF file or HF directory)."""
from __future__ import annotations

import logging
import os

from radixlm.runtime.model_loader.files import ModelLoadError

logger = logging.getLogger(__name__)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def _has_tokenizer_files(path: str) -> bool:
    """A directory holding a tokenizer (--tokenizer-path may name one without a model)."""
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES)


def get_tokenizer(model_path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    from radixlm.runtime.model_loader.config import resolve_model_dir

    model_dir = model_path if _has_tokenizer_files(model_path) else resolve_model_dir(model_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise ModelLoadError(f"cannot load a tokenizer from {model_dir}: {type(e).__name__}: {e}") from e
    if getattr(tokenizer, "chat_template", None) is None:
        logger.warning("tokenizer in %s has no chat template; chat requests will fail", model_dir)
    return tokenizer
