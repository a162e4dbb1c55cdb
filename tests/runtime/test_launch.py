"""LaunchedRuntime.shutdown: a child stopped by SIGSTOP (it cannot act on the SIGTERM) is killed at once, not after
the timeout; a running child that ignores SIGTERM still gets the whole timeout before it is killed."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

from radixlm.runtime.ipc import PortArgs
from radixlm.runtime.launch import LaunchedRuntime, _stopped


def _ignore_sigterm_and_wait() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)


def _launched(proc) -> LaunchedRuntime:
    return LaunchedRuntime(server_args=None, ports=PortArgs.new(), procs={"scheduler": proc}, info=None,
                           load_time_s=0.0)


def _started():
    proc = mp.get_context("fork").Process(target=_ignore_sigterm_and_wait, daemon=True)
    proc.start()
    time.sleep(0.3)  # its SIGTERM handler is set
    return proc


def test_a_stopped_child_is_killed_without_waiting_out_the_timeout():
    proc = _started()
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while not _stopped(proc.pid) and time.monotonic() < deadline:  # the signal is delivered asynchronously
        time.sleep(0.01)
    t0 = time.monotonic()
    _launched(proc).shutdown(timeout=30)
    assert time.monotonic() - t0 < 5
    assert proc.exitcode == -signal.SIGKILL


def test_a_running_child_gets_the_timeout():
    proc = _started()
    t0 = time.monotonic()
    _launched(proc).shutdown(timeout=1.0)
    assert time.monotonic() - t0 >= 1.0
    assert proc.exitcode == -signal.SIGKILL
