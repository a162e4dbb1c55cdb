"""Triton kernels tested on the CPU: Triton chooses its interpreter when a kernel is defined (at import), so a test
module runs itself again as a script with TRITON_INTERPRET=1 and prints a marker when its cases passed.

The scripts run in a host process started once per test process (and per CUDA visibility) that has imported torch
and Triton in interpreter mode (2-3 s a start on 2 cores): each script runs in a fork of it, so scripts still share
no state, and the host only saves the start-ups. Run as `python tests/triton_interpret.py` this module is the
host."""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# Triton 3.6's interpreter gives a loaded scalar a shape, and `range` over it fails ("only 0-dimensional arrays can be
# converted to Python scalars"): every kernel that loops to a loaded length. 3.7 to 3.9 run them (checked 2026-11-27).
INTERPRETER_MIN_VERSION = (3, 7)
HOST_READY = "interpreter host ready"


def interpreter_works() -> bool:
    try:
        import triton
        from triton.runtime.interpreter import InterpretedFunction  # noqa: F401
    except Exception:  # noqa: BLE001 - no triton, or one without an interpreter
        return False
    version = tuple(int(part) for part in triton.__version__.split("+")[0].split(".")[:2])
    return version >= INTERPRETER_MIN_VERSION


@dataclass(frozen=True)
class ScriptResult:
    returncode: int
    stdout: str
    stderr: str


class InterpreterHost:
    """The host subprocess: one JSON line per script in ({"script": path}), one per finished script out
    ({"returncode": n, "stdout": file, "stderr": file})."""

    def __init__(self, hide_cuda: bool) -> None:
        env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        if hide_cuda:
            env["CUDA_VISIBLE_DEVICES"] = ""
        self.outdir = tempfile.TemporaryDirectory(prefix="triton-interpret-")
        # Its own session: a timeout kills the host and the script it forked together.
        self.proc = subprocess.Popen([sys.executable, __file__], env=env, cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        line = self._read_line(120)
        if line.strip() != HOST_READY:
            self.close()
            raise RuntimeError(f"the interpreter host did not start: {line!r}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read_line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise subprocess.TimeoutExpired(self.proc.args, timeout)
        return self.proc.stdout.readline()

    def run(self, script: str, timeout: float) -> ScriptResult:
        self.proc.stdin.write(json.dumps({"script": str(script), "outdir": self.outdir.name}) + "\n")
        self.proc.stdin.flush()
        line = self._read_line(timeout)
        if not line:
            code = self.proc.wait()
            self.close()
            raise RuntimeError(f"the interpreter host exited with {code} running {script}")
        reply = json.loads(line)
        return ScriptResult(reply["returncode"], Path(reply["stdout"]).read_text(errors="replace"),
                            Path(reply["stderr"]).read_text(errors="replace"))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.outdir.cleanup()


# The test process's hosts by CUDA visibility: a cache of subprocesses that lives as long as the process (atexit
# closes them), not state any test reads.
_HOSTS: dict[bool, InterpreterHost] = {}


def close_hosts() -> None:
    for host in _HOSTS.values():
        host.close()
    _HOSTS.clear()


atexit.register(close_hosts)


def run_under_interpreter(script: str, marker: str, hide_cuda: bool = False, timeout: float = 300) -> None:
    """Runs `script` (a test module's __main__ block) under the interpreter; asserts it exits 0 and prints marker."""
    host = _HOSTS.get(hide_cuda)
    if host is None or not host.alive():
        host = _HOSTS[hide_cuda] = InterpreterHost(hide_cuda)
    try:
        proc = host.run(script, timeout)
    except BaseException:
        _HOSTS.pop(hide_cuda, None)
        host.close()
        raise
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert marker in proc.stdout


def _run_forked(script: str, outdir: str, n: int) -> dict:
    """Runs one script in a fork of the host, as `python script` would (its folder first on sys.path, __main__)."""
    stdout, stderr = os.path.join(outdir, f"{n}.out"), os.path.join(outdir, f"{n}.err")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd, path in ((1, stdout), (2, stderr)):
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(target, fd)
                os.close(target)
            import runpy
            import traceback

            sys.argv = [script]
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            try:
                runpy.run_path(script, run_name="__main__")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 - reported as a failed script, as the interpreter would
                traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {"returncode": os.waitstatus_to_exitcode(status), "stdout": stdout, "stderr": stderr}


def _patch_language_once() -> None:
    """Triton's interpreter patches triton.language for a launch (GridExecutor.__call__) and, from scratch, again at
    every call of a @triton.jit helper inside it (InterpretedFunction.__call__: inspect.getmembers over tl, tl.core,
    tl.math and tl.tensor, which sets nothing new): a third of a decode-attention script's time, a quarter of the
    tier's. A helper whose modules the launch has already patched skips it (their `load` is no longer the builtin), so
    kernels run as before. A Triton without these internals runs unchanged."""
    import triton.language as tl
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang", None)
    scope = getattr(interpreter, "_LangPatchScope", None)
    is_builtin = getattr(tl.core, "is_builtin", None)
    if original is None or scope is None or is_builtin is None:
        return

    def patch_lang(fn):
        langs = [value for value in fn.__globals__.values() if value is tl or value is tl.core]
        if langs and not any(is_builtin(lang.load) for lang in langs):
            return scope()  # nothing to undo: the launch's scope restores the language
        return original(fn)

    interpreter._patch_lang = patch_lang


def _serve() -> None:
    import torch  # noqa: F401 - what every script imports first: loaded once, inherited by each fork
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    _patch_language_once()
    print(HOST_READY, flush=True)
    for n, line in enumerate(sys.stdin):
        request = json.loads(line)
        print(json.dumps(_run_forked(request["script"], request["outdir"], n)), flush=True)


if __name__ == "__main__":
    _serve()
