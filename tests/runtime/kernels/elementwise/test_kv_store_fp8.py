"""The KV store kernels into a float8 pool (store_kv, the rotary kernel's store; kv_cache_value): k / k_scale and
v / v_scale saturated to the format's range, as the pool's CPU path (cache/kv_quant.py quantize_kv) stores them. On
CUDA on random values, bit for bit (the hardware rounds to nearest even, as torch does). On the CPU under
TRITON_INTERPRET=1 (a subprocess) on values the format holds exactly (scales powers of two, position 0 so the
rotation is the identity) and saturating ones: the interpreter's own float8 rounding differs from the hardware's near
the top of each binade, so rounded values would test the interpreter."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

MARKER = "fp8 kv store cases passed"


def _values(tokens: int, width: int, kv_dtype: torch.dtype, scale: float, device: str, exact: bool) -> torch.Tensor:
    x = torch.randn(tokens, width, device=device) * 30 * scale
    if exact:
        x = quantize_to_grid(x, scale, kv_dtype)
    x[0, :3] = torch.tensor([1e6, -1e6, 0.0])  # saturate both ways, and a zero
    return x


def quantize_to_grid(x: torch.Tensor, scale: float, kv_dtype: torch.dtype) -> torch.Tensor:
    from radixlm.runtime.cache.kv_quant import quantize_kv

    return quantize_kv(x, scale, kv_dtype).float() * scale


def run_cases(device: str) -> None:
    from radixlm.runtime.cache.kv_quant import KVScales, quantize_kv
    from radixlm.runtime.kernels.elementwise import rotary_, store_kv
    from radixlm.runtime.layers.rotary import get_rope

    exact = device == "cpu"
    # A unit scale skips the kernels' division (kv_cache_value): (1.0, 4.0) takes each branch once. Scales that are
    # not powers of two (their reciprocals inexact) on CUDA only: the interpreter's rounding needs values on the grid.
    cases = [(torch.float8_e4m3fn, KVScales(0.5, 4.0)), (torch.float8_e5m2, KVScales(0.5, 4.0)),
             (torch.float8_e4m3fn, KVScales(1.0, 4.0))]
    if not exact:
        cases += [(torch.float8_e4m3fn, KVScales(0.37, 3.3)), (torch.float8_e5m2, KVScales(1.7e-3, 123.4))]
    for kv_dtype, scales in cases:
        tokens, kv_heads, head_dim, q_heads = 6, 2, 64, 4
        width = kv_heads * head_dim
        k = _values(tokens, width, kv_dtype, scales.k_scale, device, exact)
        v = _values(tokens, width, kv_dtype, scales.v_scale, device, exact)
        loc = torch.tensor([3, 9, 1, 12, 7, 5], device=device)
        want_k = quantize_kv(k.reshape(tokens, kv_heads, head_dim), scales.k_scale, kv_dtype).view(torch.uint8)
        want_v = quantize_kv(v.reshape(tokens, kv_heads, head_dim), scales.v_scale, kv_dtype).view(torch.uint8)

        k_buf = torch.zeros(16, kv_heads, head_dim, dtype=kv_dtype, device=device)
        v_buf = torch.zeros_like(k_buf)
        store_kv(k, v, loc, k_buf, v_buf, scales)
        assert torch.equal(k_buf[loc].view(torch.uint8), want_k), (kv_dtype, scales)
        assert torch.equal(v_buf[loc].view(torch.uint8), want_v), (kv_dtype, scales)
        assert float(k_buf[3, 0, 0].float()) == torch.finfo(kv_dtype).max

        # The rotary kernel's store: position 0 on the CPU (no rotation), any positions on CUDA.
        rope = get_rope(head_dim, 4096, 10000.0)
        pos = torch.zeros(tokens, dtype=torch.int64, device=device) if exact else torch.randint(0, 4096, (tokens,),
                                                                                               device=device)
        q = torch.randn(tokens, q_heads * head_dim, device=device)
        k_rot, q_rot = k.clone(), q.clone()
        k_buf.zero_()
        v_buf.zero_()
        rotary_(pos, q_rot, k_rot, rope.cos_sin_on(torch.device(device)), head_dim, (v, loc, k_buf, v_buf),
                scales.k_scale, scales.v_scale)
        if exact:
            assert torch.equal(k_rot, k) and torch.equal(q_rot, q)
        want_k = quantize_kv(k_rot.reshape(tokens, kv_heads, head_dim), scales.k_scale, kv_dtype).view(torch.uint8)
        assert torch.equal(k_buf[loc].view(torch.uint8), want_k), (kv_dtype, scales)
        assert torch.equal(v_buf[loc].view(torch.uint8), want_v), (kv_dtype, scales)
    print(MARKER)


@pytest.mark.skipif(not interpreter_works() or torch.cuda.is_available(), reason="needs Triton's interpreter, no CUDA")
def test_fp8_kv_store_interpreted():
    run_under_interpreter(__file__, MARKER, hide_cuda=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp8_kv_store_cuda():
    run_cases("cuda")


if __name__ == "__main__":
    torch.set_num_threads(1)
    run_cases("cuda" if torch.cuda.is_available() else "cpu")
