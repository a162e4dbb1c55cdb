"""The loader's hooks: keep the float weights of the layers a format may quantize off the device while the model is
built, attach each layer's method after (or, for a layer the model reads as a float weight, a method that dequantizes
it once loaded), fill a quantized layer with dummy weights, and convert every quantized layer to the kernels' layout
once its weights are loaded."""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Callable, Iterator

import torch
from torch import nn

from radixlm.runtime.layers.linear import ColumnParallelLinear, RowParallelLinear
from radixlm.runtime.layers.mla import LatentUpProjection
from radixlm.runtime.layers.moe import FusedMoE
from radixlm.runtime.quantization.base import DrawFn, LinearMethod, MoEMethod, QuantParam, replace_param
from radixlm.runtime.quantization.config import QuantConfig

logger = logging.getLogger(__name__)

# Replicated `Linear`s (routers, gates, EAGLE's fc) and the embeddings / lm_head stay in float, as in SGLang.
QUANTIZABLE = (ColumnParallelLinear, RowParallelLinear, FusedMoE)
# Layers the model reads as float weights: a checkpoint that quantizes them is dequantized at load (DequantizedAtLoad).
DEQUANTIZED_AT_LOAD = (LatentUpProjection,)


class DequantizedAtLoad(LinearMethod):
    """A layer the model reads as a float weight (MLA's kv_b_proj: its views feed batched matmuls), from a checkpoint
    that quantizes it (DeepSeek-V3's FP8 blocks): loaded as `inner`'s parameters, then dequantized once into the
    layer's float `weight` (its own shape, the model's dtype), after which the layer is a float one."""

    def __init__(self, inner: LinearMethod, shape: tuple[int, ...], dtype: torch.dtype):
        self.inner, self.shape, self.dtype = inner, shape, dtype

    def params(self, layer: nn.Module) -> list[QuantParam]:
        return self.inner.params(layer)

    def create_weights(self, layer: nn.Module, device: torch.device | None = None) -> None:
        self.inner.create_weights(layer, device)

    def weight_shards(self, layer: nn.Module, pname: str) -> list:
        return self.inner.weight_shards(layer, pname)

    def load_weight(self, layer: nn.Module, pname: str, param: nn.Parameter, w, shard_id) -> None:
        self.inner.load_weight(layer, pname, param, w, shard_id)

    def checkpoint_shape(self, layer: nn.Module, pname: str, shard_id) -> tuple[int, ...]:
        return self.inner.checkpoint_shape(layer, pname, shard_id)

    def quantize_checkpoint(self, layer: nn.Module, w: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.inner.quantize_checkpoint(layer, w)

    def init_dummy(self, layer: nn.Module, draw: DrawFn) -> None:
        self.inner.init_dummy(layer, draw)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.inner.process_weights_after_loading(layer)
        w = self.inner.dequantized_weight(layer, self.dtype).reshape(self.shape)
        for name in list(layer._parameters):
            replace_param(layer, name, None)
        replace_param(layer, "weight", w.contiguous())
        layer.quant_method = None

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise RuntimeError("a DequantizedAtLoad layer runs as a float layer once loaded")


def float_weight_names(module: nn.Module) -> tuple[str, ...]:
    """The parameters a quantized format replaces (a linear layer keeps its bias)."""
    if isinstance(module, FusedMoE):
        return ("w13_weight", "w2_weight")
    return ("weight",) if isinstance(module, QUANTIZABLE) else ()


@contextlib.contextmanager
def deferred_float_weights(quant_config: QuantConfig | None) -> Iterator[None]:
    """While the model is built in this thread (and quant_config is not None): each float weight a quantizable layer
    registers moves to the meta device as it is registered, so the whole float model is never held at once (a
    checkpoint that fits the device only quantized loads). quantize_modules then creates the quantized parameters,
    or the float ones of a layer the format leaves in float, on the device."""
    if quant_config is None:
        yield
        return
    builder = threading.get_ident()

    def to_meta(module: nn.Module, name: str, param):
        if param is None or threading.get_ident() != builder or name not in float_weight_names(module):
            return None
        return nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=False)

    handle = torch.nn.modules.module.register_module_parameter_registration_hook(to_meta)
    try:
        yield
    finally:
        handle.remove()


