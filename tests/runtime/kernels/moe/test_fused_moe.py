"""Mixture-of-experts pieces: the router's top-k, the torch path of `fused_experts` against a naive per-token loop,
the expert-sorted block layout of the Triton path, the Triton grouped GEMM against the torch path (on CUDA when there
is one, else under TRITON_INTERPRET=1 in a subprocess: the interpreter is chosen when the kernels are defined), and
FusedMoE's weight loading under tensor and expert parallelism."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.runtime.distributed.parallel import Parallel
from radixlm.runtime.kernels.moe import fused_experts, select_experts
from radixlm.runtime.kernels.moe.fused_moe import align_pairs, fused_experts_torch
from radixlm.runtime.layers.moe import FusedMoE
from tests.triton_interpret import interpreter_works, run_under_interpreter


def _problem(t, e, k, h, i, dtype=torch.float32, num_experts=None, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * i, h, generator=g) * h**-0.5
    w2 = torch.randn(e, h, i, generator=g) * i**-0.5
    weights, ids = select_experts(torch.randn(t, num_experts or e, generator=g), k, renormalize=True)
    return [a.to(device) for a in (x.to(dtype), w13.to(dtype), w2.to(dtype), weights, ids)]


def _naive(x, w13, w2, weights, ids, expert_start=0):
    """One token and one chosen expert at a time, in float64."""
    i = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) - expert_start
            if not 0 <= e < w13.shape[0]:
                continue
            gu = w13[e].double() @ x[t].double()
            out[t] += float(weights[t, j]) * (w2[e].double() @ (F.silu(gu[:i]) * gu[i:]))
    return out


def test_select_experts_softmax_top_k():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.5, -1.0, 4.0, 4.5]])
    probs = torch.softmax(logits, -1)
    w, ids = select_experts(logits, 2, renormalize=False)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert ids.tolist() == [[1, 2], [3, 2]]
    torch.testing.assert_close(w, probs.gather(1, ids.long()))
    wn, ids_n = select_experts(logits.to(torch.bfloat16), 2, renormalize=True)
    assert ids_n.tolist() == ids.tolist() and wn.dtype == torch.float32
    torch.testing.assert_close(wn.sum(-1), torch.ones(2))
    torch.testing.assert_close(wn, w / w.sum(-1, keepdim=True), rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="top_k"):
        select_experts(logits, 5, renormalize=True)


@pytest.mark.parametrize("t, e, k, h, i", [(1, 4, 1, 16, 8), (9, 8, 2, 32, 24), (40, 16, 4, 24, 16), (3, 6, 6, 16, 8)])
def test_torch_path_matches_naive_loop(t, e, k, h, i):
    x, w13, w2, weights, ids = _problem(t, e, k, h, i, seed=t + e)
    out = fused_experts(x, w13, w2, weights, ids)  # CPU: the torch path
    torch.testing.assert_close(out.double(), _naive(x, w13, w2, weights, ids), rtol=1e-5, atol=1e-5)


def test_torch_path_other_ranks_experts_contribute_zero():
    """A rank holding experts 4..7 of 8: pairs routed to 0..3 add nothing; the two halves sum to the whole."""
    x, w13, w2, weights, ids = _problem(17, 8, 3, 32, 16, seed=3)
    whole = fused_experts(x, w13, w2, weights, ids)
    low = fused_experts(x, w13[:4], w2[:4], weights, ids, expert_start=0, num_experts=8)
    high = fused_experts(x, w13[4:], w2[4:], weights, ids, expert_start=4, num_experts=8)
    torch.testing.assert_close(high.double(), _naive(x, w13[4:], w2[4:], weights, ids, 4), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(low + high, whole, rtol=1e-5, atol=1e-5)


def test_torch_path_half_precision_and_empty():
    x, w13, w2, weights, ids = _problem(12, 8, 2, 32, 16, dtype=torch.bfloat16, seed=5)
    out = fused_experts(x, w13, w2, weights, ids)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), _naive(x, w13, w2, weights, ids), rtol=2e-2, atol=2e-2)
    empty = fused_experts(x[:0], w13, w2, weights[:0], ids[:0])
    assert empty.shape == (0, 32)
    with pytest.raises(ValueError, match="shapes"):
        fused_experts(x, w13, w2[:, :, :8], weights, ids)


def check_layout(blocks, ids: torch.Tensor, expert_start: int, n_local: int) -> None:
    """Every block's pairs are its expert's; each pair of a local expert appears exactly once, no other pair does;
    used blocks come first, in expert order."""
    ids = ids.cpu()
    block_m = blocks.block_m
    num_pairs = ids.numel()
    rows = blocks.sorted_pairs.cpu().view(-1, block_m)
    experts = blocks.block_expert.cpu().tolist()
    assert rows.shape[0] == len(experts)
    seen = []
    for b, e in enumerate(experts):
        pairs = [p for p in rows[b].tolist() if p < num_pairs]
        if e < 0:
            assert not pairs  # unused blocks hold only padding
            continue
        assert pairs, "a used block has at least one pair"
        assert all(int(ids.view(-1)[p]) - expert_start == e for p in pairs)
        seen += pairs
    local = [p for p in range(num_pairs) if 0 <= int(ids.view(-1)[p]) - expert_start < n_local]
    assert sorted(seen) == local
    assert experts == sorted(experts, key=lambda e: (e < 0, e))


LAYOUT_CASES = [(block_m, start, n_local) for block_m in (1, 4, 16) for start, n_local in ((0, 8), (3, 3))]


@pytest.mark.parametrize("block_m, expert_start, n_local", LAYOUT_CASES)
def test_align_pairs_layout(block_m, expert_start, n_local):
    ids = torch.randint(0, 8, (21, 3), generator=torch.Generator().manual_seed(block_m), dtype=torch.int32)
    check_layout(align_pairs(ids, n_local, expert_start, block_m), ids, expert_start, n_local)


def _triton_cases(device: str) -> None:
    """The Triton path against the torch path (run on CUDA, or on CPU under TRITON_INTERPRET=1)."""
    from radixlm.runtime.kernels.moe import fused_moe
    from radixlm.runtime.kernels.moe.fused_moe import align_pairs_triton, fused_experts_triton

    for block_m, start, n_local in LAYOUT_CASES + [(16, 0, 128), (64, 32, 32)]:
        ids = torch.randint(0, max(8, start + n_local), (100, 4), generator=torch.Generator().manual_seed(block_m),
                            dtype=torch.int32)
        check_layout(align_pairs_triton(ids.to(device), n_local, start, block_m), ids, start, n_local)

    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
    cases = [  # t, e, k, h, i, expert_start, n_local, num_experts
        (1, 8, 2, 64, 32, 0, 8, None),      # decode: one token
        (37, 8, 3, 64, 48, 0, 8, None),     # a partial row block per expert
        (150, 4, 2, 48, 40, 0, 4, None),    # many rows per expert: the large-tile config; H, I not tile multiples
        (20, 8, 2, 64, 32, 4, 4, 8),        # expert parallel: the rank holding experts 4..7
        (20, 8, 2, 64, 32, 0, 4, 8),        # ... and the one holding 0..3
        (0, 8, 2, 64, 32, 0, 8, None),      # no tokens
    ]
    for dtype in dtypes:
        tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
        for t, e, k, h, i, start, n_local, num_experts in cases:
            x, w13, w2, weights, ids = _problem(t, e, k, h, i, dtype, num_experts, seed=t + i, device=device)
            w13, w2 = w13[start : start + n_local].contiguous(), w2[start : start + n_local].contiguous()
            ref = fused_experts_torch(x, w13, w2, weights, ids, start)
            got = fused_experts(x, w13, w2, weights, ids, start, num_experts, use_triton=True)
            assert got.dtype == dtype and got.shape == ref.shape
            torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol,
                                       msg=lambda m: f"{dtype} case {(t, e, k, h, i, start)}: {m}")
    # Token chunks of a long prefill give the unchunked result.
    x, w13, w2, weights, ids = _problem(45, 8, 2, 32, 16, seed=9, device=device)
    whole = fused_experts_triton(x, w13, w2, weights, ids)
    old = fused_moe.TRITON_CHUNK_TOKENS
    fused_moe.TRITON_CHUNK_TOKENS = 16
    try:
        chunked = fused_experts(x, w13, w2, weights, ids, use_triton=True)
    finally:
        fused_moe.TRITON_CHUNK_TOKENS = old
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_path_on_cuda():
    _triton_cases("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: test_triton_path_on_cuda runs the kernel")
@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter, 3.7 or later")
def test_triton_path_under_interpreter():
    """float32 and float16 (the 3.9 interpreter's bfloat16 tl.dot multiplies raw bits: bfloat16 is tested on CUDA)."""
    run_under_interpreter(__file__, "triton cases ok")


def _load_experts(moe: FusedMoE, gate, up, down) -> None:
    for e in range(moe.num_experts):
        moe.load_weight("w13_weight", moe.w13_weight, gate[e], (e, "gate"))
        moe.load_weight("w13_weight", moe.w13_weight, up[e], (e, "up"))
        moe.load_weight("w2_weight", moe.w2_weight, down[e], (e, "down"))


def test_fused_moe_loads_its_slice():
    g = torch.Generator().manual_seed(0)
    e, h, i = 4, 8, 6
    gate, up, down = torch.randn(e, i, h, generator=g), torch.randn(e, i, h, generator=g), torch.randn(e, h, i, generator=g)
    # Every expert, intermediate split: rank 1 of 2 holds rows / columns 3..5.
    tp = FusedMoE(e, 2, h, i, True, Parallel(tp_rank=1, tp_size=2))
    _load_experts(tp, gate, up, down)
    assert tp.w13_weight.shape == (4, 6, 8) and tp.w2_weight.shape == (4, 8, 3)
    assert torch.equal(tp.w13_weight[2], torch.cat([gate[2, 3:], up[2, 3:]]))
    assert torch.equal(tp.w2_weight[1], down[1][:, 3:])
    assert tp.weight_shards("w13_weight") == [(x, p) for x in range(4) for p in ("gate", "up")]
    # Whole experts: rank 1 of 2 holds experts 2 and 3 and lists only their shards.
    ep = FusedMoE(e, 2, h, i, True, Parallel(tp_rank=1, tp_size=2, ep_size=2))
    _load_experts(ep, gate, up, down)
    assert ep.w13_weight.shape == (2, 12, 8) and ep.expert_start == 2
    assert torch.equal(ep.w13_weight[0], torch.cat([gate[2], up[2]]))
    assert torch.equal(ep.w2_weight[1], down[3])
    assert ep.weight_shards("w2_weight") == [(2, "down"), (3, "down")]
    with pytest.raises(ValueError, match="shape"):
        ep.load_weight("w2_weight", ep.w2_weight, down[3].T, (3, "down"))
    with pytest.raises(ValueError, match="out of range"):
        ep.load_weight("w2_weight", ep.w2_weight, down[3], (4, "down"))
    with pytest.raises(ValueError, match="does not belong"):
        ep.load_weight("w2_weight", ep.w2_weight, down[3], (3, "up"))


def test_fused_moe_refuses_indivisible_sizes():
    with pytest.raises(ValueError, match=r"num_experts \(6\) is not divisible by the expert-parallel size 4"):
        FusedMoE(6, 2, 8, 8, True, Parallel(tp_rank=0, tp_size=4, ep_size=4))
    with pytest.raises(ValueError, match=r"moe_intermediate_size \(10\) is not divisible"):
        FusedMoE(8, 2, 8, 10, True, Parallel(tp_rank=0, tp_size=4))
    FusedMoE(8, 2, 8, 10, True, Parallel(tp_rank=0, tp_size=4, ep_size=4))  # whole experts: I is not split
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        FusedMoE(4, 5, 8, 8, True)


if __name__ == "__main__":  # the interpreter run of test_triton_path_under_interpreter
    torch.set_num_threads(1)
    _triton_cases("cpu")
    print("triton cases ok")
