"""Front logic shared by the offline Engine and the server's TokenizerManager: validation and
tokenization into TokenizedGenerateReqInput, detokenization state, and SGLang-shaped results
({text, output_ids, meta_info})."""
from __future__ import annotations

import dataclasses
import math
import time
import uuid
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixlm.runtime.args.choices import MAX_PRIORITY
from radixlm.runtime.grammar.spec import GrammarSpec, validate as validate_grammar
from radixlm.runtime.lora.registry import LoraRegistry
from radixlm.runtime.messages import BatchReqOutput, BootstrapInfo, ReqOutput, TokenizedGenerateReqInput
from radixlm.runtime.parsers.reasoning.budget import BudgetTags, resolve as resolve_budget
from radixlm.runtime.parsers.reasoning.families import family
from radixlm.runtime.sampling.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixlm.runtime.multimodal.inputs import MultimodalInputs
    from radixlm.runtime.multimodal.processor import MultimodalProcessor


MAX_N = 128  # samples per prompt: OpenAI's cap
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024  # per stop string: every new token re-decodes a window four times the longest one
MAX_GRAMMAR_CHARS = 1 << 20  # a regex, EBNF or JSON schema (as text)
TOKENIZE_CHUNK = 256  # text prompts of a batch encoded in one tokenizer call
IS_EMBEDDING = ("this server serves an embedding model (--is-embedding): use /encode, /v1/embeddings or /v1/rerank "
                "(Engine.encode), not generation")


@dataclass(frozen=True)
class FrontLimits:
    """Set once from the loaded model: by the Engine directly, by the server from the scheduler's ready message."""

    vocab_size: int
    context_len: int
    max_total_num_tokens: int
    disable_radix_cache: bool = False
    max_logprobs: int = 20  # ServerArgs.max_logprobs; -1: the vocabulary size
    embedding_dim: int = 0  # --is-embedding: the pooled output's size; 0: a generation server

    @property
    def max_top_logprobs(self) -> int:
        return self.vocab_size if self.max_logprobs < 0 else min(self.max_logprobs, self.vocab_size)


@dataclass
class BuiltRequests:
    """Set by RequestBuilder.build. A caller submits prefix_requests() and waits until they finish, then submits
    msgs: the n > 1 samples of a prompt then find it cached instead of all prefilling it."""

    msgs: list[TokenizedGenerateReqInput]
    as_list: bool  # the caller gets a list (batch input or n > 1)
    warm: list[int]  # indices of the first of each group of n > 1 samples (prefilled once beforehand)

    def prefix_requests(self) -> list[TokenizedGenerateReqInput]:
        """Prefill-only (max_new_tokens=0) copies of each n > 1 group's prompt; none without a radix cache."""
        return [prefix_request(self.msgs[i]) for i in self.warm]


