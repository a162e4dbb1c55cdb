"""The qkv GEMM's epilogue (gemm/epilogue.py): the skinny kernel's rotation and KV store, bit-identical to the same
kernel config without it followed by the rotary embedding and the store (on the CPU under TRITON_INTERPRET=1 in a
subprocess, in float32 and float16; on CUDA in bfloat16 and float16 at every autotune config); and the paths around
it: attention skips its rotation and store only where the GEMM applied the epilogue."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "epilogue cases passed"


def _launch(x, w, bias, pro, epi, cfg, dtype, prologue_args):
    """One launch of the skinny kernel at a fixed config (no autotuning), as skinny_linear passes its arguments."""
    from radixlm.runtime.kernels.gemm import skinny_gemm

    n, k = w.shape
    y = torch.empty(1, n, dtype=dtype, device=x.device)
    nw, r, r_out, eps, stride_r = prologue_args
    if epi is not None:
        cs = epi.rope.cos_sin_on(x.device)
        ptrs = (epi.positions, cs, epi.loc, epi.k_buf, epi.v_buf)
        ints = (epi.q_size, epi.kv_size, cs.stride(0), epi.k_buf.stride(0), epi.v_buf.stride(0), epi.k_scale,
                epi.v_scale)
    else:
        ptrs, ints = (w,) * 5, (0,) * 5 + (1.0, 1.0)
    skinny_gemm._skinny_kernel.fn[(n // cfg["BLOCK_N"],)](
        x, w, bias if bias is not None else w, y, nw, r, r_out, *ptrs, n, k, x.stride(0), w.stride(0), y.stride(0),
        stride_r, eps, *ints, M=1, HAS_BIAS=bias is not None, PRO=pro, EPI=epi is not None,
        HEAD_DIM=epi.head_dim if epi is not None else 0, **cfg)
    return y


def run_cases(device: str) -> None:
    from radixlm.runtime.cache.memory_pool import TokenToKVPool
    from radixlm.runtime.kernels.gemm import skinny_gemm
    from radixlm.runtime.kernels.gemm.epilogue import RotaryStore
    from radixlm.runtime.layers.rotary import get_rope

    cfgs = [dict(c.all_kwargs()) for c in skinny_gemm._CONFIGS]
    if device == "cpu":  # the interpreter's time: a few configs and dtypes
        cases = [(torch.float32, cfgs[6], False, 0, 64), (torch.float32, cfgs[3], True, 2, 128),
                 (torch.float16, cfgs[0], True, 1, 64), (torch.float16, cfgs[1], False, 0, 128)]
    else:
        cases = [(dtype, cfg, bias, pro, d) for dtype in (torch.bfloat16, torch.float16) for cfg in cfgs
                 for bias, pro, d in ((False, 2, 128), (True, 1, 64), (False, 0, 128))]
    for i, (dtype, cfg, bias, pro, head_dim) in enumerate(cases):
        torch.manual_seed(i)
        hq, hkv, k = 4, 2, 256
        n = (hq + 2 * hkv) * head_dim
        x = torch.randn(1, k, device=device).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        b = torch.randn(n, device=device).to(dtype) if bias else None
        norm_w = torch.randn(k, device=device).to(dtype)
        res = torch.randn(1, k, device=device).to(dtype)
        prologue_args = (norm_w, res if pro == 2 else w, torch.empty_like(res) if pro == 2 else w,
                         1e-5 if pro else 0.0, res.stride(0) if pro == 2 else 0)
        rope = get_rope(head_dim, 8192, 500000.0)
        pos = torch.tensor([4000 + i], device=device)
        loc = torch.tensor([3], device=device)
        pools = [TokenToKVPool(8, 1, dtype, 1, hkv, head_dim, device) for _ in range(2)]
        epi = RotaryStore(rope, pos, loc, pools[0].k_buffer[0], pools[0].v_buffer[0], hq * head_dim, hkv * head_dim)

        plain = _launch(x, w, b, pro, None, cfg, dtype, prologue_args)
        q, k_, v = plain.clone().split([hq * head_dim, hkv * head_dim, hkv * head_dim], dim=-1)
        q, k_ = rope(pos, q, k_)
        pools[1].set_kv_buffer(0, loc, k_, v)
        got = _launch(x, w, b, pro, epi, cfg, dtype, prologue_args)
        where = f"case {i} ({dtype}, {cfg}, bias {bias}, prologue {pro}, head dim {head_dim})"
        assert torch.equal(got, torch.cat([q, k_, v], dim=-1)), where
        assert torch.equal(pools[0].k_buffer[0], pools[1].k_buffer[0]), where
        assert torch.equal(pools[0].v_buffer[0], pools[1].v_buffer[0]), where
    fp8_cases(device, cfgs[0])
    print(MARKER)


def fp8_cases(device: str, cfg: dict) -> None:
    """A float8 pool: the epilogue stores k / k_scale and v / v_scale saturated, as set_kv_buffer does. On the CPU the
    outputs are float8 values times the scales (x one-hot, position 0: no rotation), so the interpreter's own float8
    rounding (not the hardware's) does not enter; some saturate."""
    from radixlm.runtime.cache.kv_quant import KVScales
    from radixlm.runtime.cache.memory_pool import TokenToKVPool
    from radixlm.runtime.kernels.gemm.epilogue import RotaryStore
    from radixlm.runtime.layers.rotary import get_rope

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    hq, hkv, head_dim, k = 2, 1, 64, 64
    n = (hq + 2 * hkv) * head_dim
    for i, kv_dtype in enumerate((torch.float8_e4m3fn, torch.float8_e5m2)):
        torch.manual_seed(10 + i)
        scales = KVScales(0.5, 4.0)
        x = torch.zeros(1, k, device=device).to(dtype)
        x[0, 3] = 1
        w = torch.randn(n, k, device=device)
        w[:, 3] = (torch.randn(n, device=device) * 8).to(kv_dtype).float() * 4.0
        w[hq * head_dim, 3] = w[-1, 3] = 1e6  # past the format's largest value in k and in v
        w = w.to(dtype)
        rope = get_rope(head_dim, 8192, 500000.0)
        pos = torch.tensor([0 if device == "cpu" else 4000], device=device)
        loc = torch.tensor([2], device=device)
        pools = [TokenToKVPool(4, 1, kv_dtype, 1, hkv, head_dim, device, [scales]) for _ in range(2)]
        epi = RotaryStore(rope, pos, loc, pools[0].k_buffer[0], pools[0].v_buffer[0], hq * head_dim, hkv * head_dim,
                          scales.k_scale, scales.v_scale)
        plain = _launch(x, w, None, 0, None, cfg, dtype, (w, w, w, 0.0, 0))
        q, k_, v = plain.clone().split([hq * head_dim, hkv * head_dim, hkv * head_dim], dim=-1)
        q, k_ = rope(pos, q, k_)
        pools[1].set_kv_buffer(0, loc, k_, v)
        got = _launch(x, w, None, 0, epi, cfg, dtype, (w, w, w, 0.0, 0))
        assert torch.equal(got, torch.cat([q, k_, v], dim=-1)), kv_dtype
        biggest = torch.finfo(kv_dtype).max
        # k is rotated first (position 4000 on CUDA: cos < 0 there), so its saturated value may be either sign.
        assert pools[0].k_buffer[0][2, 0, 0].float().abs() == biggest
        assert pools[0].v_buffer[0][2, 0, -1].float() == biggest
        for a, b in ((pools[0].k_buffer[0], pools[1].k_buffer[0]), (pools[0].v_buffer[0], pools[1].v_buffer[0])):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), kv_dtype


