"""Engine: the offline Python API. It validates and tokenizes requests, runs the scheduler in a
background thread and turns token outputs into SGLang-shaped results ({text, output_ids, meta_info})."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.args import ServerArgs
from radixlm.runtime.detokenizer import IncrementalDecoder, hold_back_stop_prefix, trim_stop
from radixlm.runtime.messages import AbortReq, ReqOutput, TokenizedGenerateReqInput
from radixlm.runtime.sampling.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class FlushCacheReq:
    success: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class _ReqState:
    """Front-side view of one request; fed by the scheduler thread, read by the caller."""

    def __init__(self, rid: str, prompt_ids: list[int], sp: SamplingParams, tokenizer, return_text: bool, listener):
        self.rid, self.prompt_ids, self.sp = rid, prompt_ids, sp
        self.tokenizer, self.return_text = tokenizer, return_text
        self.listener = listener  # called (in the scheduler thread) with each snapshot dict
        self.output_ids: list[int] = []
        self.decoder = IncrementalDecoder(tokenizer, prompt_ids, sp.skip_special_tokens)
        self.meta: dict[str, Any] = {"id": rid, "finish_reason": None}
        self.logprobs: dict[str, list] = {k: [] for k in ("input_token_logprobs", "input_top_logprobs", "output_token_logprobs", "output_top_logprobs")}
        self.created = time.perf_counter()
        self.finished = False

    def _tok_text(self, tok: int) -> str | None:
        return self.tokenizer.decode([tok]) if self.return_text else None

    def _triples(self, pairs) -> list:
        return [(lp, tok, self._tok_text(tok)) for lp, tok in pairs]

    def update(self, out: ReqOutput, return_logprob: bool) -> dict:
        self.output_ids.extend(out.new_output_ids)
        self.decoder.append(out.new_output_ids)
        self.meta.update(prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
                         cached_tokens=out.cached_tokens, num_retractions=out.num_retractions,
                         finish_reason=out.finished_reason)
        if return_logprob:
            lp = self.logprobs
            lp["input_token_logprobs"] += self._triples(out.input_token_logprobs)
            lp["input_top_logprobs"] += [None if t is None else self._triples(t) for t in out.input_top_logprobs]
            lp["output_token_logprobs"] += self._triples(out.output_token_logprobs)
            lp["output_top_logprobs"] += [self._triples(t) for t in out.output_top_logprobs]
        self.finished = out.finished_reason is not None
        if self.finished:
            ids = self.output_ids
            reason = out.finished_reason
            if reason and reason.get("type") == "stop" and isinstance(reason.get("matched"), int) and not self.sp.no_stop_trim:
                ids = ids[:-1]
            text = trim_stop(self.tokenizer.decode(ids, skip_special_tokens=self.sp.skip_special_tokens), reason, self.sp.no_stop_trim)
            self.meta["e2e_latency"] = time.perf_counter() - self.created
        else:
            text = hold_back_stop_prefix(self.decoder.text, self.sp.stop)
        meta = dict(self.meta)
        if return_logprob:
            meta.update({k: list(v) for k, v in self.logprobs.items()})
        return {"text": text, "output_ids": list(self.output_ids), "meta_info": meta}


def _is_final(snap) -> bool:
    return isinstance(snap, BaseException) or snap["meta_info"]["finish_reason"] is not None


def _unwrap(snap) -> dict:
    if isinstance(snap, BaseException):
        raise RuntimeError(f"generation failed: {snap!r}") from snap
    return snap


class Engine:
    def __init__(self, model_path: str = "default", **kwargs):
        self.server_args = ServerArgs.from_kwargs(model_path=model_path, **kwargs)
        self._inbox: queue.Queue = queue.Queue()
        self._states: dict[str, tuple[_ReqState, bool]] = {}
        self._error: BaseException | None = None
        self._stopped = threading.Event()
        ready = threading.Event()
        # NOTE: every torch op of the engine (loading included) runs on this one thread. Once a thread has
        # run an OpenMP region, libgomp throttles the thread teams of all other threads, which halves the
        # scheduler's speed on a 2-core machine if the caller's thread had touched torch first.
        self._thread = threading.Thread(target=self._run, args=(ready,), name="radixlm-scheduler", daemon=True)
        self._thread.start()
        ready.wait()
        if self._error is not None:
            raise self._error

    def _setup(self) -> None:
        from radixlm.runtime.executor.model_runner import ModelRunner
        from radixlm.runtime.model_loader.config import ModelConfig
        from radixlm.runtime.model_loader.tokenizer import get_tokenizer
        from radixlm.runtime.scheduler.scheduler import Scheduler

        args = self.server_args
        device = args.resolved_device()
        t0 = time.perf_counter()
        self.model_config = ModelConfig.from_path(
            args.model_path, dtype=args.dtype, device=device, context_length=args.context_length, load_format=args.load_format
        )
        self.tokenizer = get_tokenizer(args.tokenizer_path or self.model_config.model_path)
        self.runner = ModelRunner(args, self.model_config, device)
        self.scheduler = Scheduler(args, self.runner, self.tokenizer, self.model_config.eos_token_ids)
        self.context_len = self.model_config.context_len
        self.vocab_size = self.model_config.vocab_size
        logger.info("engine ready in %.1fs", time.perf_counter() - t0)

    def _run(self, ready: threading.Event) -> None:
        try:
            self._setup()
        except BaseException as e:  # noqa: BLE001 - re-raised in the constructor
            self._error = e
            return
        finally:
            ready.set()
        self._loop()

    # ------------------------------------------------------------------ scheduler thread
    def _loop(self) -> None:
        sched = self.scheduler
        try:
            while not self._stopped.is_set():
                block = sched.is_idle()
                while True:
                    try:
                        msg = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
                    except queue.Empty:
                        break
                    block = False
                    if isinstance(msg, AbortReq):
                        sched.abort_request(msg.rid)
                    elif isinstance(msg, FlushCacheReq):
                        msg.success = sched.flush_cache()
                        msg.done.set()
                    else:
                        sched.add_request(msg)
                if sched.is_idle():
                    continue
                for out in sched.step():
                    entry = self._states.get(out.rid)
                    if entry is None:
                        continue
                    state, return_logprob = entry
                    snapshot = state.update(out, return_logprob)
                    if state.finished:
                        self._states.pop(out.rid, None)
                    state.listener(snapshot)
        except BaseException as e:  # noqa: BLE001 - surfaced to every waiting caller
            logger.exception("scheduler failed")
            self._error = e
            for state, _ in list(self._states.values()):
                state.listener(e)
            self._states.clear()

    # ------------------------------------------------------------------ validation
    def _tokenize(self, prompt: str | None, input_ids: list[int] | None) -> list[int]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("exactly one of prompt (text) or input_ids must be given")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise ValueError("prompt must be a string")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(input_ids)
            if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in ids):
                raise ValueError(f"input_ids must be integers in [0, {self.vocab_size})")
        if not ids:
            raise ValueError("the prompt is empty")
        return ids

    def _make_request(self, ids, sp_dict, return_logprob, logprob_start_len, top_logprobs_num, rid, extra_key, stream):
        sp = sp_dict if isinstance(sp_dict, SamplingParams) else SamplingParams.from_dict(dict(sp_dict or {}))
        sp.normalize()
        sp.verify(self.vocab_size)
        if len(ids) + sp.max_new_tokens > self.context_len:
            raise ValueError(
                f"Requested token count exceeds the model's context length: {len(ids)} prompt + "
                f"{sp.max_new_tokens} new tokens > {self.context_len}"
            )
        if len(ids) + 1 >= self.runner.max_total_num_tokens:
            raise ValueError(f"the prompt ({len(ids)} tokens) does not fit the KV pool ({self.runner.max_total_num_tokens} tokens)")
        start = -1 if logprob_start_len is None else int(logprob_start_len)
        if return_logprob and start >= len(ids):
            raise ValueError(f"logprob_start_len ({start}) must be smaller than the prompt length ({len(ids)})")
        top = int(top_logprobs_num or 0)
        if top < 0:
            raise ValueError("top_logprobs_num must be >= 0")
        return TokenizedGenerateReqInput(
            rid=rid or uuid.uuid4().hex, input_ids=ids, sampling_params=sp, return_logprob=bool(return_logprob),
            logprob_start_len=start if return_logprob else -1, top_logprobs_num=top if return_logprob else 0,
            extra_key=extra_key, stream=stream,
        )

    def _submit(self, msg: TokenizedGenerateReqInput, listener, return_text: bool) -> None:
        if self._error is not None:
            raise RuntimeError(f"the engine's scheduler has failed: {self._error!r}")
        if self._stopped.is_set():
            raise RuntimeError("the engine is shut down")
        state = _ReqState(msg.rid, msg.input_ids, msg.sampling_params, self.tokenizer, return_text, listener)
        self._states[msg.rid] = (state, msg.return_logprob)
        self._inbox.put(msg)

    # ------------------------------------------------------------------ public API
    def _build(self, prompt, sampling_params, input_ids, return_logprob, logprob_start_len, top_logprobs_num,
               rid, extra_key, stream) -> tuple[list[TokenizedGenerateReqInput], bool, list[int]]:
        """Returns the requests to run, whether the caller gets a list, and prefill-only warm-ups for n > 1."""
        batched = isinstance(prompt, list) or (input_ids is not None and input_ids and isinstance(input_ids[0], list))
        prompts = prompt if isinstance(prompt, list) else [prompt] * (len(input_ids) if batched else 1)
        id_lists = input_ids if batched and input_ids is not None else [input_ids] * len(prompts)
        if batched and not prompts:
            raise ValueError("empty batch")
        sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(sps) != len(prompts):
            raise ValueError("sampling_params list must have one entry per prompt")
        rids = rid if isinstance(rid, list) else [rid] * len(prompts)
        msgs, warm = [], []
        for i, (p, ids, sp) in enumerate(zip(prompts, id_lists, sps)):
            tokens = self._tokenize(p, ids)
            n = int((sp or {}).get("n", 1)) if isinstance(sp, dict) else sp.n if sp else 1
            base = rids[i] if rids[i] else uuid.uuid4().hex
            for j in range(n):
                m = self._make_request(tokens, sp, return_logprob, logprob_start_len, top_logprobs_num,
                                       base if n == 1 else f"{base}-{j}", extra_key, stream)
                if n > 1 and m.sampling_params.sampling_seed is not None:
                    # The n samples of a seeded request differ from each other, and repeat as a set.
                    m.sampling_params = dataclasses.replace(
                        m.sampling_params, sampling_seed=(m.sampling_params.sampling_seed * 1_000_003 + j) % (1 << 63))
                msgs.append(m)
            if n > 1:
                warm.append(len(msgs) - n)
        if stream and len(msgs) > 1:
            raise ValueError("streaming supports one prompt with n=1")
        return msgs, batched or len(msgs) > 1, warm

    def _warm_prefix(self, msgs, warm) -> None:
        """n > 1: prefill the shared prompt once (max_new_tokens=0) so the n samples hit the cache."""
        if not warm or self.server_args.disable_radix_cache:
            return
        waits = []
        for i in warm:
            m = msgs[i]
            sp = SamplingParams(max_new_tokens=0)
            sp.normalize()
            pre = TokenizedGenerateReqInput(rid=f"{m.rid}-prefix", input_ids=m.input_ids, sampling_params=sp, extra_key=m.extra_key)
            done = threading.Event()
            self._submit(pre, lambda _s, d=done: d.set(), False)
            waits.append(done)
        for d in waits:
            d.wait()

    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False, logprob_start_len=None,
                 top_logprobs_num=None, return_text_in_logprobs=False, stream=False, rid=None, extra_key=None):
        msgs, as_list, warm = self._build(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                          top_logprobs_num, rid, extra_key, stream)
        if stream:
            return self._stream(msgs[0], return_text_in_logprobs)
        self._warm_prefix(msgs, warm)
        results: list[Any] = [None] * len(msgs)
        done = threading.Semaphore(0)

        def listener_for(i):
            def listener(snap):
                if _is_final(snap):
                    results[i] = snap
                    done.release()
            return listener

        for i, m in enumerate(msgs):
            self._submit(m, listener_for(i), return_text_in_logprobs)
        for _ in msgs:
            done.acquire()
        results = [_unwrap(r) for r in results]
        return results if as_list else results[0]

    def _stream(self, msg, return_text) -> Iterator[dict]:
        q: queue.Queue = queue.Queue()
        self._submit(msg, q.put, return_text)
        try:
            while True:
                snap = q.get()
                yield _unwrap(snap)
                if _is_final(snap):
                    return
        finally:
            if msg.rid in self._states:
                self.abort_request(msg.rid)

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                             logprob_start_len=None, top_logprobs_num=None, return_text_in_logprobs=False,
                             stream=False, rid=None, extra_key=None):
        msgs, as_list, warm = self._build(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                          top_logprobs_num, rid, extra_key, stream)
        if stream:
            return self._astream(msgs[0], return_text_in_logprobs)
        if warm:
            await asyncio.to_thread(self._warm_prefix, msgs, warm)
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in msgs]
        for fut, m in zip(futures, msgs):
            def listener(snap, fut=fut):
                if _is_final(snap):
                    loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(snap))
            self._submit(m, listener, return_text_in_logprobs)
        results = [_unwrap(r) for r in await asyncio.gather(*futures)]
        return results if as_list else results[0]

    async def _astream(self, msg, return_text) -> AsyncIterator[dict]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        self._submit(msg, lambda snap: loop.call_soon_threadsafe(q.put_nowait, snap), return_text)
        try:
            while True:
                snap = await q.get()
                yield _unwrap(snap)
                if _is_final(snap):
                    return
        finally:
            if msg.rid in self._states:
                self.abort_request(msg.rid)

    def abort_request(self, rid: str) -> None:
        self._inbox.put(AbortReq(rid))

    def flush_cache(self) -> bool:
        """Empties the radix cache; False (nothing done) while requests are queued or running."""
        msg = FlushCacheReq()
        self._inbox.put(msg)
        msg.done.wait()
        return msg.success

    def shutdown(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=30)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
