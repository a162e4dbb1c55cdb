"""The device a one-rank server takes: --base-gpu-id picks it (a second server on the same host, say PD's decode
server, lands on its own GPU), and without it the current device stays."""
from __future__ import annotations

import torch

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.distributed.parallel import SINGLE
from radixlm.runtime.distributed.setup import init_distributed


def test_one_rank_takes_base_gpu_id(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert init_distributed(ServerArgs(model_path="m", device="cuda", base_gpu_id=1), None) == (SINGLE, "cuda:1")
    assert chosen == ["cuda:1"]
    assert init_distributed(ServerArgs(model_path="m", device="cuda"), None) == (SINGLE, "cuda")
    assert init_distributed(ServerArgs(model_path="m", device="cpu", base_gpu_id=1), None) == (SINGLE, "cpu")
    assert chosen == ["cuda:1"]
