"""The quantized layers' methods: a LinearMethod (Linear, ColumnParallelLinear, RowParallelLinear) or MoEMethod
(FusedMoE) owns the layer's weights from creation to the GEMM.

  create_weights(layer, device)          registers the format's parameters on the layer (on device; None: its float
                                         weight's) at this rank's sizes, named as in the checkpoint (`weight`,
                                         `weight_scale`, `qweight`, ...; FusedMoE's `w13_<name>` / `w2_<name>`, the
                                         expert dim first)
  weight_shards(layer, pname)            the shard ids a complete load sees for that parameter
  load_weight(layer, pname, param, w, shard_id)
                                         copies this rank's slice of the whole checkpoint tensor w
  checkpoint_shape(layer, pname, shard_id)
                                         the whole checkpoint tensor's shape (the dummy loader)
  quantize_checkpoint(layer, w)          a whole float weight's checkpoint tensors in this format
  init_dummy(layer, draw)                fills the parameters with a random model in this format (the dummy loader;
                                         by default: draws the float weights and quantize_checkpoint's them)
  process_weights_after_loading(layer)   converts to the kernels.quant layout
  apply(layer, x, bias)                  the GEMM (MoE: apply(layer, hidden, topk_weights, topk_ids), the rank's
                                         partial sum, before the all-reduce)

Most methods describe their parameters as QuantParams and inherit the slicing: a QuantParam says which tensor dim
runs along the output and the input channels and how many channels one element covers (a 128x128 block scale: 128
and 128; GPTQ's qweight (K / 8, N): input dim 0 of unit 8, output dim 1). Slices must fall on element boundaries,
else the load is refused naming the tensor (a block-scaled weight split across ranks inside a block)."""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from radixlm.runtime.kernels.gemm import Prologue, RotaryStore, apply_prologue
from radixlm.runtime.layers.linear import ColumnParallelLinear, Linear, RowParallelLinear, Shard
from radixlm.runtime.layers.mla import LatentUpProjection

# draw(pname, shard_id, shape) -> a float32 tensor ~ N(0, std), the same on every rank for the same arguments
DrawFn = Callable[[str, object, tuple[int, ...]], torch.Tensor]


class LinearKind(enum.Enum):
    REPLICATED = "replicated"
    COLUMN = "column"  # output rows split (each merged shard separately)
    ROW = "row"  # input columns split


@dataclass(frozen=True)
class LinearLayout:
    """What this rank holds of a (merged) linear weight: input columns in_start .. in_start + in_local of in_full,
    and of each output shard (q, k, v / gate, up / the one), the rows Shard.start .. + Shard.local of Shard.full."""

    kind: LinearKind
    in_full: int
    in_local: int
    in_start: int
    shards: tuple[Shard, ...]

    @property
    def out_local(self) -> int:
        return sum(s.local for s in self.shards)

    @property
    def out_full(self) -> int:
        return sum(s.full for s in self.shards)


def linear_layout(layer: nn.Module) -> LinearLayout:
    if isinstance(layer, RowParallelLinear):
        p = layer.parallel
        out = Shard(layer.out_features, layer.out_features, 0)
        return LinearLayout(LinearKind.ROW, layer.full_in, layer.in_features, p.tp_rank * layer.in_features, (out,))
    if isinstance(layer, ColumnParallelLinear):
        k = layer.in_features
        return LinearLayout(LinearKind.COLUMN, k, k, 0, tuple(layer.shards))
    if isinstance(layer, Linear):
        k, n = layer.in_features, layer.out_features
        return LinearLayout(LinearKind.REPLICATED, k, k, 0, (Shard(n, n, 0),))
    if isinstance(layer, LatentUpProjection):  # a column-parallel (heads x (nope + v), kv_lora_rank) weight
        k = layer.kv_lora_rank
        return LinearLayout(LinearKind.COLUMN, k, k, 0, (layer.shard,))
    raise TypeError(f"{type(layer).__name__} is not a linear layer")


