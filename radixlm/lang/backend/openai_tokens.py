"""What the OpenAI backend does with the model's own token ids (tiktoken), as SGLang's: the logit bias that makes a
gen an integer, and `select` by biased one-token steps where the endpoint gives no prompt logprobs."""
from __future__ import annotations

from typing import Any, Callable

from radixlm.lang.backend.base_backend import BackendError
from radixlm.lang.choices import ChoicesDecision


def tiktoken_encoding(model_name: str, purpose: str) -> Any:
    try:
        import tiktoken
    except ImportError as e:
        raise BackendError(f"{purpose} on an OpenAI completion model needs the tiktoken package (the model's "
                           f"token ids)") from e
    try:
        return tiktoken.encoding_for_model(model_name)
    except KeyError:
        return tiktoken.get_encoding("cl100k_base")


def int_logit_bias(enc: Any) -> dict[int, int]:
    """+100 on up to 299 tokens made of digits only or a space, and on the end of text (the API takes 300)."""
    ids = []
    for token, token_id in enc._mergeable_ranks.items():
        text = token.decode("utf-8", errors="replace")
        if text == " " or (text and all(c.isdigit() for c in text)):
            ids.append(token_id)
            if len(ids) == 299:
                break
    return {**{i: 100 for i in ids}, enc.eot_token: 100}


def select_by_logit_bias(enc: Any, context: str, choices: list[str],
                         next_token: Callable[[list[int], dict[int, int]], str]) -> ChoicesDecision:
    """SGLang's select for OpenAI completion models: step through the choices' tokens; at each step the model picks
    one next token among the live choices' tokens (`next_token(prompt_ids, logit_bias)` -> its text), a choice
    scores a point when it is picked and dies when it is not or ends; the most points wins (the first on a tie)."""
    ids = [enc.encode(c) for c in choices]
    alive = [len(t) > 0 for t in ids]
    scores = [0] * len(choices)
    prompt = enc.encode(context)
    for step in range(max(len(t) for t in ids)):
        bias = {t[step]: 100 for t, a in zip(ids, alive) if a}
        picked_text = next_token(prompt, bias)
        picked = enc.encode(picked_text)[:1]
        if not picked or picked[0] not in bias:
            raise BackendError(f"select: the model's token {picked_text!r} is none of the choices' tokens")
        for i, t in enumerate(ids):
            if alive[i]:
                if t[step] == picked[0]:
                    scores[i] += 1
                else:
                    alive[i] = False
                if step == len(t) - 1:
                    alive[i] = False
        if sum(alive) <= 1:
            break
        prompt = prompt + picked
    best = max(range(len(choices)), key=lambda i: (scores[i], -i))
    return ChoicesDecision(choices[best], {"scores": scores})
