"""New weights for the served model, in place: from a checkpoint on disk, from named tensors, or from tensors a trainer
broadcasts. Every source goes through the model's own loader (`load_weights`: each layer's `load_weight` takes this
rank's slice of the whole tensor, quantized layers their method's, then `process_weights_after_loading`).

An update is checked before anything is written: the loader runs first over a copy of the model on the meta device
with meta tensors of the update's names, shapes and dtypes, so a name the model does not have, a wrong shape, a
quantized tensor for a float layer or (from disk) a missing tensor is refused with the loader's own message and the
old weights keep serving. Then the tensors are loaded into the live parameters in place (their storage, so CUDA
graphs stay valid): float layers directly, a quantized layer into a staging copy of itself in the loading layout,
converted by its method and copied over. Past the checks, before the first write, `before_load` runs (the owner's
ModelRunner.unpack_weights: a CPU layer's packed `weight` refuses writes); the owner packs them again after
(ModelRunner.refresh_weights)."""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from radixlm.runtime.model_loader.config import ModelConfig
from radixlm.runtime.model_loader.loader import build_model, safetensors_files, safetensors_weights_iterator
from radixlm.runtime.models.kv_scales import kv_scale_target

logger = logging.getLogger(__name__)

UPDATE_LOAD_FORMATS = (None, "auto", "safetensors")


class WeightUpdateError(ValueError):
    """The update was refused before any weight was written: the model serves its old weights."""


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype | None  # None: a dtype torch has no name for (a checkpoint's)


def check_load_format(load_format: str | None) -> None:
    if load_format not in UPDATE_LOAD_FORMATS:
        raise WeightUpdateError(f"load_format {load_format!r} cannot update weights; use auto or safetensors")


def _without_kv_scales(weights: Iterable[tuple[str, object]]) -> Iterator[tuple[str, object]]:
    # The KV pool took its float8 scales at start-up; an update keeps them.
    for name, w in weights:
        if kv_scale_target(name) is None:
            yield name, w


def quantized_layers(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if getattr(m, "quant_method", None) is not None}


