"""The INT4 weight-only methods (AWQ, GPTQ, compressed-tensors W4A16): a linear's or a FusedMoE's checkpoint tensors,
in its format (int4_formats.Int4Format), loaded at this rank's sizes and converted once loaded to radixlm's INT4
layout, which kernels.quant.int4_linear computes with.

Tensor parallelism: a column-parallel rank takes its output channels of every tensor (those packed along the
output, eight to an int32, on 8-channel boundaries); a row-parallel rank takes its input channels of the codes and
of g_idx, and every group of the scales and zero points: its channels need not cover whole groups (act-order, or a
group wider than its share), and the conversion keeps only the groups they use. The merged projections of one layer
(q | k | v, gate | up) share their input, so their act-order g_idx must agree (GPTQ's act-order derives it from
that input); a checkpoint where they differ is refused."""
from __future__ import annotations

import dataclasses
import math
import re

import torch
from torch import nn

from radixlm.runtime.kernels.quant import dequant_int4, int4_linear, int4_warmup_rows
from radixlm.runtime.layers.linear import ColumnParallelLinear
from radixlm.runtime.quantization.base import (
    DequantizingMoEMethod, DrawFn, LinearKind, LinearLayout, LinearMethod, QuantParam, checkpoint_shape, linear_layout,
    load_sliced, local_shape, moe_layouts, new_param, replace_param)
from radixlm.runtime.quantization.config import checkpoint_module_names
from radixlm.runtime.quantization.int4 import Int4Weight, default_g_idx, quantize_codes, uniform_group
from radixlm.runtime.quantization.int4_formats import Int4Format

MOE_PARTS = {"gate": ("w13", 0), "up": ("w13", 1), "down": ("w2", 0)}


def whole_input(layout: LinearLayout) -> LinearLayout:
    """The layout of a tensor whose input dim counts groups: every rank holds all of them."""
    kind = LinearKind.COLUMN if layout.kind is LinearKind.ROW else layout.kind
    return dataclasses.replace(layout, kind=kind, in_local=layout.in_full, in_start=0)


def module_skipped(prefix: str, names: tuple[str, ...]) -> bool:
    """AWQ's / GPTQ's modules_to_not_convert: a name matches whole dotted components of the module's checkpoint
    name (`gate` names `mlp.gate`, not `mlp.gate_proj`); a fused module (qkv_proj, gate_up_proj) is skipped when all
    of its parts are, refused when only some are."""
    if not names:
        return False
    parts = checkpoint_module_names(prefix)
    hits = [any(re.search(rf"(^|\.){re.escape(n)}($|\.)", p) for n in names) for p in parts]
    if any(hits) and not all(hits):
        raise ValueError(f"modules_to_not_convert names some of {parts} but not all: radixlm loads them as one "
                         f"layer ({prefix})")
    return all(hits)


