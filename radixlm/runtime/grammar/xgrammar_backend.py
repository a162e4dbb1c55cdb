"""GrammarBackend over xgrammar: token-level compilation against the model's tokenizer and vocabulary size,
bitmask filling per request, and xgrammar's bitmask kernels (CPU, or CUDA/Triton on a GPU)."""
from __future__ import annotations

import json
import os
from typing import Any

import torch
import xgrammar as xgr

from radixlm.runtime.host_to_device import host_to_device
from radixlm.runtime.grammar.backend import GrammarBackend, GrammarMatcher
from radixlm.runtime.grammar.spec import GrammarSpec, InvalidGrammar, compiler_message


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, matcher: xgr.GrammarMatcher):
        self.matcher = matcher
        # Called per token: xgrammar's own bound methods, one Python call fewer than the wrappers below.
        self.accept_token = matcher.accept_token
        self.is_terminated = matcher.is_terminated
        self.is_completed = matcher.is_completed

    def accept_token(self, token_id: int) -> bool:
        return self.matcher.accept_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.matcher.rollback(num_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def is_completed(self) -> bool:
        return self.matcher.is_completed()

    def jump_forward_string(self) -> str:
        try:
            return self.matcher.find_jump_forward_string()
        except UnicodeDecodeError:
            return ""  # the forced bytes finish a character an earlier token began: no jump here, decode on


class XGrammarBackend(GrammarBackend):
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int], max_threads: int = 2):
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self.compiler = xgr.GrammarCompiler(info, max_threads=max_threads)
        # A batch's masks are filled on several threads (one matcher per thread at a time).
        self.batch_matcher = xgr.BatchGrammarMatcher(max_threads=max(1, min(8, (os.cpu_count() or 2) // 2)))
        self._bit_shifts: dict[torch.device, torch.Tensor] = {}  # apply_bitmask's constant, per device

    def compile(self, spec: GrammarSpec) -> Any:
        try:
            if spec.kind == "regex":
                return self.compiler.compile_regex(spec.spec)
            if spec.kind == "json_schema":
                json.loads(spec.spec)
                # Compact separators: no whitespace for the model to loop on, and more text to jump over.
                return self.compiler.compile_json_schema(spec.spec, any_whitespace=False)
            return self.compiler.compile_grammar(spec.spec)
        except Exception as e:  # noqa: BLE001 - reported on the request, never raised in the scheduler loop
            raise InvalidGrammar(f"invalid {spec.kind}: {compiler_message(e)}") from None

    def new_matcher(self, compiled: Any) -> GrammarMatcher:
        return XGrammarMatcher(xgr.GrammarMatcher(compiled))

    def fill_bitmasks(self, matchers: list[GrammarMatcher], bitmask: torch.Tensor, rows: list[int]) -> None:
        if len(matchers) == 1:
            matchers[0].fill_bitmask(bitmask, rows[0])
            return
        self.batch_matcher.batch_fill_next_token_bitmask([m.matcher for m in matchers], bitmask, indices=rows)

    def allocate_bitmask(self, batch_size: int) -> torch.Tensor:
        return xgr.allocate_token_bitmask(batch_size, self.vocab_size)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        if not logits.is_cuda:
            xgr.apply_token_bitmask_inplace(logits, bitmask, indices=rows, backend="cpu")
            return
        shifts = self._bit_shifts.get(logits.device)
        if shifts is None:
            shifts = self._bit_shifts[logits.device] = torch.arange(32, dtype=torch.int32, device=logits.device)
        apply_bitmask_with_tensor_ops(logits, bitmask, rows, shifts)


def apply_bitmask_with_tensor_ops(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int],
                                  shifts: torch.Tensor) -> None:
    """In place: for each i in rows, the tokens that bitmask[i] (xgrammar's layout: bit j of word w is token 32w + j)
    leaves out get -inf in logits[i]; shifts: arange(32) int32 on logits' device. Used on CUDA: xgrammar's GPU kernel
    is a Triton kernel specialized on the row count, so it was compiled in the middle of serving for each new kind of
    count. (On the CPU xgrammar's own kernel is faster.)"""
    if not rows:
        return
    dev = logits.device
    vocab = min(logits.shape[-1], bitmask.shape[-1] * 32)
    whole = rows == list(range(len(rows)))
    words = host_to_device(bitmask[: len(rows)] if whole else bitmask[rows], torch.int32, dev)
    refused = ((words.unsqueeze(-1) >> shifts) & 1 == 0).flatten(1)[:, :vocab]
    if whole:
        logits[: len(rows), :vocab].masked_fill_(refused, float("-inf"))
        return
    index = host_to_device(rows, torch.int64, dev)
    logits[index, :vocab] = logits[index, :vocab].masked_fill(refused, float("-inf"))
