"""A function run in a fresh process of its own (benchmarks/multi_gpu/gpu_multi.py: one engine per process, so a hung
teardown of one cannot stop the next): partial results from a generator survive the child's death or timeout."""
from __future__ import annotations

import inspect
import multiprocessing as mp
import os
import time

from benchmarks.lib.engine import log


def _child(fn, conn, args) -> None:
    try:
        value = fn(*args)
        if inspect.isgenerator(value):  # each yield is a partial result; the last one is the result
            for value in value:
                conn.send(("partial", value))  # written to the pipe before the child goes on
        conn.send(("ok", value))
    except BaseException:  # noqa: BLE001 - reported to the parent
        import traceback

        conn.send(("error", traceback.format_exc()))
    conn.close()
    os._exit(0)  # no interpreter shutdown: a process-group teardown left behind must not keep us


def isolated(fn, *args, timeout_s: float = 1200.0):
    """fn(*args) in a fresh process (one engine per process: a hung shutdown of one does not stop the next). A child
    that dies or runs out of time after a partial result gives that result, marked with the reason."""
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(fn, send, args))
    proc.start()
    send.close()  # the child holds the only writer: EOF when it dies
    deadline = time.monotonic() + timeout_s
    status, value, partial = "error", f"no result within {timeout_s:.0f} s", None
    try:
        while recv.poll(max(0.0, deadline - time.monotonic())):
            try:
                kind, got = recv.recv()
            except EOFError:
                proc.join(5)
                value = f"the child process died (exit code {proc.exitcode})"
                break
            if kind == "partial":
                partial = got
                continue
            status, value = kind, got
            break
    finally:
        proc.join(30 if status == "ok" else 2)
        if proc.is_alive():
            log("the child process did not exit: killed")
            proc.kill()
            proc.join()
    if status == "ok":
        return value
    if partial is not None:
        log(f"partial result kept: {value[-300:]}")
        return {**partial, "cut_short": value[-2000:]}
    raise RuntimeError(value)