def quantize_modules(model: nn.Module, quant_config: QuantConfig | None, device: torch.device | None = None) -> int:
    """Attaches quant_config's method to every quantizable layer it does not leave in float and lets the method
    create the layer's parameters on device (None: where the layer's float weights are); a layer left in float whose
    weights were deferred (deferred_float_weights) gets them, uninitialised, on device. Returns how many layers are
    quantized."""
    if quant_config is None:
        return 0
    n = 0
    for prefix, module in model.named_modules():
        if isinstance(module, DEQUANTIZED_AT_LOAD):
            _dequantized_at_load(prefix, module, quant_config, device)
            continue
        if not isinstance(module, QUANTIZABLE):
            continue
        method = quant_config.method_for(prefix, module)
        if method is None:
            _materialize(module, device)
            continue
        want = MoEMethod if isinstance(module, FusedMoE) else LinearMethod
        if not isinstance(method, want):
            raise TypeError(f"{type(quant_config).__name__} gave {type(method).__name__} for {prefix}, expected a "
                            f"{want.__name__}")
        module.quant_method = method
        try:
            method.create_weights(module, device)
        except ValueError as e:
            raise ValueError(f"{prefix}: {e}") from None
        n += 1
    logger.info("quantization %s: %d layers quantized", quant_config.describe(), n)
    return n


def _dequantized_at_load(prefix: str, module: nn.Module, quant_config: QuantConfig,
                         device: torch.device | None) -> None:
    if quant_config.online:
        return  # a float checkpoint: quantizing the layer only to dequantize it would lose precision for nothing
    method = quant_config.method_for(prefix, module)
    if method is None:
        return
    if not isinstance(method, LinearMethod):
        raise TypeError(f"{type(quant_config).__name__} gave {type(method).__name__} for {prefix}, expected a "
                        f"LinearMethod")
    if type(method).dequantized_weight is LinearMethod.dequantized_weight:  # refused before any weight is read
        raise ValueError(f"{prefix}: {type(method).__name__} weights cannot be dequantized into a float layer")
    module.quant_method = DequantizedAtLoad(method, tuple(module.weight.shape), module.weight.dtype)
    try:
        module.quant_method.create_weights(module, device)
    except ValueError as e:
        raise ValueError(f"{prefix}: {e}") from None


def _materialize(module: nn.Module, device: torch.device | None) -> None:
    for name in float_weight_names(module):
        p = getattr(module, name)
        if p.is_meta and device is not None:
            module.register_parameter(name, nn.Parameter(torch.empty_like(p, device=device), requires_grad=False))


def quantized_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if getattr(m, "quant_method", None) is not None]


@torch.no_grad()
def process_weights_after_loading(model: nn.Module) -> None:
    for prefix, module in quantized_modules(model):
        try:
            module.quant_method.process_weights_after_loading(module)
        except ValueError as e:
            raise ValueError(f"{prefix}: {e}") from None


def dummy_draw(module_name: str, device: torch.device, std: float,
               generator: Callable[[str, object], torch.Generator]) -> DrawFn:
    """The draw function a method's init_dummy gets: generator(full parameter name, shard_id) seeds each whole
    tensor as the float dummy loader's does."""

    def draw(pname: str, shard_id, shape: tuple[int, ...]) -> torch.Tensor:
        name = f"{module_name}.{pname}" if module_name else pname
        out = torch.empty(shape, dtype=torch.float32, device=device)
        return out.normal_(0.0, std, generator=generator(name, shard_id))

    return draw