class RequestBuilder:
    """Turns user input into validated requests; raises ValueError naming the problem."""

    def __init__(self, tokenizer, limits: FrontLimits, mm: "MultimodalProcessor | None" = None,
                 lora: LoraRegistry | None = None, reasoning_parser: str | None = None):
        self.tokenizer = tokenizer
        self.limits = limits
        self.reasoning = None if reasoning_parser is None else family(reasoning_parser)  # --reasoning-parser's
        self._tags: BudgetTags | None = None  # its tags, tokenized at first use
        self.mm = mm  # a vision-language model's processor; None: media inputs are refused
        self.lora = lora or LoraRegistry(enabled=False)  # the adapters requests may name (lora_path)

    def media_token_count(self, num_images: int, num_videos: int = 0) -> int:
        """Tokens a prompt gains when its image and video placeholders (one token each) are expanded (at most, for
        models whose token count depends on the image's size)."""
        if self.mm is None:
            return 0
        return num_images * (self.mm.num_image_tokens - 1) + num_videos * (self.mm.max_video_tokens() - 1)

    def expand_media(self, ids: list[int], images, videos=None) -> tuple[list[int], "MultimodalInputs | None"]:
        """The prompt with its image and video placeholders expanded, and its media (None without any)."""
        images, videos = _items(images), _items(videos)
        if not images and not videos:
            return ids, None
        if self.mm is None:
            raise ValueError(f"this model does not take {'images' if images else 'videos'}")
        return self.mm.expand(ids, images, videos)

    def tokenize(self, prompt: str | None, input_ids: list[int] | None) -> list[int]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("exactly one of prompt (text) or input_ids must be given")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise ValueError("prompt must be a string")
            ids = self.tokenizer.encode(prompt)
        else:
            if not isinstance(input_ids, list):
                raise ValueError("input_ids must be a list of integers")
            ids = list(input_ids)
            vocab = self.limits.vocab_size
            # Whole-list builtins, not a generator per token: building 1,024 prompts of 2,176 ids took 0.19 s
            # instead of 0.29 (2-core CPU machine), all of it before the batch's first pass.
            if ids and not (set(map(type, ids)) <= {int} and 0 <= min(ids) and max(ids) < vocab):
                raise ValueError(f"input_ids must be integers in [0, {vocab})")
        if not ids:
            raise ValueError("the prompt is empty")
        return ids

    def make_request(self, ids, sp_dict, return_logprob, logprob_start_len, top_logprobs_num, rid, extra_key, stream,
                     mm_inputs: "MultimodalInputs | None" = None, lora_id: str | None = None, priority=None,
                     timeout_s=None, reasoning_open: bool | None = None):
        sp = sp_dict if isinstance(sp_dict, SamplingParams) else SamplingParams.from_dict(dict(sp_dict or {}))
        sp.normalize()
        sp.verify(self.limits.vocab_size)
        _check_sizes(sp)
        spec = GrammarSpec.from_sampling_params(sp)
        thinking = None
        if sp.thinking_budget is not None:
            self._tags = self._tags or BudgetTags.tokenize(self.reasoning, self.tokenizer)
            thinking = resolve_budget(self.reasoning, self._tags, sp.thinking_budget, spec is not None, ids,
                                      reasoning_open)
        if spec is not None:
            validate_grammar(spec)
        if len(ids) + sp.max_new_tokens > self.limits.context_len:
            raise ValueError(
                f"Requested token count exceeds the model's context length: {len(ids)} prompt + "
                f"{sp.max_new_tokens} new tokens > {self.limits.context_len}"
            )
        if len(ids) + 1 >= self.limits.max_total_num_tokens:
            raise ValueError(f"the prompt ({len(ids)} tokens) does not fit the KV pool ({self.limits.max_total_num_tokens} tokens)")
        try:
            start = -1 if logprob_start_len is None else int(logprob_start_len)
            top = int(top_logprobs_num or 0)
        except (TypeError, ValueError):
            raise ValueError("logprob_start_len and top_logprobs_num must be integers") from None
        if return_logprob and start >= len(ids):
            raise ValueError(f"logprob_start_len ({start}) must be smaller than the prompt length ({len(ids)})")
        if start < -1:
            raise ValueError(f"logprob_start_len must be -1 (output tokens only) or >= 0, got {start}")
        if return_logprob and start >= 0 and mm_inputs is not None and any(
                it.end > start for it in mm_inputs.items):
            raise ValueError("prompt logprobs cannot cover image tokens: logprob_start_len must be after the last "
                             "image's last token")
        if top < 0:
            raise ValueError("top_logprobs_num must be >= 0")
        if return_logprob and top > self.limits.max_top_logprobs:
            raise ValueError(f"top_logprobs_num ({top}) must be at most {self.limits.max_top_logprobs} "
                             f"(the server's --max-logprobs)")
        if rid is not None and not isinstance(rid, str):
            raise ValueError("rid must be a string")
        return TokenizedGenerateReqInput(
            rid=rid or uuid.uuid4().hex, input_ids=ids, sampling_params=sp, return_logprob=bool(return_logprob),
            logprob_start_len=start if return_logprob else -1, top_logprobs_num=top if return_logprob else 0,
            extra_key=extra_key, stream=stream, mm_inputs=mm_inputs, lora_id=lora_id,
            priority=check_priority(priority), timeout_s=check_timeout(timeout_s), thinking=thinking,
        )

    def build(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False, logprob_start_len=None,
              top_logprobs_num=None, rid=None, extra_key=None, stream=False, image_data=None,
              video_data=None, lora_path=None, priority=None, timeout_s=None,
              bootstrap: BootstrapInfo | None = None, reasoning_open: bool | None = None) -> BuiltRequests:
        steps = self.build_steps(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                 top_logprobs_num, rid, extra_key, stream, image_data, video_data, lora_path, priority,
                                 timeout_s, bootstrap, reasoning_open)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def build_steps(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                    logprob_start_len=None, top_logprobs_num=None, rid=None, extra_key=None,
                    stream=False, image_data=None, video_data=None, lora_path=None, priority=None,
                    timeout_s=None, bootstrap: BootstrapInfo | None = None,
                    reasoning_open: bool | None = None) -> Generator[None, None, BuiltRequests]:
        """build, yielding after each request it makes, so that an event loop can serve others during a large
        batch (TokenizerManager.build_async); returns the BuiltRequests. bootstrap: a disaggregated pair's room (the
        router's); each request made takes room + its index, on both servers alike. reasoning_open: whether the chat
        layer's reasoning parser reads the output as starting in reasoning (a thinking budget's; None: no template)."""
        if self.limits.embedding_dim:
            raise ValueError(IS_EMBEDDING)
        batched = isinstance(prompt, list) or (isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list))
        prompts = prompt if isinstance(prompt, list) else [prompt] * (len(input_ids) if batched else 1)
        id_lists = input_ids if batched and input_ids is not None else [input_ids] * len(prompts)
        if batched and not prompts:
            raise ValueError("empty batch")
        if batched and prompt is not None and input_ids is not None:
            raise ValueError("exactly one of prompt (text) or input_ids must be given")
        sps, rids, lps, starts, tops, prios, timeouts = (
            _per_prompt(name, value, len(prompts)) for name, value in (
                ("sampling_params", sampling_params), ("rid", rid), ("return_logprob", return_logprob),
                ("logprob_start_len", logprob_start_len), ("top_logprobs_num", top_logprobs_num),
                ("priority", priority), ("timeout_s", timeout_s)))
        # lora_path: an adapter's name (SGLang's field), or for a batch a list with an entry per prompt.
        loras = [self.lora.resolve(x) for x in _per_prompt("lora_path", lora_path, len(prompts))]
        # image_data, video_data: one prompt's items (an item or a list), or for a batch a list with an entry per prompt.
        images = _per_prompt("image_data", image_data, len(prompts)) if batched else [image_data]
        videos = _per_prompt("video_data", video_data, len(prompts)) if batched else [video_data]
        encode_batches = len(prompts) > 1 and all(isinstance(p, str) for p in prompts) and input_ids is None
        msgs, warm = [], []
        for i, (p, ids, sp) in enumerate(zip(prompts, id_lists, sps)):
            if encode_batches and i % TOKENIZE_CHUNK == 0:
                # One call per chunk of the batch: the fast tokenizer encodes it in parallel.
                encoded = self.tokenizer(prompts[i : i + TOKENIZE_CHUNK])["input_ids"]
            if encode_batches:
                p, ids = None, encoded[i % TOKENIZE_CHUNK]
            tokens, mm_inputs = self.expand_media(self.tokenize(p, ids), images[i], videos[i])
            n = _sample_count(sp)
            base = rids[i] if rids[i] else uuid.uuid4().hex
            for j in range(n):
                m = self.make_request(tokens, sp, lps[i], starts[i], tops[i], base if n == 1 else f"{base}-{j}",
                                      extra_key, stream, mm_inputs, loras[i], prios[i], timeouts[i], reasoning_open)
                if n > 1 and m.sampling_params.sampling_seed is not None:
                    # The n samples of a seeded request differ from each other, and repeat as a set.
                    m.sampling_params = dataclasses.replace(
                        m.sampling_params, sampling_seed=(m.sampling_params.sampling_seed * 1_000_003 + j) % (1 << 63))
                if bootstrap is not None:
                    m.bootstrap = dataclasses.replace(bootstrap, room=(bootstrap.room + len(msgs)) % (1 << 63))
                msgs.append(m)
                yield
            if n > 1:
                warm.append(len(msgs) - n)
            if stream and len(msgs) > 1:
                raise ValueError("streaming supports one prompt with n=1")
        # A disaggregated pair prefills each sample on the prefill server (its cache shares the prompt): no warm-up.
        keep_warm = not self.limits.disable_radix_cache and bootstrap is None
        return BuiltRequests(msgs, batched or len(msgs) > 1, warm if keep_warm else [])


