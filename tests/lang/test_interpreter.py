"""The interpreter against a scripted backend: asynchrony, ordering, concurrency of forks, error propagation."""
import time

import pytest

import radixlm as sgl
from radixlm.lang.global_config import global_config
from tests.lang.fake_backend import FakeBackend


def test_submit_is_non_blocking_and_fetch_blocks():
    be = FakeBackend(delay=0.3)

    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("a")

    t0 = time.monotonic()
    state = prog.run(backend=be)
    assert time.monotonic() - t0 < 0.25  # run returned while the gen was still running
    assert state["a"] == "<gen1>"
    assert time.monotonic() - t0 >= 0.3
    assert state.text() == "Q:<gen1>"


def test_primitives_run_in_order_and_see_earlier_output():
    be = FakeBackend(reply=lambda prompt, sp: f"[{len(prompt)}]")

    @sgl.function
    def prog(s, x):
        s += x + sgl.gen("a") + "|"
        s += sgl.gen("b")

    state = prog.run(x="hi", backend=be)
    assert state["a"] == "[2]"
    assert state["b"] == f"[{len('hi[2]|')}]"
    assert [c[1] for c in be.calls] == ["hi", "hi[2]|"]


def test_fork_runs_branches_concurrently_and_join_gathers_lists():
    be = FakeBackend(delay=0.3, reply=lambda prompt, sp: prompt[-1])

    @sgl.function
    def prog(s):
        s += "shared prefix "
        forks = s.fork(3)
        forks += lambda i: str(i)
        forks += sgl.gen("x")
        forks.join()
        s += "done"

    t0 = time.monotonic()
    state = prog.run(backend=be)
    assert state["x"] == ["0", "1", "2"]
    assert time.monotonic() - t0 < 0.8  # three 0.3 s gens overlapped
    assert be.max_active == 3
    # The fork hint: the shared prefix is committed once, before any branch generates.
    assert be.calls[0] == ("commit", "shared prefix ")
    assert sum(1 for kind, _ in be.calls if kind == "commit") == 1
    assert state.text() == "shared prefix done"


def test_fork_prefix_hint_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(global_config, "enable_fork_prefix_hint", False)
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += "prefix"
        forks = s.fork(2)
        forks += sgl.gen("x")
        forks.join()

    prog.run(backend=be).sync()
    assert [k for k, _ in be.calls] == ["gen", "gen"]


def test_fork_items_and_concate_and_append():
    be = FakeBackend(reply=lambda prompt, sp: "!")

    @sgl.function
    def prog(s):
        s += "A"
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"-{i}" + sgl.gen("g")
        assert forks[1]["g"] == "!"
        forks.join(mode="concate_and_append")

    assert prog.run(backend=be).text() == "A-0!-1!"


def test_copy_context_manager():
    be = FakeBackend(reply=lambda prompt, sp: "c")

    @sgl.function
    def prog(s):
        s += "P"
        with s.copy() as c:
            c += sgl.gen("child")
        s += "Q"

    state = prog.run(backend=be)
    assert state["child"] == ["c"]
    assert state.text() == "PQ"


def test_backend_error_reaches_the_caller_and_skips_the_rest():
    be = FakeBackend(fail_on="BOOM")

    @sgl.function
    def prog(s):
        s += "ok" + sgl.gen("a")
        s += "BOOM" + sgl.gen("b")
        s += sgl.gen("c")

    state = prog.run(backend=be)
    assert state["a"] == "<gen1>"  # set before the failure: still readable
    with pytest.raises(sgl.ProgramError) as ei:
        state["b"]
    assert isinstance(ei.value.__cause__, RuntimeError) and "exploded" in str(ei.value)
    with pytest.raises(sgl.ProgramError):
        state.text()
    assert isinstance(state.error(), RuntimeError)
    assert [k for k, _ in be.calls] == ["gen", "gen"]  # "c" never ran


def test_error_inside_the_program_body_propagates():
    @sgl.function
    def prog(s):
        s += "x"
        raise KeyError("user bug")

    with pytest.raises(KeyError, match="user bug"):
        prog.run(backend=FakeBackend())


def test_unknown_variable_is_a_clear_key_error():
    @sgl.function
    def prog(s):
        s += "x"

    with pytest.raises(KeyError, match="nope"):
        prog.run(backend=FakeBackend())["nope"]


def test_chat_roles_default_system_prompt_and_messages():
    be = FakeBackend(reply=lambda prompt, sp: "Paris", chat_template=sgl.lang.chat_template.get_chat_template("smollm2"))

    @sgl.function
    def prog(s):
        s += sgl.user("Capital of France?")
        with s.assistant():
            s += sgl.gen("answer", max_tokens=4)

    state = prog.run(backend=be)
    sys_prompt = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert state.text() == (f"<|im_start|>system\n{sys_prompt}<|im_end|>\n<|im_start|>user\nCapital of France?"
                            "<|im_end|>\n<|im_start|>assistant\nParis<|im_end|>\n")
    assert state.messages() == [{"role": "system", "content": sys_prompt},
                                {"role": "user", "content": "Capital of France?"},
                                {"role": "assistant", "content": "Paris"}]
    assert "<|im_end|>" in be.params[0].stop  # the template's stop string is added to every gen


def test_nested_roles_are_an_error():
    @sgl.function
    def prog(s):
        s += sgl.user_begin() + sgl.assistant_begin()

    state = prog.run(backend=FakeBackend())
    with pytest.raises(sgl.ProgramError, match="cannot nest"):
        state.sync()


