"""The soak's traffic: request kinds, what each should get back, how a response is classified, latency
summaries and the printed report. Pure (no servers, no I/O): benchmarks/serving/soak.py sends the requests,
tests/bench/test_soak_smoke.py checks the logic."""
from __future__ import annotations

import enum
import json
import random
from dataclasses import dataclass, field
from typing import Any

MAX_TOKENS = 32  # every generation is bounded, so a request's latency is bounded too
HUGE = 10**6


class Expect(enum.Enum):
    SUCCESS = "2xx"
    REJECT = "4xx"
    EITHER = "2xx or 4xx"  # e.g. a flush refused while requests run, or a stress value the server may accept


class Mode(enum.Enum):
    PLAIN = "plain"
    STREAM = "stream"
    CANCEL_STREAM = "cancel_stream"  # the client closes the connection after the first chunk
    CANCEL_EARLY = "cancel_early"  # the client gives up on a non-streamed request before its answer
    OPERATOR_ABORT = "operator_abort"  # POST /abort_request with the stream's rid after its first chunk


class Kind(enum.Enum):
    GENERATE = "generate"
    GENERATE_STREAM = "generate_stream"
    GENERATE_LOGPROBS = "generate_logprobs"
    CHAT = "chat"
    CHAT_STREAM = "chat_stream"
    COMPLETION = "completion"
    COMPLETION_STREAM = "completion_stream"
    MESSAGES = "messages"
    MESSAGES_STREAM = "messages_stream"
    REGEX = "regex"
    JSON_SCHEMA = "json_schema"
    RESPONSE_FORMAT = "response_format"
    N_SAMPLES = "n_samples"
    CLIENT_CANCEL_STREAM = "client_cancel_stream"
    CLIENT_CANCEL_EARLY = "client_cancel_early"
    OPERATOR_ABORT = "operator_abort"
    FLUSH_CACHE = "flush_cache"
    SERVER_INFO = "server_info"
    METRICS = "metrics"
    HEALTH = "health"
    BAD_JSON = "bad_json"
    WRONG_TYPES = "wrong_types"
    TOP_LOGPROBS_HUGE = "top_logprobs_num_1e6"
    CHAT_TOP_LOGPROBS_HUGE = "chat_top_logprobs_1e6"
    N_HUGE = "n_40000"
    ECHO_LOGPROBS_HUGE = "echo_logprobs_1e6"
    NEGATIVE_MAX_TOKENS = "negative_max_tokens"
    ANTHROPIC_ZERO_MAX_TOKENS = "anthropic_max_tokens_0"
    UNKNOWN_FIELDS = "unknown_fields"
    NEGATIVE_TEMPERATURE = "temperature_-1"
    EMPTY_MESSAGES = "empty_messages"
    ANTHROPIC_EMPTY_MESSAGES = "anthropic_empty_messages"
    STOP_LIST_HUGE = "stop_list_1000"
    INPUT_IDS_OUT_OF_VOCAB = "input_ids_out_of_vocab"
    PROMPT_TOO_LONG = "prompt_too_long"
    BAD_REGEX = "bad_regex"
    BAD_JSON_SCHEMA = "bad_json_schema"


@dataclass(frozen=True)
class KindSpec:
    weight: float
    expect: Expect


_ORDER = list(Kind)
GENERATION = frozenset(_ORDER[:_ORDER.index(Kind.FLUSH_CACHE)])  # valid generation traffic, in enum order
MALFORMED = frozenset(_ORDER[_ORDER.index(Kind.BAD_JSON):])
_MALFORMED_ACCEPTABLE = {Kind.STOP_LIST_HUGE}  # a long stop list is heavy, not invalid: 2xx is fine too
SPECS: dict[Kind, KindSpec] = {
    **{k: KindSpec(6.0, Expect.SUCCESS) for k in GENERATION},
    Kind.FLUSH_CACHE: KindSpec(0.2, Expect.EITHER),  # 400 while requests run: that is the API
    **{k: KindSpec(1.0, Expect.SUCCESS) for k in (Kind.SERVER_INFO, Kind.METRICS, Kind.HEALTH)},
    **{k: KindSpec(1.0, Expect.EITHER if k in _MALFORMED_ACCEPTABLE else Expect.REJECT) for k in MALFORMED},
}
SPECS = {k: SPECS[k] for k in Kind}  # the table in enum order
WARMUP_KINDS = [k for k in Kind if k not in MALFORMED and k is not Kind.FLUSH_CACHE]