def moe_layouts(layer: nn.Module) -> dict[str, LinearLayout]:
    """FusedMoE: one expert's w13 (gate | up, the intermediate rows split) and w2 (the intermediate columns split)."""
    h, i, lo, full = layer.hidden_size, layer.local_intermediate, layer.inter_start, layer.intermediate_size
    part = Shard(full, i, lo)
    return {"w13": LinearLayout(LinearKind.COLUMN, h, h, 0, (part, part)),
            "w2": LinearLayout(LinearKind.ROW, full, i, lo, (Shard(h, h, 0),))}


@dataclass(frozen=True)
class QuantParam:
    """One checkpoint tensor of a quantized linear (per output shard for merged layers).

    out_dim / in_dim: the dims running along output / input channels (None: not along them); out_unit / in_unit:
    channels per element along them. per_shard: one value per checkpoint tensor, of shape value_shape (a per-tensor
    scale: (), stored as () or (1,); compressed-tensors' weight_shape: (2,)), never sliced: the rank holds one per
    merged shard, shape (num_shards, *value_shape). exact_dtype: the checkpoint tensor must have `dtype` (quantized
    values; other float tensors may come in any float dtype and are converted)."""

    name: str
    dtype: torch.dtype
    out_dim: int | None = 0
    in_dim: int | None = 1
    out_unit: int = 1
    in_unit: int = 1
    per_shard: bool = False
    exact_dtype: bool = False
    value_shape: tuple[int, ...] = ()

    @property
    def ndim(self) -> int:
        return 0 if self.per_shard else 1 + max(d for d in (self.out_dim, self.in_dim, -1) if d is not None)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _units(start: int, count: int, full: int, unit: int, what: str, axis: str) -> tuple[int, int]:
    """Channels start .. start + count of full -> elements of unit channels (a partial last element only at the
    tensor's end)."""
    end = start + count
    if start % unit or (end % unit and end != full):
        raise ValueError(f"{what}: this rank's {axis} channels {start}..{end} of {full} do not fall on the "
                         f"{unit}-channel boundaries of its quantization (block / group / pack size)")
    return start // unit, _ceil(end, unit) - start // unit


def checkpoint_shape(spec: QuantParam, layout: LinearLayout, shard: int) -> tuple[int, ...]:
    if spec.per_shard:
        return spec.value_shape
    shape = [1] * spec.ndim
    if spec.out_dim is not None:
        shape[spec.out_dim] = _ceil(layout.shards[shard].full, spec.out_unit)
    if spec.in_dim is not None:
        shape[spec.in_dim] = _ceil(layout.in_full, spec.in_unit)
    return tuple(shape)


def local_shape(spec: QuantParam, layout: LinearLayout, what: str) -> tuple[int, ...]:
    if spec.per_shard:
        return (len(layout.shards), *spec.value_shape)
    shape = [1] * spec.ndim
    if spec.out_dim is not None:
        n = 0
        for i, s in enumerate(layout.shards):
            if i < len(layout.shards) - 1 and s.local % spec.out_unit:
                raise ValueError(f"{what}: the merged projections' rows ({[t.local for t in layout.shards]} on this "
                                 f"rank) do not fall on its {spec.out_unit}-row blocks")
            n += _units(s.start, s.local, s.full, spec.out_unit, what, "output")[1]
        shape[spec.out_dim] = n
    if spec.in_dim is not None:
        shape[spec.in_dim] = _units(layout.in_start, layout.in_local, layout.in_full, spec.in_unit, what, "input")[1]
    return tuple(shape)


def _dtype_of(w) -> torch.dtype | None:
    return getattr(w, "dtype", None)


