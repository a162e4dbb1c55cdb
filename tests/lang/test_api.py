"""The public surface: names, argument checking, expression building, chat templates, the light import."""
import subprocess
import sys

import pytest

import radixlm as sgl
from radixlm.lang.chat_template import get_chat_template, get_chat_template_by_model_path, template_from_jinja
from radixlm.lang.ir import REGEX_INT, SglExprList, SglGen, SglRoleBegin, SglRoleEnd, SglSelect

SGLANG_NAMES = ["Runtime", "assistant", "assistant_begin", "assistant_end", "flush_cache", "function", "gen",
                "gen_int", "gen_string", "get_server_info", "image", "select", "set_default_backend", "system",
                "system_begin", "system_end", "user", "user_begin", "user_end", "video", "RuntimeEndpoint",
                "greedy_token_selection", "token_length_normalized", "unconditional_likelihood_normalized",
                "ServerArgs", "Anthropic", "OpenAI", "LiteLLM", "VertexAI", "global_config", "Engine"]


def test_import_is_light_and_names_resolve():
    code = ("import sys, radixlm as sgl; assert 'torch' not in sys.modules; sgl.gen; sgl.function; "
            "sgl.ServerArgs; assert 'torch' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
    for name in SGLANG_NAMES:
        if name not in ("OpenAI", "Anthropic", "LiteLLM", "VertexAI", "Engine"):  # not built yet / heavy
            assert getattr(sgl, name) is not None, name
    with pytest.raises(AttributeError):
        sgl.no_such_name


def test_function_decorator_forms_and_checks():
    @sgl.function
    def a(s, x):
        pass

    @sgl.function(num_api_spec_tokens=64)
    def b(s):
        pass

    assert b.num_api_spec_tokens == 64 and a.arg_names == ["x"] and a.__name__ == "a"
    with pytest.raises(TypeError, match="named 's'"):
        sgl.function(lambda state: None)
    with pytest.raises(TypeError, match="no parameter"):
        a.bind(y=1)


def test_run_checks_arguments_before_starting():
    from tests.lang.fake_backend import FakeBackend

    @sgl.function
    def prog(s, x):
        s += x

    with pytest.raises(TypeError, match="prog"):
        prog.run(backend=FakeBackend())
    with pytest.raises(TypeError, match="prog"):
        prog.run(x=1, y=2, backend=FakeBackend())
    assert prog.bind(x="bound").run(backend=FakeBackend()).text() == "bound"


def test_gen_validation_and_select_form():
    with pytest.raises(ValueError, match="invalid regex"):
        sgl.gen("x", regex="(")
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen("x", dtype=list)
    with pytest.raises(ValueError, match="max_tokens"):
        sgl.gen("x", max_tokens=-1)
    with pytest.raises(ValueError, match="non-empty"):
        sgl.select("x", [])
    with pytest.raises(TypeError, match="ChoicesSamplingMethod"):
        sgl.select("x", ["a"], choices_method="greedy")
    g = sgl.gen("x", choices=["a", "b"], choices_method=sgl.greedy_token_selection)
    assert isinstance(g, SglSelect) and g.temperature == 0.0 and g.choices_method is sgl.greedy_token_selection
    gi = sgl.gen_int("n")
    assert isinstance(gi, SglGen) and gi.sampling_params.dtype == "int" and gi.sampling_params.max_new_tokens is None
    assert sgl.gen("f", dtype=float).sampling_params.dtype == "float"
    assert REGEX_INT == r"[-+]?[0-9]+[ \n]*"


def test_expression_building():
    e = "Q: " + sgl.gen("a") + "\n"
    assert isinstance(e, SglExprList) and len(e.expr_list) == 3
    roles = sgl.user("hi").expr_list
    assert isinstance(roles[0], SglRoleBegin) and roles[0].role == "user" and isinstance(roles[-1], SglRoleEnd)
    assert isinstance(sgl.assistant_begin(), SglRoleBegin)
    from tests.lang.fake_backend import FakeBackend

    @sgl.function
    def prog(s):
        s += None

    with pytest.raises(ValueError, match="None"):
        prog.run(backend=FakeBackend())


SMOLLM_JINJA = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                "{% endif %}")


def test_chat_template_from_the_models_jinja():
    tpl = template_from_jinja(SMOLLM_JINJA)
    assert tpl.default_system_prompt == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert tpl.get_generation_prompt([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    plain = template_from_jinja("{{'<|im_start|>' + message['role'] + '\n' + message['content']}}")
    assert plain.default_system_prompt is None
    assert template_from_jinja("{{ messages }}") is None


def test_chat_template_registry():
    assert get_chat_template_by_model_path("HuggingFaceTB/SmolLM2-135M-Instruct").name == "smollm2"
    assert get_chat_template_by_model_path("Qwen/Qwen2.5-0.5B-Instruct").name == "qwen2.5"
    assert get_chat_template_by_model_path("something-else").name == "default"
    with pytest.raises(ValueError, match="no role"):
        get_chat_template("chatml").get_prefix_and_suffix("tool", [])
