"""Synthetic workloads with exact prompt lengths in tokens: random, sharegpt-like, generated-shared-prefix.

Every generator is deterministic in its seed and needs no model hub: prompts are token ids drawn from the
server's tokenizer vocabulary (decoded to text for text-only backends), or, without a tokenizer, words from a
fixed list counted as one token each.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

WORDS = (
    "the of and to in is was for on that with as by at from his her they this which are be had not have one all "
    "were when we there can an your said each she do how their if will up other about out many then them these so "
    "some would make like him into time has look two more write go see number way could people my than first water "
    "been call who oil its now find long down day did get come made may part over new sound take only little work "
    "know place year live me back give most very after thing our just name good sentence man think say great where "
    "help through much before line right too mean old any same tell boy follow came want show also around form three"
).split()


@dataclass
class BenchRequest:
    prompt: str
    input_ids: list[int] | None
    prompt_len: int
    output_len: int


class Tok(Protocol):
    def decode(self, ids: list[int]) -> str: ...


class PromptSource:
    """Draws prompts of exact token lengths: random non-special token ids of `tokenizer`, or words."""

    def __init__(self, tokenizer: Tok | None, rng: random.Random):
        self.tokenizer = tokenizer
        self.rng = rng
        if tokenizer is not None:
            special = set(getattr(tokenizer, "all_special_ids", []) or [])
            n = getattr(tokenizer, "vocab_size", None) or len(tokenizer)
            # Special ids would inject control tokens (EOS, chat markers) into the prompt.
            self.pool = [i for i in range(n) if i not in special]

    def ids(self, n: int) -> list[int]:
        if self.tokenizer is None:
            return [self.rng.randrange(len(WORDS)) for _ in range(n)]
        return [self.rng.choice(self.pool) for _ in range(n)]

    def text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(WORDS[i] for i in ids)
        return self.tokenizer.decode(ids)

    def request(self, ids: list[int], output_len: int) -> BenchRequest:
        return BenchRequest(self.text(ids), ids if self.tokenizer is not None else None, len(ids), output_len)


def random_dataset(src: PromptSource, num_prompts: int, input_len: int, output_len: int,
                   range_ratio: float) -> list[BenchRequest]:
    """Lengths uniform in [len * ratio, len] (ratio 1.0 = fixed lengths), as SGLang's `random` dataset."""
    rng = src.rng
    out = []
    for _ in range(num_prompts):
        n_in = rng.randint(max(int(input_len * range_ratio), 1), input_len)
        n_out = rng.randint(max(int(output_len * range_ratio), 1), output_len)
        out.append(src.request(src.ids(n_in), n_out))
    return out


def sharegpt_like_dataset(src: PromptSource, num_prompts: int, seed: int,
                          max_input_len: int = 2048, max_output_len: int = 1024) -> list[BenchRequest]:
    """Lognormal lengths (the peer-anchor ShareGPT-like workload): in ~ LN(4.9, 0.9) clipped to [4, 2048],
    out ~ LN(4.8, 0.8) clipped to [4, 1024]; means about 191 / 163 tokens."""
    lengths_rng = random.Random(seed)
    out = []
    for _ in range(num_prompts):
        n_in = min(max(int(lengths_rng.lognormvariate(4.9, 0.9)), 4), max_input_len)
        n_out = min(max(int(lengths_rng.lognormvariate(4.8, 0.8)), 4), max_output_len)
        out.append(src.request(src.ids(n_in), n_out))
    return out


GSP_ORDERS = ("shuffled", "grouped", "rounds")


def generated_shared_prefix_dataset(src: PromptSource, num_groups: int, prompts_per_group: int,
                                    system_prompt_len: int, question_len: int, output_len: int,
                                    seed: int, order: str = "shuffled") -> list[BenchRequest]:
    """`num_groups` system prompts, each shared by `prompts_per_group` distinct questions. Order: shuffled (all
    prompts in random order), grouped (a group's prompts together), or rounds (every group sends one prompt per
    round, groups in a new random order each round: many sessions, each with its own long context, interleaved)."""
    groups = []
    for _ in range(num_groups):
        prefix = src.ids(system_prompt_len)
        groups.append([src.request(prefix + src.ids(question_len), output_len) for _ in range(prompts_per_group)])
    rng = random.Random(seed)
    if order == "grouped":
        return [r for g in groups for r in g]
    if order == "rounds":
        out = []
        for j in range(prompts_per_group):
            ids = list(range(num_groups))
            rng.shuffle(ids)
            out += [groups[i][j] for i in ids]
        return out
    if order != "shuffled":
        raise ValueError(f"unknown order {order!r}; choose from {GSP_ORDERS}")
    out = [r for g in groups for r in g]
    rng.shuffle(out)
    return out


def build_dataset(name: str, tokenizer: Tok | None, num_prompts: int, seed: int, **kw) -> list[BenchRequest]:
    src = PromptSource(tokenizer, random.Random(seed))
    if name == "random":
        return random_dataset(src, num_prompts, kw["random_input_len"], kw["random_output_len"],
                              kw["random_range_ratio"])
    if name == "sharegpt-like":
        return sharegpt_like_dataset(src, num_prompts, seed)
    if name == "generated-shared-prefix":
        return generated_shared_prefix_dataset(src, kw["gsp_num_groups"], kw["gsp_prompts_per_group"],
                                               kw["gsp_system_prompt_len"], kw["gsp_question_len"],
                                               kw["gsp_output_len"], seed, kw.get("gsp_order", "shuffled"))
    raise ValueError(f"unknown dataset {name!r}")
