"""Smaller points where radixlm.lang follows SGLang's frontend (scripted backend, no server)."""
import radixlm as sgl
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.global_config import global_config
from tests.lang.fake_backend import FakeBackend


class FlushCounter(FakeBackend):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush_cache(self) -> str:
        self.flushes += 1
        return "Cache flushed."

    def get_server_info(self) -> dict:
        return {"version": "test"}


def test_flush_cache_and_server_info_without_a_backend(monkeypatch):
    monkeypatch.setattr(global_config, "default_backend", None)
    assert sgl.flush_cache() is False
    assert sgl.get_server_info() is None
    be = FlushCounter()
    assert sgl.flush_cache(be, empty_cache=False) == "Cache flushed." and be.flushes == 1
    monkeypatch.setattr(global_config, "default_backend", be)
    assert sgl.get_server_info() == {"version": "test"}


def test_an_empty_default_system_prompt_adds_no_system_turn():
    roles = {r: (f"<{r}>", f"</{r}>") for r in ("system", "user", "assistant")}
    be = FakeBackend(chat_template=ChatTemplate("empty-system", "", roles))

    @sgl.function
    def prog(s):
        s += sgl.user("hi")

    state = prog.run(backend=be)
    assert [m["role"] for m in state.messages()] == ["user"]
    assert state.text() == "<user>hi</user>"


def test_llama2_style_puts_the_system_message_inside_the_first_user_turn():
    from radixlm.lang.chat_template import ChatTemplateStyle, get_chat_template

    tpl = get_chat_template("llama-2-chat")
    assert tpl.style == ChatTemplateStyle.LLAMA2
    be = FakeBackend(chat_template=tpl, reply=lambda prompt, sp: "Hello!")

    @sgl.function
    def chat(s):
        s += sgl.system("Be kind.")
        s += sgl.user("Hi")
        s += sgl.assistant(sgl.gen("a"))
        s += sgl.user("Bye")

    state = chat.run(backend=be)
    assert state.text() == ("[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi [/INST]Hello! </s><s>"
                            "[INST] Bye [/INST]")


def test_registering_templates_and_model_path_matchers():
    from radixlm.lang.chat_template import (get_chat_template, get_chat_template_by_model_path,
                                            register_chat_template, register_chat_template_matching_function)

    mine = ChatTemplate("parity-test", None, {r: (f"[{r}]", "\n") for r in ("system", "user", "assistant")},
                        audio_token="<aud>")
    register_chat_template(mine)
    assert get_chat_template("parity-test") is mine

    @register_chat_template_matching_function  # as in SGLang, a matcher returns the template itself
    def match_parity(model_path):
        return mine if "parity-model" in model_path else None

    assert get_chat_template_by_model_path("org/parity-model-7b") is mine
    assert get_chat_template_by_model_path("meta-llama/Llama-2-7b-chat-hf").name == "llama-2-chat"
    assert get_chat_template_by_model_path("lmsys/vicuna-7b-v1.5").name == "vicuna_v1.1"
    assert get_chat_template_by_model_path("google/gemma-2-2b-it").name == "gemma-it"


def test_verbosity_2_prints_each_runs_text(monkeypatch, capsys):
    @sgl.function
    def prog(s, x):
        s += "Q: " + x + "\nA:" + sgl.gen("a")

    prog.run(x="hi", backend=FakeBackend())
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(global_config, "verbosity", 2)
    states = prog.run_batch([{"x": "one"}, {"x": "two"}], backend=FakeBackend(reply=lambda p, sp: " ok"))
    out = capsys.readouterr().out
    assert "Q: one\nA: ok\n" in out and "Q: two\nA: ok\n" in out
    assert [st.text() for st in states] == ["Q: one\nA: ok", "Q: two\nA: ok"]


