"""Split-K sizing of the decode kernel. Imports no Triton: the attention backend sizes CUDA graphs' splits with it."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

DECODE_BLOCK_N = 64  # sequence positions per block of the decode kernel's stage 1
# Wide passes (at least this many (request, kv head) programs, no shared prefixes) walk 128 positions per block: on an
# H100 at batch 256 (8 kv heads, 640 positions) 5% faster than 64, at batch 64 7% slower
# (benchmarks/results/kernels/h100/decode_attention_sweep_before.json).
DECODE_WIDE_PROGRAMS = 1024
DECODE_WIDE_BLOCK_N = 128


DECODE_TARGET_PROGRAMS = 256  # stage-1 programs that fill the GPU (splits multiply the (kv head, request) programs)


def decode_num_splits(max_seq_len: int, bs: int, num_kv_heads: int, block_n: int = DECODE_BLOCK_N) -> int:
    """Enough programs to fill the GPU at small batch sizes, never splits shorter than a few blocks."""
    return max(1, min(16, -(-max_seq_len // (4 * block_n)), -(-DECODE_TARGET_PROGRAMS // max(1, bs * num_kv_heads))))


def decode_wide_rows(num_kv_heads: int) -> int:
    """The fewest rows of a wide decode pass."""
    return -(-DECODE_WIDE_PROGRAMS // max(1, num_kv_heads))


class KvPool(str, Enum):
    """What the KV pool stores, which picks stage 1's default launch (DECODE_DEFAULT_VARIANTS)."""

    MODEL = "model"  # the model's dtype
    E4M3 = "e4m3"
    E5M2 = "e5m2"

    @classmethod
    def of(cls, dtype) -> "KvPool":
        """A pool's kind from its torch dtype (by name: this module imports no torch)."""
        return {"torch.float8_e4m3fn": cls.E4M3, "torch.float8_e5m2": cls.E5M2}.get(str(dtype), cls.MODEL)


def decode_block_n(bs: int, num_kv_heads: int, shared: bool, pool: KvPool = KvPool.MODEL) -> int:
    """Stage 1's positions per block (decode_kernel_config's). A wide pass has one split (decode_num_splits), so its
    variant is one."""
    return decode_kernel_config(pool, not shared and bs >= decode_wide_rows(num_kv_heads)).block_n


class KvWiden(str, Enum):
    """How stage 1 widens a float8 pool's K/V for its dots (model-dtype pools and float32 queries: ignored).

    QUERY: to the query's dtype (bf16: the packed cvt to halves, then each half to bf16; span.kv_convert_asm).
    F16: to halves by the packed cvt alone, one instruction per two elements; the query is cast to float16 once
    (saturated to +-65504) and the dots run in float16 with float32 sums. Every e4m3/e5m2 value is a half exactly, a
    bf16 query of magnitude 2^-14..65504 is too, and p (0..1) keeps 11 significant bits instead of bf16's 8: the
    same as QUERY's arithmetic but for p's rounding, which is finer.
    F16_BITS: as F16, but the halves are made with integer instructions (byte permute, and, shift, or: no conversion
    unit); e4m3's then read value * 2^-8, and 2^8 is folded into the softmax scale (K) and the output scale (V).
    F16_MIXED: as F16, half of each 4-element word by the packed cvt and half by F16_BITS's bit moves (e4m3's
    then times 2^8 on the half pipe, exact): the two units share the widening."""

    QUERY = "query"
    F16 = "f16"
    F16_BITS = "f16_bits"
    F16_MIXED = "f16_mixed"


