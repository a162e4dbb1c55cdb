"""SGLang-style programs against one real SmolLM2 server, started through `sgl.Runtime`.

Generations are short (a few tokens) to keep the module fast on CPU."""
from __future__ import annotations

import asyncio
import json
import re
import uuid

import httpx
import pytest

import radixlm as sgl
from radixlm.lang.backend.base_backend import BackendError
from radixlm.lang.global_config import global_config
from radixlm.lang.ir import REGEX_STR

pytestmark = pytest.mark.slow


def nonce() -> str:
    """A unique opening so that a test's prompts miss the cache left by other tests."""
    return f"[{uuid.uuid4().hex[:8]}] "


def test_runtime_endpoint_picks_the_models_chat_template(backend):
    tpl = backend.get_chat_template()
    assert tpl.default_system_prompt.startswith("You are a helpful AI assistant named SmolLM")
    # The frontend renders a conversation exactly as the server's own template does.
    msgs = [{"role": "user", "content": "Hello there"}]
    ours = backend.client.post("/tokenize", json={"prompt": tpl.get_generation_prompt(msgs)}).json()["tokens"]
    theirs = backend.client.post("/tokenize", json={"messages": msgs}).json()["tokens"]
    assert ours == theirs


def test_few_shot_qa(backend):
    @sgl.function
    def few_shot_qa(s, question):
        s += "The following are questions with answers.\n\n"
        s += "Q: What is the capital of Germany?\nA: Berlin\n\n"
        s += "Q: What is the capital of Italy?\nA: Rome\n\n"
        s += "Q: " + question + "\nA:" + sgl.gen("answer", stop="\n", temperature=0, max_tokens=6)

    state = few_shot_qa.run(question="What is the capital of France?", backend=backend)
    assert "paris" in state["answer"].lower()
    meta = state.get_meta_info("answer")
    assert meta["prompt_tokens"] > 20 and 1 <= meta["completion_tokens"] <= 6


def test_multi_turn_chat(backend):
    @sgl.function
    def chat(s, q1, q2):
        s += sgl.system("You are brief.")
        s += sgl.user(q1)
        s += sgl.assistant(sgl.gen("a1", max_tokens=8))
        with s.user():
            s += q2
        with s.assistant():
            s += sgl.gen("a2", max_tokens=8)

    state = chat.run(q1="Name a color.", q2="Another one?", temperature=0, backend=backend)
    msgs = state.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[2]["content"] == state["a1"].strip() and state["a2"]
    assert state.text().startswith("<|im_start|>system\nYou are brief.<|im_end|>\n")
    assert "<|im_end|>" not in state["a1"]


def test_select_scores_the_choice_tokens_with_token_healing(backend):
    @sgl.function
    def pick(s, ctx, method):
        s += ctx + sgl.select("city", choices=[" Paris", " London", " Tokyo"], choices_method=method)

    for method in (sgl.token_length_normalized, sgl.greedy_token_selection,
                   sgl.unconditional_likelihood_normalized):
        state = pick.run(ctx="The capital of France is", method=method, backend=backend)
        assert state["city"] == " Paris", method
    meta = pick.run(ctx="The capital of France is", method=sgl.token_length_normalized,
                    backend=backend).get_meta_info("city")
    # Each choice is one token here; only it (not the context) is scored.
    assert [len(x) for x in meta["input_token_logprobs"]] == [1, 1, 1]
    assert meta["input_token_logprobs"][0][0][2] == " Paris"
    # A context ending in a space merges with the choice (" Paris" is one token): the healed token is scored.
    @sgl.function
    def healed(s):
        s += "The capital of France is " + sgl.select("city", choices=["Paris", "London"])

    hmeta = healed.run(backend=backend).get_meta_info("city")
    assert [e[2] for e in hmeta["input_token_logprobs"][0]] == [" Paris"]
    assert hmeta["normalized_prompt_logprobs"][0] == pytest.approx(meta["normalized_prompt_logprobs"][0], abs=1e-3)


