"""Triton kernels tested on the CPU: Triton chooses its interpreter when a kernel is defined (at import), so a test
module runs itself again as a script in a subprocess with TRITON_INTERPRET=1 and prints a marker when its cases
passed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def interpreter_works() -> bool:
    try:
        import triton  # noqa: F401
        from triton.runtime.interpreter import InterpretedFunction  # noqa: F401
    except Exception:  # noqa: BLE001 - no triton, or one without an interpreter
        return False
    return True


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
