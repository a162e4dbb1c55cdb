"""Tracing as SGLang's tests pin it: formatting an argument into an f-string is a TypeError, and an sgl.function
called by a traced program is traced into the caller's graph (a stream of its own), so `compile()` runs programs
built from other programs and gives what running them gives."""
import pytest

import radixlm as sgl
from tests.lang.fake_backend import FakeBackend


def echo_backend() -> FakeBackend:
    return FakeBackend(reply=lambda prompt, sp: "<" + prompt[-10:].replace("\n", "|") + ">")


def test_an_argument_in_an_f_string_is_a_type_error():
    @sgl.function
    def wrong(s, question):
        s += f"I want to ask {question}"

    with pytest.raises(TypeError, match="f-string"):
        wrong.trace()
    with pytest.raises(sgl.TracingError):  # still radixlm's own error type too
        wrong.trace()


@sgl.function
def expand(s, tip, style="short"):
    s += "Expand the tip (" + style + "): " + tip + "\n"
    s += sgl.gen("detailed_tip", max_tokens=16)


@sgl.function
def tip_suggestion(s, topic):
    s += "Here are 2 tips for " + topic + ".\n"
    s += "1." + sgl.gen("tip_1", stop=["\n", "."]) + "\n"
    s += "2." + sgl.gen("tip_2", stop=["\n", "."]) + "\n"
    branch1 = expand(tip=s["tip_1"])
    branch2 = expand(s["tip_2"], style=topic)  # positional, and the caller's own argument
    s += "Tip 1: " + branch1["detailed_tip"] + "\n"
    s += "Tip 2: " + branch2["detailed_tip"] + "\n"
    s += "In summary" + sgl.gen("summary")


def test_called_functions_become_streams_of_the_graph():
    graph = tip_suggestion.trace(backend=echo_backend())
    labels = [st.label for st in graph.streams]
    assert labels == ["main", "call of expand", "call of expand"]
    main, first, second = graph.streams
    # The callee starts empty (no fork of the caller's text) and reads the caller's variables across streams.
    assert [type(n).__name__ for n in first.nodes] == ["SglConstantText", "SglVariable", "SglConstantText",
                                                       "SglGen"]
    assert any(type(n).__name__ == "SglArgument" and n.name == "topic" for n in second.nodes)
    edges = {(e.src.pid, e.dst.pid, e.kind) for e in graph.edges()}
    assert {(0, 1, "variable"), (0, 2, "variable"), (1, 0, "variable"), (2, 0, "variable")} <= edges


def test_compiled_program_with_calls_equals_running_it(monkeypatch):
    be = echo_backend()
    # Run (not traced), a nested call is a program of its own on the default backend, as in SGLang.
    monkeypatch.setattr(sgl.global_config, "default_backend", be)
    compiled = tip_suggestion.compile(backend=be)
    got = compiled.run(topic="sleep")
    want = tip_suggestion.run(topic="sleep", backend=be)
    assert got.text() == want.text()
    assert got["summary"] == want["summary"]
    batch = compiled.run_batch([{"topic": "a"}, {"topic": "b"}], temperature=0)
    assert [s.text() for s in batch] == [tip_suggestion.run(topic=t, backend=be).text() for t in "ab"]


def test_run_level_options_on_a_nested_call_are_refused_while_tracing():
    @sgl.function
    def caller(s):
        s += "x" + sgl.gen("y")
        expand(tip=s["y"], temperature=0)

    with pytest.raises(sgl.TracingError, match="expand\\(\\) called while tracing"):
        caller.trace()


def test_trace_last_node_prints_the_graph_up_to_it():
    # SGLang's test_bind_cache: print(f.bind(...).trace().last_node.print_graph_dfs())
    @sgl.function
    def few_shot_qa(s, prompt, question):
        s += prompt
        s += "Q: What is the capital of France?\nA: Paris\n"
        s += "Q: " + question + "\n"
        s += "A:" + sgl.gen("answer", stop="\n")

    text = few_shot_qa.bind(prompt="The following are questions.\n").trace().last_node.print_graph_dfs()
    lines = text.splitlines()
    assert "The following are questions." in lines[0] and "SglGen('answer')" in lines[-1]
    assert any("SglArgument(name='question')" in ln for ln in lines)
    ids = [ln.split(" = ")[0] for ln in lines]
    assert all(f"= {prev} + " in ln for prev, ln in zip(ids, lines[1:]))  # one chain, in stream order

    @sgl.function
    def tips(s):
        s += "Tips: "
        forks = s.fork(2)
        for i in range(2):
            forks[i] += "tip: " + sgl.gen("t")
        s += "First:" + forks[0]["t"] + sgl.gen("sum")

    lines = tips.trace().last_node.print_graph_dfs().splitlines()
    order = [next(i for i, ln in enumerate(lines) if key in ln)
             for key in ("SglFork(2)", "SglGetForkItem(", "SglGen('t')", "SglVariable('t')", "SglGen('sum')")]
    assert order == sorted(order)  # dependencies first: the fork, the branch that sets t, then its reader
    assert not any("'tip: '" in ln and lines.index(ln) > order[3] for ln in lines)