def test_select_true_false_unknown(backend):
    @sgl.function
    def judge(s, claim):
        s += sgl.user("Is this true: " + claim + "?")
        s += sgl.assistant(sgl.select("answer", ["True", "False", "Unknown"]))

    state = judge.run(claim="The sky is green", backend=backend)
    assert state["answer"] in ("True", "False", "Unknown")
    assert len(state.get_meta_info("answer")["normalized_prompt_logprobs"]) == 3


def test_fork_prefix_hint_raises_cache_hits(backend):
    def run(hint: bool):
        old = global_config.enable_fork_prefix_hint
        global_config.enable_fork_prefix_hint = hint
        metas = []
        try:
            @sgl.function
            def branches(s, prefix):
                s += prefix
                forks = s.fork(3)
                forks += lambda i: f" Branch {i}:"
                forks += sgl.gen("out", max_tokens=1, temperature=0)
                for f in forks:
                    metas.append(f.get_meta_info("out"))

            prefix = nonce() + "A long shared document about gardens, rivers and mountains. " * 12
            branches.run(prefix=prefix, backend=backend).sync()
        finally:
            global_config.enable_fork_prefix_hint = old
        n_prefix = backend.client.post("/tokenize", json={"prompt": prefix}).json()["count"]
        return [m["cached_tokens"] for m in metas], n_prefix

    with_hint, n = run(True)
    assert all(c >= n - 2 for c in with_hint), (with_hint, n)  # every branch found the prefix cached
    without, _ = run(False)
    # Without the hint the first branch to arrive prefills the (never seen) prefix itself.
    assert min(without) < n // 2 and sum(without) < sum(with_hint), (without, with_hint)


def test_parallel_decoding_with_fork(backend):
    @sgl.function
    def tips(s, topic):
        s += "Here are two tips for " + topic + ".\n1." + sgl.gen("tip1", max_tokens=6, stop="\n") + "\n"
        s += "2." + sgl.gen("tip2", max_tokens=6, stop="\n") + "\n"
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"Expand tip {i + 1}:" + sgl.gen("detail", max_tokens=6, stop="\n")
        forks.join()
        s += "In summary," + sgl.gen("summary", max_tokens=6)

    state = tips.run(topic="staying healthy", temperature=0, backend=backend)
    assert isinstance(state["detail"], list) and len(state["detail"]) == 2
    assert isinstance(state["summary"], str)
    assert state.text().endswith(state["summary"])


def test_parallel_encoding_concate_and_append(backend):
    docs = ["Alice works as a baker in Lyon.", "Bob is a pilot based in Oslo.", "Chen teaches math in Taipei."]

    @sgl.function
    def answer(s, question):
        s += "Read the documents.\n"
        forks = s.fork(len(docs))
        forks += lambda i: f"Document {i + 1}: {docs[i]}\n"  # each branch encodes its document on its own
        forks.join(mode="concate_and_append")
        s += "Question: " + question + "\nAnswer:" + sgl.gen("answer", max_tokens=6, stop="\n")

    state = answer.run(question="Who lives in Oslo?", temperature=0, backend=backend)
    text = state.text()
    assert all(f"Document {i + 1}: {d}" in text for i, d in enumerate(docs))
    assert text.index("Document 1") < text.index("Document 2") < text.index("Document 3") < text.index("Question:")
    assert isinstance(state["answer"], str)


def test_tool_use_stop_and_python_control_flow(backend):
    @sgl.function
    def react(s, question):
        s += "Question: " + question + "\n"
        for step in range(3):
            s += f"Action {step}:" + sgl.select(f"action_{step}", choices=[" calculate", " finish"])
            if s[f"action_{step}"] == " finish":
                break
            s += "(" + sgl.gen(f"arg_{step}", max_tokens=8, stop=")") + ")\n"
        s += "Answer:" + sgl.gen("answer", max_tokens=4, stop="\n")

    state = react.run(question="What is 3 times 4?", temperature=0, backend=backend)
    steps = [k for k in ("action_0", "action_1", "action_2") if k in state]
    assert steps and all(state[k] in (" calculate", " finish") for k in steps)
    for i in range(3):
        if f"arg_{i}" in state:
            assert ")" not in state[f"arg_{i}"]


