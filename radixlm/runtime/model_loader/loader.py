"""Build a model from a ModelConfig and fill its weights: safetensors (sharded or not) or dummy."""
from __future__ import annotations

import contextlib
import functools
import glob
import logging
import os
import time
import zlib
from typing import Iterator

import torch
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.files import ModelLoadError
from radixlm.runtime.quantization import (
    deferred_float_weights, dummy_draw, process_weights_after_loading, quantize_modules)

__all__ = ["ModelLoadError", "build_model", "load_model", "safetensors_weights_iterator", "initialize_dummy_weights"]

logger = logging.getLogger(__name__)

DUMMY_SEED = 1234
DUMMY_STD = 0.02


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def safetensors_files(model_path: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    if not files:
        raise ModelLoadError(f"no *.safetensors files in {model_path}")
    return files


_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}


class CheckpointTensor:
    """A tensor of a safetensors file, read only where it is indexed: a tensor-parallel rank reads its own slice of
    each weight (`w[a:b]`, `w[:, a:b]`); `w[...]` reads all of it. Valid while the iterator that yielded it is at it."""

    def __init__(self, safe_slice) -> None:
        self._slice = safe_slice
        self.shape = torch.Size(safe_slice.get_shape())
        self.nbytes = self.shape.numel() * _DTYPE_BYTES.get(safe_slice.get_dtype(), 1)
        self.dtype = _SAFETENSORS_DTYPES.get(safe_slice.get_dtype())  # None: a dtype torch has no name for here

    def dim(self) -> int:
        return len(self.shape)

    def __getitem__(self, index) -> torch.Tensor:
        return self._slice[index]


def safetensors_weights_iterator(files: list[str]) -> Iterator[tuple[str, CheckpointTensor]]:
    from safetensors import safe_open
    from tqdm import tqdm

    total = 0
    for f in files:
        total += os.path.getsize(f)
    with tqdm(total=total, desc="loading safetensors", unit="B", unit_scale=True, disable=total < (256 << 20)) as bar:
        for f in files:
            try:
                with safe_open(f, framework="pt", device="cpu") as st:
                    for name in st.keys():
                        t = CheckpointTensor(st.get_slice(name))
                        yield name, t
                        bar.update(t.nbytes)
            except ModelLoadError:
                raise
            except Exception as e:  # safetensors' own errors (truncated header, bad offsets, ...)
                raise ModelLoadError(f"cannot read safetensors file {f}: {type(e).__name__}: {e}") from e


@torch.no_grad()
def initialize_dummy_weights(model: nn.Module, seed: int = DUMMY_SEED, std: float = DUMMY_STD) -> None:
    """Deterministic random weights: norms 1, biases 0, everything else N(0, std). Each checkpoint tensor is drawn
    whole from a generator seeded by its name and sliced by its layer's `load_weight`, so every tensor-parallel and
    expert-parallel layout holds the same model. Generated on the parameter's own device (no CPU round trip). A
    quantized layer's method draws its float weights the same way and quantizes them (init_dummy)."""
    for module_name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            device = next(module.parameters()).device
            method.init_dummy(module, dummy_draw(module_name, device, std, functools.partial(_generator, device, seed)))
        for pname, param in module.named_parameters(recurse=False):
            if method is not None and pname != "bias":
                continue
            name = f"{module_name}.{pname}" if module_name else pname
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif pname.endswith("bias"):
                param.zero_()
            elif not hasattr(module, "checkpoint_shape"):
                param.normal_(0.0, std, generator=_generator(param.device, seed, name, None))
            else:
                for shard_id in module.weight_shards(pname):
                    whole = torch.empty(module.checkpoint_shape(pname, shard_id), dtype=param.dtype,
                                        device=param.device)
                    whole.normal_(0.0, std, generator=_generator(param.device, seed, name, shard_id))
                    module.load_weight(pname, param, whole, shard_id)


def _generator(device: torch.device, seed: int, name: str, shard_id) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed ^ zlib.crc32(f"{name}:{shard_id!r}".encode()))


def build_model(model_config: ModelConfig, device: str | torch.device, parallel: Parallel = SINGLE,
                model_cls: type[nn.Module] | None = None) -> nn.Module:
    """The model with its quantized layers' methods attached, its parameters created empty (uninitialised) on device
    ("meta": shapes only) in the model's dtype, as loading expects them. The float weights of the layers a format
    quantizes are never all on the device at once (deferred_float_weights)."""
    if model_cls is None:
        from radixlm.runtime.models.registry import get_model_class

        model_cls = get_model_class(model_config.architecture)
    quant_config = model_config.quant_config
    with torch.device(device), _default_dtype(model_config.dtype):
        with deferred_float_weights(quant_config):
            model = model_cls(model_config.hf_config, parallel)
        if model_config.is_embedding and hasattr(model, "drop_lm_head"):
            model.drop_lm_head()
        try:
            quantize_modules(model, quant_config, torch.device(device))
        except ValueError as e:
            raise ModelLoadError(f"{model_config.model_path}: {e}") from e
    return model


def load_model(model_config: ModelConfig, load_format: str = "auto", device: str | torch.device = "cpu",
               parallel: Parallel = SINGLE) -> nn.Module:
    """The model on `device`, holding this rank's shard of every weight."""
    from radixlm.runtime.models.registry import get_model_class

    if load_format not in ("auto", "safetensors", "dummy"):
        raise ValueError(f"unknown load_format {load_format!r}; use auto, safetensors or dummy")
    try:
        model_cls = get_model_class(model_config.architecture)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None
    t0 = time.perf_counter()
    model = build_model(model_config, device, parallel, model_cls)
    if load_format == "dummy":
        initialize_dummy_weights(model)
    else:
        files = safetensors_files(model_config.model_path)
        try:
            model.load_weights(safetensors_weights_iterator(files))
        except ModelLoadError:
            raise
        except ValueError as e:
            raise ModelLoadError(f"{model_config.model_path}: {e}") from e
    try:
        process_weights_after_loading(model)
    except ValueError as e:
        raise ModelLoadError(f"{model_config.model_path}: {e}") from e
    if torch.device(device).type == "cuda":
        # The load's transients (float tensors quantized as they are read, dummy draws, layout conversions) stay in
        # the caching allocator, where the KV pool's sizing (free device memory) would count them as used.
        torch.cuda.empty_cache()
    logger.info(
        "loaded %s (%s, %s) in %.2f s", model_config.architecture, model_config.dtype, load_format,
        time.perf_counter() - t0,
    )
    return model.eval()
