"""Same-host transfers between GPUs: the decode server shares its KV pool's buffers through CUDA IPC, and the prefill
server writes a room's KV straight into the decode server's slots (over NVLink where the GPUs have it), so no byte goes
through the host and the decode server's scheduler does no copy at all.

The decode server sends its pool's export with each fetch (`export_pool`: JSON, the handles of torch's CUDA IPC
reductions, its host and GPU identity); the prefill server opens it once (`PeerPools.open`) when it runs on the same
host and sees that GPU, and otherwise the room's KV goes over the zmq backend's host path as before. Nothing read from
the wire picks code to run: only the fields of a fixed rebuild function, with tensor and storage classes from a fixed
list, are taken from it."""
from __future__ import annotations

import base64
import functools
import logging
import os
import socket
import threading
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_CLASSES = {"Tensor": torch.Tensor, "UntypedStorage": torch.UntypedStorage, "TypedStorage": torch.TypedStorage}
_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.bfloat16, torch.float16,
                                                      torch.float8_e4m3fn, torch.float8_e5m2, torch.uint8)}


def host_id() -> str:
    """This host's identity (name and boot): two processes with the same one can open each other's IPC handles."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def gpu_uuid(device: torch.device | int) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def _encode(x):
    if isinstance(x, bytes):
        return {"b": base64.b64encode(x).decode()}
    if isinstance(x, torch.dtype):
        return {"dtype": str(x).removeprefix("torch.")}
    if isinstance(x, type):
        return {"cls": x.__name__}
    if isinstance(x, (torch.Size, tuple, list)):
        return {"seq": [_encode(i) for i in x]}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"cannot describe {type(x).__name__} in a KV pool export")


def _decode(x):
    if isinstance(x, dict):
        if "b" in x:
            return base64.b64decode(x["b"])
        if "dtype" in x:
            return _DTYPES[x["dtype"]]
        if "cls" in x:
            return _CLASSES[x["cls"]]
        if "seq" in x:
            return tuple(_decode(i) for i in x["seq"])
        raise ValueError("unknown field in a KV pool export")
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise ValueError("unknown value in a KV pool export")


def export_pool(buffers: list[torch.Tensor]) -> dict | None:
    """The pool's buffers as the JSON a prefill server on this host opens; None where they are not CUDA tensors or
    torch cannot share them."""
    if not buffers or not buffers[0].is_cuda:
        return None
    try:
        from torch.multiprocessing.reductions import reduce_tensor

        handles = []
        for buf in buffers:
            _, args = reduce_tensor(buf)
            handles.append(_encode(args))
        return {"host": host_id(), "pid": os.getpid(), "uuid": gpu_uuid(buffers[0].device),
                "device": buffers[0].device.index, "buffers": handles}
    except Exception as e:  # noqa: BLE001 - an optional fast path: the host path serves without it
        logger.warning("the KV pool cannot be shared through CUDA IPC (%s: %s); rooms arrive over the host path",
                       type(e).__name__, e)
        return None


class PeerPools:
    """The prefill side's opened exports: one per GPU, the latest decode server's pool there. An opened export keeps
    its memory alive, so a decode server started again on that GPU (another process) replaces the old one's, which
    is closed, rather than leaving its pool mapped."""

    def __init__(self, writer: torch.device | None = None) -> None:
        # The GPU whose kernels store into the opened pools (the prefill server's). A peer's pool is mapped into
        # that GPU's context: IPC memory opened in the owner GPU's context is not in a peer's page tables, whatever
        # peer access says, and a store to it from the writer is an illegal address (2 x H200, row_copy kernel).
        self.writer = writer
        self._open: dict[str, tuple[str, list[torch.Tensor] | None]] = {}  # GPU uuid -> (export key, its buffers)
        self._local: dict[str, int] | None = None
        self._lock = threading.Lock()  # the prefill scheduler's thread and the bootstrap thread both open

    def _device_of(self, uuid: str) -> int | None:
        if self._local is None:
            self._local = {gpu_uuid(i): i for i in range(torch.cuda.device_count())} if torch.cuda.is_available() \
                else {}
        return self._local.get(uuid)

    def open(self, export: dict) -> list[torch.Tensor] | None:
        """The decode pool's buffers, writable from here; None where this process cannot reach them (another host,
        a GPU it does not see, an export it cannot open)."""
        try:
            uuid = export["uuid"]
            key = f"{export['pid']}:{export['buffers'][0]['seq'][7]['b']}"
        except (KeyError, IndexError, TypeError):
            return None
        with self._lock:
            known = self._open.get(uuid)
            if known is not None and known[0] == key:
                return known[1]
            self._open.pop(uuid, None)  # another process's pool on that GPU: closed with its tensors
            bufs = self._rebuild(export)
            self._open[uuid] = (key, bufs)
            return bufs

    def _rebuild(self, export: dict) -> list[torch.Tensor] | None:
        if export.get("host") != host_id():
            return None
        device = self._device_of(export.get("uuid", ""))
        if device is None:
            logger.warning("the decode server's GPU %s is not visible here: its rooms go over the host path "
                           "(start both servers with every GPU visible and --base-gpu-id)", export.get("uuid"))
            return None
        try:
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            w = self.writer
            if w is not None and w.type == "cuda" and torch.cuda.can_device_access_peer(w, device):
                device = w.index if w.index is not None else torch.cuda.current_device()
            bufs = []
            for h in export["buffers"]:
                args = list(_decode(h))
                if args[6] != export["device"]:
                    raise ValueError("an export's buffers name different devices")
                args[6] = device  # the context the handle is opened in: the writer's where it reaches the pool
                bufs.append(rebuild_cuda_tensor(*args))
            return bufs
        except Exception as e:  # noqa: BLE001 - as export_pool
            logger.warning("cannot open the decode server's KV pool (%s: %s): its rooms go over the host path",
                           type(e).__name__, e)
            return None


def check_layout(src: list[torch.Tensor], dst: list[torch.Tensor]) -> str | None:
    """Why dst cannot take src's rows (None: it can)."""
    if len(src) != len(dst):
        return f"{len(src)} KV buffers here, {len(dst)} on the decode server"
    for a, b in zip(src, dst):
        if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
            return (f"KV rows {tuple(a.shape[1:])} {a.dtype} here, {tuple(b.shape[1:])} {b.dtype} on the decode "
                    "server: both servers must run the same model, dtype and KV dtype")
    return None