@dataclass
class Plan:
    kind: Kind
    method: str
    path: str
    body: dict[str, Any] | None = None
    raw: bytes | None = None  # sent as is (malformed JSON)
    mode: Mode = Mode.PLAIN
    rid: str | None = None
    cancel_after_s: float = 0.0

    def content(self) -> bytes | None:
        return self.raw if self.raw is not None else (None if self.body is None else json.dumps(self.body).encode())

    def snippet(self, limit: int = 300) -> str:
        data = self.content() or b""
        return f"{self.method} {self.path} {data[:limit].decode(errors='replace')}"


SYSTEM = ("You are a concise assistant for a trivia game. Answer in one short sentence, without lists, "
          "and never repeat the question.")
TOPICS = ["the moon", "rivers", "bread", "chess", "volcanoes", "bees", "jazz", "glaciers", "tea", "bridges",
          "owls", "copper", "deserts", "violins", "comets", "salt"]
PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                  "age": {"type": "integer"}}, "required": ["name", "age"]}


def _prompt(rng: random.Random) -> str:
    # Shared system text + a few topics: the radix cache gets hits, evictions and splits.
    return f"{SYSTEM}\nQuestion {rng.randint(0, 99)}: tell me one fact about {rng.choice(TOPICS)}."


def _messages(rng: random.Random) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"One fact about {rng.choice(TOPICS)}?"}]


def _sampling(rng: random.Random) -> dict[str, Any]:
    return {"max_new_tokens": rng.randint(1, MAX_TOKENS), "temperature": rng.choice([0.0, 0.7, 1.0])}


def _openai(rng: random.Random) -> dict[str, Any]:
    return {"model": "default", "max_tokens": rng.randint(1, MAX_TOKENS), "temperature": rng.choice([0.0, 0.8])}


