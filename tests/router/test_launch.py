"""CLI plumbing: router flags, and the worker command line `serve --dp-size` builds from ServerArgs."""
from __future__ import annotations

import argparse

import pytest

from radixlm.cli import add_server_args, server_args_from
from radixlm.router.args import RouterArgs, add_router_args, router_args_from
from radixlm.router.launch import worker_argv
from radixlm.runtime.args import ServerArgs


def parse_router(*argv: str) -> RouterArgs:
    p = argparse.ArgumentParser()
    add_router_args(p)
    return router_args_from(p.parse_args(argv))


def test_router_defaults_match_the_guide():
    a = parse_router()
    assert (a.policy, a.cache_threshold, a.balance_abs_threshold, a.balance_rel_threshold) == ("cache_aware", 0.3, 64, 1.5)
    assert (a.eviction_interval, a.max_tree_size, a.port) == (120.0, 67108864, 30000)
    assert (a.health_failure_threshold, a.health_success_threshold, a.cb_failure_threshold) == (3, 2, 10)


def test_router_flags_and_alias():
    a = parse_router("--worker-urls", "http://a:1", "http://b:2", "--policy", "round_robin",
                     "--eviction-interval-secs", "5", "--disable-retries")
    assert a.worker_urls == ["http://a:1", "http://b:2"] and a.policy == "round_robin"
    assert a.eviction_interval == 5.0 and a.disable_retries


def test_retry_backoff_flags_and_defaults_as_sglang():
    a = parse_router()
    assert (a.retry_max_retries, a.retry_initial_backoff_ms, a.retry_max_backoff_ms, a.retry_backoff_multiplier,
            a.retry_jitter_factor) == (5, 50, 30000, 1.5, 0.2)
    a = parse_router("--retry-initial-backoff-ms", "10", "--retry-max-backoff-ms", "100",
                     "--retry-backoff-multiplier", "2", "--retry-jitter-factor", "0", "--quarantine-secs", "5")
    assert (a.retry_initial_backoff_ms, a.retry_max_backoff_ms, a.retry_backoff_multiplier, a.retry_jitter_factor,
            a.quarantine_secs) == (10, 100, 2.0, 0.0, 5.0)


@pytest.mark.parametrize("kw,msg", [({"cache_threshold": 1.5}, "cache_threshold"),
                                    ({"balance_rel_threshold": 0.5}, "balance_rel_threshold"),
                                    ({"policy": "nope"}, "policy")])
def test_router_args_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        RouterArgs(**kw)


def test_worker_argv_round_trips_server_args():
    sa = ServerArgs(max_total_tokens=4096, random_seed=0, enable_integrity_check=True, log_level="warning")
    argv = worker_argv(sa)
    assert "--max-total-tokens" in argv and "--enable-integrity-check" in argv and "--model-path" not in argv
    p = argparse.ArgumentParser()
    add_server_args(p)
    assert ServerArgs(**server_args_from(p.parse_args(argv))) == sa


def test_worker_argv_round_trips_enums_and_lists():
    sa = ServerArgs(schedule_policy="fcfs", jump_forward="exact", overlap_schedule="off", mixed_chunk="on",
                    allowed_media_domains=["a.example", "b.example"], speculative_algorithm="NGRAM")
    argv = worker_argv(sa)
    assert argv[argv.index("--schedule-policy") + 1] == "fcfs"
    p = argparse.ArgumentParser()
    add_server_args(p)
    assert ServerArgs(**server_args_from(p.parse_args(argv))) == sa


def test_serve_rejects_bad_dp_size(capsys):
    from radixlm.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--dp-size", "0"])
    assert "dp_size must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("gpus, tp, base, want", [
    (4, 2, 0, ["0,1", "2,3"]),   # each replica on its own tp GPUs
    (8, 2, 4, ["4,5", "6,7"]),   # from --base-gpu-id on
    (1, 1, 0, [None, None]),     # too few GPUs: they share the device
    (0, 1, 0, [None, None]),     # CPU workers
])
def test_each_replica_gets_its_own_gpus(monkeypatch, gpus, tp, base, want):
    import torch

    from radixlm.router.launch import _device_env

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    sa = ServerArgs(tp_size=tp, base_gpu_id=base, dp_size=2)
    for rank, visible in enumerate(want):
        env, args = _device_env(rank, 2, sa)
        assert env.get("CUDA_VISIBLE_DEVICES") == visible
        assert (args.dp_size, args.tp_size) == (1, tp)  # each worker is one replica
        assert args.base_gpu_id == (0 if visible else base)
        if gpus and visible is None:
            assert args.mem_fraction_static == 0.4  # half of 0.8 each
