"""The optimal cache hit rate of a set of requests (the paper's Theorem 3.1 bound).

Build the prefix tree T of every request's prompt tokens. Served in DFS order with a cache at least as large as
the longest request, every tree token is computed exactly once, so

    optimal hit rate = 1 - (tokens of T that must be computed) / (sum of prompt tokens over requests).

A token that some request generated (decoded) already has its KV computed: a multi-turn program's next prompt
contains the previous answer, and a runtime that caches decoded tokens hits them. Those tokens are free here
(`optimal_hit_rate`); `optimal_hit_rate_prompts_only` counts every tree token, as in the paper's plain statement.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence


@dataclass
class Request:
    """A request's prompt and what it decoded. Where the output is known only as text, `full` is the joint
    tokenization of prompt + output and `full[gen_from:]` is what was decoded (full may differ from the prompt
    near the boundary)."""
    prompt: Sequence[int]
    output: Sequence[int] = ()
    full: Optional[Sequence[int]] = None
    gen_from: int = 0

    def sequence(self) -> tuple[list[int], int]:
        if self.full is not None:
            return list(self.full), self.gen_from
        return list(self.prompt) + list(self.output), len(self.prompt)


class PrefixTree:
    """A token trie: node 0 is the root; node i's children map a token id to a node id."""

    def __init__(self) -> None:
        self.children: list[dict[int, int]] = [{}]
        self.generated: list[bool] = [False]

    def walk(self, ids: Iterable[int], generated_from: int | None = None) -> list[int]:
        """The node ids along `ids` (created as needed); positions >= generated_from are marked generated."""
        node, path = 0, []
        for pos, t in enumerate(ids):
            nxt = self.children[node].get(t)
            if nxt is None:
                nxt = len(self.children)
                self.children[node][t] = nxt
                self.children.append({})
                self.generated.append(False)
            if generated_from is not None and pos >= generated_from:
                self.generated[nxt] = True
            path.append(nxt)
            node = nxt
        return path

    def __len__(self) -> int:
        return len(self.children) - 1


def optimal_hit_rate(requests: Sequence[Request]) -> dict:
    tree = PrefixTree()
    for r in requests:
        seq, gen_from = r.sequence()
        tree.walk(seq, generated_from=gen_from)
    prompt_nodes: set[int] = set()
    for r in requests:
        prompt_nodes.update(tree.walk(r.prompt))
    total = sum(len(r.prompt) for r in requests)
    computed = sum(1 for n in prompt_nodes if not tree.generated[n])
    return {
        "total_prompt_tokens": total,
        "unique_prompt_tokens": len(prompt_nodes),
        "must_compute_tokens": computed,
        "optimal_hit_rate": 1 - computed / total if total else 0.0,
        "optimal_hit_rate_prompts_only": 1 - len(prompt_nodes) / total if total else 0.0,
    }


def simulate_dfs(requests: Sequence[Request]) -> float:
    """Hit rate of serving the requests one at a time, sorted so that shared prefixes are adjacent (a DFS of the
    prompt tree), with an unbounded cache that also keeps decoded tokens. Only valid where no request's prompt
    depends on another's output in a way the sort would reorder; used to check optimal_hit_rate in tests."""
    cache = PrefixTree()
    hits = total = 0
    for r in sorted(requests, key=lambda r: tuple(r.prompt)):
        node = 0
        matched = 0
        for t in r.prompt:
            nxt = cache.children[node].get(t)
            if nxt is None:
                break
            node, matched = nxt, matched + 1
        hits += matched
        total += len(r.prompt)
        cache.walk(r.sequence()[0])
    return hits / total if total else 0.0
