"""Tracing into an IR graph and running it compiled, against the scripted backend (no server)."""
import time

import pytest

import radixlm as sgl
from radixlm.lang.global_config import global_config
from radixlm.lang.ir import SglArgument, SglConstantText, SglFork, SglGen, SglGetForkItem, SglJoin, SglVariable
from radixlm.lang.tracer import TracingError
from tests.lang.fake_backend import FakeBackend


@sgl.function
def tip_suggestion(s, topic):
    s += "Here are two tips for " + topic + ".\n"
    s += "1." + sgl.gen("tip1", max_tokens=8, stop="\n") + "\n"
    s += "2." + sgl.gen("tip2", max_tokens=8, stop="\n") + "\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Expand tip {i + 1}:" + sgl.gen("detail", max_tokens=8, stop="\n")
    s += "Tip 1:" + forks[0]["detail"] + "\nTip 2:" + forks[1]["detail"] + "\n"
    forks.join()
    s += "In summary," + sgl.gen("summary", max_tokens=8)


def echo_backend(delay: float = 0.0) -> FakeBackend:
    # The reply depends on the whole prompt, so any difference in the text a gen sees shows up.
    return FakeBackend(delay=delay, reply=lambda prompt, sp: f"<{len(prompt)}:{prompt[-6:]}>")


def test_trace_records_streams_nodes_and_edges():
    graph = tip_suggestion.trace()
    assert [st.pid for st in graph.streams] == [0, 1, 2]
    kinds = [type(n) for n in graph.main.nodes]
    assert kinds[:3] == [SglConstantText, SglArgument, SglConstantText]
    assert SglFork in kinds and SglJoin in kinds and kinds.count(SglVariable) == 2
    assert [type(n) for n in graph.streams[1].nodes] == [SglGetForkItem, SglConstantText, SglGen]
    edges = graph.edges()
    assert {e.kind for e in edges} == {"stream", "fork", "variable", "join"}
    var_edges = [e for e in edges if e.kind == "variable"]
    # Each "Tip k:" reference waits for the gen of branch k.
    assert [(e.src.pid, e.src.name, e.dst.pid) for e in var_edges] == [(1, "detail", 0), (2, "detail", 0)]
    order = graph.topological_order()
    pos = {id(n): i for i, n in enumerate(order)}
    assert all(pos[id(e.src)] < pos[id(e.dst)] for e in edges)
    text = graph.pretty()
    assert "program tip_suggestion(topic)" in text and "Argument topic" in text
    assert "Fork 2" in text and "Join gather_variable ['detail'] <- streams [1, 2]" in text
    assert "Variable detail <- stream 1" in text


def test_trace_binds_given_arguments_as_constants():
    graph = tip_suggestion.trace(topic="sleep")
    assert not any(isinstance(n, SglArgument) for n in graph.nodes)
    assert graph.main.nodes[0].value == "Here are two tips for sleep.\n"


def test_compiled_program_matches_the_interpreter():
    be = echo_backend()
    ref = tip_suggestion.run(topic="sleep", backend=be)
    compiled = tip_suggestion.compile()
    got = compiled.run(topic="sleep", backend=be)
    assert got.text() == ref.text()
    for k in ("tip1", "tip2", "detail", "summary"):
        assert got[k] == ref[k]
    assert isinstance(got["detail"], list) and len(got["detail"]) == 2
    # The fork hint fires in compiled mode too: one commit per run.
    assert sum(1 for kind, _ in be.calls if kind == "commit") == 2


def test_compiled_branches_run_concurrently():
    be = FakeBackend(delay=0.3)

    @sgl.function
    def fan(s, q):
        s += q
        forks = s.fork(3)
        forks += sgl.gen("x")
        forks.join()

    t0 = time.monotonic()
    state = fan.compile().run(q="question", backend=be)
    assert len(state["x"]) == 3
    assert time.monotonic() - t0 < 0.8 and be.max_active == 3


def test_compiled_roles_select_var_scope_and_sampling_defaults():
    be = FakeBackend(reply=lambda prompt, sp: f"T={sp.temperature}")

    @sgl.function
    def chat(s, question):
        s += sgl.system("Be brief.")
        with s.user():
            s += question
        with s.var_scope("turn"):
            s += sgl.assistant(sgl.gen("answer", max_tokens=4))
        s += sgl.select("pick", choices=["a", "bb"])

    ref = chat.run(question="Hi?", temperature=0.25, backend=be)
    got = chat.compile().run(question="Hi?", temperature=0.25, backend=be)
    assert got.text() == ref.text() and got["answer"] == "T=0.25"
    assert got["turn"] == ref["turn"] and got["pick"] == "bb"
    assert got.messages() == ref.messages()


