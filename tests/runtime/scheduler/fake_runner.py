"""A stand-in for ModelRunner, so that the planner and the scheduler are tested without a model.

FakeRunner has the real request table (ReqToTokenPool) and KV allocator (TokenToKVPoolAllocator), on the CPU. Its
"model" depends on the KV cache the way attention does: every row writes (token id, position) to its KV slot, and a
row that yields logits reads its request's whole prefix back through req_to_token from those slots. The next token is
a deterministic function (a polynomial hash) of the token sequence read back, so a scheduling bug that points a
request at the wrong slots, loses a token or skips a row changes the tokens; a slot holding the wrong position raises
FakeKVError at once. `reference(prompt, n)` is the greedy continuation of that model, computed without a scheduler.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from radixlm.runtime.distributed.parallel import SINGLE
from radixlm.runtime.executor.forward_batch import IN_FLIGHT, ModelWorkerBatch
from radixlm.runtime.executor.logits import LogitsOutput, top_logprobs
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.scheduler.planner import ScheduleBatch
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.spec.factory import DraftFactory

VOCAB = 512
FIRST_TOKEN = 3  # the model never produces 0..2 (pad, BOS, EOS of the usual tiny configs)
HASH_BASE = 1_000_003
HASH_MOD = (1 << 61) - 1
TOP_LOGIT = 8.0  # the chosen token's logit; every other one is in [-1, 1]
EMPTY = -1  # a slot of the fake KV store that no row has written


class FakeKVError(AssertionError):
    """A logits row read a KV slot that does not hold what its position needs."""


# ---------------------------------------------------------------------- the model
def extend_hash(h: int, token: int) -> int:
    return (h * HASH_BASE + token + 1) % HASH_MOD


def seq_hash(tokens) -> int:
    h = 0
    for t in tokens:
        h = extend_hash(h, int(t))
    return h


def token_of(h: int, vocab_size: int = VOCAB) -> int:
    """The model's greedy next token after a sequence whose hash is h."""
    return FIRST_TOKEN + h % (vocab_size - FIRST_TOKEN)


def next_token(tokens, vocab_size: int = VOCAB) -> int:
    return token_of(seq_hash(tokens), vocab_size)


def reference(prompt: list[int], n: int, vocab_size: int = VOCAB) -> list[int]:
    """The fake model's greedy continuation of `prompt` (n tokens), without any scheduler."""
    h, out = seq_hash(prompt), []
    for _ in range(n):
        tok = token_of(h, vocab_size)
        out.append(tok)
        h = extend_hash(h, tok)
    return out


def fake_logits(hashes: list[int], vocab_size: int = VOCAB) -> torch.Tensor:
    """(len(hashes), vocab) float32: a smooth deterministic wave in [-1, 1] (its phase from the hash), and
    TOP_LOGIT at token_of(hash)."""
    if not hashes:
        return torch.empty((0, vocab_size), dtype=torch.float32)
    v = torch.arange(vocab_size, dtype=torch.float32)
    phase = torch.tensor([(h % 997) * 0.013 for h in hashes], dtype=torch.float32)
    rows = torch.sin(v[None, :] * 0.37 + phase[:, None])
    rows[torch.arange(len(hashes)), torch.tensor([token_of(h, vocab_size) for h in hashes])] = TOP_LOGIT
    return rows


