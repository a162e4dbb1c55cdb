"""Runs workloads against a backend under one variant (full radixlm or an ablation) and measures them."""
from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import httpx

from radixlm.bench.programs.optimal import optimal_hit_rate
from radixlm.bench.programs.record import Recorder, RecordingTransport, token_requests
from radixlm.bench.programs.workloads import Workload
from radixlm.lang.global_config import global_config
from radixlm.lang.program import SglFunction, precache_constant_prefix
from radixlm.lang.state import ProgramState


@dataclass(frozen=True)
class Variant:
    """server_args go to `radixlm serve`; parallel: run_batch on threads with forks in parallel (else one program
    at a time, every primitive in the program's thread, forks sequential); hints: the frontend's prefix hints
    (fork prefills the shared prefix once; run_batch prefills the traced constant prefix)."""
    name: str
    server_args: tuple[str, ...] = ()
    parallel: bool = True
    hints: bool = True


ALL_OFF_SERVER = ("--disable-radix-cache", "--schedule-policy", "fcfs")
# Ordered so that variants sharing a server run one after another (one server start each).
VARIANTS = [
    Variant("full"),
    Variant("no_frontend_parallelism", parallel=False),
    Variant("no_frontend_hint", hints=False),
    Variant("no_radix_cache", ("--disable-radix-cache",)),
    Variant("fcfs", ("--schedule-policy", "fcfs")),
    Variant("random", ("--schedule-policy", "random")),
    Variant("all_off", ALL_OFF_SERVER, parallel=False, hints=False),
]


@dataclass
class BackendSpec:
    kind: str  # "runtime" or "openai"
    base_url: str
    model: str = "default"
    api_key: Optional[str] = None
    openai_chat: bool = False

    def make(self, recorder: Recorder) -> Any:
        transport = RecordingTransport(recorder)
        if self.kind == "runtime":
            from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint

            return RuntimeEndpoint(self.base_url, api_key=self.api_key, transport=transport)
        from radixlm.lang.backend.openai import OpenAI

        return OpenAI(self.model, is_chat_model=self.openai_chat, base_url=self.base_url,
                      api_key=self.api_key or "EMPTY", http_client=httpx.Client(transport=transport, timeout=600))

    def flush(self, backend: Any) -> bool:
        """Empties the server's prefix cache: the runtime's /flush_cache, or for an OpenAI endpoint the same path
        beside /v1 (radixlm and SGLang have it); False where the server has none."""
        if self.kind == "runtime":
            backend.flush_cache()
            return True
        root = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
        try:
            return httpx.post(root + "/flush_cache", timeout=60).status_code == 200
        except httpx.HTTPError:
            return False


def timed(program: SglFunction, sink: list[float]) -> SglFunction:
    """The program with each real run's wall time (body plus its queued primitives) appended to sink."""
    func = program.func

    @functools.wraps(func)
    def wrapper(s, *args, **kwargs):
        if not isinstance(s, ProgramState):  # tracing (the run_batch prefix hint)
            return func(s, *args, **kwargs)
        t0 = time.perf_counter()
        try:
            return func(s, *args, **kwargs)
        finally:
            s.stream_executor.wait_error()
            sink.append(time.perf_counter() - t0)

    return SglFunction(wrapper, program.num_api_spec_tokens, program.bind_arguments)


def unsupported(w: Workload, spec: BackendSpec, model_info: Optional[dict] = None) -> Optional[str]:
    """Why the backend cannot run the workload, or None. model_info: the runtime server's /get_model_info."""
    if "image" in w.needs and not (spec.kind == "runtime" and (model_info or {}).get("has_image_understanding")):
        return "the model takes no images (a vision-language model on the runtime backend runs it)"
    if spec.kind == "openai" and "regex" in w.needs:
        return "the OpenAI backend cannot constrain decoding with a regex"
    if spec.kind == "openai" and spec.openai_chat:
        return "programs are written for completion models (pass no --openai-chat)"
    return None


# Warm-up programs are drawn with this seed offset: other prompts than the measured ones.
WARM_UP_SEED_OFFSET = 1_000_003