class Int4Tensors:
    """One linear's (or one expert projection's) INT4 checkpoint tensors at a layout: shapes, loading, dummy."""

    def __init__(self, fmt: Int4Format, group_size: int, layout: LinearLayout, dtype: torch.dtype, what: str):
        self.fmt = fmt
        self.layout = layout
        self.group = layout.in_full if group_size == -1 else group_size
        if self.group <= 0 or (layout.in_full % self.group):
            raise ValueError(f"{what}: the group size {group_size} does not divide its input size {layout.in_full}")
        self.specs = {s.name: s for s in fmt.params(self.group, dtype)}

    def spec_layout(self, name: str) -> LinearLayout:
        return whole_input(self.layout) if name in self.fmt.grouped else self.layout

    def local_shapes(self, what: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        out = {n: (local_shape(s, self.spec_layout(n), f"{n} of {what}"), s.dtype) for n, s in self.specs.items()}
        shards = len(self.layout.shards)
        if self.fmt.g_idx_name:
            out[self.fmt.g_idx_name] = ((shards, self.layout.in_local), torch.int64)
        if self.fmt.shape_name:
            out[self.fmt.shape_name] = ((shards, 2), torch.int64)
        return out

    def fill_defaults(self, name: str, dst: torch.Tensor) -> None:
        """The values of the tensors a checkpoint may leave out (g_idx without act-order, weight_shape)."""
        if name == self.fmt.g_idx_name:
            dst.copy_(default_g_idx(self.layout.in_local, self.group, self.layout.in_start, dst.device).expand_as(dst))
        elif name == self.fmt.shape_name:
            for i, s in enumerate(self.layout.shards):
                dst[i, 0], dst[i, 1] = s.full, self.layout.in_full

    def required(self, name: str) -> bool:
        return name != self.fmt.shape_name and (name != self.fmt.g_idx_name or self.fmt.act_order)

    def load(self, name: str, dst: torch.Tensor, w, shard: int, what: str) -> None:
        if name in (self.fmt.g_idx_name, self.fmt.shape_name):
            dtype = getattr(w, "dtype", None)
            if dtype is not None and (dtype.is_floating_point or dtype == torch.bool):
                raise ValueError(f"tensor {what} is stored as {dtype}, expected integers")
        if name == self.fmt.g_idx_name:
            if tuple(w.shape) != (self.layout.in_full,):
                raise ValueError(f"tensor {what} has shape {tuple(w.shape)}, expected ({self.layout.in_full},)")
            lo = self.layout.in_start
            dst[shard].copy_(w[lo : lo + self.layout.in_local])
        elif name == self.fmt.shape_name:
            got = [int(v) for v in (w if isinstance(w, torch.Tensor) else w[...]).reshape(-1)]
            want = [self.layout.shards[shard].full, self.layout.in_full]
            if got != want:
                raise ValueError(f"tensor {what} says the weight is {got}, the model expects {want}")
        elif name in self.specs:
            load_sliced(self.specs[name], self.spec_layout(name), dst, w, shard, what)
        else:
            raise ValueError(f"{type(self.fmt).__name__} has no tensor {name!r} ({what})")

    def whole_shape(self, name: str, shard: int) -> tuple[int, ...]:
        if name == self.fmt.g_idx_name:
            return (self.layout.in_full,)
        if name == self.fmt.shape_name:
            return (2,)
        return checkpoint_shape(self.specs[name], self.spec_layout(name), shard)

    def g_idx(self, held: dict[str, torch.Tensor], what: str) -> torch.Tensor:
        if not self.fmt.g_idx_name:
            device = next(iter(held.values())).device
            return default_g_idx(self.layout.in_local, self.group, self.layout.in_start, device)
        g = held[self.fmt.g_idx_name]
        if any(not torch.equal(g[0], g[i]) for i in range(1, g.shape[0])):
            raise ValueError(f"{what}: the merged projections' {self.fmt.g_idx_name} differ (act-order orders of "
                             f"one input must agree)")
        return g[0]

    def convert(self, held: dict[str, torch.Tensor], dtype: torch.dtype, what: str,
                group: int | None = None) -> Int4Weight:
        t = {n: held[n] for n in self.specs}
        return self.fmt.convert(t, self.g_idx(held, what), dtype, what, group)

    def quantize(self, w: torch.Tensor, order: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """A whole float weight (N, K)'s checkpoint tensors; act-order without an order: the channels by
        decreasing norm (GPTQ orders them by its Hessian's diagonal)."""
        w = w.detach().float()
        if self.fmt.act_order and order is None:
            order = torch.argsort(w.norm(dim=0), descending=True, stable=True)
        return self.fmt.pack(quantize_codes(w, self.group, self.fmt.symmetric, order))

    def dummy(self, draw: DrawFn, weight_name: str, shard_ids: list, order_id) -> list[dict[str, torch.Tensor]]:
        """Each shard's checkpoint tensors of a random float weight, quantized in this format (act-order: one
        channel order for all shards, drawn like a weight)."""
        k = self.layout.in_full
        order = None
        if self.fmt.act_order:
            order = torch.argsort(draw(self.fmt.g_idx_name, order_id, (k,)), stable=True)
        return [self.quantize(draw(weight_name, sid, (self.layout.shards[i].full, k)), order)
                for i, sid in enumerate(shard_ids)]


class Int4LinearMethod(LinearMethod):
    """Messages name the tensor within its layer; the loader adds the layer's and the checkpoint tensor's names."""

    def __init__(self, fmt: Int4Format, group_size: int):
        self.fmt = fmt
        self.group_size = group_size

    def tensors(self, layer: nn.Module, dtype: torch.dtype | None = None) -> Int4Tensors:
        return Int4Tensors(self.fmt, self.group_size, linear_layout(layer), dtype or torch.get_default_dtype(),
                           type(layer).__name__)

    @staticmethod
    def _what(pname: str, shard_id) -> str:
        return pname if shard_id is None else f"{pname}[shard {shard_id}]"

    def params(self, layer: nn.Module) -> list[QuantParam]:
        return list(self.tensors(layer).specs.values())

    def create_weights(self, layer: nn.Module, device: torch.device | None = None) -> None:
        device = layer.weight.device if device is None else device
        t = self.tensors(layer)
        replace_param(layer, "weight", None)
        for name, (shape, dtype) in t.local_shapes(type(layer).__name__).items():
            p = new_param(shape, dtype, device)
            t.fill_defaults(name, p.data)
            layer.register_parameter(name, p)

    def weight_shards(self, layer: nn.Module, pname: str) -> list:
        if not self.tensors(layer).required(pname):
            return []
        return super().weight_shards(layer, pname)

    def load_weight(self, layer: nn.Module, pname: str, param: nn.Parameter, w, shard_id) -> None:
        self.tensors(layer, param.dtype).load(pname, param.data, w, shard_id or 0,
                                              self._what(pname, shard_id))

    def checkpoint_shape(self, layer: nn.Module, pname: str, shard_id) -> tuple[int, ...]:
        return self.tensors(layer).whole_shape(pname, shard_id or 0)

    def quantize_checkpoint(self, layer: nn.Module, w: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.tensors(layer).quantize(w)

    def init_dummy(self, layer: nn.Module, draw: DrawFn) -> None:
        t = self.tensors(layer)
        shard_ids = [None] if not isinstance(layer, ColumnParallelLinear) or len(layer.shards) == 1 \
            else list(range(len(layer.shards)))
        for sid, tensors in zip(shard_ids, t.dummy(draw, "weight", shard_ids, None)):
            for name, w in tensors.items():
                t.load(name, getattr(layer, name).data, w, sid or 0, self._what(name, sid))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        t = self.tensors(layer)
        dtype = getattr(layer, t.fmt.scale_name).dtype
        held = {n: getattr(layer, n).data for n in t.local_shapes("")}
        int4 = t.convert(held, dtype, type(layer).__name__)
        for name in held:
            replace_param(layer, name, None)
        replace_param(layer, "qweight", int4.qweight)
        replace_param(layer, "scales", int4.scales)
        replace_param(layer, "zeros", int4.zeros)
        replace_param(layer, "perm", int4.perm)
        layer.int4_group_size = int4.group_size

    def warmup_rows(self, layer: nn.Module, dtype: torch.dtype) -> tuple[int, ...]:
        """Row counts past the row buckets at which start-up's warm-up runs this layer (quant.int4_warmup_rows)."""
        return int4_warmup_rows(layer.qweight, layer.int4_group_size, dtype)

    def dequantized_weight(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        w = dequant_int4(layer.qweight, layer.scales, layer.zeros, layer.int4_group_size, dtype)
        perm = getattr(layer, "perm", None)
        if perm is None:
            return w
        out = torch.empty_like(w)
        out[:, perm] = w  # the weight's columns in act-order: x[perm] @ w.T is x @ out.T
        return out

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return int4_linear(x, layer.qweight, layer.scales, layer.zeros, layer.int4_group_size,
                           getattr(layer, "perm", None), bias)


class Int4MoEMethod(DequantizingMoEMethod):
    """Each expert's gate | up (w13) and down (w2) projections in the format; converted per expert, stacked with
    one group size per projection (the greatest that suits every expert). CUDA passes run the grouped W4A16 kernel
    (kernels.moe.quant_moe) on that layout, act-order perms included."""

    def __init__(self, fmt: Int4Format, group_size: int):
        self.fmt = fmt
        self.group_size = group_size

    def tensors(self, layer: nn.Module, prefix: str, dtype: torch.dtype | None = None) -> Int4Tensors:
        return Int4Tensors(self.fmt, self.group_size, moe_layouts(layer)[prefix], dtype or torch.get_default_dtype(),
                           f"experts' {prefix}")

    def params(self, layer: nn.Module) -> list[QuantParam]:
        return list(self.tensors(layer, "w13").specs.values())

    def create_weights(self, layer: nn.Module, device: torch.device | None = None) -> None:
        device = layer.w13_weight.device if device is None else device
        replace_param(layer, "w13_weight", None)
        replace_param(layer, "w2_weight", None)
        for prefix in ("w13", "w2"):
            t = self.tensors(layer, prefix)
            for name, (shape, dtype) in t.local_shapes(f"experts' {prefix}").items():
                p = new_param((layer.num_local_experts, *shape), dtype, device)
                for e in range(layer.num_local_experts):
                    t.fill_defaults(name, p.data[e])
                layer.register_parameter(f"{prefix}_{name}", p)

    def _split(self, layer: nn.Module, pname: str) -> tuple[str, str]:
        prefix, _, name = pname.partition("_")
        if prefix not in ("w13", "w2") or name not in self.tensors(layer, prefix).local_shapes(""):
            raise ValueError(f"{type(self.fmt).__name__} experts have no parameter {pname!r}")
        return prefix, name

    def weight_shards(self, layer: nn.Module, pname: str) -> list:
        prefix, name = self._split(layer, pname)
        if not self.tensors(layer, prefix).required(name):
            return []
        return [(e, p) for e in layer.local_experts() for p, (pre, _) in MOE_PARTS.items() if pre == prefix]

    def load_weight(self, layer: nn.Module, pname: str, param: nn.Parameter, w, shard_id) -> None:
        prefix, name = self._split(layer, pname)
        expert, part = layer.check_shard(pname, shard_id, {p: pre for p, (pre, _) in MOE_PARTS.items()})
        local = expert - layer.expert_start
        if not 0 <= local < layer.num_local_experts:
            return  # another rank's expert
        self.tensors(layer, prefix, param.dtype).load(name, param.data[local], w, MOE_PARTS[part][1],
                                                      f"{pname}[expert {expert}, {part}]")

    def checkpoint_shape(self, layer: nn.Module, pname: str, shard_id) -> tuple[int, ...]:
        prefix, name = self._split(layer, pname)
        return self.tensors(layer, prefix).whole_shape(name, MOE_PARTS[shard_id[1]][1])

    def quantize_checkpoint(self, layer: nn.Module, w: torch.Tensor) -> dict[str, torch.Tensor]:
        prefix = "w2" if w.shape[1] != layer.hidden_size else "w13"
        return self.tensors(layer, prefix).quantize(w)

    def init_dummy(self, layer: nn.Module, draw: DrawFn) -> None:
        for prefix in ("w13", "w2"):
            t = self.tensors(layer, prefix)
            parts = [p for p, (pre, _) in MOE_PARTS.items() if pre == prefix]
            for e in layer.local_experts():
                sids = [(e, p) for p in parts]
                for (_, part), tensors in zip(sids, t.dummy(draw, f"{prefix}_weight", sids, (e, parts[0]))):
                    for name, w in tensors.items():
                        t.load(name, getattr(layer, f"{prefix}_{name}").data[e - layer.expert_start], w,
                               MOE_PARTS[part][1], f"{prefix}_{name}[expert {e}, {part}]")

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        for prefix in ("w13", "w2"):
            t = self.tensors(layer, prefix)
            names = list(t.local_shapes(""))
            held = {n: getattr(layer, f"{prefix}_{n}").data for n in names}
            dtype = held[t.fmt.scale_name].dtype
            experts = range(layer.num_local_experts)
            what = [f"experts' {prefix} (expert {layer.expert_start + e})" for e in experts]
            group = math.gcd(*(uniform_group(t.g_idx({n: v[e] for n, v in held.items()}, what[e])) for e in experts))
            ws = [t.convert({n: v[e] for n, v in held.items()}, dtype, what[e], group) for e in experts]
            for n in names:
                replace_param(layer, f"{prefix}_{n}", None)
            replace_param(layer, f"{prefix}_qweight", torch.stack([w.qweight for w in ws]))
            replace_param(layer, f"{prefix}_scales", torch.stack([w.scales for w in ws]))
            replace_param(layer, f"{prefix}_zeros", torch.stack([w.zeros for w in ws]))
            perms = None
            if any(w.perm is not None for w in ws):
                k = ws[0].qweight.shape[0] * 8
                ar = torch.arange(k, device=ws[0].qweight.device)
                perms = torch.stack([ar if w.perm is None else w.perm for w in ws])
            replace_param(layer, f"{prefix}_perm", perms)
            setattr(layer, f"{prefix}_group_size", group)

    def grouped_experts(self, layer: nn.Module, dtype: torch.dtype, device: torch.device) -> tuple | None:
        """The converted layout as is: qweight (E, K // 8, N), scales / zeros (E, K // g, N), perm (E, K) or None."""
        from radixlm.runtime.kernels.moe.quant_moe import Int4Experts, grouped_supported

        w13, w2 = (Int4Experts(getattr(layer, f"{p}_qweight"), getattr(layer, f"{p}_scales"),
                               getattr(layer, f"{p}_zeros"), getattr(layer, f"{p}_group_size"),
                               getattr(layer, f"{p}_perm", None)) for p in ("w13", "w2"))
        return (w13, w2) if grouped_supported(w13, w2, dtype, device) else None

    def dequantized(self, layer: nn.Module, prefix: str, dtype: torch.dtype) -> torch.Tensor:
        perm = getattr(layer, f"{prefix}_perm", None)
        return torch.stack([
            Int4Weight(getattr(layer, f"{prefix}_qweight")[e], getattr(layer, f"{prefix}_scales")[e],
                       getattr(layer, f"{prefix}_zeros")[e], getattr(layer, f"{prefix}_group_size"),
                       None if perm is None else perm[e]).dequantize(dtype)
            for e in range(layer.num_local_experts)])