# With CUDA the compiled test runs instead (Triton 3.6's interpreter, on the GPU machine, fails on the scalar loads).
@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs triton's interpreter, no CUDA")
def test_epilogue_equals_rotation_then_store_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True, timeout=600)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_epilogue_equals_rotation_then_store_cuda():
    run_cases("cuda")


class _Recorder:
    def __init__(self):
        self.calls = []

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, rotary=None):
        self.calls.append((save_kv_cache, rotary))
        return q


def test_attention_skips_rotation_and_store_only_where_the_gemm_applied_the_epilogue():
    from radixlm.runtime.kernels.gemm.epilogue import RotaryStore
    from radixlm.runtime.layers.radix_attention import RadixAttention
    from radixlm.runtime.layers.rotary import get_rope

    attn = RadixAttention(4, 64, 0.125, 2, layer_id=0)
    fb = dataclasses.make_dataclass("FB", ["attn_backend", "layer_loads"])(_Recorder(), None)
    q, k, v = torch.zeros(1, 256), torch.zeros(1, 128), torch.zeros(1, 128)
    rotary = (get_rope(64, 128, 10000.0), torch.zeros(1, dtype=torch.long))
    epi = RotaryStore(rotary[0], rotary[1], torch.zeros(1, dtype=torch.long), torch.zeros(4, 2, 64),
                      torch.zeros(4, 2, 64), 256, 128)
    attn(q, k, v, fb, rotary, epi)
    epi.applied = True
    attn(q, k, v, fb, rotary, epi)
    attn(q, k, v, fb, rotary)
    assert fb.attn_backend.calls == [(True, rotary), (False, None), (True, rotary)]


def test_linear_on_cpu_leaves_the_epilogue_to_attention():
    from radixlm.runtime.kernels.gemm.epilogue import RotaryStore
    from radixlm.runtime.layers.linear import Linear
    from radixlm.runtime.layers.rotary import get_rope

    lin = Linear(32, 4 * 64)
    lin.weight.data.normal_()
    lin.pack_for_cpu()
    x = torch.randn(1, 32)
    epi = RotaryStore(get_rope(64, 128, 10000.0), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                      torch.zeros(4, 1, 64), torch.zeros(4, 1, 64), 128, 64)
    assert torch.equal(lin(x, None, epi), lin(x))
    assert not epi.applied and not epi.fits(x, lin.weight)


if __name__ == "__main__":
    run_cases("cuda" if torch.cuda.is_available() else "cpu")
