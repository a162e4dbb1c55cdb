"""The L2 prefetch before a one-row pass's attention (kernels/l2_prefetch.py): off on the CPU, past PDL_MAX_ROWS
rows, for strided tensors and under RADIXLM_L2_PREFETCH=0; compiled for sm_90 (Triton's bundled ptxas, no GPU) it
waits for the previous kernel, then asks for its lines and stores nothing. On an sm_90 GPU its launch inside a graph
of PDL kernels is tests/runtime/kernels/test_pdl.py's chain."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works


def test_prefetch_is_off_on_the_cpu_and_when_turned_off(monkeypatch):
    from radixlm.runtime.kernels import l2_prefetch
    from radixlm.runtime.layers.linear import Linear

    assert not l2_prefetch.prefetch_wanted(torch.zeros(64, 64), 1)
    Linear(64, 64).prefetch_weight(1)  # a CPU layer: nothing to launch
    try:
        monkeypatch.setenv("RADIXLM_L2_PREFETCH", "0")
        l2_prefetch._prefetch_on.cache_clear()
        assert not l2_prefetch._prefetch_on()
    finally:
        l2_prefetch._prefetch_on.cache_clear()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="needs an sm_90 GPU")
def test_prefetch_launches_at_one_row_on_contiguous_weights():
    from radixlm.runtime.kernels import l2_prefetch

    w = torch.zeros(4096, 4096, device="cuda", dtype=torch.float8_e4m3fn)
    assert l2_prefetch.prefetch_wanted(w, 1)
    assert not l2_prefetch.prefetch_wanted(w, l2_prefetch.PDL_MAX_ROWS + 1)
    assert not l2_prefetch.prefetch_wanted(w.t(), 1)
    l2_prefetch.prefetch_l2(w, 1)
    torch.cuda.synchronize()


def _ptx(pdl: bool) -> list[str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixlm.runtime.kernels import l2_prefetch

    consts = {"BLOCK": l2_prefetch.PREFETCH_BLOCK, "PDL": pdl}
    sig = {"W": "*u8", "n_lines": "i32", **{n: "constexpr" for n in consts}}
    src = ASTSource(l2_prefetch._l2_prefetch_kernel, sig, constexprs=consts, attrs={(0,): [["tt.divisibility", 16]]})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    return [line.strip() for line in ptx.splitlines()]


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton 3.7+ with its bundled ptxas")
def test_the_prefetch_kernel_waits_then_asks_for_lines_and_stores_nothing():
    from radixlm.runtime.kernels import l2_prefetch

    lines = _ptx(True)
    wait = next(i for i, line in enumerate(lines) if line.startswith("griddepcontrol.wait"))
    prefetches = [i for i, line in enumerate(lines) if line.startswith("prefetch.global.L2")]
    assert len(prefetches) == l2_prefetch.PREFETCH_BLOCK // (32 * 4) and wait < prefetches[0]
    assert not any(line.startswith(("st.global", "ld.global")) for line in lines)
    assert not any("griddepcontrol" in line for line in _ptx(False))
