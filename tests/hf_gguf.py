"""transformers' float32 model of a GGUF file (its own dequantizer: the parity tests' reference), kept on disk between
runs beside radixlm's own conversions (~/.cache/radixlm or $RADIXLM_CACHE_DIR): converting takes SmolLM2 10-30 s and
Qwen2.5-0.5B ~40 s on 2 cores, reading the saved module back a few seconds. The key holds the file's contents (its
sha256: a fresh clone installs the same SmolLM2 file at a new path) and the transformers and torch versions, so a saved
module is always what this transformers would build from this file."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def saved_path(gguf_path: str) -> Path:
    import torch
    import transformers

    from radixlm.runtime.model_loader.files import cache_dir

    contents = hashlib.sha256()
    with open(gguf_path, "rb") as f:
        while chunk := f.read(1 << 24):
            contents.update(chunk)
    key_src = f"{contents.hexdigest()}|transformers {transformers.__version__}|torch {torch.__version__}"
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    return cache_dir() / "hf-gguf" / f"{Path(gguf_path).stem}-{key}.pt"


def _convert(gguf_path: str):
    """Its config is the one transformers parsed from the same file when the engine converted it (the converted
    directory's config.json), where that directory exists: reading a GGUF's metadata (the tokenizer's arrays) costs
    Qwen2.5-0.5B 12 s each time."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from radixlm.runtime.model_loader.gguf import converted_dir_for

    converted = converted_dir_for(os.path.abspath(gguf_path))
    config = {"config": AutoConfig.from_pretrained(converted)} if (converted / "config.json").is_file() else {}
    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32, **config).eval()


def load_hf_gguf(gguf_path: str):
    """The model, converted once per file and version (a lock makes a second process, e.g. the other xdist worker,
    wait for the one converting). Read into memory, not mapped: over a mapped file (4 KiB pages) Qwen2.5-0.5B's
    greedy reference ran 2.5x slower."""
    import torch
    from filelock import FileLock

    saved = saved_path(gguf_path)
    saved.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(saved) + ".lock"):
        if saved.exists():
            return torch.load(saved, weights_only=False, mmap=False).eval()
        model = _convert(gguf_path)
        torch.save(model, str(saved) + ".part")
        os.replace(str(saved) + ".part", saved)
    return model