# ---------------------------------------------------------------------- the runner
class FakeRunner:
    """What the Scheduler reads from a ModelRunner: device, is_cuda, parallel, req_to_token_pool,
    token_to_kv_pool_allocator, model_config.vocab_size, max_running_requests, forward(wb) and
    can_replay(num_rows, input_logprobs)."""

    parallel = SINGLE

    def __init__(self, size: int = 4096, page_size: int = 1, max_running_requests: int = 32, graph_rows: int = 0,
                 vocab_size: int = VOCAB, context_len: int = 2048):
        self.device = "cpu"
        self.is_cuda = False
        self.takes_shared_prefixes = False
        self.is_causal = True
        self.pooler = None  # generation (a ModelRunner's Pooler under --is-embedding)
        self.page_size = page_size
        self.graph_rows = graph_rows
        self.model_config = SimpleNamespace(vocab_size=vocab_size, context_len=context_len)
        self.max_running_requests = max_running_requests
        self.max_total_num_tokens = size
        self.req_to_token_pool = ReqToTokenPool(max_running_requests + 1, context_len + 4, "cpu")
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(size, page_size, "cpu", debug=True)
        # The "KV cache": per slot, the token id and the position written there (slot 0.. page_size-1: dummy page).
        self.kv_token = torch.full((size + page_size,), EMPTY, dtype=torch.int64)
        self.kv_pos = torch.full((size + page_size,), EMPTY, dtype=torch.int64)
        # What moving KV between slots reads (tree drafts' compaction: KVPool.move_slots).
        self.token_to_kv_pool = SimpleNamespace(move_slots=self._move_slots)
        self.passes: list[ModelWorkerBatch] = []  # every pass seen, as planned (IN_FLIGHT ids left as they were)
        self.resolved_ids: list[list[int]] = []  # the row tokens of each pass, IN_FLIGHT resolved
        self.logits_dtype = torch.float32  # the model's dtype: what a ModelRunner's logits come in

    def _move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        for buf in (self.kv_token, self.kv_pos):
            buf[dst] = buf[src]

    def can_replay(self, num_rows: int, input_logprobs: bool = False, multi_row: bool = False) -> bool:
        return 0 < num_rows <= self.graph_rows and not input_logprobs

    choose_mode = ModelRunner.choose_mode  # the executor's own rule, over can_replay above

    def forward(self, wb: ModelWorkerBatch) -> LogitsOutput:
        self.passes.append(wb)
        n = wb.num_rows
        if not (len(wb.positions) == n == wb.out_cache_loc.numel()):
            raise FakeKVError(f"rows disagree: {n} ids, {len(wb.positions)} positions, "
                              f"{wb.out_cache_loc.numel()} slots")
        if sum(wb.extend_lens) != n or len(wb.prefix_lens) != len(wb.req_pool_indices):
            raise FakeKVError("extend_lens do not add up to the rows")
        row_req: list[int] = []  # request row (req_to_token) of each pass row
        for idx, start, ext, end in zip(wb.req_pool_indices, wb.prefix_lens, wb.extend_lens, wb.seq_lens):
            if start + ext != end:
                raise FakeKVError(f"prefix {start} + rows {ext} != seq_len {end}")
            row_req += [idx] * ext
        trees = wb.tree_masks or [None] * len(wb.req_pool_indices)
        row_tree: dict[int, tuple[int, list[int]]] = {}  # a tree request's row: (tree start, table columns it sees)
        for i, (idx, start, ext) in enumerate(zip(wb.req_pool_indices, wb.prefix_lens, wb.extend_lens)):
            first = sum(wb.extend_lens[:i])
            pos = wb.positions[first : first + ext]
            if trees[i] is not None:
                for j in range(ext):
                    cols = trees[i].mask[j].nonzero().flatten().tolist()
                    row_tree[first + j] = (trees[i].start, cols)
                    if pos[j] != trees[i].start + len(cols) - 1:
                        raise FakeKVError(f"request row {idx}: tree row {j} at position {pos[j]} sees {cols}")
                continue
            if pos != list(range(start, start + ext)):
                raise FakeKVError(f"request row {idx}: positions {pos} are not {start}..{start + ext - 1}")
        ids = list(wb.input_ids)
        for r, tok in enumerate(ids):
            if tok == IN_FLIGHT:
                if wb.token_buf is None:
                    raise FakeKVError("an IN_FLIGHT row without a token buffer")
                ids[r] = int(wb.token_buf[row_req[r]])
        self.resolved_ids.append(ids)
        slots = wb.out_cache_loc.to("cpu", torch.int64)
        self._check_allocated(slots, "a row is written to")
        # Attention writes every row's KV before any row reads.
        self.kv_token[slots] = torch.tensor(ids, dtype=torch.int64)
        self.kv_pos[slots] = torch.tensor(wb.positions, dtype=torch.int64)

        plan = wb.logits
        wanted = plan.sample_rows + plan.verify_rows + plan.input_rows
        hashes = {r: seq_hash(self.read_prefix(row_req[r], wb.positions[r], row_tree.get(r))) for r in set(wanted)}
        vocab = self.model_config.vocab_size
        rows = fake_logits([hashes[r] for r in plan.sample_rows + plan.verify_rows], vocab).to(self.logits_dtype)
        input_lp: list[float] = []
        input_top: list[list[tuple[float, int]]] = []
        if plan.input_rows:
            lp = torch.log_softmax(fake_logits([hashes[r] for r in plan.input_rows], vocab), dim=-1)
            targets = torch.tensor(plan.input_targets, dtype=torch.int64)
            input_lp = lp.gather(1, targets[:, None]).squeeze(1).tolist()
            if plan.input_top_k:
                input_top = top_logprobs(lp, plan.input_top_k)
        k = len(plan.sample_rows)
        return LogitsOutput(
            next_token_logits=rows[:k], input_logprobs=input_lp, input_top=input_top,
            verify_logits=rows[k:] if plan.verify_rows else None, rows=rows, forward_mode=self.choose_mode(wb),
            req_pool_indices=torch.tensor(wb.req_pool_indices, dtype=torch.int64))

    def read_prefix(self, req_row: int, pos: int, tree: tuple[int, list[int]] | None = None) -> list[int]:
        """The tokens at positions [0, pos] of a request, read back through req_to_token from the KV store; each slot
        must hold its position (and be allocated). tree: (start, columns) -- a tree row sees the table up to `start`,
        then the columns past it that its mask sets (its ancestors and itself)."""
        table = self.req_to_token_pool.req_to_token[req_row].to("cpu")
        if tree is None:
            slots = table[: pos + 1]
        else:
            slots = torch.cat([table[: tree[0]], table[[tree[0] + c for c in tree[1]]]])
        self._check_allocated(slots, f"request row {req_row} reads")
        got = self.kv_pos[slots]
        bad = (got != torch.arange(pos + 1)).nonzero().flatten().tolist()
        if bad:
            p = bad[0]
            raise FakeKVError(f"request row {req_row}, row at position {pos}: slot {int(slots[p])} holds position "
                              f"{int(got[p])}, not {p}")
        return self.kv_token[slots].tolist()

    def _check_allocated(self, slots: torch.Tensor, what: str) -> None:
        if slots.numel() == 0:
            return
        ps = self.page_size
        if bool((slots < ps).any()) or bool((slots >= self.max_total_num_tokens + ps).any()):
            raise FakeKVError(f"{what} a slot outside the pool: {slots.tolist()}")
        if bool(self.token_to_kv_pool_allocator.page_is_free[slots // ps].any()):
            raise FakeKVError(f"{what} a free slot")

    # ---------------------------------------------------------------- for tests
    def corrupt(self, slot: int) -> None:
        """Writes a wrong position into a slot (tests that the KV check fires)."""
        self.kv_pos[slot] += 1


# ---------------------------------------------------------------------- building and driving a Scheduler
def make_fake_scheduler(graph_rows: int = 0, vocab_size: int = VOCAB, **kwargs) -> Scheduler:
    """A real Scheduler over a FakeRunner whose pool and request table follow the ServerArgs (max_total_tokens,
    page_size, max_running_requests). Nothing loads model_path."""
    kwargs.setdefault("max_total_tokens", 1024)  # small: the integrity check after every step is O(pool)
    # Drafting where the sources propose (the tests count drafts): the controller, timing steps, would vary it.
    kwargs.setdefault("speculative_measure_window", 0)
    args = ServerArgs(model_path="fake-model", device="cpu", enable_integrity_check=True, random_seed=0, **kwargs)
    runner = FakeRunner(args.max_total_tokens, args.page_size, args.max_running_requests or 32, graph_rows,
                        vocab_size)
    return Scheduler(args, runner, tokenizer=None, eos_token_ids=frozenset(), drafts=DraftFactory.load(args, runner))


def record_plans(sched: Scheduler) -> list[ScheduleBatch]:
    """Every ScheduleBatch the scheduler's planner makes from now on (the planner's own method, wrapped)."""
    batches: list[ScheduleBatch] = []
    plan = sched.planner.plan

    def recording(*args, **kwargs):
        batch = plan(*args, **kwargs)
        batches.append(batch)
        return batch

    sched.planner.plan = recording
    return batches


def make_prompts(seed: int, n: int, lo: int = 5, hi: int = 60, prefix: list[int] | None = None) -> list[list[int]]:
    rng = random.Random(seed)
    head = list(prefix or [])
    return [head + [rng.randrange(FIRST_TOKEN, VOCAB) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]
