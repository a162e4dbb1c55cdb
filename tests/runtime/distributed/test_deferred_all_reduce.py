"""A decoder layer's row-parallel sums left to the next norm's prologue (Prologue.reduce): summed once, in
Parallel.fused_add_rmsnorm where the device comm fuses it, else all_reduce + the norm; never inside a GEMM.

The ranks here are two threads of this process, their device comms summing through a barrier: the real two-rank sum
at unit-test cost (the gloo tests in test_tensor_parallel.py run whole servers' models)."""
from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from radixlm.runtime.kernels import gemm
from radixlm.runtime.layers.activation import SiluAndMul
from radixlm.runtime.layers.linear import Linear, RowParallelLinear
from radixlm.runtime.layers.norm import RMSNorm
from radixlm.runtime.models.llama import LlamaForCausalLM

H, EPS = 16, 1e-5


def rms(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class DoublingComm:
    """One rank's device comm where the other rank holds the same partial: the sum is 2 x."""

    def __init__(self, fuse: bool):
        self.fuse = fuse
        self.calls: Counter = Counter()

    def accepts(self, x: torch.Tensor) -> bool:
        return True

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self.calls["all_reduce"] += 1
        return x * 2

    def fused_add_rmsnorm(self, x, residual, weight, eps):
        self.calls["fused"] += 1
        if not self.fuse:
            return None
        s = x * 2 + residual
        return rms(s, weight, eps), s


def _norm() -> RMSNorm:
    norm = RMSNorm(H, EPS)
    norm.weight.data.normal_(1.0, 0.1)
    return norm


@pytest.mark.parametrize("fuse", [True, False])
def test_add_rmsnorm_prologue_sums_once_fused_or_not(fuse):
    torch.manual_seed(0)
    comm = DoublingComm(fuse)
    norm, x, res = _norm(), torch.randn(3, H), torch.randn(3, H)
    pro = norm.prologue(res, Parallel(tp_rank=0, tp_size=2, device_comm=comm))
    out = pro.apply(x)
    torch.testing.assert_close(out, rms(2 * x + res, norm.weight))
    torch.testing.assert_close(pro.residual_out, 2 * x + res)
    assert comm.calls == ({"fused": 1} if fuse else {"fused": 1, "all_reduce": 1})
    assert pro.reduce is None  # summed: what is left of it is the plain step


def test_norm_and_activation_prologues_sum_first():
    torch.manual_seed(1)
    comm = DoublingComm(fuse=True)
    two = Parallel(tp_rank=0, tp_size=2, device_comm=comm)
    norm, act, x = _norm(), SiluAndMul(), torch.randn(3, 2 * H)
    torch.testing.assert_close(norm.prologue(None, two).apply(x[:, :H]), rms(2 * x[:, :H], norm.weight))
    pro = act.prologue()
    pro.reduce = two
    torch.testing.assert_close(pro.apply(x), act(2 * x))
    assert comm.calls == {"all_reduce": 2}  # nothing to fuse without a residual


@pytest.mark.parametrize("fuse", [True, False])
def test_linear_sums_before_any_gemm(fuse, monkeypatch):
    """gemm.linear may fuse a prologue or rerun copies of it while it times kernels: it gets the plain step (the
    sum done) or, where the comm took the norm too, none."""
    torch.manual_seed(2)
    seen = []

    def gemm_that_reruns(x, weight, bias, packed, choices, prologue, epilogue):
        seen.append(prologue)
        if prologue is not None:
            for _ in range(3):  # the kernel choice's measurements, each on a fresh copy
                dataclasses.replace(prologue).apply(x)
            x = prologue.apply(x)
        return F.linear(x, weight, bias)

    monkeypatch.setattr(gemm, "linear", gemm_that_reruns)
    comm = DoublingComm(fuse)
    norm, lin = _norm(), Linear(H, 8, bias=True)
    lin.weight.data.normal_(0, H**-0.5)
    lin.bias.data.normal_()
    x, res = torch.randn(2, H), torch.randn(2, H)
    pro = norm.prologue(res, Parallel(tp_rank=0, tp_size=2, device_comm=comm))
    got = lin(x, pro)
    assert comm.calls == ({"fused": 1} if fuse else {"fused": 1, "all_reduce": 1})
    assert len(seen) == 1 and seen[0] is (None if fuse else pro) and pro.reduce is None
    torch.testing.assert_close(got, F.linear(rms(2 * x + res, norm.weight), lin.weight, lin.bias))
    torch.testing.assert_close(pro.residual_out, 2 * x + res)


def test_a_biased_row_parallel_linear_sums_itself():
    lin = RowParallelLinear(8, H, bias=True, parallel=Parallel(tp_rank=0, tp_size=2, device_comm=DoublingComm(True)))
    with pytest.raises(ValueError, match="bias"):
        lin(torch.randn(2, 4), reduce=False)


# --- a whole model on two thread ranks ----------------------------------------------------------------------------


class Exchange:
    """The ranks' partials meet here; every rank gets rank 0's + rank 1's (the same sum, in the same order)."""

    def __init__(self, world: int):
        self.barrier = threading.Barrier(world, timeout=20)
        self.slots: list[torch.Tensor | None] = [None] * world

    def sum(self, rank: int, x: torch.Tensor) -> torch.Tensor:
        self.slots[rank] = x.clone()
        self.barrier.wait()
        total = sum(self.slots[1:], self.slots[0])
        self.barrier.wait()
        return total


class ThreadComm:
    def __init__(self, exchange: Exchange, rank: int, fuse: bool):
        self.exchange, self.rank, self.fuse = exchange, rank, fuse
        self.calls: Counter = Counter()
        self.fused_args: list[tuple] = []

    def accepts(self, x: torch.Tensor) -> bool:
        return True

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self.calls["all_reduce"] += 1
        return self.exchange.sum(self.rank, x)

    def fused_add_rmsnorm(self, x, residual, weight, eps):
        self.calls["fused"] += 1
        self.fused_args.append((tuple(x.shape), x.dtype, x.is_contiguous(), tuple(residual.shape), residual.dtype,
                                tuple(weight.shape), eps))
        if not self.fuse:
            return None
        s = self.exchange.sum(self.rank, x) + residual
        return rms(s, weight, eps), s


class MixingAttention(nn.Module):
    """Stands in for RadixAttention (no KV pool): each q head mixed with its kv head, row by row."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    def qkv_epilogue(self, forward_batch, rotary):
        return None

    def forward(self, q, k, v, forward_batch, rotary, epilogue):
        t, d = q.shape[0], self.head_dim
        q, k, v = q.view(t, -1, d), k.reshape(t, -1, d), v.reshape(t, -1, d)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return (torch.tanh(q) * (1 + k.mean(-1, keepdim=True)) + v).reshape(t, -1)


LAYERS = 2


def _config(o_bias: bool):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=H, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                       num_hidden_layers=LAYERS, vocab_size=24, rms_norm_eps=EPS, attention_bias=o_bias,
                       max_position_embeddings=64)


def _checkpoint(config) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    h, i, d = H, config.intermediate_size, H // config.num_attention_heads
    kv = config.num_key_value_heads * d
    w = {"model.embed_tokens.weight": r(config.vocab_size, h), "model.norm.weight": 1 + r(h),
         "lm_head.weight": r(config.vocab_size, h)}
    for n in range(LAYERS):
        p = f"model.layers.{n}."
        w |= {p + "self_attn.q_proj.weight": r(h, h), p + "self_attn.k_proj.weight": r(kv, h),
              p + "self_attn.v_proj.weight": r(kv, h), p + "self_attn.o_proj.weight": r(h, h),
              p + "mlp.gate_proj.weight": r(i, h), p + "mlp.up_proj.weight": r(i, h),
              p + "mlp.down_proj.weight": r(h, i), p + "input_layernorm.weight": 1 + r(h),
              p + "post_attention_layernorm.weight": 1 + r(h)}
        if config.attention_bias:
            w |= {p + f"self_attn.{x}_proj.bias": r(size) for x, size in (("q", h), ("k", kv), ("v", kv), ("o", h))}
    return w


def _hidden(parallel: Parallel, config, weights) -> torch.Tensor:
    model = LlamaForCausalLM(config, parallel)
    model.load_weights(weights.items())
    for layer in model.model.layers:
        layer.self_attn.attn = MixingAttention(layer.self_attn.head_dim)
    ids = torch.tensor([1, 5, 7, 23, 0])
    return model.model(ids, torch.arange(5), SimpleNamespace(input_embeds=None))


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("o_bias", [False, True])
def test_two_thread_ranks_sum_each_partial_once(fuse, o_bias):
    config = _config(o_bias)
    weights = _checkpoint(config)
    ref = _hidden(SINGLE, config, weights)
    exchange = Exchange(2)
    comms = [ThreadComm(exchange, r, fuse) for r in range(2)]
    ranks = [Parallel(tp_rank=r, tp_size=2, device_comm=comms[r]) for r in range(2)]
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda p: _hidden(p, config, weights), ranks))
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # Per layer: post_attention_layernorm (unless o_proj's bias follows its sum), and the next norm (the next
    # layer's input_layernorm or the final one); the embedding sums itself.
    norms = LAYERS * (1 if o_bias else 2)
    attempted = {"fused": norms, "all_reduce": 1 + LAYERS * o_bias + (0 if fuse else norms)}
    for comm in comms:
        assert comm.calls == attempted
        assert set(comm.fused_args) == {((5, H), torch.float32, True, (5, H), torch.float32, (H,), EPS)}


def test_one_rank_defers_nothing():
    model = LlamaForCausalLM(_config(False), SINGLE)
    assert model.model.norm_reduce is None
    for layer in model.model.layers:
        assert layer.attn_reduce is None and layer.output_reduce is None and layer.input_reduce is None
