"""ZMQ plumbing shared by the runtime's processes: socket names and a parent watchdog for children."""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import tempfile
from dataclasses import dataclass

import zmq


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class PortArgs:
    """Set by the launcher: the ipc:// endpoint each process binds its PULL socket to."""

    scheduler_input: str
    detokenizer_input: str
    tokenizer_input: str

    @classmethod
    def new(cls) -> "PortArgs":
        d = tempfile.mkdtemp(prefix="radixlm-ipc-")
        return cls(f"ipc://{d}/scheduler", f"ipc://{d}/detokenizer", f"ipc://{d}/tokenizer")

    def cleanup(self) -> None:
        d = os.path.dirname(self.scheduler_input[len("ipc://"):])
        for name in ("scheduler", "detokenizer", "tokenizer"):
            try:
                os.unlink(os.path.join(d, name))
            except OSError:
                pass
        try:
            os.rmdir(d)
        except OSError:
            pass


def bind_pull(ctx: zmq.Context, addr: str) -> zmq.Socket:
    s = ctx.socket(zmq.PULL)
    s.bind(addr)
    return s


def connect_push(ctx: zmq.Context, addr: str) -> zmq.Socket:
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    return s


def die_with_parent() -> None:
    """Child processes: get SIGKILL when the parent dies (Linux), so no orphan keeps the model loaded.
    Callers also poll parent_alive() as a fallback for other platforms. A child of multiprocessing's forkserver
    (runtime/launch.py) first lets go of the launcher's liveness pipe, which the forkserver hands every child: the
    forkserver exits when the launcher dies only once no child holds it, and that exit is what kills this process."""
    _release_forkserver_pipe()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _release_forkserver_pipe() -> None:
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    # The launcher has the forkserver's pid; a process forked by the forkserver has none (and the pipe's copy).
    if fd is None or getattr(server, "_forkserver_pid", None) is not None:
        return
    try:
        os.close(fd)
    except OSError:
        pass
    server._forkserver_alive_fd = None


class ParentWatch:
    def __init__(self) -> None:
        self.ppid = os.getppid()

    def parent_alive(self) -> bool:
        return os.getppid() == self.ppid