def test_streaming_text_and_logprobs(backend):
    @sgl.function
    def qa(s, q):
        s += "Q: " + q + "\nA:" + sgl.gen("answer", max_tokens=8, return_logprob=True, ignore_eos=True)

    state = qa.run(q="Why is the sky blue?", temperature=0, stream=True, backend=backend)
    pieces = list(state.text_iter("answer"))
    assert len(pieces) >= 2 and "".join(pieces) == state["answer"]

    async def consume():
        st = qa.run(q="Why is the sky blue?", temperature=0, stream=True, backend=backend)
        return st, [x async for x in st.text_async_iter("answer", return_meta_data=True)]

    st, chunks = asyncio.run(consume())
    assert all(c for c, _ in chunks)
    prev = 0
    for _, meta in chunks:
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - prev
        prev = meta["completion_tokens"]
    final = st.get_meta_info("answer")
    assert final["completion_tokens"] == len(final["output_token_logprobs"]) == 8


def test_zero_token_gen_reports_the_next_tokens_top_logprobs(backend):
    # Chain-of-thought decoding reads the top-k next tokens from a max_tokens=0 gen (as in SGLang).
    @sgl.function
    def prog(s, budget):
        s += "The capital of France is" + sgl.gen("next", max_tokens=budget, return_logprob=True, top_logprobs_num=3,
                                                   return_text_in_logprobs=True)

    meta = prog.run(budget=0, temperature=0, backend=backend).get_meta_info("next")
    assert meta["completion_tokens"] == 0 and meta["output_token_logprobs"] == []
    top = meta["output_top_logprobs"]
    assert len(top) == 1 and len(top[0]) == 3 and all(isinstance(t[2], str) for t in top[0])
    one = prog.run(budget=1, temperature=0, backend=backend).get_meta_info("next")
    # The same distribution: the one after the prompt, whose argmax the greedy one-token gen picked.
    assert [t[1] for t in top[0]] == [t[1] for t in one["output_top_logprobs"][0]]
    assert [t[0] for t in top[0]] == pytest.approx([t[0] for t in one["output_top_logprobs"][0]], abs=1e-3)
    assert one["output_token_logprobs"][0][1] == top[0][0][1]


def test_min_tokens(backend):
    @sgl.function
    def prog(s):
        s += "Say hi." + sgl.gen("x", min_tokens=6, max_tokens=7, stop=".")

    assert prog.run(temperature=0, backend=backend).get_meta_info("x")["completion_tokens"] >= 6


def test_run_batch_matches_single_runs(backend):
    @sgl.function
    def capital(s, country):
        s += "The capital of " + country + " is" + sgl.gen("c", max_tokens=3, stop="\n")

    countries = ["France", "Japan", "Spain"]
    states = capital.run_batch([{"country": c} for c in countries], temperature=0, progress_bar=True,
                               backend=backend)
    assert [st["c"] for st in states] == [capital.run(country=c, temperature=0, backend=backend)["c"]
                                          for c in countries]


def multi_dimensional_judge(use_regex: bool):
    """The paper's Figure 2 program (the image left out: radixlm serves text models only)."""
    schema = r'\{"summary": "[\w\d .,]{1,40}", "grade": "[ABCD][+-]?"\}'

    @sgl.function
    def judge(s, essay):
        s += "Please evaluate the following essay.\n" + essay + "\n"
        # The paper asks "is it related?"; SmolLM2-135M answers "no" to nearly every yes/no question, so the
        # question is turned around to reach the interesting branch.
        s += "Is the essay off-topic? " + sgl.select("off_topic", choices=["yes", "no"])
        if s["off_topic"] == "yes":
            return
        forks = s.fork(3)
        for f, dim in zip(forks, ["Clarity", "Originality", "Evidence"]):
            f += "\nJudge the essay's " + dim + " in a few words: " + sgl.gen("judgment", max_tokens=6, stop="\n")
        forks.join()
        s += "\nJudgments: " + " | ".join(s["judgment"])
        s += "\nIn summary," + sgl.gen("summary", max_tokens=8, stop="\n")
        s += "\nGrade (A-D): " + sgl.select("grade", choices=["A", "B", "C", "D"])
        if use_regex:
            s += "\nReturn in JSON.\n" + sgl.gen("output", max_tokens=40, regex=schema)

    return judge


