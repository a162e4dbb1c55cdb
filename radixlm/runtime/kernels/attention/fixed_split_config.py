"""The batch-invariant attention's launch configuration (fixed_split_kernel.py): how many sub-tiles a prefill program
takes and the software pipeline's stages of each launch. A function of the model's attention shape (head dim, GQA
group, dtype) and the GPU model only, never of a pass's size: this GPU model's tuned table
(tuned/fixed_split_<GPU>.json, written by fixed_split_tune.py) or the default.

None of these choices changes a row's arithmetic: every sub-tile runs the same 16-row step whatever the program's
sub-tile count, and the stages only schedule the loads (tests/runtime/kernels/test_batch_invariant.py builds every
allowed (sub-tiles, stages) pair for sm_90 and checks it holds each floating-point instruction exactly sub-tiles
times as often as the decode build). num_warps is not a choice here: it sets the reductions' order."""
from __future__ import annotations

import functools
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

# The values the SASS test proves row-equivalent; a table may hold no other.
ALLOWED_SUB_TILES = (1, 2, 4)
ALLOWED_STAGES = (3, 4)  # 2 leaves one key buffer, waited for at the top of every block (by the build)
TUNED_DIR = Path(__file__).parent / "tuned"


@dataclass(frozen=True)
class FixedSplitConfig:
    """sub_tiles: the sub-tiles a program takes for requests of more rows than one sub-tile (prompts, chunks,
    extends); prefill_stages: that launch's pipeline stages; decode_stages: the stages of the one-sub-tile launches
    (decode rows, graph replays, a prefill pass's short requests)."""

    sub_tiles: int
    prefill_stages: int = 3
    decode_stages: int = 3

    def __post_init__(self) -> None:
        if self.sub_tiles not in ALLOWED_SUB_TILES:
            raise ValueError(f"sub_tiles {self.sub_tiles} not one of {ALLOWED_SUB_TILES}")
        for name in ("prefill_stages", "decode_stages"):
            if getattr(self, name) not in ALLOWED_STAGES:
                raise ValueError(f"{name} {getattr(self, name)} not one of {ALLOWED_STAGES}")

    def as_dict(self) -> dict:
        return asdict(self)


def default_config(head_dim: int) -> FixedSplitConfig:
    """Without a tuned entry: 4 sub-tiles, 2 past head dim 128 (whose state takes twice the registers); 3 stages."""
    if head_dim < 1:
        raise ValueError(f"head dim {head_dim}")
    return FixedSplitConfig(sub_tiles=4 if head_dim <= 128 else 2)


def table_path(device_name: str) -> Path:
    return TUNED_DIR / f"fixed_split_{re.sub(r'[^A-Za-z0-9]+', '_', device_name).strip('_')}.json"


def parse_table(entries: list[dict]) -> dict[tuple[int, int, str], FixedSplitConfig]:
    """A table's entries ({head_dim, group, dtype, config, ...}) by (head_dim, group, dtype); a malformed one raises
    ValueError."""
    out = {}
    for entry in entries:
        try:
            out[(int(entry["head_dim"]), int(entry["group"]), str(entry["dtype"]))] = FixedSplitConfig(
                **entry["config"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"bad fixed_split tuned entry {entry}: {e}") from e
    return out


@functools.cache
def _table(device_name: str) -> dict[tuple[int, int, str], FixedSplitConfig]:
    path = table_path(device_name)
    return parse_table(json.loads(path.read_text())["entries"]) if path.exists() else {}


def config_for(head_dim: int, group: int, dtype: torch.dtype, device: torch.device) -> FixedSplitConfig:
    """This GPU model's tuned entry for the attention shape, else default_config: never a function of a pass."""
    if group < 1:
        raise ValueError(f"a GQA group of {group} query heads")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device.index if device.index is not None else torch.cuda.current_device())
        found = _table(name).get((head_dim, group, str(dtype).removeprefix("torch.")))
        if found is not None:
            return found
    return default_config(head_dim)
