"""Speculative decoding: draft sources propose tokens, the next pass verifies them (path.py has the rules).

draft.py        the contract: Draft, DraftTraits, DraftSource (every hook the draft path calls)
path.py         DraftPath, the scheduler's one handle on drafting: proposing, the batch rule, verdicts
factory.py      the sources --speculative-algorithm asks for, built from ServerArgs and the target runner
sources/        grammar jump-forward, prompt lookup (NGRAM), the radix cache (RADIX), a draft model or EAGLE head
runners/        the draft model's and the EAGLE head's runners (composed over a ModelRunner) and EAGLE-3 features
controller.py   whether guessing sources draft at all, from what drafting was measured to buy
adaptive.py, backoff.py   per-request draft lengths and back-off
tree.py, eagle_tree.py    tree drafts: masks, walks, KV compaction; EAGLE's tree proposal
verification.py, draft_sampling.py   the verdict on a draft's rows; sampled drafts' distributions
budget.py       the memory a draft model takes, known before it is loaded"""
