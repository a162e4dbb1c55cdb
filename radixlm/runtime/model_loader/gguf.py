"""GGUF -> Hugging Face directory (config.json, generation_config.json, tokenizer files with the chat
template, float32 safetensors), cached under cache_dir()/converted/<name>-<key>.

Config and tokenizer come from transformers' GGUF support; the tensors from our own dequantization
(gguf.GGUFReader + gguf.quants.dequantize) and name map, so loading never needs transformers' model code.
The directory is built in a temp dir and renamed into place: if it exists, it is complete."""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from radixlm.runtime.model_loader.files import ModelLoadError, build_lock, cache_dir

logger = logging.getLogger(__name__)

CONVERTER_VERSION = 2  # bump when the output format changes: old cache entries are then ignored
MAX_SHARD_BYTES = 1 << 30

ARCH_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# llama.cpp's converter permutes q/k rows only for these GGUF architectures (not qwen2/qwen3).
PERMUTED_QK_ARCHS = {"llama"}

_TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Tensors llama.cpp adds that HF layouts derive from the config instead.
_SKIPPED = {"rope_freqs.weight"}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_tensor_name(gguf_name: str) -> str | None:
    """GGUF tensor name -> HF parameter name; None for tensors HF does not store."""
    if gguf_name in _SKIPPED:
        return None
    if gguf_name in _TOP_LEVEL:
        return _TOP_LEVEL[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _BLOCK:
        return f"model.layers.{m.group(1)}.{_BLOCK[m.group(2)]}.{m.group(3)}"
    raise ModelLoadError(f"no Hugging Face name known for GGUF tensor {gguf_name!r}")


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's row interleave of q/k (weights and biases): within each head, rows were
    reordered from [first half | second half] to pairs (i, i + half)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key: str):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def iter_gguf_tensors(reader):
    """Yields (hf_name, float32 torch tensor) for every stored tensor of an open gguf.GGUFReader."""
    from gguf.quants import dequantize

    arch = _field(reader, "general.architecture")
    n_head = _field(reader, f"{arch}.attention.head_count")
    n_kv = _field(reader, f"{arch}.attention.head_count_kv") or n_head
    for t in reader.tensors:
        name = hf_tensor_name(t.name)
        if name is None:
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = dequantize(t.data, t.tensor_type).reshape(shape)
        if arch in PERMUTED_QK_ARCHS and (".q_proj." in name or ".k_proj." in name):
            w = unpermute_qk(w, n_head if ".q_proj." in name else n_kv)
        yield name, torch.from_numpy(np.require(w, np.float32, ["C", "W"]))


def _special_ids(reader, tokenizer, model_type: str) -> tuple[int | None, list[int]]:
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    eos: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        v = _field(reader, f"tokenizer.ggml.{key}")
        if v is not None and int(v) not in eos:
            eos.append(int(v))
    # Qwen's own generation_config stops on <|endoftext|> too (a GGUF records only <|im_end|>).
    if model_type in ("qwen2", "qwen3"):
        v = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        if isinstance(v, int) and v != tokenizer.unk_token_id and v not in eos:
            eos.append(v)
    return (None if bos is None else int(bos)), eos


