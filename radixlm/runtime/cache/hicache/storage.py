"""The storage tier of the hierarchical KV cache: pages of `page_tokens` tokens, each keyed by a hash of the whole
token prefix up to its end (a chain: page i's key hashes page i-1's key and page i's tokens; the chain starts from the
model's identity and the radix namespace, e.g. a LoRA id), so a page is found only behind the same prefix, the same
model and the same namespace. The file backend keeps one file per page in a directory that outlives the server.

Writes and reads run on one worker thread each, off the scheduler's thread; the scheduler hands them host tensors
(a write waits for the device copy that filled its buffer first)."""
from __future__ import annotations

import array
import hashlib
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

STORAGE_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"


def default_storage_dir() -> Path:
    from radixlm.runtime.model_loader.files import cache_dir

    env = os.environ.get(STORAGE_DIR_ENV)
    return Path(env) if env else cache_dir() / "hicache"


def page_hashes(namespace: str, extra_key: str | None, token_ids: list[int], page_tokens: int) -> list[str]:
    """The key of every whole page of token_ids, in order."""
    h = hashlib.sha256(f"{namespace}\0{extra_key!r}".encode()).digest()
    out = []
    for start in range(0, len(token_ids) // page_tokens * page_tokens, page_tokens):
        h = hashlib.sha256(h + array.array("q", token_ids[start : start + page_tokens]).tobytes()).digest()
        out.append(h.hex())
    return out


@dataclass(frozen=True)
class PageLayout:
    """What one page file holds: (page_tokens, rows, heads, dim) of `dtype` (the host pool's rows: rows = its buffers,
    MHA's 2 x layers, MLA's layers with heads 1), as raw bytes."""

    page_tokens: int
    rows: int
    heads: int
    dim: int
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return self.rows * self.page_tokens * self.heads * self.dim * torch.empty((), dtype=self.dtype).element_size()


class FileStorage:
    """One file per page, named by its key, written whole (a temporary file renamed into place)."""

    def __init__(self, root: Path, layout: PageLayout):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.layout = layout

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.kv"

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def put(self, key: str, page: torch.Tensor) -> None:
        path = self._path(key)
        if path.is_file():
            return
        data = page.contiguous().view(torch.uint8).numpy().tobytes()
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def get(self, key: str) -> torch.Tensor | None:
        try:
            data = self._path(key).read_bytes()
        except OSError:
            return None
        lay = self.layout
        if len(data) != lay.nbytes:
            logger.warning("hicache storage: %s has %d bytes, expected %d; ignored", key, len(data), lay.nbytes)
            return None
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return raw.view(lay.dtype).reshape(lay.page_tokens, lay.rows, lay.heads, lay.dim)

    def longest_run(self, keys: list[str]) -> list[torch.Tensor]:
        """The pages of the longest run of keys[0], keys[1], ... that storage holds."""
        out = []
        for key in keys:
            page = self.get(key)
            if page is None:
                break
            out.append(page)
        return out


class StorageIO:
    """The storage's worker threads: writes in order on one, prefetch reads on another."""

    def __init__(self, storage: FileStorage):
        self.storage = storage
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="hicache-write")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="hicache-read")
        self.written: set[str] = set()  # keys written or queued by this process

    def write(self, keys: list[str], pages: torch.Tensor, event=None) -> Future:
        """pages: (len(keys) * page_tokens, rows, heads, dim) on the host; event: the device copy filling it."""
        self.written.update(keys)
        n = self.storage.layout.page_tokens

        def run() -> None:
            if event is not None:
                event.synchronize()
            for i, key in enumerate(keys):
                self.storage.put(key, pages[i * n : (i + 1) * n])

        return self._writer.submit(run)

    def prefetch(self, keys: list[str]) -> Future:
        return self._reader.submit(self.storage.longest_run, keys)

    def drain(self) -> None:
        """Waits for the writes queued so far."""
        self._writer.submit(lambda: None).result()

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)