def test_var_scope_and_n_samples():
    be = FakeBackend(reply=lambda prompt, sp: "v")

    @sgl.function
    def prog(s):
        with s.var_scope("scoped"):
            s += "a" + sgl.gen("g") + "b"
        s += sgl.gen("many", n=3)

    state = prog.run(backend=be)
    assert state["scoped"] == "avb"
    assert state["many"] == ["v#0", "v#1", "v#2"]
    assert state.text() == "avbv#0"


def test_sampling_params_merge_run_defaults_with_gen():
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += sgl.gen("a", max_tokens=3, stop="\n")
        s += sgl.gen("b")

    prog.run(backend=be, temperature=0.0, max_new_tokens=7, top_k=5).sync()
    a, b = be.params
    assert (a.max_new_tokens, a.temperature, a.top_k) == (3, 0.0, 5)
    assert a.stop == ["\n", "<|im_end|>"]
    assert (b.max_new_tokens, b.stop) == (7, ["<|im_end|>"])


def test_select_and_gen_with_choices():
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += sgl.select("a", choices=["x", "yyy"]) + " "
        s += sgl.gen("b", choices=["zz", "w"])

    state = prog.run(backend=be)
    assert (state["a"], state["b"]) == ("yyy", "zz")
    assert state.text() == "yyy zz"
    assert state.get_meta_info("a") == {"normalized_prompt_logprobs": [0.0, 0.0]}


def test_streaming_text_iter_and_var_iter():
    be = FakeBackend(delay=0.05, reply=lambda prompt, sp: "alpha beta gamma")

    @sgl.function
    def prog(s):
        s += "Q: "
        s += sgl.gen("answer")

    state = prog.run(backend=be, stream=True)
    pieces = list(state.text_iter())
    assert "".join(pieces) == "Q: alpha beta gamma"
    assert len(pieces) >= 2
    state2 = prog.run(backend=be, stream=True)
    assert list(state2.text_iter("answer")) == ["alpha", " beta", " gamma"]
    assert state2.get_meta_info("answer")["output_token_logprobs"] == [[-0.5, i, None] for i in range(3)]


def test_async_stream_with_meta():
    import asyncio

    be = FakeBackend(delay=0.02, reply=lambda prompt, sp: "a b")

    @sgl.function
    def prog(s):
        s += sgl.gen("answer")

    async def consume():
        state = prog.run(backend=be, stream=True)
        return [x async for x in state.text_async_iter("answer", return_meta_data=True)]

    out = asyncio.run(consume())
    assert [c for c, _ in out] == ["a", " b"]
    assert [m["completion_tokens"] for _, m in out] == [1, 2]
    assert all(len(m["output_token_logprobs"]) == 1 for _, m in out)


def test_streaming_error_surfaces_in_iterator():
    @sgl.function
    def prog(s):
        s += "x"
        raise ValueError("late failure")

    state = prog.run(backend=FakeBackend(), stream=True)
    with pytest.raises(sgl.ProgramError, match="late failure"):
        list(state.text_iter())


def test_run_batch_keeps_order_and_isolates_failures():
    be = FakeBackend(delay=0.05, fail_on="bad", reply=lambda prompt, sp: prompt.upper())

    @sgl.function
    def prog(s, word):
        s += word
        s += sgl.gen("out")

    states = prog.run_batch([{"word": "a"}, ("bad",), {"word": "c"}], num_threads=3, progress_bar=True,
                           backend=be)
    assert states[0]["out"] == "A" and states[2]["out"] == "C"
    assert states[1].error() is not None
    gen_states = list(prog.run_batch([{"word": w} for w in "xyz"], generator_style=True, backend=be))
    assert [st["out"] for st in gen_states] == ["X", "Y", "Z"]


def test_without_threads_primitives_run_inline():
    be = FakeBackend(reply=lambda prompt, sp: "r")

    @sgl.function
    def prog(s):
        s += "a" + sgl.gen("x")
        forks = s.fork(2)
        forks += sgl.gen("y")
        forks.join()

    state = prog.run(backend=be, use_thread=False)
    assert state.stream_executor.text_ == "ar"  # already done when run returns
    assert state["y"] == ["r", "r"]
    assert next(state.text_iter()) == "ar"  # a non-streaming state yields its whole text once


def test_images_become_template_tokens_and_message_parts(tmp_path):
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG fake")

    @sgl.function
    def prog(s):
        s += sgl.user(sgl.image(str(png)) + "What is this?")

    state = prog.run(backend=FakeBackend())
    assert "<image>What is this?" in state.text()
    content = state.messages()[0]["content"]
    assert content[0]["image_url"]["url"].startswith("data:image/png;base64,")  # in its token's place
    assert content[1] == {"type": "text", "text": "What is this?"}  # the token itself is not sent


def test_videos_become_template_tokens_and_video_url_parts(tmp_path):
    clip = tmp_path / "x.mp4"
    clip.write_bytes(b"fake video")

    @sgl.function
    def prog(s):
        s += sgl.user("Look: " + sgl.video(str(clip), num_frames=4) + "What happens?")

    state = prog.run(backend=FakeBackend())
    assert "Look: <video>What happens?" in state.text()
    content = state.messages()[0]["content"]
    assert content[0] == {"type": "text", "text": "Look: "}
    assert content[1]["video_url"]["url"].startswith("data:video/mp4;num_frames=4;base64,")
    assert content[2] == {"type": "text", "text": "What happens?"}


def test_missing_image_file_is_a_program_error(tmp_path):
    @sgl.function
    def prog(s):
        s += sgl.image(str(tmp_path / "nope.png"))

    with pytest.raises(sgl.ProgramError, match="nope.png"):
        prog.run(backend=FakeBackend()).sync()