def _write_tensors(reader, path: str, out: Path) -> None:
    from safetensors.torch import save_file
    from tqdm import tqdm

    # Each shard is written as soon as it is full, so peak memory stays near one shard; files get their
    # final HF names once the shard count is known.
    shard_names: list[list[str]] = []
    current: dict[str, torch.Tensor] = {}
    size = 0

    def flush() -> None:
        save_file(current, out / f"shard-{len(shard_names)}.tmp", metadata={"format": "pt"})
        shard_names.append(list(current))
        current.clear()

    tensors = iter_gguf_tensors(reader)
    for name, t in tqdm(tensors, total=len(reader.tensors), desc=f"dequantizing {os.path.basename(path)}"):
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > MAX_SHARD_BYTES:
            flush()
            size = 0
        current[name] = t
        size += nbytes
    flush()
    if len(shard_names) == 1:
        (out / "shard-0.tmp").rename(out / "model.safetensors")
        return
    weight_map = {}
    for i, names in enumerate(shard_names):
        fname = f"model-{i + 1:05d}-of-{len(shard_names):05d}.safetensors"
        (out / f"shard-{i}.tmp").rename(out / fname)
        weight_map.update(dict.fromkeys(names, fname))
    index = {"metadata": {}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


@contextlib.contextmanager
def _parsed_once(reader, path: str):
    """While transformers builds the config and the tokenizer: its GGUF loader (load_gguf_checkpoint, which imports
    gguf.GGUFReader on each call) gets `reader`, parsed here already, for `path`. Each parse walks the vocabulary's
    token arrays: 12.6 s for Qwen2.5-0.5B's 151,936 tokens on 2 cores, whose conversion took 51.3 s with three parses
    and 32.3 s with one (a run each). Other paths and arguments get a reader of their own. Held by the converting
    thread under the conversion's lock; any other thread constructing a GGUFReader meanwhile gets the same answer it
    would otherwise."""
    import gguf

    original = gguf.GGUFReader

    def reuse(p, *args, **kwargs):
        if not args and not kwargs and os.path.abspath(p) == path:
            return reader
        return original(p, *args, **kwargs)

    gguf.GGUFReader = reuse
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _write_config_and_tokenizer(reader, path: str, out: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    parent, name = os.path.dirname(path), os.path.basename(path)
    with _parsed_once(reader, path):
        config = AutoConfig.from_pretrained(parent, gguf_file=name)
        model_type = getattr(config, "model_type", None)
        if model_type not in ARCH_BY_MODEL_TYPE:
            supported = ", ".join(sorted(ARCH_BY_MODEL_TYPE))
            raise ModelLoadError(f"GGUF {path}: unsupported architecture {model_type!r} (supported: {supported})")
        tokenizer = AutoTokenizer.from_pretrained(parent, gguf_file=name)
    config.architectures = [ARCH_BY_MODEL_TYPE[model_type]]
    if hasattr(config, "quantization_config"):
        del config.quantization_config

    tokenizer.save_pretrained(out)
    if tokenizer.chat_template is None:
        logger.warning("GGUF %s carries no chat template", path)

    bos, eos = _special_ids(reader, tokenizer, model_type)
    eos_value = eos[0] if len(eos) == 1 else (eos or None)
    if eos:
        config.eos_token_id = eos_value
    config.save_pretrained(out)
    GenerationConfig(bos_token_id=bos, eos_token_id=eos_value).save_pretrained(out)


def converted_dir_for(path: str) -> Path:
    st = os.stat(path)
    key_src = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|v{CONVERTER_VERSION}"
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    return cache_dir() / "converted" / f"{Path(path).stem}-{key}"


def convert_gguf(path: str, with_tensors: bool = True) -> str:
    """Returns the HF directory for GGUF file `path`, converting it on first use (one process at a time: the others
    wait for its result). with_tensors=False: its config and tokenizer are enough (a directory of their own, unless
    the whole conversion is there already), and the weights are not dequantized."""
    path = os.path.abspath(path)
    out = converted_dir_for(path)
    if out.is_dir():
        return str(out)
    if not with_tensors:
        out = out.with_name(out.name + "-config")
        if out.is_dir():
            return str(out)
    with build_lock(out):
        if not out.is_dir():
            _convert(path, out, with_tensors)
    return str(out)


def _convert(path: str, out: Path, with_tensors: bool) -> None:
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    t0 = time.perf_counter()
    try:
        from gguf import GGUFReader

        try:
            reader = GGUFReader(path)  # parsing the metadata costs seconds (token arrays): once only
        except Exception as e:
            raise ModelLoadError(
                f"GGUF file {path} is truncated or corrupt ({os.path.getsize(path)} bytes): {type(e).__name__}: {e}"
            ) from e
        _write_config_and_tokenizer(reader, path, tmp)
        if with_tensors:
            _write_tensors(reader, path, tmp)
        (tmp / "radixlm_source.json").write_text(json.dumps({"gguf": path, "converter_version": CONVERTER_VERSION}))
        # mkdtemp makes the directory private; the cache holds nothing secret.
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        try:
            os.rename(tmp, out)
        except OSError:
            if not out.is_dir():  # a converter without the lock (no fcntl) won the race, or a real failure
                raise
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"cannot convert GGUF file {path}: {type(e).__name__}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted %s to %s in %.1f s", path, out, time.perf_counter() - t0)


def find_gguf(path: str) -> str | None:
    """The GGUF file `path` names: the file itself, or the single .gguf in a directory that has no config.json."""
    p = Path(path)
    if p.is_file():
        with open(p, "rb") as f:
            if f.read(4) == b"GGUF":
                return str(p)
        raise ModelLoadError(f"{path} is neither a GGUF file nor a model directory")
    if p.is_dir() and not (p / "config.json").exists():
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return str(ggufs[0])
        if len(ggufs) > 1:
            raise ModelLoadError(f"{path} holds several GGUF files ({', '.join(g.name for g in ggufs)}); name one")
    return None