def plan(kind: Kind, rng: random.Random) -> Plan:
    """One request of `kind`; the keyword arguments of the builders below replace their defaults."""
    def gen(**kw: Any) -> Plan:
        return Plan(kind, "POST", "/generate", {"text": _prompt(rng), "sampling_params": _sampling(rng), **kw})

    def chat(**kw: Any) -> Plan:
        return Plan(kind, "POST", "/v1/chat/completions", {**_openai(rng), "messages": _messages(rng), **kw})

    def comp(**kw: Any) -> Plan:
        return Plan(kind, "POST", "/v1/completions", {**_openai(rng), "prompt": _prompt(rng), **kw})

    def msgs(**kw: Any) -> Plan:
        body = {"model": "default", "max_tokens": rng.randint(1, MAX_TOKENS), "system": SYSTEM,
                "messages": _messages(rng)[1:], **kw}
        return Plan(kind, "POST", "/v1/messages", body)

    rid = f"soak-{rng.getrandbits(64):016x}"
    match kind:
        case Kind.GENERATE:
            return gen()
        case Kind.GENERATE_STREAM:
            return _with(gen(stream=True), mode=Mode.STREAM)
        case Kind.GENERATE_LOGPROBS:
            return gen(return_logprob=True, top_logprobs_num=rng.randint(1, 5), logprob_start_len=0)
        case Kind.CHAT:
            return chat()
        case Kind.CHAT_STREAM:
            return _with(chat(stream=True, stream_options={"include_usage": True}), mode=Mode.STREAM)
        case Kind.COMPLETION:
            return comp(logprobs=rng.choice([None, 2]))
        case Kind.COMPLETION_STREAM:
            return _with(comp(stream=True), mode=Mode.STREAM)
        case Kind.MESSAGES:
            return msgs()
        case Kind.MESSAGES_STREAM:
            return _with(msgs(stream=True), mode=Mode.STREAM)
        case Kind.REGEX:
            return gen(sampling_params={**_sampling(rng), "regex": r"(yes|no), because [a-z ]{1,20}\."})
        case Kind.JSON_SCHEMA:
            return gen(sampling_params={**_sampling(rng), "json_schema": json.dumps(PERSON_SCHEMA)})
        case Kind.RESPONSE_FORMAT:
            return chat(response_format={"type": "json_schema",
                                         "json_schema": {"name": "person", "schema": PERSON_SCHEMA}})
        case Kind.N_SAMPLES:
            n = rng.randint(2, 4)
            if rng.random() < 0.5:
                return chat(n=n, temperature=0.8)
            return gen(sampling_params={**_sampling(rng), "n": n, "temperature": 0.8})
        case Kind.CLIENT_CANCEL_STREAM:
            p = rng.choice([gen(stream=True), chat(stream=True), msgs(stream=True)])
            return _with(p, mode=Mode.CANCEL_STREAM)
        case Kind.CLIENT_CANCEL_EARLY:
            p = gen(sampling_params={"max_new_tokens": MAX_TOKENS, "ignore_eos": True})
            return _with(p, mode=Mode.CANCEL_EARLY, cancel_after_s=rng.uniform(0.02, 0.5))
        case Kind.OPERATOR_ABORT:
            p = gen(stream=True, rid=rid, sampling_params={"max_new_tokens": MAX_TOKENS, "ignore_eos": True})
            return _with(p, mode=Mode.OPERATOR_ABORT, rid=rid)
        case Kind.FLUSH_CACHE:
            return Plan(kind, "POST", "/flush_cache")
        case Kind.SERVER_INFO | Kind.METRICS | Kind.HEALTH:
            return Plan(kind, "GET", "/" + kind.value)
        case Kind.BAD_JSON:
            path = rng.choice(["/generate", "/v1/chat/completions", "/v1/completions", "/v1/messages"])
            return Plan(kind, "POST", path, raw=b'{"text": "unterminated", "sampling_params": {')
        case Kind.WRONG_TYPES:
            return Plan(kind, "POST", "/generate", {"text": 42, "sampling_params": {"max_new_tokens": "ten"}})
        case Kind.TOP_LOGPROBS_HUGE:
            return gen(return_logprob=True, top_logprobs_num=HUGE)
        case Kind.CHAT_TOP_LOGPROBS_HUGE:
            return chat(logprobs=True, top_logprobs=HUGE)
        case Kind.N_HUGE:
            return chat(n=40000)
        case Kind.ECHO_LOGPROBS_HUGE:
            return comp(echo=True, logprobs=HUGE)
        case Kind.NEGATIVE_MAX_TOKENS:
            return comp(max_tokens=-5)
        case Kind.ANTHROPIC_ZERO_MAX_TOKENS:
            return msgs(max_tokens=0)
        case Kind.UNKNOWN_FIELDS:
            return gen(soak_unknown=1, sampling_params={"max_new_tokens": 4, "soak_unknown": 2})
        case Kind.NEGATIVE_TEMPERATURE:
            return chat(temperature=-1)
        case Kind.EMPTY_MESSAGES:
            return chat(messages=[])
        case Kind.ANTHROPIC_EMPTY_MESSAGES:
            return msgs(messages=[])
        case Kind.STOP_LIST_HUGE:
            return gen(sampling_params={"max_new_tokens": 8, "stop": [f"stop-{i}-{rng.random():.6f}"
                                                                       for i in range(1000)]})
        case Kind.INPUT_IDS_OUT_OF_VOCAB:
            return Plan(kind, "POST", "/generate", {"input_ids": [1, 2, rng.choice([10**9, 2**31 - 1, -1])],
                                                    "sampling_params": {"max_new_tokens": 4}})
        case Kind.PROMPT_TOO_LONG:
            return gen(text="word " * 5000)
        case Kind.BAD_REGEX:
            return gen(sampling_params={"max_new_tokens": 4, "regex": "(unclosed[a-"})
        case Kind.BAD_JSON_SCHEMA:
            return gen(sampling_params={"max_new_tokens": 4, "json_schema": '{"type": "object", "properties": '})
    raise AssertionError(kind)


def _with(p: Plan, **kw: Any) -> Plan:
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def pick(rng: random.Random) -> Kind:
    kinds = list(SPECS)
    return rng.choices(kinds, weights=[SPECS[k].weight for k in kinds])[0]


class Outcome(enum.Enum):
    OK = "ok"  # the expected 2xx
    REJECTED = "rejected"  # the expected 4xx
    CANCELLED = "cancelled"  # the client went away on purpose
    BUSY = "busy"  # 503 with Retry-After
    UNEXPECTED_5XX = "unexpected_5xx"
    UNEXPECTED_STATUS = "unexpected_status"  # 2xx for a malformed request, 4xx for a valid one
    STREAM_ERROR = "stream_error"  # a 200 stream that carried an error event
    CONNECTION_ERROR = "connection_error"  # refused, reset or timed out while the server was alive
    SERVER_DOWN = "server_down"  # failed after the soak saw a target die (the death is reported once)


EXPECTED_OUTCOMES = frozenset({Outcome.OK, Outcome.REJECTED, Outcome.CANCELLED, Outcome.BUSY, Outcome.SERVER_DOWN})


