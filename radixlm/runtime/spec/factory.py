"""Where the draft sources are built: DraftFactory.load (from ServerArgs and the target runner: loads a draft model or
EAGLE head where --speculative-algorithm asks for one) is handed to the Scheduler, which builds its DraftPath with
the collaborators the sources share with it (DraftFactory.build)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from radixlm.runtime.args import ServerArgs, SpeculativeAlgorithm
from radixlm.runtime.spec.budget import draft_scratch, draft_steps
from radixlm.runtime.spec.controller import DraftController
from radixlm.runtime.spec.draft import DraftSource
from radixlm.runtime.spec.path import DraftPath
from radixlm.runtime.spec.runners.draft_model import DraftModelRunner
from radixlm.runtime.spec.runners.eagle import EagleRunner
from radixlm.runtime.spec.sources.jump_forward import JumpForwardSource
from radixlm.runtime.spec.sources.model import DraftModelSource, EagleSource
from radixlm.runtime.spec.sources.ngram import NGramSource
from radixlm.runtime.spec.sources.radix import RadixSource

if TYPE_CHECKING:
    from radixlm.runtime.cache.radix_cache import RadixCache
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.grammar.backend import GrammarBackend


@dataclass(frozen=True)
class DraftContext:
    """What the sources share with the scheduler that builds them."""

    tree_cache: "RadixCache"
    tokenizer: object
    eos_token_ids: frozenset[int]
    grammar_backend: Callable[[], "GrammarBackend"]  # built at the first grammar's compilation
    stats: Counter
    page_size: int
    batch_size: Callable[[], int]  # the running requests now


@dataclass(frozen=True)
class DraftFactory:
    args: ServerArgs
    draft_runner: DraftModelRunner | None  # the draft model's or EAGLE head's (an EagleRunner), if any
    tp_size: int = 1

    @classmethod
    def load(cls, args: ServerArgs, target: "ModelRunner") -> "DraftFactory":
        algo = args.speculative_algorithm
        runner = None
        if algo is SpeculativeAlgorithm.STANDALONE:
            runner = DraftModelRunner(args, target, draft_steps(args))
        elif algo is not None and algo.is_eagle:
            runner = EagleRunner(args, target, draft_scratch(args))
        return cls(args, runner, target.parallel.tp_size)

    def build(self, ctx: DraftContext) -> DraftPath:
        args = self.args
        jump = JumpForwardSource(args.jump_forward, ctx.tokenizer, ctx.eos_token_ids, ctx.grammar_backend, ctx.stats)
        speculative = self.speculative_sources(ctx)
        window = args.speculative_measure_window
        # Its decisions follow this rank's clock: tensor-parallel ranks, which must decide alike, go without it.
        controller = DraftController(window, stats=ctx.stats) if window and self.tp_size == 1 and any(
            s.traits.batch_adaptive for s in speculative) else None
        return DraftPath([jump, *speculative], ctx.tokenizer, ctx.page_size, ctx.stats,
                         args.speculative_max_batch_rows, ctx.batch_size, controller)

    def speculative_sources(self, ctx: DraftContext) -> list[DraftSource]:
        """--speculative-algorithm's draft sources, in the order they are asked (the first with a draft wins).
        NGRAM_RADIX: the cache's continuation of the whole sequence (same context), then prompt lookup (the
        request's own text), then the cache's latest k tokens (another context)."""
        args = self.args
        algo = args.speculative_algorithm
        # --speculative-num-draft-tokens counts the verified root token (SGLang's): a step drafts one token fewer.
        n, stats = args.max_draft_tokens, ctx.stats

        def ngram() -> NGramSource:
            return NGramSource(n, args.speculative_ngram_min_match_window_size,
                               args.speculative_ngram_max_match_window_size, stats)

        def radix(path: bool = True, kgram: bool = True) -> RadixSource:
            return RadixSource(ctx.tree_cache, n, args.speculative_radix_match_window_size, stats, path, kgram)

        if algo is SpeculativeAlgorithm.NGRAM:
            return [ngram()]
        if algo is SpeculativeAlgorithm.RADIX:
            return [radix()]
        if algo is SpeculativeAlgorithm.NGRAM_RADIX:
            return [radix(kgram=False), ngram(), radix(path=False)]
        if isinstance(self.draft_runner, EagleRunner):
            return [EagleSource(self.draft_runner, stats, draft_steps(args), args.speculative_eagle_topk,
                                args.max_draft_tokens)]
        if self.draft_runner is not None:
            return [DraftModelSource(self.draft_runner, stats, ctx.tree_cache)]
        return []
