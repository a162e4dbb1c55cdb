"""DeepSeek-V2 and V3 (tiny, float32) on 2 gloo ranks equal 1 rank: each rank drives its own Scheduler over the same
requests in lockstep (heads split over the ranks, the latent cache replicated; V2's experts sliced over the ranks, V3's
whole experts per rank, --ep-size 2), with 8-token chunks and a second round that hits the radix cache. Rank 0 is
this process (as the offline Engine's rank 0 is), rank 1 one spawned process that runs every case (retraction at one
rank: tests/runtime/models/test_deepseek.py)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlm.runtime.distributed.parallel import SINGLE, Parallel
from tests.runtime.distributed.harness import RANK_TIMEOUT_S, free_port

NEW_TOKENS = 8
PROMPT_LENS = [3, 17, 9, 30]

# (model, ep_size): experts sliced over the ranks, whole experts per rank; v3-fp8: V3 with every projection in FP8
# blocks (tests/runtime/quantization/test_deepseek_quantized.py), kv_b_proj's heads split before its dequantization.
CASES = [("v2", 1), ("v3", 2), ("v3-fp8", 2)]


def _scheduler(model_dir: str, parallel):
    from radixlm.runtime.args import ServerArgs
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.model_loader.config import ModelConfig
    from radixlm.runtime.scheduler.scheduler import Scheduler
    from radixlm.runtime.spec.factory import DraftFactory

    args = ServerArgs(model_path=model_dir, dtype="float32", device="cpu", enable_integrity_check=True, random_seed=0,
                      chunked_prefill_size=8, max_total_tokens=1024)
    runner = ModelRunner(args, ModelConfig.from_path(model_dir, dtype="float32", device="cpu"), "cpu", parallel)
    return Scheduler(args, runner, tokenizer=None, eos_token_ids=frozenset(), drafts=DraftFactory.load(args, runner))


def _sessions(parallel, model_dirs: dict[str, str], prompts: list[list[int]]) -> dict:
    from tests.runtime.scheduler.conftest import request, run_all

    torch.set_num_threads(1)
    out = {}
    for name, ep_size in CASES:
        sched = _scheduler(model_dirs[name], dataclasses.replace(parallel, ep_size=min(ep_size, parallel.tp_size)))
        for i, ids in enumerate(prompts):
            sched.add_request(request(f"r{i}", ids, max_new_tokens=NEW_TOKENS))
        first = run_all(sched)
        for i, ids in enumerate(prompts[:2]):
            sched.add_request(request(f"again{i}", ids, max_new_tokens=NEW_TOKENS))
        again = run_all(sched)
        sched.check_memory()
        layers = sched.runner.model.model.layers
        experts = layers[1].mlp.experts
        out[name] = {"outputs": {rid: r["output_ids"] for rid, r in {**first, **again}.items()},
                     "cached": sum(r["cached_tokens"] for r in again.values()),
                     "held": (layers[0].self_attn.num_heads, experts.num_local_experts, experts.local_intermediate)}
    return out


def _join(rank: int, port: int) -> Parallel:
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=RANK_TIMEOUT_S))
    return Parallel(tp_rank=rank, tp_size=2, group=dist.group.WORLD)


def _rank1(port: int, model_dirs: dict[str, str], prompts: list[list[int]], conn) -> None:
    import os
    import traceback

    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        conn.send(("ok", _sessions(_join(1, port), model_dirs, prompts)))
    except BaseException:  # noqa: BLE001 - reported to the test
        conn.send(("error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _two_ranks(model_dirs: dict[str, str], prompts: list[list[int]]) -> tuple[dict, list[dict]]:
    """(the one-rank sessions, run while rank 1 starts; each rank's sessions)."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if dist.is_initialized():
        pytest.skip("this process already belongs to a process group")
    ctx, port = mp.get_context("spawn"), free_port()
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_rank1, args=(port, model_dirs, prompts, theirs), daemon=True)
    child.start()
    try:
        single = _sessions(SINGLE, model_dirs, prompts)
        rank0 = _sessions(_join(0, port), model_dirs, prompts)
        if not ours.poll(RANK_TIMEOUT_S):
            raise AssertionError("rank 1 sent no result")
        status, rank1 = ours.recv()
        assert status == "ok", f"rank 1 failed:\n{rank1}"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        child.join(RANK_TIMEOUT_S)
        if child.is_alive():
            child.kill()
    return single, [rank0, rank1]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, str]:
    from tests.runtime.models.test_deepseek import configs, save_deepseek
    from tests.runtime.quantization.helpers import DEEPSEEK_PROJ, quantize_saved
    from tests.runtime.quantization.test_deepseek_quantized import FP8_BLOCKS

    dirs = {}
    for name in {name for name, _ in CASES}:
        path = tmp_path_factory.mktemp(name)
        base = name.removesuffix("-fp8")
        save_deepseek(configs()[base], path, seed=len(base))
        if name != base:
            quantize_saved(path, *FP8_BLOCKS, names=DEEPSEEK_PROJ)
        dirs[name] = str(path)
    return dirs


def test_two_ranks_equal_one(model_dirs):
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(1, 200, (n,), generator=g).tolist() for n in PROMPT_LENS]
    single, ranks = _two_ranks(model_dirs, prompts)
    for name, ep_size in CASES:
        want = single[name]
        assert want["cached"] > 0 and want["held"] == (4, 8, 32)
        for rank, got in enumerate(ranks):
            case = got[name]
            assert case["outputs"] == want["outputs"], (name, ep_size, rank)
            assert case["cached"] == want["cached"]
            assert case["held"] == ((2, 8, 16) if ep_size == 1 else (2, 4, 32))