def load_sliced(spec: QuantParam, layout: LinearLayout, dst: torch.Tensor, w, shard: int, what: str) -> None:
    """Copies this rank's part of checkpoint tensor w (shard `shard` of a merged layer) into dst (the rank's whole
    parameter for this layer, or for one expert)."""
    src_dtype = _dtype_of(w)
    if spec.exact_dtype and src_dtype is not None and src_dtype != spec.dtype:
        raise ValueError(f"tensor {what} is stored as {src_dtype}, expected {spec.dtype}")
    if not spec.exact_dtype and src_dtype is not None and not src_dtype.is_floating_point:
        raise ValueError(f"tensor {what} is stored as {src_dtype}, expected a float")
    want = checkpoint_shape(spec, layout, shard)
    got = tuple(w.shape)
    if spec.per_shard:
        if got != want and not (want == () and got == (1,)):
            raise ValueError(f"tensor {what} has shape {got}, expected "
                             + ("a single value (shape () or (1,))" if want == () else str(want)))
        dst[shard] = (w if isinstance(w, torch.Tensor) else w[...]).reshape(want)
        return
    # (N, 1) per-channel scales and the like: trailing size-1 dims beyond the spec's are accepted.
    if got[: len(want)] != want or any(d != 1 for d in got[len(want):]):
        raise ValueError(f"tensor {what} has shape {got}, expected {want}")
    index: list[slice] = [slice(None)] * len(want)
    out_index: list[slice] = [slice(None)] * len(want)
    if spec.out_dim is not None:
        s = layout.shards[shard]
        start, n = _units(s.start, s.local, s.full, spec.out_unit, what, "output")
        index[spec.out_dim] = slice(start, start + n)
        offset = sum(_units(t.start, t.local, t.full, spec.out_unit, what, "output")[1] for t in layout.shards[:shard])
        out_index[spec.out_dim] = slice(offset, offset + n)
    if spec.in_dim is not None and layout.kind is LinearKind.ROW:
        start, n = _units(layout.in_start, layout.in_local, layout.in_full, spec.in_unit, what, "input")
        index[spec.in_dim] = slice(start, start + n)
    part = w[tuple(index)] if index else (w if isinstance(w, torch.Tensor) else w[...])
    part = part.reshape(part.shape[: len(want)])
    target = dst[tuple(out_index)] if out_index else dst
    if tuple(part.shape) != tuple(target.shape):
        raise ValueError(f"tensor {what}: this rank's slice has shape {tuple(part.shape)}, expected "
                         f"{tuple(target.shape)}")
    target.copy_(part)