def test_get_prompt_renders_the_messages_as_given():
    # SGLang's ChatTemplate.get_prompt: a system message with content None stands for the default system prompt
    # (skipped without one); no system turn and no assistant prefix are added.
    from radixlm.lang.chat_template import get_chat_template

    msgs = [{"role": "system", "content": None}, {"role": "user", "content": "Hello!"},
            {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "What can you do?"}]
    assert get_chat_template("llama-2-chat").get_prompt(msgs) == (
        "[INST] Hello! [/INST]Hi! </s><s>[INST] What can you do? [/INST]")
    vicuna = get_chat_template("vicuna_v1.1")
    assert vicuna.get_prompt(msgs[:2]) == vicuna.default_system_prompt + " USER:Hello! "
    assert vicuna.get_prompt(msgs[1:2]) == "USER:Hello! "
    # radixlm's rendering with a generation prompt is the model template's add_generation_prompt.
    assert vicuna.get_generation_prompt(msgs[1:2]) == vicuna.default_system_prompt + " USER:Hello! ASSISTANT:"


def test_sglangs_named_chat_templates_exist():
    from radixlm.lang.chat_template import get_chat_template, get_chat_template_by_model_path

    for name in ("default", "claude", "chatml", "chatml-llava", "qwen", "qwen2-vl", "vicuna_v1.1", "llama-2-chat",
                 "mistral", "llama-3-instruct", "llama-3-instruct-llava", "llama-4", "minicpmv", "minicpmo",
                 "janus-pro", "janus", "yi-1.5", "gemma-it", "c4ai-command-r", "granite-3-instruct", "deepseek-v3",
                 "glm-4v"):
        tpl = get_chat_template(name)
        assert set(tpl.role_prefix_and_suffix) >= {"system", "user", "assistant"}, name
    assert get_chat_template("qwen").default_system_prompt == "You are a helpful assistant."
    assert get_chat_template("qwen2-vl").image_token == "<|vision_start|><|image_pad|><|vision_end|>"
    assert get_chat_template("llama-3-instruct").image_token == "<|image|>"
    assert get_chat_template("deepseek-v3").get_prompt([{"role": "user", "content": "1+1?"}]) == "<｜User｜>1+1?"
    assert get_chat_template_by_model_path("Qwen/Qwen2-VL-7B-Instruct").name == "qwen2-vl"
    # With a named template, a program's text follows it.
    tpl = get_chat_template("mistral")

    @sgl.function
    def prog(s):
        s += sgl.system("Be brief.") + sgl.user("Hi") + sgl.assistant(sgl.gen("a"))

    state = prog.run(backend=FakeBackend(chat_template=tpl, reply=lambda p, sp: "Hello"))
    assert state.text() == "[SYSTEM_PROMPT] Be brief. [/SYSTEM_PROMPT][INST] Hi [/INST]Hello </s><s>"


def test_printing_a_state_shows_its_whole_text():
    # SGLang's ProgramState repr waits for the program and shows its text: print(state) right after run().
    @sgl.function
    def prog(s):
        s += "Q: 2+2?\nA:" + sgl.gen("a")

    state = prog.run(backend=FakeBackend(reply=lambda p, sp: " 4", delay=0.2))
    assert repr(state) == "ProgramState(Q: 2+2?\nA: 4)"
    failed = prog.run(backend=FakeBackend(fail_on="A:"))
    assert repr(failed).startswith("ProgramState(Q: 2+2?\nA:, error=RuntimeError(")


def test_text_iter_of_a_variable_without_streaming_yields_its_value():
    # SGLang: a state run without stream=True yields the variable's value once, as it is (n > 1: the list).
    import asyncio

    @sgl.function
    def prog(s):
        s += "Pick: " + sgl.gen("x", n=2)

    state = prog.run(backend=FakeBackend(reply=lambda p, sp: "v"))
    assert list(state.text_iter("x")) == [["v#0", "v#1"]]

    async def collect():
        return [v async for v in state.text_async_iter("x")]

    assert asyncio.run(collect()) == [["v#0", "v#1"]]