@dataclass
class RunOptions:
    num_programs: int = 16
    seed: int = 0
    scale: float = 1.0
    num_threads: int = 64
    tokenizer: Any = None  # for the optimal hit rate; None skips it
    flush: bool = True
    extra: dict = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # per-workload num_programs overrides
    warm_up: int = 0  # before each measured run: up to this many programs of the workload, unmeasured
    repeat: int = 1  # measured runs per workload (each flushed unless flush=False; same seed: identical work)
    repeat_max_seconds: Optional[float] = None  # repeat only where the first run took less than this; None: always

    def programs_for(self, workload: str) -> int:
        return self.counts.get(workload, self.num_programs)


def run_workload(w: Workload, backend: Any, recorder: Recorder, variant: Variant, opt: RunOptions,
                 flush: Optional[Callable[[], bool]] = None) -> dict:
    items, labels = w.instances(opt.programs_for(w.name), opt.seed, opt.scale)
    flushed = bool(flush()) if (opt.flush and flush is not None) else False
    recorder.clear()
    latencies: list[float] = []
    prog = timed(w.program, latencies)
    saved = (global_config.enable_fork_prefix_hint, global_config.enable_precache_with_tracing)
    global_config.enable_fork_prefix_hint = global_config.enable_precache_with_tracing = variant.hints
    try:
        t0 = time.perf_counter()
        if variant.parallel:
            states = prog.run_batch(items, backend=backend, num_threads=opt.num_threads, temperature=0.0)
        else:
            if variant.hints and len(items) > 1:
                precache_constant_prefix(prog, backend)
            states = [prog.run(**it, backend=backend, use_thread=False, temperature=0.0) for it in items]
        duration = time.perf_counter() - t0
    finally:
        global_config.enable_fork_prefix_hint, global_config.enable_precache_with_tracing = saved
    errors = [st.error() for st in states]
    ok = sum(e is None for e in errors)
    rec = recorder.summary()
    res: dict[str, Any] = {
        "programs": len(items), "completed": ok, "failed": len(items) - ok, "duration_s": duration,
        "programs_per_s": ok / duration if duration > 0 else 0.0,
        "mean_latency_s": statistics.fmean(latencies) if latencies else None,
        "output_tokens": rec["output_tokens"], "output_tokens_per_s": rec["output_tokens"] / duration,
        "requests": rec["requests"], "prompt_tokens": rec["prompt_tokens"],
        "cache_hit_rate": rec["cache_hit_rate"], "http_errors": rec["http_errors"], "cache_flushed": flushed,
    }
    first_error = next((e for e in errors if e is not None), None)
    if first_error is not None:
        res["error"] = f"{type(first_error).__name__}: {first_error}"[:300]
    judged = [w.correct(st, lab) for st, lab, e in zip(states, labels, errors) if e is None]
    judged = [j for j in judged if j is not None]
    res["accuracy"] = sum(judged) / len(judged) if judged else None
    if opt.tokenizer is not None:
        reqs, mismatched = token_requests(recorder.sent, opt.tokenizer, model_info(backend).get("image_token"))
        res.update(optimal_hit_rate(reqs))
        res["tokenize_mismatches"] = mismatched
        if res["cache_hit_rate"] is not None and res["optimal_hit_rate"] > 0:
            res["achieved_over_optimal"] = res["cache_hit_rate"] / res["optimal_hit_rate"]
    return res


def run_variant(workloads: list[Workload], spec: BackendSpec, variant: Variant, opt: RunOptions,
                log: Any = print) -> dict[str, dict]:
    recorder = Recorder()
    backend = spec.make(recorder)
    out = {}
    try:
        for w in workloads:
            why = unsupported(w, spec, model_info(backend))
            if why:
                out[w.name] = {"skipped": why}
                continue
            warm = warm_up_workload(w, backend, recorder, variant, opt)
            if warm is not None:
                log(f"[{variant.name}] {w.name}: warm-up {warm['programs'] - warm['failed']}/{warm['programs']} "
                    f"programs in {warm['duration_s']:.2f} s (not measured)")
            out[w.name] = r = measure_workload(w, backend, recorder, variant, opt, lambda: spec.flush(backend))
            if warm is not None:
                r["warm_up"] = warm
            hit = r["cache_hit_rate"]
            runs = ""
            if "runs" in r:
                runs = f" (median of {len(r['runs'])} runs: {', '.join(f'{x:.2f}' for x in run_pps(r))} p/s)"
            log(f"[{variant.name}] {w.name}: {r['completed']}/{r['programs']} programs in {r['duration_s']:.2f} s, "
                f"{r['programs_per_s']:.2f} p/s{runs}, hit rate {'-' if hit is None else f'{hit:.1%}'}, "
                f"optimal {r.get('optimal_hit_rate', float('nan')):.1%}"
                + (f"  ERROR {r['error']}" if "error" in r else ""))
    finally:
        backend.shutdown()
    return out


