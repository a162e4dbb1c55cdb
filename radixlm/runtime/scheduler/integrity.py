"""The KV accounting invariant, and the LoRA slots', checked when the scheduler is idle (and after every step with
enable_integrity_check)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.runtime.scheduler.scheduler import Scheduler


def check_kv_accounting(sched: "Scheduler") -> None:
    """NOTE invariant: free + evictable + protected + slots owned by live requests == pool size, and every live
    request's own slots are allocated (not free); a draft model's KV of a request (kv.draft_kv_len) is within its
    KV."""
    tree, alloc, pool = sched.tree_cache, sched.allocator, sched.req_to_token_pool
    tree.check_consistency()
    alloc.check_no_double_free()
    ps = sched.page_size
    owned = 0
    in_use = [tree.all_values_flatten()]
    active = sched._active_reqs() + sched.disagg_holding()
    for req in active:
        if req.req_pool_idx is None:
            continue
        committed = req.kv.committed
        if req.kv.draft_kv_len > committed:
            raise AssertionError(f"request {req.rid}: draft KV past its KV ({req.kv.draft_kv_len} > {committed})")
        owned += (-(-committed // ps) - req.cache_lock.protected_len // ps) * ps
        in_use.append(pool.req_to_token[req.req_pool_idx, :committed])
    pages = torch.cat(in_use) // ps
    if pages.numel() and bool(alloc.page_is_free[pages].any()):
        raise AssertionError("a KV slot held by the tree or a running request is on the free list")
    total = alloc.available_size() + tree.evictable_size() + tree.protected_size() + owned
    if total != alloc.size:
        raise AssertionError(
            f"KV accounting broken: free {alloc.available_size()} + evictable {tree.evictable_size()} "
            f"+ protected {tree.protected_size()} + owned {owned} != {alloc.size}"
        )
    if sched.is_idle() and tree.protected_size() != 0:
        raise AssertionError(f"idle scheduler still protects {tree.protected_size()} tokens")
    rows_in_use = sum(1 for r in active if r.req_pool_idx is not None)
    if pool.available_size() + rows_in_use != pool.size:
        raise AssertionError("req_to_token rows leaked")
    if sched.lora is not None:
        check_lora_slots(sched)


def check_lora_slots(sched: "Scheduler") -> None:
    """NOTE invariant: the scheduler's slot table and the runner's slots hold the same adapters, each loaded; the
    adapters of the running requests fit the slots and are resident once a pass has run them."""
    table, manager = sched.lora.slots, sched.lora.manager
    if table.holder != manager.slot_ids:
        raise AssertionError(f"LoRA slots differ: scheduler {table.holder}, runner {manager.slot_ids}")
    unknown = {i for i in table.holder if i is not None} - set(manager.adapters)
    if unknown:
        raise AssertionError(f"LoRA slots hold unloaded adapters {sorted(unknown)}")
    running = {r.lora_id for r in sched.running if not r.finished()} - {None}
    if len(running | table.pinned) > table.num_slots:
        raise AssertionError(f"{len(running | table.pinned)} LoRA adapters in use exceed {table.num_slots} slots")
    if not running <= set(table.holder):
        raise AssertionError(f"running requests' adapters {sorted(running - set(table.holder))} are not in a slot")