class WeightUpdater:
    """Updates one rank's model (ModelRunner.model) in place; `model_config` is the served model's. `before_load` runs
    once an update has passed its checks, before anything is written; the caller calls ModelRunner.refresh_weights
    after a load."""

    def __init__(self, model: nn.Module, model_config: ModelConfig, parallel, device: str | torch.device,
                 before_load: Callable[[], None] = lambda: None):
        self.model = model
        self.model_config = model_config
        self.parallel = parallel
        self.device = torch.device(device)
        self.before_load = before_load

    # ------------------------------------------------------------------ checks
    def check(self, metas: Iterable[TensorMeta], complete: bool) -> None:
        """Runs the loader over meta tensors: WeightUpdateError with its message if the update does not fit the model.
        complete: every weight must be there (a checkpoint); else any subset, a quantized layer's tensors together."""
        meta_model = build_model(self.model_config, "meta", self.parallel)
        tensors = ((m.name, torch.empty(m.shape, dtype=m.dtype or torch.uint8, device="meta")) for m in metas)
        try:
            report = meta_model.load_weights(_without_kv_scales(tensors), require_all=complete)
        except ValueError as e:
            raise WeightUpdateError(str(e)) from None
        if report.unexpected:
            shown = ", ".join(report.unexpected[:8])
            raise WeightUpdateError(f"{len(report.unexpected)} tensor(s) the model does not have: {shown}")
        if not report.loaded:
            raise WeightUpdateError("the update holds no weight of the model")
        if not complete:
            self._check_quantized_whole(meta_model, report.loaded)

    @staticmethod
    def _check_quantized_whole(model: nn.Module, loaded: set[tuple[str, object]]) -> None:
        for prefix, layer in quantized_layers(model).items():
            want = {(f"{prefix}.{p}", s) for p, _ in layer.named_parameters(recurse=False)
                    for s in layer.weight_shards(p)}
            got = want & loaded
            if got and got != want:
                missing = sorted(f"{n}[{s}]" if s is not None else n for n, s in want - got)
                raise WeightUpdateError(f"quantized layer {prefix} is updated with all of its tensors or none; "
                                        f"missing: {', '.join(missing[:6])}")

    # ------------------------------------------------------------------ loading
    @torch.no_grad()
    def load(self, weights: Iterable[tuple[str, object]], complete: bool) -> int:
        """Loads checked weights in place; returns how many parameters (or shards) were written."""
        self.before_load()
        staging = build_model(self.model_config, "meta", self.parallel)
        live = dict(self.model.named_modules())
        quantized = quantized_layers(staging)
        for name, module in staging.named_modules():
            if name in quantized:
                module.to_empty(device=self.device, recurse=False)
                continue
            for pname, p in list(module._parameters.items()):
                if p is not None:  # float layers load straight into the live parameters
                    module._parameters[pname] = live[name]._parameters[pname]
        report = staging.load_weights(_without_kv_scales(weights), require_all=complete)
        touched = {target.rsplit(".", 1)[0] for target, _ in report.loaded}
        for prefix, layer in quantized.items():
            if prefix in touched:
                layer.quant_method.process_weights_after_loading(layer)
                _copy_layer(layer, live[prefix], prefix)
        return len(report.loaded)

    # ------------------------------------------------------------------ sources
    def from_disk(self, model_path: str, load_format: str | None, args) -> int:
        """A checkpoint of the served architecture (HF directory, GGUF file or alias), complete."""
        check_load_format(load_format)
        cfg = self.model_config
        try:
            new = ModelConfig.from_path(model_path, dtype=cfg.dtype, device=str(self.device),
                                        load_format="auto", quantization=args.quantization)
            files = safetensors_files(new.model_path)
        except (ValueError, OSError) as e:
            raise WeightUpdateError(f"cannot read {model_path!r}: {e}") from None
        if new.architecture != cfg.architecture:
            raise WeightUpdateError(f"{model_path} is a {new.architecture}; the server runs a {cfg.architecture}")
        ours = None if cfg.quant_config is None else cfg.quant_config.describe()
        theirs = None if new.quant_config is None else new.quant_config.describe()
        if ours != theirs:
            raise WeightUpdateError(f"{model_path} is quantized as {theirs}; the server runs {ours}")
        self.check((TensorMeta(n, tuple(t.shape), t.dtype) for n, t in safetensors_weights_iterator(files)), True)
        return self.load(safetensors_weights_iterator(files), True)

    def from_tensors(self, named_tensors: list[tuple[str, torch.Tensor]], load_format: str | None) -> int:
        check_load_format(load_format)
        for item in named_tensors:
            if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], torch.Tensor)):
                raise WeightUpdateError("named_tensors must be (name, torch.Tensor) pairs")
        self.check((TensorMeta(n, tuple(t.shape), t.dtype) for n, t in named_tensors), False)
        return self.load(named_tensors, False)

    def from_broadcast(self, metas: list[TensorMeta], receive, load_format: str | None) -> int:
        """Tensors rank 0 of a weights-update group broadcasts, one per meta in order (receive(shape, dtype)). A
        refused update still receives them all (the trainer's broadcasts must complete), then drops them."""
        try:
            check_load_format(load_format)
            self.check(metas, False)
        except WeightUpdateError:
            for m in metas:
                receive(m.shape, m.dtype)
            raise
        return self.load(((m.name, receive(m.shape, m.dtype)) for m in metas), False)


def _copy_layer(staged: nn.Module, live: nn.Module, prefix: str) -> None:
    """A quantized layer converted in staging -> the live layer's parameters, in place."""
    ours = dict(live.named_parameters(recurse=False))
    theirs = dict(staged.named_parameters(recurse=False))
    if ours.keys() != theirs.keys():
        raise WeightUpdateError(f"{prefix}: the converted layer has parameters {sorted(theirs)}, the live one "
                                f"{sorted(ours)}")
    for name, p in theirs.items():
        if p.shape != ours[name].shape or p.dtype != ours[name].dtype:
            raise WeightUpdateError(f"{prefix}.{name}: converted to {tuple(p.shape)} {p.dtype}, the live layer holds "
                                    f"{tuple(ours[name].shape)} {ours[name].dtype}")
    for name, p in theirs.items():
        ours[name].data.copy_(p.data)
