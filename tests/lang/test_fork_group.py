"""ProgramStateGroup (what `s.fork(n)` returns) as SGLang programs use it, against the scripted backend."""
import threading

import pytest

import radixlm as sgl
from radixlm.lang.ir import SglGen, SglJoin
from tests.lang.fake_backend import FakeBackend


def echo_backend(delay: float = 0.0) -> FakeBackend:
    return FakeBackend(delay=delay, reply=lambda prompt, sp: f"<{prompt[-7:]}>")


@sgl.function
def expand_steps(s, task):
    # The pattern of SGLang's parallel-decoding test: each branch is appended to through `forks[i] += ...`.
    s += "Steps to " + task + ":\n"
    forks = s.fork(3)
    for i in range(3):
        forks[i] += f"Step {i + 1}:"
        forks[i] += sgl.gen("detail", 8, stop=["\n\n"])
    forks.join()
    for i in range(3):
        s += f"Step {i + 1}:" + forks[i]["detail"] + "\n"


def test_item_assignment_appends_to_one_branch():
    state = expand_steps.run(task="bake", backend=echo_backend())
    assert state["detail"] == ["<Step 1:>", "<Step 2:>", "<Step 3:>"]
    assert state.text() == "Steps to bake:\nStep 1:<Step 1:>\nStep 2:<Step 2:>\nStep 3:<Step 3:>\n"


def test_item_assignment_is_traced_too():
    graph = expand_steps.trace()
    branches = graph.streams[1:]
    assert len(branches) == 3 and all(isinstance(b.nodes[-1], SglGen) for b in branches)
    assert any(isinstance(n, SglJoin) and n.var_names == ["detail"] for n in graph.main.nodes)


def test_a_branch_cannot_be_replaced():
    @sgl.function
    def prog(s):
        forks = s.fork(2)
        forks[0] = forks[1]

    with pytest.raises(ValueError, match="cannot be replaced"):
        prog.run(backend=FakeBackend())


def test_group_append_forms():
    @sgl.function
    def prog(s):
        s += "P"
        forks = s.fork(2)
        forks += ["a", "b"]  # a list (or tuple) gives one item per branch
        forks += lambda i: str(i)  # a callable gets the branch index
        forks += sgl.gen("g")  # an expression goes to every branch
        forks.join()

    state = prog.run(backend=echo_backend())
    assert state["g"] == ["<Pa0>", "<Pb1>"]

    @sgl.function
    def wrong_length(s):
        forks = s.fork(2)
        forks += ("only one",)

    with pytest.raises(ValueError, match="one item per branch"):
        wrong_length.run(backend=FakeBackend())


def test_join_ends_the_branches_but_keeps_their_values():
    @sgl.function
    def prog(s):
        forks = s.fork(2)
        forks += [sgl.gen("g"), "x" + sgl.gen("g")]
        forks.join()
        assert [f["g"] for f in forks] == ["<>", "<x>"]
        with pytest.raises(RuntimeError, match="has ended"):
            forks[0] += "more"

    prog.run(backend=echo_backend()).sync()


def test_concate_and_append_after_item_assignment():
    @sgl.function
    def prog(s):
        s += "Q "
        forks = s.fork(2)
        forks[0] += "first "
        forks[1] += "second "
        forks.join(mode="concate_and_append")
        s += "end"

    assert prog.run(backend=FakeBackend()).text() == "Q first second end"


def test_error_waits_for_the_stream():
    gate = threading.Event()

    def reply(prompt, sp):
        gate.wait()
        raise RuntimeError("backend exploded")

    @sgl.function
    def prog(s):
        s += sgl.gen("x")

    state = prog.run(backend=FakeBackend(reply=reply))
    got = []
    reader = threading.Thread(target=lambda: got.append(state.error()))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive()  # as SGLang: error() waits for what was submitted
    gate.set()
    reader.join()
    assert isinstance(got[0], RuntimeError)
    assert sgl.function(lambda s: None).run(backend=FakeBackend()).error() is None
