"""sgl.VertexAI (SGLang's Gemini backend) against a stand-in `vertexai` SDK: the project from $GCP_PROJECT_ID, the
state's turns as Gemini contents (a system turn as a user turn answered "Understood."), a role-less program's text
with its images in place, the generation config, streaming."""
import base64
import sys
import types

import pytest

import radixlm as sgl


class FakeVertex:
    def __init__(self, replies):
        self.replies = list(replies)
        self.inits, self.calls = [], []
        fake = self

        class GenerationConfig:
            def __init__(self, **kw):
                self.kw = kw

        class Image:
            @staticmethod
            def from_bytes(data):
                return ("image", data)

        class GenerativeModel:
            def __init__(self, name):
                self.name = name

            def generate_content(self, contents, generation_config=None, safety_settings=None, stream=False):
                fake.calls.append({"model": self.name, "contents": contents, "config": generation_config.kw,
                                   "safety": safety_settings, "stream": stream})
                text = fake.replies.pop(0)
                if stream:
                    return iter(types.SimpleNamespace(text=t) for t in (text[:3], text[3:]))
                return types.SimpleNamespace(text=text)

        self.gm = types.ModuleType("vertexai.preview.generative_models")
        self.gm.GenerationConfig, self.gm.Image, self.gm.GenerativeModel = GenerationConfig, Image, GenerativeModel
        self.root = types.ModuleType("vertexai")
        self.root.init = lambda **kw: fake.inits.append(kw)
        self.preview = types.ModuleType("vertexai.preview")
        self.preview.generative_models = self.gm
        self.root.preview = self.preview


@pytest.fixture
def vertex(monkeypatch):
    monkeypatch.setenv("GCP_PROJECT_ID", "proj")
    monkeypatch.setenv("GCP_LOCATION", "us-central1")

    def install(*replies):
        fake = FakeVertex(replies)
        for name, mod in (("vertexai", fake.root), ("vertexai.preview", fake.preview),
                          ("vertexai.preview.generative_models", fake.gm)):
            monkeypatch.setitem(sys.modules, name, mod)
        return fake
    return install


def test_chat_turns_become_gemini_contents(vertex):
    fake = vertex("Paris.")

    @sgl.function
    def qa(s):
        s += sgl.system("Be brief.")
        s += sgl.user("Capital of France?")
        s += sgl.assistant(sgl.gen("a", max_tokens=8, stop="\n"))

    backend = sgl.VertexAI("gemini-pro", safety_settings={"x": 1})
    with pytest.warns(UserWarning, match="system"):  # the worker thread warns; the block waits for it
        state = qa.run(backend=backend, temperature=0.5, top_k=5)
        state.sync()
    assert state["a"] == "Paris."
    assert fake.inits == [{"project": "proj", "location": "us-central1"}]
    call, = fake.calls
    assert call["model"] == "gemini-pro" and call["safety"] == {"x": 1} and call["stream"] is False
    assert call["contents"] == [{"role": "user", "parts": [{"text": "System prompt: Be brief."}]},
                                {"role": "model", "parts": [{"text": "Understood."}]},
                                {"role": "user", "parts": [{"text": "Capital of France?"}]}]
    assert call["config"] == {"candidate_count": 1, "max_output_tokens": 8, "stop_sequences": ["\n"],
                              "temperature": 0.5, "top_p": 1.0, "top_k": 5}


def test_role_less_text_with_an_image_in_place_and_streaming(vertex, tmp_path):
    fake = vertex("A red square")
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG data")

    @sgl.function
    def describe(s):
        s += "Look: " + sgl.image(str(png)) + "Describe it: " + sgl.gen("d", max_tokens=8)

    state = describe.run(backend=sgl.VertexAI("gemini-pro-vision"), stream=True)
    assert "".join(state.text_iter("d")) == "A red square"
    call, = fake.calls
    assert call["stream"] is True
    assert call["contents"] == ["Look: ", ("image", b"\x89PNG data"), "Describe it: "]
    assert call["config"]["top_k"] is None and call["config"]["stop_sequences"] is None


def test_images_in_a_user_turn_are_inline_data(vertex, tmp_path):
    fake = vertex("cat")
    png = tmp_path / "x.png"
    png.write_bytes(b"img")

    @sgl.function
    def qa(s):
        s += sgl.user(sgl.image(str(png)) + "What is it?")
        s += sgl.assistant(sgl.gen("a"))

    assert qa.run(backend=sgl.VertexAI("gemini-pro-vision"))["a"] == "cat"
    parts = fake.calls[0]["contents"][0]["parts"]
    assert parts[0] == {"inline_data": {"data": base64.b64encode(b"img").decode(), "mime_type": "image/png"}}
    assert parts[1] == {"text": "What is it?"}


def test_project_and_package_are_required(vertex, monkeypatch):
    vertex()
    monkeypatch.delenv("GCP_PROJECT_ID")
    with pytest.raises(ValueError, match="GCP_PROJECT_ID"):
        sgl.VertexAI("gemini-pro")
    monkeypatch.setitem(sys.modules, "vertexai", None)
    with pytest.raises(ImportError, match="vertexai"):
        sgl.VertexAI("gemini-pro")