def new_param(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def replace_param(layer: nn.Module, name: str, value: torch.Tensor | None) -> None:
    """Sets (or with None removes) a parameter of the layer, dropping the previous one."""
    if name in layer._parameters:
        del layer._parameters[name]
    elif hasattr(layer, name):
        delattr(layer, name)
    if value is not None:
        layer.register_parameter(name, nn.Parameter(value, requires_grad=False))


class LinearMethod(ABC):
    """A quantized linear layer's weights and GEMM. Subclasses list their checkpoint tensors in `params(layer)`;
    the default create/load/shape methods follow them."""

    @abstractmethod
    def params(self, layer: nn.Module) -> list[QuantParam]:
        """The checkpoint tensors this layer loads (bias excluded: the layer keeps its own)."""

    def _spec(self, layer: nn.Module, pname: str) -> QuantParam:
        for spec in self.params(layer):
            if spec.name == pname:
                return spec
        raise ValueError(f"{type(self).__name__} has no parameter {pname!r}")

    def create_weights(self, layer: nn.Module, device: torch.device | None = None) -> None:
        layout = linear_layout(layer)
        device = layer.weight.device if device is None else device
        specs = self.params(layer)  # may read the float weight's dtype
        replace_param(layer, "weight", None)
        for spec in specs:
            shape = local_shape(spec, layout, f"{spec.name} of {type(layer).__name__}")
            layer.register_parameter(spec.name, new_param(shape, spec.dtype, device))

    # The layer keeps loading its own bias: these see every parameter but `bias`.
    def weight_shards(self, layer: nn.Module, pname: str) -> list:
        if not isinstance(layer, ColumnParallelLinear) or len(layer.shards) == 1:
            return [None]
        return list(range(len(layer.shards)))

    def load_weight(self, layer: nn.Module, pname: str, param: nn.Parameter, w, shard_id) -> None:
        load_sliced(self._spec(layer, pname), linear_layout(layer), param.data, w, shard_id or 0, pname)

    def checkpoint_shape(self, layer: nn.Module, pname: str, shard_id) -> tuple[int, ...]:
        return checkpoint_shape(self._spec(layer, pname), linear_layout(layer), shard_id or 0)

    @abstractmethod
    def quantize_checkpoint(self, layer: nn.Module, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """The checkpoint tensors of this format for one whole float weight w (N, K) of the layer (one shard of a
        merged one): the dummy loader's, and the tests' writers'."""

    def init_dummy(self, layer: nn.Module, draw: DrawFn) -> None:
        """Random weights in this format: each shard's whole float weight drawn as the float dummy loader draws the
        layer's `weight`, quantized (quantize_checkpoint) and loaded as a checkpoint's."""
        layout = linear_layout(layer)
        ids = [None] if len(layout.shards) == 1 else list(range(len(layout.shards)))
        for sid in ids:
            w = draw("weight", sid, (layout.shards[sid or 0].full, layout.in_full))
            for pname, t in self.quantize_checkpoint(layer, w).items():
                self.load_weight(layer, pname, getattr(layer, pname), t, sid)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """To the kernels.quant layout (default: as loaded)."""

    def dequantized_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """This rank's (N, K) float weight, once loaded and processed (DequantizedAtLoad)."""
        raise ValueError(f"{type(self).__name__} weights cannot be dequantized into a float layer")

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ W.T + bias (x already through any prologue)."""

    def apply_with_prologue(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                            prologue: Prologue | None, epilogue: RotaryStore | None = None) -> torch.Tensor:
        """apply() where x is the input before `prologue` (the norm or activation before this GEMM): run first,
        unfused, unless the method's kernels take it (Fp8LinearMethod: in the few-row kernel's loads, or with the
        activations' quantization). epilogue (the qkv GEMM's rotation and KV store): left to the caller unless the
        method's kernel applies it (RotaryStore.applied)."""
        return self.apply(layer, apply_prologue(prologue, x), bias)


MOE_PREFIXES = {"gate": "w13", "up": "w13", "down": "w2"}
FLOAT_SHAPE = {"gate": lambda m: (m.intermediate_size, m.hidden_size),
               "up": lambda m: (m.intermediate_size, m.hidden_size),
               "down": lambda m: (m.hidden_size, m.intermediate_size)}


class MoEMethod(ABC):
    """A FusedMoE's quantized experts. `params(layer)` lists one expert's checkpoint tensors (names without the
    w13_/w2_ prefix); the layer holds w13_<name> (gate | up) and w2_<name> (down), the local experts stacked first."""

    @abstractmethod
    def params(self, layer: nn.Module) -> list[QuantParam]: ...

    def _split(self, layer: nn.Module, pname: str) -> tuple[str, QuantParam]:
        prefix, _, name = pname.partition("_")
        for spec in self.params(layer):
            if spec.name == name and prefix in ("w13", "w2"):
                return prefix, spec
        raise ValueError(f"{type(self).__name__} has no expert parameter {pname!r}")

    def create_weights(self, layer: nn.Module, device: torch.device | None = None) -> None:
        device = layer.w13_weight.device if device is None else device
        specs = self.params(layer)  # may read the float weights' dtype
        replace_param(layer, "w13_weight", None)
        replace_param(layer, "w2_weight", None)
        for prefix, layout in moe_layouts(layer).items():
            for spec in specs:
                shape = local_shape(spec, layout, f"experts' {prefix}_{spec.name}")
                layer.register_parameter(f"{prefix}_{spec.name}",
                                         new_param((layer.num_local_experts, *shape), spec.dtype, device))

    def weight_shards(self, layer: nn.Module, pname: str) -> list:
        prefix, _ = self._split(layer, pname)
        parts = [p for p, pre in MOE_PREFIXES.items() if pre == prefix]
        return [(e, p) for e in layer.local_experts() for p in parts]

    def load_weight(self, layer: nn.Module, pname: str, param: nn.Parameter, w, shard_id) -> None:
        expert, part = layer.check_shard(pname, shard_id, MOE_PREFIXES)
        local = expert - layer.expert_start
        if not 0 <= local < layer.num_local_experts:
            return  # another rank's expert
        prefix, spec = self._split(layer, pname)
        shard = 1 if part == "up" else 0
        load_sliced(spec, moe_layouts(layer)[prefix], param.data[local], w, shard,
                    f"{pname}[expert {expert}, {part}]")

    def checkpoint_shape(self, layer: nn.Module, pname: str, shard_id) -> tuple[int, ...]:
        prefix, spec = self._split(layer, pname)
        return checkpoint_shape(spec, moe_layouts(layer)[prefix], 1 if shard_id[1] == "up" else 0)

    @abstractmethod
    def quantize_checkpoint(self, layer: nn.Module, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """One expert projection's checkpoint tensors (names without w13_/w2_) for its whole float weight w."""

    def init_dummy(self, layer: nn.Module, draw: DrawFn) -> None:
        """As LinearMethod's, drawing w13_weight / w2_weight per local expert and part as the float loader does."""
        for prefix in ("w13", "w2"):
            pname = f"{prefix}_weight"
            for sid in self.weight_shards(layer, pname):
                w = draw(pname, sid, FLOAT_SHAPE[sid[1]](layer))
                for name, t in self.quantize_checkpoint(layer, w).items():
                    full = f"{prefix}_{name}"
                    self.load_weight(layer, full, getattr(layer, full), t, sid)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """To the kernels.quant layout (default: as loaded)."""

    @abstractmethod
    def apply(self, layer: nn.Module, hidden: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        """The routed experts' output on this rank (a partial sum; the layer all-reduces)."""


class DequantizingMoEMethod(MoEMethod):
    """Experts computed by dequantizing this rank's experts (kernels.quant) and running the float experts: the CPU
    path, and the reference a grouped quantized kernel is checked against. A method whose format the grouped
    quantized kernels take (kernels.moe.quant_moe) says so in grouped_experts: CUDA passes run those instead."""

    @abstractmethod
    def dequantized(self, layer: nn.Module, prefix: str, dtype: torch.dtype) -> torch.Tensor:
        """w13 (E_local, 2 I_local, H) or w2 (E_local, H, I_local) in float, for prefix "w13" / "w2"."""

    def grouped_experts(self, layer: nn.Module, dtype: torch.dtype, device: torch.device) -> tuple | None:
        """(w13, w2) as kernels.moe.quant_moe's experts (views of the layer's tensors) where its grouped kernels run
        this layer for activations of dtype on device; None: the dequantizing path."""
        return None

    def apply(self, layer: nn.Module, hidden: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        from radixlm.runtime.kernels.moe import fused_experts

        if hidden.is_cuda:
            experts = self.grouped_experts(layer, hidden.dtype, hidden.device)
            if experts is not None:
                from radixlm.runtime.kernels.moe.quant_moe import fused_experts_quant

                return fused_experts_quant(hidden, *experts, topk_weights, topk_ids, layer.expert_start,
                                           layer.num_experts)
        w13 = self.dequantized(layer, "w13", hidden.dtype)
        w2 = self.dequantized(layer, "w2", hidden.dtype)
        return fused_experts(hidden, w13, w2, topk_weights, topk_ids, layer.expert_start, layer.num_experts)
