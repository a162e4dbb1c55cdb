"""The LoRA kernels (kernels/lora/gather.py) against the torch path, in both forms: the graph table (lora/graph.py;
blocks of 16 rows, K split over programs) and an eager pass's exact blocks (LoraBatchInfo.build; blocks of 64 rows,
K whole): rows mixing slots and base rows in any order, a slot with more rows than a block, padded rows, B block
diagonal over fused parts whose sizes are not multiples of the tile; float32 under TRITON_INTERPRET=1 (a subprocess,
tests/triton_interpret.py). With CUDA: both forms at Llama-3.1-8B's layer shapes, ranks 16 and 64, bfloat16, and a
captured graph of the graph form replayed with new mixes of slots equals the eager kernels."""
from __future__ import annotations

import pytest
import torch

from tests.triton_interpret import interpreter_works, run_under_interpreter

# Llama-3.1-8B's adapted layers: (parts, in, out): qkv, o, gate_up, down
LLAMA8B = [(3, 4096, 6144), (1, 4096, 4096), (2, 4096, 28672), (1, 14336, 4096)]


def _check(got: torch.Tensor, want: torch.Tensor, base: torch.Tensor, row_slots: list[int], tol: float, what) -> None:
    # (not torch.testing.assert_close: its import of torch.distributed.tensor costs seconds)
    err = (got.float() - want).abs().max().item()
    assert err <= tol * want.abs().max().item(), (what, err)
    base_rows = torch.tensor(row_slots, device=got.device) < 0
    assert torch.equal(got[base_rows], base[base_rows]), what  # rows of the base model untouched


def block_diagonal(b: torch.Tensor, parts: tuple[int, ...]) -> torch.Tensor:
    """B with each part's output rows zero outside its own rank block (how LoraLayer writes it)."""
    r = b.shape[2] // len(parts)
    out = torch.zeros_like(b)
    row = 0
    for j, size in enumerate(parts):
        out[:, row : row + size, j * r : (j + 1) * r] = b[:, row : row + size, j * r : (j + 1) * r]
        row += size
    return out


def compare(device: str, dtype: torch.dtype, slots: int, width: int, k: int, parts: tuple[int, ...],
            row_slots: list[int], capacity: int, segments: bool, tol: float, g: torch.Generator,
            configs=(None,)) -> None:
    from radixlm.runtime.lora.graph import LoraGraphInputs
    from radixlm.runtime.lora.ops import LoraBatchInfo, add_lora_delta, lora_delta_torch

    n = sum(parts)
    a = (torch.randn(slots, width, k, generator=g) / k**0.5).to(dtype).to(device)
    b = block_diagonal(torch.randn(slots, n, width, generator=g), parts).to(dtype).to(device)
    scalings = torch.rand(slots, generator=g).add(0.5).to(device)
    rows = len(row_slots)
    x = torch.randn(rows, k, generator=g).to(dtype).to(device)
    base = torch.randn(rows, n, generator=g).to(dtype).to(device)
    info = LoraBatchInfo.build(row_slots, [1] * rows, scalings, device)
    want = base.float() + lora_delta_torch(x.float(), a.float(), b.float(), info)
    for config in configs:
        inputs = LoraGraphInputs(capacity, slots, scalings, device, config)
        inputs.fill(row_slots)
        got = add_lora_delta(base.clone(), x, a, b, inputs.info(rows), use_triton=True, parts=parts)
        _check(got, want, base, row_slots, tol, ("graph", dtype, width, k, parts, config))
    if segments:
        got = add_lora_delta(base.clone(), x, a, b, info, use_triton=True, parts=parts)
        _check(got, want, base, row_slots, tol, ("eager", dtype, width, k, parts))


