"""RuntimeEndpoint's requests and parsing against a scripted HTTP transport (no server)."""
import json

import httpx
import pytest

import radixlm as sgl
from radixlm.lang.backend.base_backend import BackendError
from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint, choice_token_logprobs
from radixlm.lang.ir import REGEX_INT, REGEX_STR

MODEL_INFO = {"model_path": "default", "tokenizer_path": "/nonexistent", "has_image_understanding": False}


class Server:
    """Answers /get_model_info, then pops scripted /generate answers and records the request bodies."""

    def __init__(self, answers=(), model_info=MODEL_INFO):
        self.answers = list(answers)
        self.bodies = []
        self.model_info = model_info

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json=self.model_info)
        self.bodies.append(json.loads(request.content))
        ans = self.answers.pop(0)
        if isinstance(ans, httpx.Response):
            return ans
        return httpx.Response(200, json=ans)

    def endpoint(self, **kw) -> RuntimeEndpoint:
        return RuntimeEndpoint("http://test", transport=httpx.MockTransport(self), **kw)


def run(prog, be, **kw):
    state = prog.run(backend=be, **kw)
    state.sync()
    return state


def test_model_path_picks_the_chat_template():
    assert Server().endpoint().get_chat_template().name == "smollm2"
    assert Server(model_info={**MODEL_INFO, "model_path": "my/odd-model"}).endpoint().get_chat_template().name \
        == "default"
    assert Server().endpoint(chat_template_name="chatml").get_chat_template().name == "chatml"
    with pytest.raises(ValueError, match="unknown chat template"):
        Server().endpoint(chat_template_name="nope")


def test_gen_body_maps_dtype_and_passes_constraints_through():
    srv = Server([{"text": "42", "meta_info": {}}, {"text": "x", "meta_info": {}}, {"text": "{}", "meta_info": {}}])

    @sgl.function
    def prog(s):
        s += "n=" + sgl.gen_int("n", max_tokens=4)
        s += sgl.gen_string("w") + sgl.gen("j", json_schema='{"type": "object"}', return_logprob=True,
                                            top_logprobs_num=2)

    state = run(prog, srv.endpoint(), temperature=0)
    b0, b1, b2 = srv.bodies
    assert b0["text"] == "n=" and b0["sampling_params"]["regex"] == REGEX_INT
    assert b0["sampling_params"]["stop"] == ["<|im_end|>", " ", "\n"]
    assert b0["sampling_params"]["max_new_tokens"] == 4 and b0["sampling_params"]["temperature"] == 0
    assert b1["sampling_params"]["regex"] == REGEX_STR and " " not in b1["sampling_params"]["stop"]
    assert b2["sampling_params"]["json_schema"] == '{"type": "object"}'
    assert (b2["return_logprob"], b2["top_logprobs_num"]) == (True, 2) and "regex" not in b2["sampling_params"]
    assert state.text() == "n=42x{}"


def test_server_error_message_reaches_the_program():
    bad = httpx.Response(400, json={"object": "error", "message": "top_p must be in (0, 1]"})
    srv = Server([bad])

    @sgl.function
    def prog(s):
        s += sgl.gen("x")

    state = prog.run(backend=srv.endpoint())
    with pytest.raises(sgl.ProgramError, match=r"top_p must be in \(0, 1\]") as ei:
        state["x"]
    assert isinstance(ei.value.__cause__, BackendError)


def test_generate_stream_turns_cumulative_chunks_into_deltas():
    chunks = [{"text": "He", "meta_info": {"completion_tokens": 1, "output_token_logprobs": [[-1, 5, None]]}},
              {"text": "Hello", "meta_info": {"completion_tokens": 2,
                                              "output_token_logprobs": [[-1, 5, None], [-2, 6, None]]}}]
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    srv = Server([httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})])

    @sgl.function
    def prog(s):
        s += sgl.gen("g", return_logprob=True)

    state = prog.run(backend=srv.endpoint(), stream=True)
    assert list(state.text_iter("g")) == ["He", "llo"]
    assert state.get_meta_info("g")["output_token_logprobs"] == [[-1, 5, None], [-2, 6, None]]
    assert srv.bodies[0]["stream"] is True


def test_zero_token_gen_reads_the_next_tokens_top_logprobs():
    # Chain-of-thought decoding (an SGLang example): a max_tokens=0 gen asks for the k likeliest next tokens, then
    # one branch continues from each. The server reports them in output_top_logprobs though it generates nothing.
    top3 = [[-0.1, 11, " Yes"], [-1.2, 12, " No"], [-3.0, 13, " Maybe"]]
    srv = Server([{"text": "", "meta_info": {"completion_tokens": 0, "output_token_logprobs": [],
                                             "output_top_logprobs": [top3]}},
                  {"text": "", "meta_info": {}}]  # the fork's prefix hint
                 + [{"text": ", since", "meta_info": {}}] * 3)

    @sgl.function
    def branch_on_first_token(s, question, k):
        s += "Q: " + question + "\nA:"
        probe = s.fork(1)[0]
        probe += sgl.gen("next", max_tokens=0, return_logprob=True, top_logprobs_num=k,
                         return_text_in_logprobs=True)
        candidates = probe.get_meta_info("next")["output_top_logprobs"][0]
        branches = s.fork(k)
        for i, (_, _, token_text) in enumerate(candidates):
            branches[i] += token_text + sgl.gen("rest", max_tokens=4)
        branches.join()

    state = run(branch_on_first_token, srv.endpoint(), question="Is snow cold?", k=3)
    body = srv.bodies[0]
    assert body["sampling_params"]["max_new_tokens"] == 0
    assert (body["return_logprob"], body["top_logprobs_num"], body["return_text_in_logprobs"]) == (True, 3, True)
    assert state["rest"] == [", since"] * 3
    assert sorted(b["text"] for b in srv.bodies[2:]) == sorted(
        f"Q: Is snow cold?\nA:{t}" for t in (" Yes", " No", " Maybe"))


