"""`separate_reasoning` (SGLang's `sgl.separate_reasoning`): the split, and programs using it (scripted backend)."""
import pytest

import radixlm as sgl
import radixlm.lang as lang
from radixlm.lang.reasoning import split_reasoning
from tests.lang.fake_backend import FakeBackend, scripted_chat


@pytest.mark.parametrize("model_type,text,expected", [
    ("deepseek-r1", "<think>2+2 is 4</think>The answer is 4.", ("2+2 is 4", "The answer is 4.")),
    ("deepseek-r1", "2+2 is 4</think>The answer is 4.", ("2+2 is 4", "The answer is 4.")),  # R1: no start tag
    ("deepseek-r1", "still thinking", ("still thinking", "")),  # cut before the end tag
    ("qwen3", "The answer is 4.", ("", "The answer is 4.")),  # not thinking at all
    ("qwen3", "<think>hmm</think>\n\n4", ("hmm", "\n\n4")),
    ("qwen3", "<think>look it up<tool_call>{}</tool_call>", ("look it up", "<tool_call>{}</tool_call>")),
    ("qwen3-thinking", "hmm</think>4", ("hmm", "4")),
    ("kimi", "◁think▷hmm◁/think▷4", ("hmm", "4")),
    ("DeepSeek-R1", "a</think>b", ("a", "b")),  # names are case-insensitive
])
def test_split_reasoning(model_type, text, expected):
    assert split_reasoning(model_type, text) == expected


def test_bad_arguments_fail_when_the_program_is_written():
    with pytest.raises(ValueError, match="unsupported reasoning model type"):
        lang.separate_reasoning(sgl.gen("a"), model_type="no-such-model")
    with pytest.raises(ValueError, match="needs a model_type"):
        lang.separate_reasoning(sgl.gen("a"))
    with pytest.raises(ValueError, match="named gen"):
        lang.separate_reasoning(sgl.gen(), model_type="qwen3")


@sgl.function
def qa(s, question):
    s += sgl.user(question)
    s += sgl.assistant(lang.separate_reasoning(sgl.gen("answer", max_tokens=64), model_type="deepseek-r1"))


def thinking_backend() -> FakeBackend:
    return FakeBackend(reply=lambda prompt, sp: "<think>2+2 is 4</think>The answer is 4.")


def test_program_keeps_the_answer_and_the_reasoning_apart():
    state = qa.run(question="What is 2+2?", backend=thinking_backend())
    assert state["answer"] == "The answer is 4."
    assert state["answer_reasoning_content"] == "2+2 is 4"
    assert state.messages()[-1] == {"role": "assistant", "content": "The answer is 4."}
    assert "<think>" not in state.text() and state.text().endswith("The answer is 4.<|im_end|>\n")


def test_separated_variables_reach_later_primitives_and_the_tracer():
    @sgl.function
    def prog(s):
        s += "Q:" + lang.separate_reasoning(sgl.gen("a"), model_type="deepseek-r1") + "\n"
        s += "Why? " + s["a_reasoning_content"]

    state = prog.run(backend=thinking_backend())
    assert state.text() == "Q:The answer is 4.\nWhy? 2+2 is 4"
    graph = prog.trace()
    assert graph.main.defined.keys() >= {"a", "a_reasoning_content"}


def test_nothing_is_separated_while_streaming():
    # As SGLang: in stream mode the output stays whole and no reasoning variable is set.
    be = FakeBackend(reply=lambda prompt, sp: "<think>x</think> y")
    state = qa.run(question="?", stream=True, backend=be)
    assert "".join(state.text_iter("answer")) == "<think>x</think> y"
    assert "answer_reasoning_content" not in state


def test_separate_reasoning_is_a_top_level_name():
    assert sgl.separate_reasoning is lang.separate_reasoning


def test_chat_speculation_generates_the_turn_before_splitting_it():
    be, requests = scripted_chat("<think>easy</think>4")

    @sgl.function(num_api_spec_tokens=64)
    def prog(s):
        s += sgl.user("2+2?")
        s += sgl.assistant(lang.separate_reasoning(sgl.gen("answer"), model_type="qwen3"))

    state = prog.run(backend=be)
    assert (state["answer"], state["answer_reasoning_content"]) == ("4", "easy")
    assert state.messages()[-1] == {"role": "assistant", "content": "4"} and len(requests) == 1