def classify(expect: Expect, status: int | None, retry_after: bool = False, stream_error: str | None = None,
             connection_error: bool = False, server_down: bool = False) -> Outcome:
    """`server_down`: the soak saw a target die before this answer; failures that a death explains (a dead
    pipeline's 503, with Retry-After as any 503, refused connections, broken streams) then count once, as the
    death; a 500, 502 or 504 never does."""
    if connection_error or status is None:
        return Outcome.SERVER_DOWN if server_down else Outcome.CONNECTION_ERROR
    if status == 503 and server_down:
        return Outcome.SERVER_DOWN
    if status == 503 and retry_after:
        return Outcome.BUSY
    if status >= 500:
        return Outcome.UNEXPECTED_5XX
    if stream_error is not None:
        return Outcome.SERVER_DOWN if server_down else Outcome.STREAM_ERROR
    if 200 <= status < 300:
        return Outcome.OK if expect is not Expect.REJECT else Outcome.UNEXPECTED_STATUS
    if 400 <= status < 500:
        return Outcome.REJECTED if expect is not Expect.SUCCESS else Outcome.UNEXPECTED_STATUS
    return Outcome.UNEXPECTED_STATUS


def sse_error(text: str) -> str | None:
    """The first error event in an SSE body (native and OpenAI: {"error": ...}; Anthropic: {"type": "error"})."""
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        try:
            obj = json.loads(line[5:].strip())
        except ValueError:
            continue  # [DONE]
        if isinstance(obj, dict) and ("error" in obj or obj.get("type") == "error"):
            return line[5:].strip()[:300]
    return None


@dataclass
class Record:
    kind: Kind
    status: int | None
    outcome: Outcome
    latency_s: float
    request: str = ""
    detail: str = ""  # response body snippet or the exception


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    xs = sorted(values)
    at = lambda q: xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]  # noqa: E731 - nearest rank
    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": xs[-1], "mean": sum(xs) / len(xs)}


@dataclass
class KindStats:
    total: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)


def summarize(records: list[Record]) -> dict[str, KindStats]:
    out: dict[str, KindStats] = {}
    lat: dict[str, list[float]] = {}
    for r in records:
        s = out.setdefault(r.kind.value, KindStats())
        s.total += 1
        key = str(r.status) if r.status is not None else "none"
        s.statuses[key] = s.statuses.get(key, 0) + 1
        s.outcomes[r.outcome.value] = s.outcomes.get(r.outcome.value, 0) + 1
        lat.setdefault(r.kind.value, []).append(r.latency_s * 1000)
    for k, s in out.items():
        s.latency_ms = {q: round(v, 1) for q, v in percentiles(lat[k]).items()}
    return out


def report(result: dict[str, Any], stats: dict[str, KindStats]) -> str:
    """The printed table: per kind the count, expectation, latency and statuses; then the verdicts."""
    lines = [f"\n{'kind':26} {'n':>6} {'expect':>10} {'p50 ms':>8} {'p99 ms':>8}  statuses / outcomes"]
    for kind, spec in SPECS.items():
        if (s := stats.get(kind.value)) is None:
            continue
        statuses = " ".join(f"{k}:{v}" for k, v in sorted(s.statuses.items()))
        outcomes = " ".join(f"{k}:{v}" for k, v in s.outcomes.items() if k not in ("ok", "rejected"))
        lines.append(f"{kind.value:26} {s.total:6d} {spec.expect.value:>10} {s.latency_ms['p50']:8.0f} "
                     f"{s.latency_ms['p99']:8.0f}  {statuses}  {outcomes}")
    lines.append(f"\nrequests {result['requests']} in {result['elapsed_s']} s; outcomes "
                 + ", ".join(f"{k} {v}" for k, v in result["outcomes"].items() if v))
    lines += [f"  unexpected {u['outcome']} {u['status']} [{u['kind']}] {u['request'][:80]!r} -> "
              f"{u['response'][:160]!r}" for u in result["unexpected"][:10]]
    for c in result["kv_idle_check"]:
        rest = {k: v for k, v in c.items() if k not in ("target", "idle_ok")}
        lines.append(f"  KV/idle {c['target']}: {'ok' if c['idle_ok'] else 'NOT OK'} {json.dumps(rest)}")
    lines += [f"  RSS {name}: {v['start_mib']:.0f} -> {v['end_mib']:.0f} MiB (growth {v['growth_mib']:+.1f})"
              for name, v in result["rss_mib"].items()]
    lines.append(("PASS" if result["pass"] else "FAIL: " + "; ".join(result["failures"])) + "\n")
    return "\n".join(lines)