def run_interpreted() -> None:
    from radixlm.runtime.kernels.lora import LoraDecodeConfig

    g = torch.Generator().manual_seed(0)
    # 19 rows of slot 2 (two graph blocks), base rows between, 24 of a graph of 28 rows (the rest padding); K 600:
    # three splits in the graph form (the last one short), whole in the eager form; three parts of rank 8. The
    # decode kernels' defaults (one output tile a program), and 16-column tiles with parts straddling them, 13 tiles
    # in one program (expand_programs 1), five K splits of 128
    slots = [2, -1, 0, 2, 1] + [2] * 17 + [-1, 0]
    narrow = LoraDecodeConfig(splits=5, min_split_k=128, shrink_block_k=64, shrink_block_w=16, expand_block_n=16,
                              expand_programs=1)
    compare("cpu", torch.float32, 3, 24, 600, (40, 24, 136), slots, 28, True, 1e-5, g, (None, narrow))
    # one part, 70 rows of one slot: two eager blocks; rank 4 (below the 16 of a tile)
    compare("cpu", torch.float32, 2, 4, 40, (72,), [1] * 70, 70, True, 1e-5, g)


def run_cuda_llama8b() -> None:
    g = torch.Generator().manual_seed(1)
    for rank in (16, 64):
        for parts, k, n in LLAMA8B:
            row_slots = torch.randint(-1, 8, (200,), generator=g).tolist()  # 8 adapters and the base, mixed
            row_slots[:40] = [3] * 40  # a slot over several blocks
            sizes = (4096, 1024, 1024) if parts == 3 else (n // parts,) * parts
            compare("cuda", torch.bfloat16, 8, parts * rank, k, sizes, row_slots, 256, True, 2e-2, g)


def run_cuda_graph_replays() -> None:
    """One capture of the graph form, with the shrink on the pass's stream and on a side stream beside other work
    (LoraLayer.begin's); replays after refilling the table equal the eager kernels."""
    from radixlm.runtime.lora.graph import LoraGraphInputs
    from radixlm.runtime.lora.ops import add_lora_delta, begin_lora_shrink

    g = torch.Generator().manual_seed(2)
    slots, width, k, n, rows = 32, 48, 4096, 6144, 64
    a = (torch.randn(slots, width, k, generator=g) / k**0.5).bfloat16().cuda()
    b = torch.randn(slots, n, width, generator=g).bfloat16().cuda()
    scalings = torch.rand(slots, generator=g).add(0.5).cuda()
    x = torch.randn(rows, k, generator=g).bfloat16().cuda()
    base = torch.randn(rows, n, generator=g).bfloat16().cuda()
    w = torch.randn(n, k, generator=g).bfloat16().cuda()  # the "base GEMM" the side stream's shrink runs beside
    inputs = LoraGraphInputs(rows, slots, scalings, "cuda")
    info = inputs.info(rows)
    side = torch.cuda.Stream()
    outs = [base.clone(), base.clone()]

    def run(side_stream) -> None:
        out = outs[side_stream is not None]
        partials = begin_lora_shrink(x, a, info, True, side_stream)
        out.add_(x @ w.t() * 0)
        add_lora_delta(out, x, a, b, info, use_triton=True, parts=(4096, 1024, 1024), partials=partials,
                       side_stream=side_stream)

    graphs = []
    for side_stream in (None, side):
        run(side_stream)  # builds the kernels before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run(side_stream)
        graphs.append(graph)
    for mix in ([-1] * rows, [5] * rows, torch.randint(-1, slots, (rows,), generator=g).tolist(),
                [i % slots for i in range(rows)]):
        inputs.fill(mix)
        eager = LoraGraphInputs(rows, slots, scalings, "cuda")
        eager.fill(mix)
        want = add_lora_delta(base.clone(), x, a, b, eager.info(rows), use_triton=True, parts=(4096, 1024, 1024))
        for out, graph in zip(outs, graphs):
            out.copy_(base)
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(outs[0], want) and torch.equal(outs[1], want), mix[:8]


@pytest.mark.skipif(not interpreter_works(), reason="needs Triton's interpreter, 3.7 or later")
def test_gather_kernels_under_interpreter():
    run_under_interpreter(__file__, "gather lora ok", hide_cuda=True, timeout=120)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_and_eager_kernels_at_llama8b_shapes():
    run_cuda_llama8b()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gather_graph_replays_equal_eager():
    run_cuda_graph_replays()


if __name__ == "__main__":  # the interpreter run of test_gather_kernels_under_interpreter
    torch.set_num_threads(1)
    run_interpreted()
    print("gather lora ok")