@functools.cache  # a fact of the process's GPUs: peer access, once on, stays on
def _reaches(src: torch.device, dst: torch.device) -> bool:
    """Whether kernels on src may store into dst's memory: the same GPU, or a peer (torch turns peer access on with
    a copy between the two)."""
    if src == dst:
        return True
    if not torch.cuda.can_device_access_peer(src, dst):
        return False
    torch.empty(1, device=dst).copy_(torch.empty(1, device=src))
    return True


def write_rows(rows, dst: list[torch.Tensor], dst_slots: torch.Tensor,
               src_slots: torch.Tensor | None = None) -> torch.device:
    """Rows src_slots (default: all, in order) of each of rows (one [n, ...] tensor per dst buffer, on one device)
    into rows dst_slots of its dst buffer; returns the device whose current stream the writes were queued on. GPU to
    GPU that is the rows' GPU: one kernel there storing into dst's memory (kernels/elementwise/row_copy.py); else
    dst's: copies, then a scatter there."""
    rows = list(rows)
    if rows and rows[0].is_cuda and dst[0].is_cuda and _reaches(rows[0].device, dst[0].device):
        from radixlm.runtime.kernels.elementwise import copy_rows

        copy_rows(rows, torch.arange(rows[0].shape[0]) if src_slots is None else src_slots, dst, dst_slots)
        return rows[0].device
    dst_slots = dst_slots.to(dst[0].device)
    for r, d in zip(rows, dst):
        if src_slots is not None:
            r = r.index_select(0, src_slots.to(r.device))
        d.index_copy_(0, dst_slots, r.to(d.device, non_blocking=True))
    return dst[0].device


def copy_slots(src: list[torch.Tensor], src_slots: torch.Tensor, dst: list[torch.Tensor],
               dst_slots: torch.Tensor) -> torch.cuda.Event | None:
    """Rows src_slots of every src buffer into rows dst_slots of the matching dst buffer, queued on the current
    streams (the reads come before anything later on src's stream overwrites those rows); the event completes with
    the last write (None on the CPU, where the copy is done on return)."""
    writer = write_rows(src, dst, dst_slots, src_slots)
    if not dst[0].is_cuda:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(writer))
    return event
