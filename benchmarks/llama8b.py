"""The Llama-3.1-8B benchmark model: config and tokenizer kept in benchmarks/models/llama-3.1-8b (weights are
dummy), unpacked into a directory that radixlm and transformers both load."""
from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

FILES = Path(__file__).resolve().parent / "models" / "llama-3.1-8b"


def model_dir(dst: str | None = None) -> str:
    out = Path(dst or os.path.join(os.environ.get("RADIXLM_CACHE_DIR", os.path.expanduser("~/.cache/radixlm")),
                                   "llama-3.1-8b-dummy"))
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer_config.json"):
        shutil.copyfile(FILES / name, out / name)
    if not (out / "tokenizer.json").exists():
        with gzip.open(FILES / "tokenizer.json.gz", "rb") as src, open(out / "tokenizer.json.tmp", "wb") as f:
            shutil.copyfileobj(src, f)
        os.replace(out / "tokenizer.json.tmp", out / "tokenizer.json")
    return str(out)
