"""The symmetric-memory all-reduce: which tensors `Parallel.all_reduce` routes to it (CPU), and its one-shot and
two-shot sums on 2 GPUs against NCCL's (skipped without them)."""
from __future__ import annotations

import pytest
import torch

from radixlm.runtime.distributed.parallel import Parallel
from radixlm.runtime.distributed.symm_all_reduce import SymmMemAllReduce


class CountingComm:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.calls = 0

    def accepts(self, x: torch.Tensor) -> bool:
        return x.nbytes <= self.max_bytes

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * 2


def test_small_tensors_go_to_the_device_comm_and_large_ones_to_the_group():
    comm = CountingComm(max_bytes=64)
    parallel = Parallel(tp_rank=0, tp_size=2, device_comm=comm)
    assert torch.equal(parallel.all_reduce(torch.ones(16)), torch.full((16,), 2.0))
    assert comm.calls == 1
    # 17 floats: past the comm's limit, so torch.distributed's all-reduce, which has no group here
    with pytest.raises(ValueError, match="process group has not been initialized"):
        parallel.all_reduce(torch.ones(17))
    assert comm.calls == 1


def test_cpu_tensors_are_never_accepted():
    comm = SymmMemAllReduce(group_name="g", buffer=torch.empty(1 << 20, dtype=torch.uint8), world_size=2)
    assert not comm.accepts(torch.ones(8))


def test_a_rank_that_cannot_set_up_says_so_before_any_probe():
    from types import SimpleNamespace

    from radixlm.runtime.distributed.symm_all_reduce import build_symm_all_reduce

    said = []

    def agree(flags):
        said.append(flags)
        return flags

    group = SimpleNamespace(group_name="none", rank=lambda: 0, size=lambda: 2)
    assert build_symm_all_reduce(group, "cpu", agree) is None  # no symmetric memory on the CPU
    assert said == [[False]]


def test_a_group_name_registered_earlier_in_this_process_is_not_reused(monkeypatch):
    """PyTorch keeps a group name's first registration (and its store) for the life of the process; a second engine's
    group of the same name must not rendezvous through the first one's dead store (it hung there on 2 x H200)."""
    from types import SimpleNamespace

    import torch.distributed._symmetric_memory as symm_mem

    from radixlm.runtime.distributed.symm_all_reduce import build_symm_all_reduce

    monkeypatch.setattr(symm_mem, "_group_name_to_store", {"0": object()}, raising=False)
    touched = []
    monkeypatch.setattr(symm_mem, "empty", lambda *a, **k: touched.append("empty"))
    monkeypatch.setattr(symm_mem, "rendezvous", lambda *a, **k: touched.append("rendezvous"))
    said = []

    def agree(flags):
        said.append(flags)
        return flags

    group = SimpleNamespace(group_name="0", rank=lambda: 0, size=lambda: 2)
    assert build_symm_all_reduce(group, "cpu", agree) is None
    assert said == [[False]] and touched == []


def _rank(rank: int, world: int, port: int, check, results) -> None:
    import torch.distributed as dist

    device = f"cuda:{rank}"
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device(device))
    try:
        results[rank] = check(rank, device)
    finally:
        dist.destroy_process_group()


def _on_two_gpus(check) -> dict:
    """check(rank, device) on each of two ranks in a process of its own (NCCL group joined); their answers."""
    import torch.multiprocessing as mp

    from tests.runtime.distributed.harness import free_port

    results = mp.Manager().dict()
    mp.spawn(_rank, args=(2, free_port(), check, results), nprocs=2)
    return dict(results)


