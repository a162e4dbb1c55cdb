"""Running the router: alone (`radixlm router`), or in front of N local workers (`radixlm serve --dp-size N`)."""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Callable

import httpx

from radixlm.router.args import RouterArgs
from radixlm.runtime.args import ServerArgs, server_argv
from radixlm.runtime.ipc import die_with_parent, free_port

logger = logging.getLogger(__name__)

WORKER_STARTUP_TIMEOUT_S = 600.0
WORKER_STOP_TIMEOUT_S = 40.0


def run_router(args: RouterArgs, on_shutdown: Callable[[], None] | None = None) -> None:
    import uvicorn

    from radixlm.router.app import create_app

    uvicorn.run(create_app(args, on_shutdown=on_shutdown), host=args.host, port=args.port,
                log_level=args.log_level.lower(), timeout_keep_alive=5)


def worker_argv(server_args: ServerArgs) -> list[str]:
    """The flags that reproduce `server_args` for a worker process (only those that differ from defaults)."""
    return server_argv(server_args)


def _device_env(rank: int, dp_size: int, server_args: ServerArgs) -> tuple[dict[str, str], ServerArgs]:
    """Its own tp_size GPUs per worker (from --base-gpu-id on) when there are enough GPUs; otherwise they share the
    device, each with 1/N of the memory fraction (CPU workers need nothing). Each worker is one replica (dp_size 1)."""
    env = dict(os.environ)
    try:
        import torch

        gpus = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch / no CUDA: CPU workers
        gpus = 0
    tp = server_args.tp_size
    first = server_args.base_gpu_id + rank * tp
    server_args = dataclasses.replace(server_args, dp_size=1)
    if gpus >= server_args.base_gpu_id + dp_size * tp:  # every replica fits on GPUs of its own
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(first, first + tp))
        server_args = dataclasses.replace(server_args, base_gpu_id=0)
    elif gpus and server_args.max_total_tokens is None:
        share = (server_args.mem_fraction_static or 0.8) / dp_size
        server_args = dataclasses.replace(server_args, mem_fraction_static=round(share, 3))
    return env, server_args


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + WORKER_STOP_TIMEOUT_S
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def serve_data_parallel(server_args: ServerArgs, dp_size: int, router_args: RouterArgs) -> None:
    """Starts `dp_size` worker processes on free local ports, waits until they are healthy, then serves the
    router on router_args.port in this process; stops the workers on exit (also on failure)."""
    if dp_size < 1:
        raise ValueError("dp_size must be >= 1")
    procs: list[subprocess.Popen] = []
    urls: list[str] = []
    try:
        for rank in range(dp_size):
            port = free_port()
            env, args = _device_env(rank, dp_size, server_args)
            cmd = [sys.executable, "-m", "radixlm.launch_server", "--host", "127.0.0.1", "--port", str(port),
                   *worker_argv(args)]
            procs.append(subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent))  # no orphan workers
            urls.append(f"http://127.0.0.1:{port}")
        _wait_healthy(procs, urls)
        logger.info("%d workers ready: %s", dp_size, " ".join(urls))
        run_router(dataclasses.replace(router_args, worker_urls=urls), on_shutdown=lambda: _stop(procs))
    finally:
        _stop(procs)


def _wait_healthy(procs: list[subprocess.Popen], urls: list[str]) -> None:
    deadline = time.monotonic() + WORKER_STARTUP_TIMEOUT_S
    pending = set(range(len(urls)))
    with httpx.Client(timeout=5) as client:
        while pending:
            for i in list(pending):
                if procs[i].poll() is not None:
                    raise RuntimeError(f"worker {urls[i]} exited with {procs[i].returncode} while starting")
                try:
                    if client.get(urls[i] + "/health").status_code == 200:
                        pending.discard(i)
                except httpx.TransportError:
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers {[urls[i] for i in pending]} did not become healthy")
            time.sleep(0.5)
