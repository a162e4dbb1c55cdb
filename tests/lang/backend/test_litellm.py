"""sgl.LiteLLM (SGLang's backend over the litellm package) against a stand-in `litellm` module: what a program's
gens send (the state's messages, or its text as one user message; OpenAI-style sampling fields; the client
parameters) and what comes back, streamed or not."""
import sys
import types

import pytest

import radixlm as sgl


class FakeLiteLLM(types.ModuleType):
    num_retries = 3

    def __init__(self, replies):
        super().__init__("litellm")
        self.replies = list(replies)
        self.calls = []

    def completion(self, **kw):
        self.calls.append(kw)
        text = self.replies.pop(0)
        if kw.get("stream"):
            return iter(types.SimpleNamespace(choices=[types.SimpleNamespace(
                delta=types.SimpleNamespace(content=piece))]) for piece in (text[:2], None, text[2:]))
        return types.SimpleNamespace(choices=[types.SimpleNamespace(message=types.SimpleNamespace(content=text))])


@pytest.fixture
def litellm(monkeypatch):
    def install(*replies):
        mod = FakeLiteLLM(replies)
        monkeypatch.setitem(sys.modules, "litellm", mod)
        return mod
    return install


def test_chat_program_sends_messages_and_reads_the_reply(litellm):
    mod = litellm("Paris.", "Lyon.")

    @sgl.function
    def qa(s):
        s += sgl.system("Be brief.")
        s += sgl.user("Capital of France?")
        s += sgl.assistant(sgl.gen("a", max_tokens=8, stop="\n"))
        s += sgl.user("Second city?")
        s += sgl.assistant(sgl.gen("b", max_tokens=8))

    backend = sgl.LiteLLM("gpt-4o-mini", api_key="k")
    state = qa.run(backend=backend, temperature=0)
    assert state["a"] == "Paris." and state["b"] == "Lyon."
    first, second = mod.calls
    assert first["model"] == "gpt-4o-mini" and first["api_key"] == "k" and first["max_retries"] == 3
    assert first["messages"] == [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Capital of France?"}]
    assert first["max_tokens"] == 8 and first["temperature"] == 0 and "\n" in first["stop"]
    assert second["messages"][-2:] == [{"role": "assistant", "content": "Paris."},
                                       {"role": "user", "content": "Second city?"}]
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant", "user", "assistant"]


def test_text_outside_roles_is_one_user_message_and_streams(litellm):
    mod = litellm("Once upon")

    @sgl.function
    def story(s):
        s += "Tell a story: " + sgl.gen("story", max_tokens=4)

    state = story.run(backend=sgl.LiteLLM("claude-3-haiku"), stream=True)
    assert "".join(state.text_iter("story")) == "Once upon"
    assert mod.calls[0]["messages"] == [{"role": "user", "content": "Tell a story: "}]
    assert mod.calls[0]["stream"] is True
    assert state.text() == "Tell a story: Once upon"


def test_constraints_are_refused(litellm):
    litellm("1")

    @sgl.function
    def num(s):
        s += sgl.gen_int("n")

    state = num.run(backend=sgl.LiteLLM("gpt-4o-mini"))
    with pytest.raises(sgl.ProgramError, match="cannot constrain"):
        state["n"]


def test_missing_package_is_an_import_error_at_construction(monkeypatch):
    monkeypatch.setitem(sys.modules, "litellm", None)
    with pytest.raises(ImportError, match="litellm"):
        sgl.LiteLLM("gpt-4o-mini")