def model_info(backend: Any) -> dict:
    return getattr(backend, "model_info", None) or {}


def run_pps(r: dict) -> list[float]:
    return [x["programs_per_s"] for x in r["runs"]]


def repeats_for(first: dict, opt: RunOptions) -> int:
    """How many measured runs a workload gets in all, given its first run."""
    if opt.repeat_max_seconds is not None and first["duration_s"] >= opt.repeat_max_seconds:
        return 1
    return opt.repeat


def measure_workload(w: Workload, backend: Any, recorder: Recorder, variant: Variant, opt: RunOptions,
                     flush: Optional[Callable[[], bool]] = None) -> dict:
    """run_workload once, or (opt.repeat > 1) up to opt.repeat times per repeats_for, combined by combine_runs."""
    runs = [run_workload(w, backend, recorder, variant, opt, flush)]
    if opt.repeat == 1:
        return runs[0]
    runs += [run_workload(w, backend, recorder, variant, opt, flush) for _ in range(repeats_for(runs[0], opt) - 1)]
    return combine_runs(runs)


MEDIAN_KEYS = ("duration_s", "programs_per_s", "mean_latency_s", "output_tokens", "output_tokens_per_s", "requests",
               "prompt_tokens", "cache_hit_rate", "accuracy", "optimal_hit_rate", "optimal_hit_rate_prompts_only",
               "total_prompt_tokens", "unique_prompt_tokens", "must_compute_tokens", "achieved_over_optimal")
RUN_KEYS = ("programs_per_s", "duration_s", "completed", "cache_hit_rate", "mean_latency_s")


def combine_runs(runs: list[dict]) -> dict:
    """One result from runs of the same work: each figure the median over the runs that have it (per figure, so
    they need not come from one run), failures and errors the worst run's, and every run's figures under "runs"."""
    res = dict(runs[0])
    for k in MEDIAN_KEYS:
        xs = [r[k] for r in runs if r.get(k) is not None]
        if k in res or xs:
            res[k] = statistics.median(xs) if xs else None
    res["completed"] = min(r["completed"] for r in runs)
    res["failed"] = max(r["failed"] for r in runs)
    for k in ("http_errors", "tokenize_mismatches"):
        if k in res:
            res[k] = max(r[k] for r in runs)
    res["cache_flushed"] = all(r["cache_flushed"] for r in runs)
    error = next((r["error"] for r in runs if "error" in r), None)
    if error is not None:
        res["error"] = error
    res["runs"] = [{k: r.get(k) for k in RUN_KEYS} for r in runs]
    pps = run_pps(res)
    res["programs_per_s_spread"] = max(pps) / min(pps) if min(pps) > 0 else None
    return res


def warm_up_workload(w: Workload, backend: Any, recorder: Recorder, variant: Variant,
                     opt: RunOptions) -> Optional[dict]:
    """Runs min(opt.warm_up, n) programs of the workload before its measured run, so that one-off server costs
    (grammar compiles, first select/logprob requests) do not land in whichever variant runs first. In parallel even
    for sequential variants (a sequential chat_long warm-up alone would take seconds on a GPU); the measured run
    clears the recorder and flushes the cache (unless --no-flush) after it."""
    k = min(opt.warm_up, opt.programs_for(w.name))
    if k <= 0:
        return None
    wopt = dataclasses.replace(opt, num_programs=k, counts={}, seed=opt.seed + WARM_UP_SEED_OFFSET, tokenizer=None,
                               flush=False, warm_up=0)
    r = run_workload(w, backend, recorder, dataclasses.replace(variant, parallel=True), wopt)
    recorder.clear()
    return {"programs": r["programs"], "failed": r["failed"], "duration_s": r["duration_s"]}


def warm_up(base_url: str) -> None:
    """One tiny request: the first one on a fresh server pays one-off costs."""
    httpx.post(base_url + "/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 2}},
               timeout=300).raise_for_status()
