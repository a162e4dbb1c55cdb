"""The Llama-3.1-8B benchmark model: config and tokenizer kept in benchmarks/models/llama-3.1-8b (weights are
dummy), unpacked into a directory that radixlm and transformers both load; the same with tiny shapes (the CPU dry
runs of the GPU benchmarks), and 8B shapes with another model's tokenizer."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path

FILES = Path(__file__).resolve().parents[1] / "models" / "llama-3.1-8b"
TINY_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16}


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


# The formats benchmarks run Llama-3.1-8B's shapes in (dummy weights, drawn in float and quantized at load): the
# checkpoint's quantization_config, and the server arguments beside it.
QUANT_FORMATS: dict[str, tuple[dict | None, dict]] = {
    "bf16": (None, {}),
    "fp8": (None, {"quantization": "fp8"}),  # online: per channel
    "fp8_block": ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, {}),
    "w4a16": ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, {}),
    "fp8kv": (None, {"kv_cache_dtype": "fp8_e4m3"}),
    "fp8_fp8kv": (None, {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}),  # both, as users often run FP8
}


def quantized_model_dir(fmt: str, dst: str | None = None) -> tuple[str, dict]:
    """model_dir() with QUANT_FORMATS[fmt]'s quantization_config (a directory of its own), and its server arguments."""
    qc, engine_args = QUANT_FORMATS[fmt]
    if qc is None:
        return model_dir(dst), dict(engine_args)
    base = os.environ.get("RADIXLM_CACHE_DIR", os.path.expanduser("~/.cache/radixlm"))
    d = model_dir(dst or os.path.join(base, f"llama-3.1-8b-dummy-{fmt}"))
    p = Path(d) / "config.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "quantization_config": qc}, indent=2))
    return d, dict(engine_args)


def tiny_model_dir() -> str:
    """The 8B directory with TINY_SHAPE's config: a tiny random Llama with the Llama-3.1 tokenizer."""
    d = model_dir(tempfile.mkdtemp(prefix="radixlm_profile_tiny_"))  # per process: model_dir writes the 8B config first
    p = Path(d) / "config.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), **TINY_SHAPE}, indent=2))
    return d


def shaped_like_8b(tokenizer_model: str, dst: str) -> str:
    """A model directory with Llama-3.1-8B's shapes (dummy weights) and another model's tokenizer, vocabulary and
    stop tokens (tokenizer_model: an alias, GGUF file or directory): benchmarks that replay that model's outputs
    (grammar/json_decoding.py --script-ids) then pay an 8B model's passes."""
    from radixlm.runtime.model_loader.config import resolve_model_dir

    src = Path(resolve_model_dir(tokenizer_model, with_tensors=False))
    out = Path(dst)
    out.mkdir(parents=True, exist_ok=True)
    skip = ("config.json", "radixlm_source.json")
    for f in src.iterdir():
        if f.is_file() and f.name not in skip and not f.name.endswith((".safetensors", ".bin", ".gguf")):
            shutil.copyfile(f, out / f.name)
    own = json.loads((src / "config.json").read_text())
    config = json.loads((FILES / "config.json").read_text())
    config.update({k: own[k] for k in ("vocab_size", "bos_token_id", "eos_token_id") if k in own})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return str(out)