def _items(media) -> list:
    """A prompt's media field: None, one item, or a list of items."""
    return [] if media is None else media if isinstance(media, list) else [media]


def _sample_count(sp) -> int:
    if sp is not None and not isinstance(sp, (dict, SamplingParams)):
        raise ValueError("sampling_params must be an object (dict) or a list of them")
    n = (sp or {}).get("n", 1) if isinstance(sp, dict) else sp.n if sp else 1
    if n is None:
        n = 1
    if not isinstance(n, int) or isinstance(n, bool):
        raise ValueError(f"n must be an integer, got {n!r}")
    if not 1 <= n <= MAX_N:
        raise ValueError(f"n must be in [1, {MAX_N}], got {n}")
    return n


def _check_sizes(sp: SamplingParams) -> None:
    """Bounds on the sizes of a request's strings: checked before any of them reaches a compiler or the scheduler."""
    if len(sp.stop) > MAX_STOP_STRINGS:
        raise ValueError(f"stop: at most {MAX_STOP_STRINGS} stop strings, got {len(sp.stop)}")
    longest = max((len(s) for s in sp.stop), default=0)
    if longest > MAX_STOP_CHARS:
        raise ValueError(f"stop: a stop string may have at most {MAX_STOP_CHARS} characters, got {longest}")
    for name in ("regex", "ebnf", "json_schema"):
        value = getattr(sp, name)
        if isinstance(value, str) and len(value) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"{name}: at most {MAX_GRAMMAR_CHARS} characters, got {len(value)}")


