"""Linear and embedding layers, tensor-parallel when the rank's `Parallel` says so, whose parameters start
uninitialised: the loader fills every one of them (real weights or dummy init), so skipping torch's default init
saves seconds on big models.

Loading is the layer's job: `load_weight(pname, param, w, shard_id)` takes a whole checkpoint tensor (read lazily: only
the part it indexes leaves the file) and copies this rank's slice of it; `weight_shards(pname)` lists the shard ids a
complete load must have seen (the model checks); `checkpoint_shape(pname, shard_id)` is the whole tensor's shape (the
dummy loader draws whole tensors, so every tensor-parallel layout holds the same model).

A quantized layer (`quant_method` set by radixlm.runtime.quantization.quantize_modules) holds its format's
parameters instead of `weight`; loading them (all but `bias`) and the GEMM are its method's, and so are the prologue
and the epilogue: run unfused before it and left to the caller (RotaryStore.applied stays False) unless the method's
kernel takes them (LinearMethod.apply_with_prologue)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel, divide
from radixlm.runtime.kernels import gemm
from radixlm.runtime.kernels.gemm import Prologue, RotaryStore, apply_prologue, cpu_gemm


def check_float_source(dst: torch.Tensor, src, what: str) -> None:
    """A float parameter must not take a quantized checkpoint tensor (it would be cast without its scales)."""
    src_dtype = getattr(src, "dtype", None)
    if src_dtype is not None and dst.dtype.is_floating_point and not (src_dtype.is_floating_point
                                                                      and src_dtype.itemsize > 1):
        raise ValueError(f"weight {what} is stored as {src_dtype} (quantized) but its layer is not quantized: the "
                         f"checkpoint's quantization_config does not cover it (or names it in its ignore list)")


def copy_checked(dst: torch.Tensor, src, what: str) -> None:
    """src: a tensor, or a checkpoint's lazily read one (anything indexable with shape: read here, whole)."""
    check_float_source(dst, src, what)
    if tuple(src.shape) != tuple(dst.shape):
        raise ValueError(f"weight {what} has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    dst.copy_(src if isinstance(src, torch.Tensor) else src[...])


@dataclass(frozen=True)
class Shard:
    """One projection of a (merged) column-parallel linear: its full output size in the checkpoint, and the rows of
    it this rank holds."""

    full: int
    local: int
    start: int

    @staticmethod
    def split(full: int, parallel: Parallel, what: str) -> "Shard":
        local = divide(full, parallel.tp_size, what)
        return Shard(full, local, parallel.tp_rank * local)

    @staticmethod
    def heads(num_heads: int, head_dim: int, parallel: Parallel, what: str) -> "Shard":
        """Whole heads per rank; with fewer heads than ranks, each head is replicated on tp_size / num_heads ranks."""
        tp = parallel.tp_size
        if num_heads >= tp:
            n = divide(num_heads, tp, what)
            return Shard(num_heads * head_dim, n * head_dim, parallel.tp_rank * n * head_dim)
        if tp % num_heads:
            raise ValueError(f"the tensor-parallel size {tp} is not a multiple of {what} ({num_heads})")
        return Shard(num_heads * head_dim, head_dim, parallel.tp_rank * num_heads // tp * head_dim)


class Linear(nn.Module):
    """Replicated: every rank holds the whole weight."""

    quant_method = None  # a quantization LinearMethod, or None: float
    lora = None  # a LoraLayer (radixlm.runtime.lora) under --enable-lora: adds each row's adapter delta

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.packed_weight: torch.Tensor | None = None  # set by pack_for_cpu(), cleared by unpack_for_cpu()
        # CUDA: choice key -> fastest kernel (set by gemm.linear), or row count -> a tuned LtGemm
        # (kernels/gemm/tuned_gemm.py)
        self.gemm_choices: dict[int, object] = {}

    def pack_for_cpu(self) -> None:
        """On the CPU, float32: the weight's oneDNN-packed copy becomes its only one (`weight` a placeholder of its
        shape, which refuses writes) until unpack_for_cpu. Packed already: nothing to do."""
        if self.quant_method is not None or self.packed_weight is not None:
            return
        self.packed_weight = gemm.pack_weight(self.weight)
        if self.packed_weight is not None:
            self.weight.data = cpu_gemm.placeholder(self.weight)

    def dense_weight(self) -> torch.Tensor:
        """The weight's values: the parameter, or a plain copy made from its packed one."""
        return self.weight if self.packed_weight is None else cpu_gemm.unpack(self.packed_weight)

    def unpack_for_cpu(self) -> None:
        """The plain weight back from its packed copy (before its values are written or moved)."""
        if self.packed_weight is not None:
            self.weight.data = cpu_gemm.unpack(self.packed_weight)
            self.packed_weight = None

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None, prologue: Prologue | None = None,
               epilogue: RotaryStore | None = None) -> torch.Tensor:
        if prologue is not None and prologue.reduce is not None:
            # A collective: run here, once, never inside the GEMM nor rerun by its kernel choice's measurements.
            x, prologue = prologue.reduce_input(x)
        lora = self.lora is not None and self.lora.active  # a pass with no adapter rows runs as the base model's
        partials = None
        if lora:
            # The delta reads the GEMM's input and lands before the rotary and KV store: nothing fused either side.
            x = apply_prologue(prologue, x)
            prologue = epilogue = None
            partials = self.lora.begin(x)  # graph decode: the shrink beside the GEMM
        if self.quant_method is not None:
            out = self.quant_method.apply_with_prologue(self, x, bias, prologue, epilogue)
        else:
            out = gemm.linear(x, self.weight, bias, self.packed_weight, self.gemm_choices, prologue, epilogue)
        return self.lora.add(out, x, partials) if lora else out

    def forward(self, x: torch.Tensor, prologue: Prologue | None = None,
                epilogue: RotaryStore | None = None) -> torch.Tensor:
        return self.matmul(x, self.bias, prologue, epilogue)

    def weight_shards(self, pname: str) -> list:
        if self.quant_method is not None and pname != "bias":
            return self.quant_method.weight_shards(self, pname)
        return self.float_weight_shards(pname)

    def load_weight(self, pname: str, param: nn.Parameter, w: torch.Tensor, shard_id) -> None:
        if self.quant_method is not None and pname != "bias":
            return self.quant_method.load_weight(self, pname, param, w, shard_id)
        self.load_float_weight(pname, param, w, shard_id)

    def checkpoint_shape(self, pname: str, shard_id) -> tuple[int, ...]:
        if self.quant_method is not None and pname != "bias":
            return self.quant_method.checkpoint_shape(self, pname, shard_id)
        return self.float_checkpoint_shape(pname, shard_id)

    def float_weight_shards(self, pname: str) -> list:
        return [None]

    def load_float_weight(self, pname: str, param: nn.Parameter, w: torch.Tensor, shard_id) -> None:
        copy_checked(param.data, w, pname)

    def float_checkpoint_shape(self, pname: str, shard_id) -> tuple[int, ...]:
        return tuple(getattr(self, pname).shape)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"


class ColumnParallelLinear(Linear):
    """Several projections of the same input stacked along the output dim (q|k|v, gate|up, or just one), each split
    across ranks by rows; the output stays split (the next layer is row-parallel or reads its own heads)."""

    def __init__(self, in_features: int, shards: list[Shard], bias: bool = False):
        super().__init__(in_features, sum(s.local for s in shards), bias)
        self.shards = list(shards)
        self.output_sizes = [s.local for s in shards]

    def shard_range(self, shard_id: int) -> tuple[int, int]:
        start = sum(self.output_sizes[:shard_id])
        return start, start + self.output_sizes[shard_id]

    def float_weight_shards(self, pname: str) -> list:
        return list(range(len(self.shards))) if len(self.shards) > 1 else [None]

    def load_float_weight(self, pname: str, param: nn.Parameter, w: torch.Tensor, shard_id) -> None:
        s = self.shards[shard_id or 0]
        lo, hi = self.shard_range(shard_id or 0)
        if w.shape[0] != s.full:
            raise ValueError(f"weight {pname} has {w.shape[0]} rows, expected {s.full}")
        copy_checked(param.data[lo:hi], w[s.start : s.start + s.local], pname)

    def float_checkpoint_shape(self, pname: str, shard_id) -> tuple[int, ...]:
        full = self.shards[shard_id or 0].full
        return (full, self.in_features) if pname == "weight" else (full,)


class RowParallelLinear(Linear):
    """The input dim split across ranks; the partial products are summed over ranks (bias added once, after), or
    left to the caller (`reduce=False`: the next norm's prologue sums them, Prologue.reduce)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, parallel: Parallel = SINGLE):
        self.parallel = parallel
        self.full_in = in_features
        super().__init__(divide(in_features, parallel.tp_size, "a row-parallel input size"), out_features, bias)

    def forward(self, x: torch.Tensor, prologue: Prologue | None = None, reduce: bool = True) -> torch.Tensor:
        """reduce=False: this rank's partial sum (no bias: it must be added once, after the sum)."""
        if self.parallel.tp_size == 1:
            return super().forward(x, prologue)
        if not reduce:
            if self.bias is not None:
                raise ValueError("a row-parallel linear with a bias cannot leave its sum to the caller")
            return self.matmul(x, None, prologue)
        out = self.parallel.all_reduce(self.matmul(x, None, prologue))
        return out if self.bias is None else out + self.bias

    def load_float_weight(self, pname: str, param: nn.Parameter, w: torch.Tensor, shard_id) -> None:
        if pname == "bias":
            return copy_checked(param.data, w, pname)
        if w.dim() != 2 or w.shape[1] != self.full_in:
            raise ValueError(f"weight {pname} has shape {tuple(w.shape)}, expected ({self.out_features}, {self.full_in})")
        start = self.parallel.tp_rank * self.in_features
        copy_checked(param.data, w[:, start : start + self.in_features], pname)

    def float_checkpoint_shape(self, pname: str, shard_id) -> tuple[int, ...]:
        return (self.out_features, self.full_in) if pname == "weight" else (self.out_features,)


class VocabEmbedding(nn.Module):
    """Rows split across ranks (the vocabulary padded to a multiple of tp_size); as an embedding each rank looks up
    its own ids and the ranks' rows are summed; as the LM head (`lm_head.weight`) each rank yields its vocab slice."""

    def __init__(self, num_embeddings: int, embedding_dim: int, parallel: Parallel = SINGLE):
        super().__init__()
        self.parallel = parallel
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.rows_per_rank = -(-num_embeddings // parallel.tp_size)
        self.start = parallel.tp_rank * self.rows_per_rank
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, embedding_dim), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.parallel.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.rows_per_rank)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.parallel.all_reduce(out.masked_fill(outside[:, None], 0))

    def weight_shards(self, pname: str) -> list:
        return [None]

    def load_weight(self, pname: str, param: nn.Parameter, w: torch.Tensor, shard_id) -> None:
        check_float_source(param.data, w, pname)
        if tuple(w.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"weight {pname} has shape {tuple(w.shape)}, "
                             f"expected {(self.num_embeddings, self.embedding_dim)}")
        rows = w[self.start : self.start + self.rows_per_rank]
        param.data[: rows.shape[0]].copy_(rows)
        param.data[rows.shape[0] :].zero_()

    def checkpoint_shape(self, pname: str, shard_id) -> tuple[int, ...]:
        return (self.num_embeddings, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, rows {self.start}..{self.start + self.rows_per_rank}"