ESSAY = "The forest wakes at dawn. Birds sing, rivers run, and the trees slowly turn green in spring."


def test_figure2_program(backend):
    state = multi_dimensional_judge(False).run(essay=ESSAY, temperature=0, backend=backend)
    assert state["off_topic"] == "no"
    assert len(state["judgment"]) == 3 and all(isinstance(j, str) for j in state["judgment"])
    assert state["grade"] in ("A", "B", "C", "D") and isinstance(state["summary"], str)
    assert "Judgments: " + " | ".join(state["judgment"]) in state.text()


def test_server_error_surfaces_with_its_message(backend):
    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("y", top_p=5.0)

    state = prog.run(backend=backend)
    with pytest.raises(sgl.ProgramError, match="top_p"):
        state["y"]


def test_flush_cache_and_server_info(backend):
    sgl.set_default_backend(backend)
    try:
        info = sgl.get_server_info()
        assert info["internal_states"][0]["max_total_num_tokens"] > 0
        assert "flushed" in sgl.flush_cache().lower()
    finally:
        sgl.set_default_backend(None)


def test_endpoint_unreachable_is_a_clear_error():
    with pytest.raises(BackendError, match="failed") as ei:
        sgl.RuntimeEndpoint("http://127.0.0.1:9", timeout=2)
    assert isinstance(ei.value.__cause__, httpx.HTTPError)


# ---- regex-constrained decoding
def test_figure2_program_with_regex(backend):
    state = multi_dimensional_judge(True).run(essay=ESSAY, temperature=0, backend=backend)
    assert state["off_topic"] == "no"
    json.loads(state["output"])


def test_decode_int_and_regex(backend):
    @sgl.function
    def prog(s):
        s += "2 + 2 = " + sgl.gen_int("n", max_tokens=4)
        s += "\nAn IP address: " + sgl.gen("ip", max_tokens=16, regex=r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}"
                                                                         r"(25[0-5]|2[0-4]\d|1?\d?\d)")
        s += "\nA name: " + sgl.gen_string("name", max_tokens=6)

    state = prog.run(temperature=0, backend=backend)
    int(state["n"].strip())
    assert re.fullmatch(r"(\d+\.){3}\d+", state["ip"])


def test_gen_string_values_stay_inside_sglangs_string_contract(backend):
    # Sampled (temperature 1), so each program draws other tokens: every value is a quoted run of word characters,
    # digits and whitespace; only a value cut at the token limit may lack its closing quote.
    @sgl.function
    def prog(s, topic):
        s += f"Write a JSON object about {topic}.\n" + '{"name": ' + sgl.gen_string("name", max_tokens=12)
        s += ', "place": ' + sgl.gen("place", dtype=str, max_tokens=12)

    topics = ["a city", "a river", "a cat", "a song", "a chemist", "a mountain", "a ship", "a tree"]
    states = prog.run_batch([{"topic": t} for t in topics], temperature=1.0, backend=backend)
    closed = 0
    for state in states:
        for name in ("name", "place"):
            value = state[name]
            if state.get_meta_info(name)["finish_reason"]["type"] == "length":
                assert re.fullmatch(r'"[\w\d\s]*"?', value, re.ASCII), value
            else:
                assert re.fullmatch(REGEX_STR, value, re.ASCII), value
                closed += 1
    assert closed > 0


def test_decode_json(backend):
    @sgl.function
    def prog(s):
        s += "A city as JSON:\n"
        with s.var_scope("json_output"):
            # As in SGLang, gen_string writes the string's quotes itself.
            s += '{\n  "name": ' + sgl.gen_string("name", max_tokens=24) + ',\n'
            s += '  "population": ' + sgl.gen("population", dtype=int, max_tokens=6) + "\n}"

    state = prog.run(temperature=0, backend=backend)
    obj = json.loads(state["json_output"])
    assert isinstance(obj["name"], str) and json.loads(state["name"]) == obj["name"]
    assert isinstance(obj["population"], int)