def check_priority(priority) -> int | None:
    """A request's priority: None (the server's default) or an integer within +-MAX_PRIORITY."""
    if priority is None:
        return None
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    if abs(priority) > MAX_PRIORITY:
        raise ValueError(f"priority must be in [-{MAX_PRIORITY}, {MAX_PRIORITY}], got {priority}")
    return priority


def check_timeout(timeout_s) -> float | None:
    """A request's own deadline: None, or a finite number of seconds > 0."""
    if timeout_s is None:
        return None
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool):
        raise ValueError(f"timeout_s must be a number of seconds, got {timeout_s!r}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s}")
    return float(timeout_s)


def bootstrap_info(host, port, room) -> BootstrapInfo | None:
    """SGLang's bootstrap_host / bootstrap_port / bootstrap_room request fields: all three or none."""
    given = [x is not None for x in (host, port, room)]
    if not any(given):
        return None
    if not all(given):
        raise ValueError("bootstrap_host, bootstrap_port and bootstrap_room go together (the PD router sets them)")
    if not isinstance(host, str) or not host:
        raise ValueError("bootstrap_host must be a host name or address")
    for name, value, top in (("bootstrap_port", port, 65535), ("bootstrap_room", room, (1 << 63) - 1)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
            raise ValueError(f"{name} must be an integer in [0, {top}], got {value!r}")
    return BootstrapInfo(host, port, room)


def _per_prompt(name: str, value, count: int) -> list:
    """A batch's per-request field: one value for all prompts, or a list with one entry per prompt."""
    if not isinstance(value, list):
        return [value] * count
    if len(value) != count:
        raise ValueError(f"{name}: a list must have one entry per prompt ({count}), got {len(value)}")
    return value


def prefix_request(m: TokenizedGenerateReqInput) -> TokenizedGenerateReqInput:
    """n > 1: a prefill-only (max_new_tokens=0) copy of the shared prompt, so the n samples hit the cache."""
    sp = SamplingParams(max_new_tokens=0)
    sp.normalize()
    return TokenizedGenerateReqInput(rid=f"{m.rid}-prefix", input_ids=m.input_ids, sampling_params=sp, extra_key=m.extra_key,
                                     mm_inputs=m.mm_inputs, lora_id=m.lora_id, priority=m.priority,
                                     timeout_s=m.timeout_s)


class ReqState:
    """Meta side of one request: accumulates its rows of the steps' BatchReqOutputs into {text, output_ids, meta_info} snapshots."""

    def __init__(self, rid: str, tokenizer, return_logprob: bool, return_text_in_logprobs: bool):
        self.rid, self.tokenizer = rid, tokenizer
        self.return_logprob, self.return_text = return_logprob, return_text_in_logprobs
        self.output_ids: list[int] = []
        self.meta: dict[str, Any] = {"id": rid, "finish_reason": None}
        self.logprobs: dict[str, list] = {k: [] for k in (
            "input_token_logprobs", "input_top_logprobs", "output_token_logprobs", "output_top_logprobs",
            "output_token_ids_logprobs")}
        self.created = time.perf_counter()
        self.finished = False
        self.text = ""
        self.embedding: list[float] | None = None

    def _triples(self, pairs) -> list:
        return [(lp, tok, self.tokenizer.decode([tok]) if self.return_text else None) for lp, tok in pairs]

    def update(self, out: ReqOutput, text: str) -> dict:
        self.add(out, text)
        return self.snapshot()

    def update_row(self, batch: BatchReqOutput, i: int, text: str) -> dict:
        self.add_row(batch, i, text)
        return self.snapshot()

    def add(self, out: ReqOutput, text: str) -> None:
        self.add_row(BatchReqOutput.of([out]), 0, text)

    def add_row(self, batch: BatchReqOutput, i: int, text: str) -> None:
        """Takes row i of a step's outputs (text: the request's cumulative text); snapshot() then shows everything
        taken so far, so several outputs taken between two snapshots cost one snapshot (the server's streams
        coalesce so)."""
        self.text = text
        self.embedding = batch.embeddings[i] if batch.embeddings is not None else None
        self.output_ids.extend(batch.new_output_ids[i])
        finished_reason = batch.finished_reasons[i]
        meta = self.meta
        meta["prompt_tokens"] = batch.prompt_tokens[i]
        meta["completion_tokens"] = batch.completion_tokens[i]
        meta["cached_tokens"] = batch.cached_tokens[i]
        meta["num_retractions"] = batch.num_retractions[i]
        meta["finish_reason"] = finished_reason
        if batch.spec is not None and batch.spec[i][0]:
            meta.update(zip(("spec_verify_ct", "spec_draft_tokens", "spec_accepted_tokens"), batch.spec[i]))
        if self.return_logprob and batch.logprobs is not None:
            in_tok, in_top, out_tok, out_top, out_ids = batch.logprobs[i]
            lp = self.logprobs
            lp["input_token_logprobs"] += self._triples(in_tok)
            lp["input_top_logprobs"] += [None if t is None else self._triples(t) for t in in_top]
            lp["output_token_logprobs"] += self._triples(out_tok)
            lp["output_top_logprobs"] += [self._triples(t) for t in out_top]
            lp["output_token_ids_logprobs"] += [self._triples(t) for t in out_ids]
        self.finished = finished_reason is not None
        if self.finished:
            meta["e2e_latency"] = time.perf_counter() - self.created

    def snapshot(self) -> dict:
        """{text, output_ids, meta_info} (or {embedding, meta_info}) of everything added so far; a new object that
        later adds leave as it is."""
        meta = dict(self.meta)
        if self.return_logprob:
            meta.update({k: list(v) for k, v in self.logprobs.items() if v or k != "output_token_ids_logprobs"})
        if self.embedding is not None:
            return {"embedding": self.embedding, "meta_info": meta}
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}

    def failed(self, message: str) -> dict:
        """The snapshot a request ends with when the runtime fails under it."""
        self.finished = True
        meta = dict(self.meta, finish_reason={"type": "abort", "message": message, "status_code": 503, "err_type": "ServiceUnavailable"})
        return {"text": "", "output_ids": list(self.output_ids), "meta_info": meta}
