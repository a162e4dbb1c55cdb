"""API speculative execution against a deterministic fake OpenAI client (no server, no network)."""
from types import SimpleNamespace

import radixlm as sgl
from radixlm.lang.ir import SglGen, SglSamplingParams
from radixlm.lang.speculative import first_stop, match_turn, match_turn_prefix
from tests.lang.fake_backend import scripted_chat

DESCRIPTION = "Alice Smith was born on 3 May 1990 and works as a baker in Lyon."
TRUTH = " Alice Smith\nBirthday: 3 May 1990\nJob: baker\n\nDescription:"


class FakeModel:
    """A 'model' that always continues the prompt along `world`: the reply is what follows the longest suffix
    of the prompt found in `world`, cut at a stop string and at max_tokens characters."""

    def __init__(self, world: str) -> None:
        self.world = world
        self.requests: list[dict] = []

    def continuation(self, prompt: str, max_tokens: int, stop) -> str:
        k = len(prompt)
        while k > 0 and prompt[-k:] not in self.world:
            k -= 1
        start = self.world.index(prompt[-k:]) + k if k else 0
        text = self.world[start:start + max_tokens]
        cut = first_stop(text, [stop] if isinstance(stop, str) else list(stop or []))
        return text if cut < 0 else text[:cut]

    def completions_create(self, **kw):
        self.requests.append(kw)
        text = self.continuation(kw["prompt"], kw["max_tokens"], kw.get("stop"))
        return SimpleNamespace(id="x", choices=[SimpleNamespace(text=text, finish_reason="stop", index=0)],
                               usage=SimpleNamespace(prompt_tokens=len(kw["prompt"]), completion_tokens=len(text)))

    def chat_create(self, **kw):
        self.requests.append(kw)
        text = self.world[:kw["max_tokens"]]
        return SimpleNamespace(id="x", choices=[SimpleNamespace(message=SimpleNamespace(content=text),
                                                                finish_reason="stop", index=0)],
                               usage=SimpleNamespace(prompt_tokens=10, completion_tokens=len(text)))


def fake_openai(world: str, chat: bool = False):
    be = sgl.OpenAI("fake", is_chat_model=chat, base_url="http://127.0.0.1:9/v1", api_key="unused")
    model = FakeModel(world)
    be.client = SimpleNamespace(completions=SimpleNamespace(create=model.completions_create),
                                chat=SimpleNamespace(completions=SimpleNamespace(create=model.chat_create)))
    return be, model


def extract(spec_tokens):
    @sgl.function(num_api_spec_tokens=spec_tokens)
    def prog(s, description):
        s += "Description: " + description + "\n"
        s += "Name:" + sgl.gen("name", max_tokens=16, stop="\n")
        s += "\nBirthday:" + sgl.gen("birthday", max_tokens=16, stop="\n")
        s += "\nJob:" + sgl.gen("job", max_tokens=16, stop="\n")
    return prog


def test_completion_speculation_saves_calls_and_keeps_the_values():
    world = "Description: " + DESCRIPTION + "\nName:" + TRUTH
    plain_be, _ = fake_openai(world)
    plain = extract(None).run(description=DESCRIPTION, backend=plain_be)
    spec_be, model = fake_openai(world)
    spec = extract(64).run(description=DESCRIPTION, backend=spec_be)
    assert [plain[k] for k in ("name", "birthday", "job")] == [" Alice Smith", " 3 May 1990", " baker"]
    assert [spec[k] for k in ("name", "birthday", "job")] == [plain[k] for k in ("name", "birthday", "job")]
    assert spec.text() == plain.text()
    assert plain_be.token_usage.num_calls == 3 and spec_be.token_usage.num_calls == 1
    assert spec_be.token_usage.prompt_tokens * 2 < plain_be.token_usage.prompt_tokens
    # The one call over-generated without the stop; the later gens were served from it.
    assert model.requests[0]["max_tokens"] == 64 and "stop" not in model.requests[0]
    assert spec.get_meta_info("job") == {"speculative": True, "completion_tokens": 0}


def test_mismatching_speculation_falls_back_to_real_calls():
    # The model writes "Occupation:" where the program says "Job:": birthday is still served, job is not.
    world = ("Description: " + DESCRIPTION + "\nName: Alice Smith\nBirthday: 3 May 1990\nOccupation: chef\n"
             "\nJob: baker\n")
    be, model = fake_openai(world)
    state = extract(64).run(description=DESCRIPTION, backend=be)
    assert state["name"] == " Alice Smith" and state["birthday"] == " 3 May 1990"
    assert state["job"] == " baker"  # from a second, real call
    assert be.token_usage.num_calls == 2
    assert state.stream_executor.spec.dropped == 1 and state.stream_executor.spec.served == 1