def _sums(rank: int, device: str) -> list[bool]:
    import torch.distributed as dist

    from radixlm.runtime.distributed.symm_all_reduce import build_symm_all_reduce

    comm = build_symm_all_reduce(dist.group.WORLD, device, lambda flags: flags, 8 << 20)
    assert comm is not None
    g = torch.Generator(device=device).manual_seed(rank)
    out = [not comm.accepts(torch.ones((9 << 20) // 4, device=device)),  # past the buffer
           # two-shot needs world x 16-byte shares
           not comm.accepts(torch.ones((1 << 20) + 8, dtype=torch.bfloat16, device=device)),
           not comm.accepts(torch.ones(3, device=device))]  # 12 bytes: not 16-byte vectors
    for dtype in (torch.bfloat16, torch.float32):
        # one-shot sizes, then two-shot sizes (past 1 MiB)
        for n in (8, 4096, (1 << 20) // dtype.itemsize, (2 << 20) // dtype.itemsize, (8 << 20) // dtype.itemsize):
            x = torch.randn(n, generator=g, device=device).to(dtype)
            want = x.clone()
            dist.all_reduce(want)
            assert comm.accepts(x)
            out.append(bool(torch.allclose(comm.all_reduce(x).float(), want.float(), rtol=1e-2, atol=1e-2)))
    return out


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_sum_like_nccl():
    results = _on_two_gpus(_sums)
    assert all(all(v) for v in results.values()) and len(results) == 2


def _fused_norms(rank: int, device: str) -> tuple[list[bool], float]:
    import torch.distributed as dist

    from radixlm.runtime.distributed.symm_all_reduce import build_symm_all_reduce
    from radixlm.runtime.kernels.elementwise import rmsnorm

    comm = build_symm_all_reduce(dist.group.WORLD, device, lambda flags: flags, fuse_norm=True)
    assert comm is not None and comm.arnorm is not None
    g = torch.Generator(device=device).manual_seed(rank)
    shared = torch.Generator(device=device).manual_seed(99)  # the residual and weight are alike on every rank
    h = 4096
    weight = torch.randn(h, generator=shared, device=device).to(torch.bfloat16)
    out = [comm.fused_add_rmsnorm(torch.ones(257, h, dtype=torch.bfloat16, device=device),
                                  torch.ones(257, h, dtype=torch.bfloat16, device=device), weight, 1e-5) is None]

    def case(rows: int, dtype: torch.dtype = torch.bfloat16):
        x = torch.randn(rows, h, generator=g, device=device).to(dtype)
        residual = torch.randn(rows, h, generator=shared, device=device).to(dtype)
        want = rmsnorm(comm.all_reduce(x), weight.to(dtype), 1e-5, residual)
        return x, residual, *want

    # Rows 0.. alternate slots by their own counts; float32 is a model's dtype in the parity runs.
    for rows, dtype in ((1, torch.bfloat16), (7, torch.bfloat16), (256, torch.bfloat16), (1, torch.bfloat16),
                        (3, torch.bfloat16), (2, torch.float32)):
        x, residual, want_out, want_res = case(rows, dtype)
        got_out, got_res = comm.fused_add_rmsnorm(x, residual, weight.to(dtype), 1e-5)
        out += [torch.equal(got_res, want_res), bool(torch.allclose(got_out.float(), want_out.float(),
                                                                     rtol=2e-2, atol=2e-2))]
    # A partial whose bits are the slots' empty pattern arrives (as another NaN) instead of being waited for.
    x, residual, want_out, want_res = case(2)
    x.view(torch.int16)[0, 3] = -1
    got_out, got_res = comm.fused_add_rmsnorm(x, residual, weight, 1e-5)
    out += [bool(got_res[0, 3].isnan()), torch.equal(got_res[1], want_res[1])]
    # Replays of a captured call, between eager ones: the slots follow the counters on the GPU.
    x, residual, want_out, want_res = case(5)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            got = comm.fused_add_rmsnorm(x, residual, weight, 1e-5)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        graph.replay()
        out += [torch.equal(got[1], want_res)]
        e_out, e_res = comm.fused_add_rmsnorm(x, residual, weight, 1e-5)
        out += [torch.equal(e_res, want_res), torch.equal(e_out, got[0])]
    torch.cuda.synchronize()
    out.append(bool((comm.arnorm.buffer == 0xFF).all()))  # every slot read was left empty
    return out, got[1].float().sum().item()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_fuse_the_sum_with_the_residual_add_and_norm():
    results = _on_two_gpus(_fused_norms)
    failed = {rank: [i for i, ok in enumerate(v[0]) if not ok] for rank, v in results.items()}
    assert len(results) == 2 and not any(failed.values()), failed
    assert results[0][1] == results[1][1]  # both ranks hold the same sum