@dataclass(frozen=True)
class DecodeKernelConfig:
    """Stage 1's launch: positions per block, warps, Triton's pipeline stages, and how the walk prefetches
    (span.attend_span's PREFETCH: 0 Triton's pipeliner, 1 the table a block ahead, 2 the table two blocks and K/V one
    block ahead, in registers). Triton's pipeliner (num_stages 2, PREFETCH 0) issues a block's table load and then
    its K/V loads after the previous block's math and waits for both: two memory round trips per block with nothing
    in flight during the math. num_stages 3 moves the table load two blocks ahead (one round trip a block); PREFETCH
    does it in the source, with num_stages 1."""

    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    prefetch: int = 0
    inline_cvt: bool = True  # a float8 pool converted by span.kv_convert_asm on CUDA (False: the plain cast)
    maxnreg: int = 0  # registers per thread the compiler may use (0: its choice); 128 fits 4 programs of 4 warps
    widen: KvWiden = KvWiden.QUERY  # a float8 pool's widening for the dots (KvWiden)
    swapped: bool = False  # the products transposed (span._block_t: wgmma; an e4m3 pool with F16: Q K^T in FP8)

    def __post_init__(self):
        if self.block_n not in (16, 32, 64, 128, 256):
            raise ValueError(f"DecodeKernelConfig.block_n: a power of two in 16..256, got {self.block_n}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"DecodeKernelConfig.num_warps: 1, 2, 4 or 8, got {self.num_warps}")
        if not 1 <= self.num_stages <= 4:
            raise ValueError(f"DecodeKernelConfig.num_stages: 1..4, got {self.num_stages}")
        if self.prefetch not in (0, 1, 2):
            raise ValueError(f"DecodeKernelConfig.prefetch: 0, 1 or 2, got {self.prefetch}")
        if self.maxnreg and not 32 <= self.maxnreg <= 255:
            raise ValueError(f"DecodeKernelConfig.maxnreg: 0 or 32..255, got {self.maxnreg}")
        if not isinstance(self.widen, KvWiden):
            raise ValueError(f"DecodeKernelConfig.widen: a KvWiden, got {self.widen!r}")
        if self.widen != KvWiden.QUERY and not self.inline_cvt:
            raise ValueError("DecodeKernelConfig: widening to halves (widen F16, F16_BITS) needs inline_cvt")
        if self.prefetch and self.num_stages != 1:
            raise ValueError("DecodeKernelConfig: a prefetching walk runs with num_stages=1 (it is its own pipeline)")


# The variants benchmarks/kernels/fp8_kv_decode_gpu.py times side by side (--variants). Registers per thread and
# programs per SM (sm_90, Triton 3.6, Llama-3.1-8B heads, float8 pools converted inline: span.kv_convert_asm):
# "old" bf16 96 (5; 4 used at batch 64 x 8 kv heads), e4m3 183 (2: the plain cast); "cvt" e4m3 128 (4);
# "s3" bf16 105 (4), e4m3 128 (4); "p1" bf16 144 (3), e4m3 128 (4); "p2" bf16 246 (2), e4m3 251 (2);
# "n128p1" e4m3 168 (3); "n128w8p1" bf16 and e4m3 128 (2 programs of 8 warps); "p1r128" bf16 128 (4, no spills);
# (benchmarks/RETIRED.md: decode_registers_sm90.py);
# "n128p1r128" e4m3 128 (4; 9 spilled stores): a float8 block of 128 positions is bf16's 64 in bytes, at bf16's
# occupancy, in half the round trips.
# "...h" variants widen a float8 pool to halves (KvWiden.F16), "...b" with integer instructions (KvWiden.F16_BITS),
# "...m" with both (KvWiden.F16_MIXED); a model-dtype pool skips them. Per thread and 128-position block of e4m3 (256
# elements; sm_90, Triton 3.9, SASS of the loop): QUERY widens with 128 F2FP.F16.E4M3 (two elements each), 256
# F2F.BF16.F16 (one each) and 128 PRMT, 1,144 instructions in all; F16 with the 128 F2FP alone, 763; F16_BITS with
# 128 PRMT, 264 LOP3 and 129 LEA, 1,138, none on the conversion unit; F16_MIXED with 64 F2FP and 64 HMUL2 besides
# half the bit moves, 1,024. "...t" variants walk with the products transposed (span._block_t; with "h"'s widening an
# e4m3 pool's Q K^T runs in FP8 (decode.fp8_query), "s3t" widens as QUERY); they stack 8 query rows a
# program, not 16 (the GQA group's 4, padded: the products' N side), 518 instructions a loop against 678 (Triton 3.9;
# Triton 3.6 builds their products with mma.sync at 8 rows, widening K: 614). Registers (stack bytes, spill
# loads/stores in the loop):
# "n128p1r128h" 128 (40, 7), "n128p1r128b" 128 (8, 0), "p1h" 126 (0), "s3h" 124 (0), "n256w8p1r128h" 128 (24, 2),
# "n128w8p1h" 108 (0), "n128p1h" 168 (8, 0), "s3b" 124 (0), "n128p1r128m" 128 (56, 12), "p1m" 128 (0).
DECODE_VARIANTS = {  # likeliest first: a timed run under a budget drops the last ones
    "old": DecodeKernelConfig(64, 4, 2, 0, inline_cvt=False),  # the kernel before these variants
    "s3": DecodeKernelConfig(64, 4, 3, 0),
    "n128p1r128": DecodeKernelConfig(128, 4, 1, 1, maxnreg=128),
    "n128p1r128h": DecodeKernelConfig(128, 4, 1, 1, maxnreg=128, widen=KvWiden.F16),
    "n128s2t": DecodeKernelConfig(128, 4, 2, 0, widen=KvWiden.F16, swapped=True),
    "n128s3t": DecodeKernelConfig(128, 4, 3, 0, widen=KvWiden.F16, swapped=True),
    "n64s3t": DecodeKernelConfig(64, 4, 3, 0, widen=KvWiden.F16, swapped=True),
    "n128p1t": DecodeKernelConfig(128, 4, 1, 1, widen=KvWiden.F16, swapped=True),
    "n128w8s2t": DecodeKernelConfig(128, 8, 2, 0, widen=KvWiden.F16, swapped=True),
    "n128p1r128t": DecodeKernelConfig(128, 4, 1, 1, maxnreg=128, widen=KvWiden.F16, swapped=True),
    "n256p1t": DecodeKernelConfig(256, 4, 1, 1, widen=KvWiden.F16, swapped=True),
    "n128w8p1t": DecodeKernelConfig(128, 8, 1, 1, widen=KvWiden.F16, swapped=True),
    "n128p2t": DecodeKernelConfig(128, 4, 1, 2, widen=KvWiden.F16, swapped=True),
    "n64p1t": DecodeKernelConfig(64, 4, 1, 1, widen=KvWiden.F16, swapped=True),
    "s3t": DecodeKernelConfig(64, 4, 3, 0, swapped=True),
    "p1h": DecodeKernelConfig(64, 4, 1, 1, widen=KvWiden.F16),
    "s3h": DecodeKernelConfig(64, 4, 3, 0, widen=KvWiden.F16),
    "p1m": DecodeKernelConfig(64, 4, 1, 1, widen=KvWiden.F16_MIXED),
    "n128p1r128b": DecodeKernelConfig(128, 4, 1, 1, maxnreg=128, widen=KvWiden.F16_BITS),
    "n128p1r128m": DecodeKernelConfig(128, 4, 1, 1, maxnreg=128, widen=KvWiden.F16_MIXED),
    "n256w8p1r128h": DecodeKernelConfig(256, 8, 1, 1, maxnreg=128, widen=KvWiden.F16),
    "n128w8p1h": DecodeKernelConfig(128, 8, 1, 1, widen=KvWiden.F16),
    "n128p1h": DecodeKernelConfig(128, 4, 1, 1, widen=KvWiden.F16),
    "s3b": DecodeKernelConfig(64, 4, 3, 0, widen=KvWiden.F16_BITS),
    "p1": DecodeKernelConfig(64, 4, 1, 1),
    "cvt": DecodeKernelConfig(64, 4, 2, 0),
    "p1r128": DecodeKernelConfig(64, 4, 1, 1, maxnreg=128),
    "n128p1": DecodeKernelConfig(128, 4, 1, 1),
    "n128w8p1": DecodeKernelConfig(128, 8, 1, 1),
    "n128s3": DecodeKernelConfig(128, 4, 3, 0),
    "wide": DecodeKernelConfig(DECODE_WIDE_BLOCK_N, 4, 2, 0),
    "p2": DecodeKernelConfig(64, 4, 1, 2),
}
# The defaults, per (pool, wide pass); fixed per server and batch class, so start-up's passes build them
# (kernels/startup/kernel_variants.py). A model-dtype pool keeps the blocks it had (64 positions, 128 in wide passes):
# same blocks, same numerics, whatever the pipeline. The float8 ones are fp8_kv_decode_gpu.py --variants' fastest on an
# H200 (Llama-3.1-8B heads, 8k-token contexts; benchmarks/results/kernels/h200/kv_sweep_8q/): e4m3's transposed walk
# with its query in e4m3 (n128p1t) 0.421 ms at batch 64 against n128p1r128h's 0.470 (bf16's s3: 0.538), 0.756 at
# batch 128 in wide passes against 0.994; e5m2 has no FP8 query (its K is widened): the transposed walk at 128
# registers (n128p1r128t) 0.446 ms against n128p1r128h's 0.465 and n128p1t's 0.634 (kv_sweep_8q/verify/).
DECODE_DEFAULT_VARIANTS = {
    (KvPool.MODEL, False): "s3",
    (KvPool.MODEL, True): "wide",
    (KvPool.E4M3, False): "n128p1t",
    (KvPool.E4M3, True): "n128p1t",
    (KvPool.E5M2, False): "n128p1r128t",
    (KvPool.E5M2, True): "n128p1r128h",
}


def decode_kernel_config(pool: KvPool, wide: bool) -> DecodeKernelConfig:
    """Stage 1's launch of a pass without shared prefixes (DECODE_DEFAULT_VARIANTS)."""
    return DECODE_VARIANTS[DECODE_DEFAULT_VARIANTS[(KvPool(pool), bool(wide))]]


# Chunked decode (small batches, where splits would multiply the programs): stage 1's program (kv head, entry) walks
# one of a request's equal parts of whole BLOCK_N-position blocks, at most `chunk` blocks, so no program does much
# more than the others however ragged the lengths (or however many padded rows a CUDA graph carries). The work list
# is built on the device (decode_work.py) once a pass, so a graph replays it for any lengths; the host mirror is
# decode_chunk_layout.
DECODE_CHUNK_MAX_ROWS = 32  # the work list builder's request tile: every row of a chunked pass in one vector
DECODE_CHUNK_SPARE = 48  # entries per kv head beyond one per request
DECODE_CHUNK_BLOCK_S = 8  # stage 2's tile: it merges a request's entries (at most DECODE_CHUNK_SPARE + 1) in tiles


def decode_chunk_capacity(bs: int, num_kv_heads: int) -> int:
    """Work-list entries per kv head of a chunked decode pass of bs rows (its stage-1 grid); 0 where the pass splits
    instead: one row (nothing to balance), or enough (kv head, request) programs to fill the GPU unsplit."""
    if 2 <= bs <= DECODE_CHUNK_MAX_ROWS and bs * num_kv_heads < DECODE_TARGET_PROGRAMS:
        return bs + DECODE_CHUNK_SPARE
    return 0


def decode_chunk_layout(seq_lens: list[int], capacity: int, block_n: int = DECODE_BLOCK_N) -> tuple[int, list[int]]:
    """(chunk, entries per request) as decode_work.py derives them, in blocks of block_n positions: chunk =
    ceil(all blocks / (capacity - bs)), and a request of n blocks takes ceil(n / chunk) entries of ceil(n / entries)
    blocks each (the last one shorter). Entries are at most n / chunk + 1 a request: the list fits its capacity and
    no request has more than capacity - bs + 1."""
    blocks = [-(-n // block_n) for n in seq_lens]
    chunk = max(1, -(-sum(blocks) // (capacity - len(seq_lens))))
    return chunk, [-(-n // chunk) for n in blocks]


# Query rows (request x GQA head of one kv head) per tile of the shared-prefix kernel: one tl.dot operand.
SHARED_PREFIX_BLOCK_M = 64
# Shortest prefix read once per group in a decode pass; shorter ones are not worth a third launch.
SHARED_PREFIX_MIN_LEN = 256


def shared_prefix_block_m(group: int) -> int:
    return max(SHARED_PREFIX_BLOCK_M, 1 << max(group - 1, 0).bit_length())


def shared_prefix_rows_per_tile(group: int) -> int:
    """Requests per tile: all of a tile's requests' query heads of one kv head fill one BLOCK_M operand."""
    return shared_prefix_block_m(group) // group


def shared_prefix_num_splits(max_prefix_len: int, num_tiles: int, num_kv_heads: int,
                             block_n: int = DECODE_BLOCK_N) -> int:
    """decode_num_splits' rule over the prefix kernel's (tile, kv head) programs: a tile stands where a request does."""
    return decode_num_splits(max_prefix_len, num_tiles, num_kv_heads, block_n)