def _lp_answer(*per_choice):
    return [{"text": "", "meta_info": {"input_token_logprobs": lps, "output_token_logprobs": []}}
            for lps in per_choice]


def test_select_requests_and_decision():
    ctx = "The answer is"
    srv = Server([
        {"text": "", "meta_info": {"prompt_tokens": 3}},
        _lp_answer([[-0.2, 1, "answer"], [-0.3, 2, " is"], [-1.0, 7, " yes"]],
                   [[-0.2, 1, "answer"], [-0.3, 2, " is"], [-0.5, 8, " no"]]),
    ])

    @sgl.function
    def prog(s):
        s += ctx + sgl.select("a", [" yes", " no"])

    state = run(prog, srv.endpoint())
    assert state["a"] == " no"
    first, second = srv.bodies
    assert first["sampling_params"]["max_new_tokens"] == 0 and first["text"] == ctx
    assert second["text"] == [ctx + " yes", ctx + " no"] and second["logprob_start_len"] == 1
    meta = state.get_meta_info("a")
    assert meta["normalized_prompt_logprobs"] == [-1.0, -0.5]  # the context tokens are not scored
    assert meta["input_token_logprobs"] == [[[-1.0, 7, " yes"]], [[-0.5, 8, " no"]]]


def test_select_unconditional_method_sends_choice_tokens_alone():
    srv = Server([
        {"text": "", "meta_info": {"prompt_tokens": 2}},
        _lp_answer([[-0.1, 1, "Q"], [-1.0, 7, " a"]], [[-0.1, 1, "Q"], [-2.0, 8, " b"]]),
        _lp_answer([[None, 7, None]], [[None, 8, None]]),
    ])

    @sgl.function
    def prog(s):
        s += "Q" + sgl.select("a", [" a", " b"], choices_method=sgl.unconditional_likelihood_normalized)

    state = run(prog, srv.endpoint())
    assert srv.bodies[2]["input_ids"] == [[7], [8]]
    assert state["a"] == " a"
    assert state.get_meta_info("a")["normalized_unconditional_prompt_logprobs"] == [-1.0, -2.0]


def test_select_rejects_sampling_temperature():
    srv = Server([])

    @sgl.function
    def prog(s):
        s += sgl.select("a", ["x", "y"], temperature=0.7)

    with pytest.raises(sgl.ProgramError, match="temperature must be 0"):
        run(prog, srv.endpoint())


@pytest.mark.parametrize("context,choice,texts,kept", [
    ("The capital is", " Paris", ["capital", " is", " Paris"], [" Paris"]),  # no healing: context tokens drop
    ("The capital is ", "Paris", [" is", " Paris"], [" Paris"]),  # healed: the boundary token is kept
    ("ab", "cd", ["a", "bc", "d"], ["bc", "d"]),  # a token straddling the boundary counts for the choice
    # Texts that do not spell the prompt (a partial UTF-8 piece): SGLang's rule, drop the first if ctx ends so.
    ("xy", "z", ["y", "\ufffdz"], ["\ufffdz"]),
    ("xy", "z", ["?", "z"], ["?", "z"]),
])
def test_choice_token_logprobs(context, choice, texts, kept):
    entries = [[-0.1 * i, i, t] for i, t in enumerate(texts)]
    assert [e[2] for e in choice_token_logprobs(context, choice, entries)] == kept


def test_images_are_refused_by_a_text_only_model(tmp_path):
    png = tmp_path / "x.png"
    png.write_bytes(b"png")

    @sgl.function
    def prog(s):
        s += sgl.image(str(png)) + sgl.gen("x")

    with pytest.raises(sgl.ProgramError, match="does not accept images"):
        run(prog, Server([]).endpoint())


def test_runtime_server_flags_are_checked_before_launch():
    from radixlm.lang.runtime import server_flags

    assert server_flags({"max_total_tokens": 64, "disable_radix_cache": True, "tokenizer_path": None}) == [
        "--max-total-tokens", "64", "--disable-radix-cache"]
    with pytest.raises(ValueError, match="unknown server argument"):
        server_flags({"no_such_flag": 1})


def test_priority_goes_into_the_generate_body():
    srv = Server([{"text": "a", "meta_info": {}}, {"text": "b", "meta_info": {}}])

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", max_tokens=2) + sgl.gen("b", max_tokens=2, priority=9)

    run(prog, srv.endpoint(), priority=3)
    assert [b["priority"] for b in srv.bodies] == [3, 9]  # the run's default, then the gen's own
