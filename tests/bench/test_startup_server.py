"""benchmarks/startup/startup_profile.py --server's process-tree accounting on this machine (no server): a process and what runs
below it, grandchildren included, each with its CPU seconds from /proc."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.startup import startup_profile  # noqa: E402

# A child that starts a grandchild, then both sleep: the tree's three processes stay up while it is read.
_TREE = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
         "print('up', flush=True); time.sleep(30)")


def test_the_tree_holds_the_grandchildren_and_their_cpu():
    child = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        cpu = startup_profile.tree_cpu(child.pid)
        assert child.pid in cpu and len(cpu) == 2, cpu  # the child and its grandchild
        assert all(s >= 0 for s in cpu.values())
        assert startup_profile.tree_cpu(2 ** 22 + 12345) == {}  # no such process
    finally:
        for pid in startup_profile.tree_cpu(child.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        child.wait(10)
