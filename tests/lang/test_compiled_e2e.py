"""Compiled programs and the run_batch prefix hint against one real SmolLM2 server (greedy, short gens)."""
from __future__ import annotations

import uuid

import pytest

import radixlm as sgl
from radixlm.lang.global_config import global_config

pytestmark = pytest.mark.slow


@sgl.function
def tip_suggestion(s, topic):
    s += "Here are two tips for " + topic + ".\n"
    s += "1." + sgl.gen("tip1", max_tokens=6, stop="\n") + "\n"
    s += "2." + sgl.gen("tip2", max_tokens=6, stop="\n") + "\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Expand tip {i + 1}:" + sgl.gen("detail", max_tokens=6, stop="\n")
    s += "Tip 1:" + forks[0]["detail"] + "\nTip 2:" + forks[1]["detail"] + "\n"
    forks.join()
    s += "In summary," + sgl.gen("summary", max_tokens=6)


@sgl.function
def essay_judge(s, essay):
    """The paper's Figure 2 without the image and without the data-dependent early return (not traceable):
    the off-topic check is recorded, and the judgments are joined with `+` instead of str.join."""
    s += "Please evaluate the following essay.\n" + essay + "\n"
    s += "Is the essay off-topic? " + sgl.select("off_topic", choices=["yes", "no"])
    forks = s.fork(3)
    for f, dim in zip(forks, ["Clarity", "Originality", "Evidence"]):
        f += "\nJudge the essay's " + dim + " in a few words: " + sgl.gen("judgment", max_tokens=6, stop="\n")
    s += "\nJudgments: " + forks[0]["judgment"] + " | " + forks[1]["judgment"] + " | " + forks[2]["judgment"]
    forks.join()
    s += "\nIn summary," + sgl.gen("summary", max_tokens=8, stop="\n")
    s += "\nGrade (A-D): " + sgl.select("grade", choices=["A", "B", "C", "D"])


@sgl.function
def chat_select(s, question):
    s += sgl.system("Answer with one word.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.select("answer", choices=["yes", "no", "maybe"]))
    s += sgl.user("Why?")
    s += sgl.assistant(sgl.gen("why", max_tokens=6))


ESSAY = "The forest wakes at dawn. Birds sing, rivers run, and the trees slowly turn green in spring."


@pytest.mark.parametrize("program, kwargs, names", [
    (tip_suggestion, {"topic": "staying healthy"}, ("tip1", "tip2", "detail", "summary")),
    (essay_judge, {"essay": ESSAY}, ("off_topic", "judgment", "summary", "grade")),
    (chat_select, {"question": "Is water wet?"}, ("answer", "why")),
], ids=["fork_join", "figure2", "select_chat"])
def test_compiled_matches_interpreter(backend, program, kwargs, names):
    ref = program.run(**kwargs, temperature=0, backend=backend)
    compiled = program.compile()
    got = compiled.run(**kwargs, temperature=0, backend=backend)
    assert got.text() == ref.text()
    assert {k: got[k] for k in names} == {k: ref[k] for k in names}
    assert got.messages() == ref.messages()


def test_run_batch_prefix_hint_raises_cache_hits(backend):
    def run(hint: bool):
        prefix = f"[{uuid.uuid4().hex[:8]}] " + "You answer questions about geography in one word. " * 10

        @sgl.function
        def qa(s, country):
            s += prefix + "Q: What is the capital of " + country + "?\nA:"
            s += sgl.gen("a", max_tokens=1)

        old = global_config.enable_precache_with_tracing
        global_config.enable_precache_with_tracing = hint
        try:
            states = qa.run_batch([{"country": c} for c in ("France", "Spain", "Peru")], temperature=0,
                                  num_threads=3, backend=backend)
        finally:
            global_config.enable_precache_with_tracing = old
        n = backend.client.post("/tokenize", json={"prompt": prefix}).json()["count"]
        return [st.get_meta_info("a")["cached_tokens"] for st in states], n

    with_hint, n = run(True)
    assert all(c >= n - 2 for c in with_hint), (with_hint, n)  # every item, the first ones included
    without, n2 = run(False)
    assert min(without) < n2 // 2 and sum(without) < sum(with_hint), (without, with_hint)
