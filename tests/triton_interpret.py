"""Triton kernels tested on the CPU: Triton chooses its interpreter when a kernel is defined (at import), so a test
module runs itself again as a script in a subprocess with TRITON_INTERPRET=1 and prints a marker when its cases
passed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# Triton 3.6's interpreter gives a loaded scalar a shape, and `range` over it fails ("only 0-dimensional arrays can be
# converted to Python scalars"): every kernel that loops to a loaded length. 3.7 to 3.9 run them (checked 2026-11-27).
INTERPRETER_MIN_VERSION = (3, 7)


def interpreter_works() -> bool:
    try:
        import triton
        from triton.runtime.interpreter import InterpretedFunction  # noqa: F401
    except Exception:  # noqa: BLE001 - no triton, or one without an interpreter
        return False
    version = tuple(int(part) for part in triton.__version__.split("+")[0].split(".")[:2])
    return version >= INTERPRETER_MIN_VERSION


def run_under_interpreter(script: str, marker: str, hide_cuda: bool = False, timeout: float = 300) -> None:
    """Runs `script` (a test module's __main__ block) under the interpreter; asserts it exits 0 and prints marker."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if hide_cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, script], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert marker in proc.stdout