def test_speculation_short_budget_and_gens_without_stop():
    world = "Description: " + DESCRIPTION + "\nName:" + TRUTH
    be, _ = fake_openai(world)
    # 14 characters cover the name and the start of the next line only: birthday needs its own call.
    state = extract(14).run(description=DESCRIPTION, backend=be)
    assert [state[k] for k in ("name", "birthday", "job")] == [" Alice Smith", " 3 May 1990", " baker"]
    assert be.token_usage.num_calls == 3

    @sgl.function(num_api_spec_tokens=64)
    def no_stop(s):
        s += "Description: " + DESCRIPTION + "\nName:" + sgl.gen("name", max_tokens=5)

    be2, model2 = fake_openai(world)
    assert no_stop.run(backend=be2)["name"] == " Alic"[:5]
    assert model2.requests[0]["max_tokens"] == 5  # no stop: nothing to speculate past


def test_chat_speculation_one_call_per_assistant_turn():
    be, model = fake_openai("Name: Alice Smith\nBirthday: 3 May 1990\nJob: baker", chat=True)

    @sgl.function(num_api_spec_tokens=128)
    def prog(s, description):
        s += sgl.user("Extract the fields from: " + description)
        with s.assistant():
            s += "Name: " + sgl.gen("name", stop="\n")
            s += "\nBirthday: " + sgl.gen("birthday", stop="\n")
            s += "\nJob: " + sgl.gen("job", stop="\n")

    state = prog.run(description=DESCRIPTION, backend=be)
    assert [state[k] for k in ("name", "birthday", "job")] == ["Alice Smith", "3 May 1990", "baker"]
    assert be.token_usage.num_calls == 1
    assert state.messages()[-1] == {"role": "assistant",
                                    "content": "Name: Alice Smith\nBirthday: 3 May 1990\nJob: baker"}
    assert model.requests[0]["messages"] == [{"role": "user", "content": "Extract the fields from: " + DESCRIPTION}]


@sgl.function(num_api_spec_tokens=128)
def planet(s):
    # The shape of SGLang's chat speculation test: an example turn, then one assistant turn of three gens.
    s += sgl.system("You answer in the format you are shown.")
    s += sgl.user("Describe a planet.")
    s += sgl.assistant("Planet: Mars\nMoons: 2\nColor: red\n")
    s += sgl.user("Now another one.")
    s += sgl.assistant("Planet:" + sgl.gen("planet", stop="\n") + "\nMoons:" + sgl.gen("moons", stop="\n")
                       + "\nColor:" + sgl.gen("color", stop="\n"))
    s += sgl.user("Thanks.")


def test_chat_speculation_asks_again_when_the_reply_does_not_follow_the_template():
    be, requests = scripted_chat("Sure! Jupiter has 95 moons and is beige.",
                                 "Planet: Jupiter\nMoons: 95\nColor: beige")
    state = planet.run(backend=be)
    assert [state[k] for k in ("planet", "moons", "color")] == [" Jupiter", " 95", " beige"]
    assert len(requests) == 2 and requests[0]["messages"] == requests[1]["messages"]
    assert state.stream_executor.spec.unmatched == 0


def test_chat_speculation_keeps_what_matched_after_three_tries_and_goes_on():
    be, requests = scripted_chat("Planet: Jupiter\nIt has 95 moons.", "I cannot help with that.")
    state = planet.run(backend=be)
    assert state.error() is None  # waits for the program's primitives
    assert len(requests) == 3  # SGLang's spec_max_num_tries
    # The reply that matched furthest fills what it reached; the other gens are left empty.
    assert [state[k] for k in ("planet", "moons", "color")] == [" Jupiter", "", ""]
    assert state.stream_executor.spec.unmatched == 1
    assert [m["role"] for m in state.messages()][-2:] == ["assistant", "user"]  # the program went on
    assert state.messages()[-2]["content"] == "Planet: Jupiter\nMoons:\nColor:"


def test_match_turn():
    def g(name, stop=None):
        return SglGen(name, SglSamplingParams(stop=stop))

    parts = ["Name: ", g("a", "\n"), "\nJob: ", g("b")]
    assert match_turn(parts, "Name: Bo\nJob: cook") == ["Bo", "cook"]
    assert match_turn(parts, " Name: Bo\nJob: cook") is None
    assert match_turn(["  Name: ", g("a"), ", age ", g("b")], "Name: Bo, age 3") == ["Bo", "3"]  # no stops
    assert match_turn(parts, "Name: Bo\nWork: cook") is None
    assert match_turn_prefix(parts, "Name: Bo\nWork: cook") == (["Bo"], False)
    assert match_turn_prefix(parts, "Nom: Bo") == ([], False)
    assert match_turn_prefix(parts, "Name: Bo\nJob: cook") == (["Bo", "cook"], True)
    assert first_stop("abc\ndef", ["\n", "c"]) == 2 and first_stop("abc", ["x"]) == -1