def test_compiled_run_batch_and_missing_argument():
    be = echo_backend()
    compiled = tip_suggestion.compile()
    states = compiled.run_batch([{"topic": "sleep"}, {"topic": "food"}], backend=be)
    assert [st["tip1"] for st in states] == [tip_suggestion.run(topic=t, backend=be)["tip1"]
                                              for t in ("sleep", "food")]
    with pytest.raises(TypeError, match="missing argument"):
        compiled.run(backend=be)


def test_compiled_error_in_a_branch_surfaces_at_the_join():
    be = FakeBackend(fail_on="boom:")

    @sgl.function
    def prog(s):
        s += "x"
        forks = s.fork(2)
        forks += lambda i: "boom:" if i == 1 else "fine:"
        forks += sgl.gen("y")
        forks.join()
        s += sgl.gen("after")

    state = prog.compile().run(backend=be)
    with pytest.raises(sgl.ProgramError, match="backend exploded"):
        state["after"]


def _line_of(fragment: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if fragment in line)


def test_data_dependent_control_flow_names_the_line():
    @sgl.function
    def branchy(s, q):
        s += q + sgl.select("ok", choices=["yes", "no"])
        if s["ok"] == "yes":  # data-dependent
            s += "fine"

    with pytest.raises(TracingError, match="comparison") as ei:
        branchy.trace()
    assert f"{__file__}:{_line_of('# data-dependent')}" in str(ei.value)
    assert "variable 'ok'" in str(ei.value)


@pytest.mark.parametrize("body, what", [
    (lambda s, q: bool(q), "bool()"),
    (lambda s, q: [x for x in q], "iterating"),
    (lambda s, q: f"Question: {q}", "f-string"),
    (lambda s, q: str(q), "str()"),
    (lambda s, q: "%s" % q, "str()"),
    (lambda s, q: len(q), "len()"),
])
def test_traced_argument_misuse_is_a_clear_error(body, what):
    def prog(s, q):
        body(s, q)

    with pytest.raises(TracingError, match="argument 'q'") as ei:
        sgl.function(prog).trace()
    assert what in str(ei.value) and __file__ in str(ei.value)


def test_reading_state_text_or_unknown_variable_while_tracing():
    @sgl.function
    def reads_text(s):
        s += "a"
        s.text()

    with pytest.raises(TracingError, match=r"s\.text\(\)"):
        reads_text.trace()

    @sgl.function
    def unknown(s):
        s += "a" + s["nope"]

    with pytest.raises(TracingError, match="'nope' is read before"):
        unknown.trace()


def test_run_batch_caches_the_traced_constant_prefix():
    be = FakeBackend()
    long_prefix = "You are a careful assistant who answers questions about geography. " * 2

    @sgl.function
    def qa(s, q):
        s += sgl.system(long_prefix)
        s += "Q: " + q + "\nA:" + sgl.gen("a")

    qa.run_batch([{"q": "x"}, {"q": "y"}], backend=be)
    cached = [p for kind, p in be.calls if kind == "cache_prefix"]
    assert cached == ["<|im_start|>system\n" + long_prefix + "<|im_end|>\nQ: "]
    assert all(p.startswith(cached[0]) for kind, p in be.calls if kind == "gen")

    be2 = FakeBackend()
    old = global_config.enable_precache_with_tracing
    global_config.enable_precache_with_tracing = False
    try:
        qa.run_batch([{"q": "x"}, {"q": "y"}], backend=be2)
    finally:
        global_config.enable_precache_with_tracing = old
    assert not any(kind == "cache_prefix" for kind, _ in be2.calls)


def test_short_or_untraceable_prefix_is_not_cached():
    be = FakeBackend()

    @sgl.function
    def short(s, q):
        s += "Q: " + q + sgl.gen("a")

    short.run_batch([{"q": "x"}, {"q": "y"}], backend=be)
    assert not any(kind == "cache_prefix" for kind, _ in be.calls)

    @sgl.function
    def branchy(s, q):
        s += "A long constant opening that is well over the threshold of characters. " * 2
        if q == "x":  # the trace stops here; the constant opening is still cached
            s += "x"
        s += sgl.gen("a")

    branchy.run_batch([{"q": "x"}, {"q": "y"}], backend=be)
    assert sum(1 for kind, _ in be.calls if kind == "cache_prefix") == 1
