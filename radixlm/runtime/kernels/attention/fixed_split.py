"""Batch-invariant attention (--enable-deterministic-inference), the host side and the torch implementation (CPU, and
the reference of the Triton kernel, fixed_split_kernel.py).

Every query row, whatever pass it is in (a prompt's prefill, a chunk of it, an extend over a cached prefix, a
decode step, a CUDA-graph replay padded to its captured size), is described by the same two numbers: its request's
row of req_to_token and its position (it sees the keys at positions 0..position: causal). Its attention walks those
keys from position 0 in splits of exactly FIXED_SPLIT_SIZE positions, a split's scores and its softmax-weighted
values each one fixed-shape reduction, the splits merged into an online softmax in position order. Nothing in that
walk depends on the other rows of the pass, on how many there are, or on whether the row's prefix came from the radix
cache: a fixed split size, not a fixed number of splits (the decode kernels' split count follows the batch and the
longest sequence, which moves every split boundary). The Triton kernel takes a request's consecutive rows in tiles
(span_tiles) that share each block's key reads; every row's walk in a tile is still its own."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from radixlm.runtime.kernels.attention.fixed_split_config import ALLOWED_SUB_TILES, FixedSplitConfig, default_config

# Keys per split. The Triton kernel's BLOCK_N: one tl.dot of this many keys per step.
FIXED_SPLIT_SIZE = 64
# The torch implementation runs its rows in calls of exactly this many (the last padded), so that each of its ops has
# one shape and takes one path whatever the pass's size.
TORCH_ROW_BLOCK = 16
# The most sub-tiles (of rows_per_tile rows each) one Triton program takes: its float32 state per sub-tile is 16 rows
# x the head dim.
MAX_SUB_TILES = max(ALLOWED_SUB_TILES)


def rows_per_tile(group: int) -> int:
    """How many query rows of one request the Triton kernel's program takes (fixed_split_kernel.py): its tile holds
    rows x the GQA group's query heads (padded to a power of two), 16 in all for groups up to 16. A function of the
    model alone, so a decode row and a prefill row run one tile shape."""
    if group < 1:
        raise ValueError(f"a GQA group of {group} query heads")
    return max(1, 16 // (1 << (group - 1).bit_length()))


def sub_tiles(head_dim: int) -> int:
    """The default sub-tiles per program for requests of more rows than one sub-tile (fixed_split_config: a GPU's
    table may choose another). A row's result does not depend on it (fixed_split_kernel.py), only how often keys are
    read."""
    return default_config(head_dim).sub_tiles


@dataclass(frozen=True)
class TileLaunch:
    """One launch of the Triton kernel over some of a pass's rows: tiles as (first row, row count) and the
    sub-tiles its programs take and its pipeline stages (host lists; the backend moves them to the device)."""
    starts: list[int]
    counts: list[int]
    sub_tiles: int
    num_stages: int = 3


def span_launches(spans: list[int], group: int, head_dim: int, prefix_lens: list[int] | None = None,
                  config: FixedSplitConfig | None = None) -> list[TileLaunch]:
    """A REQUEST_SPANS pass's launches: requests of at most one sub-tile's rows (decode rows and chain drafts mixed
    into a prefill) one sub-tile a program at config's decode stages, the longer ones (prompts, chunks, extends)
    config.sub_tiles a program at its prefill stages (config: the shape's table entry, fixed_split_config.config_for;
    None: the default), each set longest first (span_tiles); no launch for a set without rows. Splitting them keeps
    a one-row request from paying for the idle sub-tiles of a prefill's program; which launch a row takes changes
    none of its bits."""
    cfg = config or default_config(head_dim)
    rows = rows_per_tile(group)
    sub = cfg.sub_tiles
    most = max(spans, default=0)
    launches = [TileLaunch(*span_tiles(spans, rows, prefix_lens, range(rows + 1)), 1, cfg.decode_stages),
                TileLaunch(*span_tiles(spans, rows * sub, prefix_lens, range(rows + 1, most + 1)), sub,
                           cfg.prefill_stages)]
    return [launch for launch in launches if launch.starts]


def span_tiles(spans: list[int], rows: int, prefix_lens: list[int] | None = None,
               sizes: range | None = None) -> tuple[list[int], list[int]]:
    """The kernel's tiles of a REQUEST_SPANS pass: each request's rows (spans, in pass order) cut into runs of at most
    `rows` from its first; (first row, row count) per tile. With the requests' cached prefix lengths the tiles come
    longest walk first (the most keys at their last row; ties in row order), so that the longest programs start
    first rather than last: the order only schedules, every tile's rows are computed alike. sizes: only the
    requests whose row count is in it get tiles (the others' rows are left to another launch)."""
    if rows < 1 or any(n < 0 for n in spans):
        raise ValueError(f"tiles of {rows} rows over spans {spans}")
    if prefix_lens is not None and (len(prefix_lens) != len(spans) or any(n < 0 for n in prefix_lens)):
        raise ValueError(f"prefix lengths {prefix_lens} for spans {spans}")
    starts, counts, keys, row = [], [], [], 0
    for i, n in enumerate(spans):
        for j in range(0, n if sizes is None or n in sizes else 0, rows):
            starts.append(row + j)
            counts.append(min(rows, n - j))
            keys.append(-(prefix_lens[i] + j + counts[-1]) if prefix_lens is not None else 0)
        row += n
    if prefix_lens is not None:
        order = sorted(range(len(starts)), key=keys.__getitem__)
        starts, counts = [starts[i] for i in order], [counts[i] for i in order]
    return starts, counts


def row_tiles(num_rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One tile per row (TOKEN_ROWS passes: decode rows, graph replays): (first row, row count) int32 vectors."""
    return (torch.arange(num_rows, dtype=torch.int32, device=device),
            torch.ones(num_rows, dtype=torch.int32, device=device))


def row_requests(req_pool_indices: torch.Tensor, extend_lens: list[int] | None, num_rows: int) -> torch.Tensor:
    """Each row's req_to_token row: extend_lens None when every row is its own request (TOKEN_ROWS), else the rows
    per request (REQUEST_SPANS)."""
    if extend_lens is None:
        return req_pool_indices
    lens = torch.tensor(extend_lens, dtype=torch.int64).to(req_pool_indices.device, non_blocking=True)
    return torch.repeat_interleave(req_pool_indices, lens, output_size=num_rows)


def _gather(buf: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    raw = buf.view(torch.uint8) if buf.element_size() == 1 else buf
    rows = raw.view(buf.shape[0], -1).index_select(0, slots.reshape(-1))
    return rows.view(buf.dtype).view(*slots.shape, *buf.shape[1:])


def fixed_split_attention_torch(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                                req_to_token: torch.Tensor, row_req: torch.Tensor, positions: torch.Tensor,
                                scale: float, v_scale: float = 1.0) -> torch.Tensor:
    """q: (T, H, D); k_buf, v_buf: (slots, Hkv, D); row_req (row_requests), positions: (T,). scale: the softmax
    scale times the pool's k_scale. Computes in float32; returns (T, H, D) in q's dtype."""
    t, h, d = q.shape
    hkv = k_buf.shape[1]
    if h % hkv:
        raise ValueError(f"{h} query heads do not group over {hkv} kv heads")
    g, r, s = h // hkv, TORCH_ROW_BLOCK, FIXED_SPLIT_SIZE
    out = torch.empty_like(q)
    row_len = positions + 1
    lens = row_len.tolist()
    if t and min(lens) < 1:
        raise ValueError("a query row's position is negative")
    split = torch.arange(s, device=q.device)
    last_col = req_to_token.shape[1] - 1
    for c0 in range(0, t, r):
        n = min(r, t - c0)
        idx = torch.arange(c0, c0 + r, device=q.device).clamp_max(t - 1)  # padding repeats the block's last row
        qc = q[idx].float().reshape(r, hkv, g, d)
        req, ln = row_req[idx], row_len[idx]
        m = torch.full((r, hkv, g), float("-inf"), device=q.device)
        l = torch.zeros(r, hkv, g, device=q.device)
        acc = torch.zeros(r, hkv, g, d, device=q.device)
        for b in range(math.ceil(max(lens[c0 : c0 + n]) / s)):
            pos = b * s + split
            valid = pos[None, :] < ln[:, None]  # (r, s)
            slots = req_to_token[req[:, None], pos.clamp_max(last_col)[None, :]].masked_fill(~valid, 0)
            kb = _gather(k_buf, slots).float()  # (r, s, hkv, d)
            vb = _gather(v_buf, slots).float()
            sc = torch.einsum("rhgd,rshd->rhgs", qc, kb).mul_(scale)
            sc.masked_fill_(~valid[:, None, None, :], float("-inf"))
            active = (b * s < ln)[:, None, None]
            m_new = torch.where(active, torch.maximum(m, sc.amax(-1)), m)
            alpha = torch.exp(m - m_new)
            p = torch.exp(sc - m_new[..., None])
            l = torch.where(active, l * alpha + p.sum(-1), l)
            acc = torch.where(active[..., None], acc * alpha[..., None] + torch.einsum("rhgs,rshd->rhgd", p, vb), acc)
            m = m_new
        o = acc / l[..., None]
        if v_scale != 1.0:
            o = o * v_scale
        out[c0 : c0 + n] = o.reshape(r, h, d)[:n].to(q.dtype)
    return out
