"""Seeded synthetic data with the paper's shapes. Text is made of common English words (radixlm.bench.datasets
WORDS), each one token for SmolLM2/Llama-style BPE tokenizers when space-separated, so a length in words is close
to a length in tokens. Everything here is deterministic in (seed, scale)."""
from __future__ import annotations

import random
from dataclasses import dataclass

from radixlm.bench.datasets import WORDS

LETTERS = "ABCD"


class TextGen:
    """Word text of a given length; `scale` shrinks every length (at least 1 word) for small CPU runs."""

    def __init__(self, seed: int, scale: float = 1.0) -> None:
        self.rng = random.Random(seed)
        self.scale = scale

    def n(self, words: int) -> int:
        return max(1, round(words * self.scale))

    def words(self, n: int, scaled: bool = True) -> str:
        k = self.n(n) if scaled else max(1, n)
        return " ".join(self.rng.choice(WORDS) for _ in range(k))

    def words_between(self, lo: int, hi: int) -> str:
        return self.words(self.rng.randint(lo, hi))

    def sentence(self, lo: int, hi: int) -> str:
        text = self.words_between(lo, hi)
        return text[:1].upper() + text[1:] + "."


# ---- MMLU 5-shot: subjects, each with 5 fixed examples shared by all its questions
@dataclass
class MultipleChoice:
    question: str
    choices: list[str]
    answer: str  # a letter


def mc_item(g: TextGen, q_words: tuple[int, int] = (20, 60), c_words: tuple[int, int] = (2, 10)) -> MultipleChoice:
    return MultipleChoice(g.sentence(*q_words).rstrip(".") + "?", [g.sentence(*c_words) for _ in LETTERS],
                          g.rng.choice(LETTERS))


def format_mc(item: MultipleChoice, with_answer: bool) -> str:
    lines = [item.question] + [f"{L}. {c}" for L, c in zip(LETTERS, item.choices)]
    return "\n".join(lines) + "\nAnswer:" + (f" {item.answer}\n\n" if with_answer else "")


def mmlu_data(n: int, seed: int, scale: float, num_subjects: int | None = None, shots: int = 5) -> list[dict]:
    """By default one subject per 16 questions (MMLU: 57 subjects, about 250 questions each), at most 57."""
    g = TextGen(seed, scale)
    if num_subjects is None:
        num_subjects = min(57, max(1, -(-n // 16)))
    subjects = []
    for k in range(num_subjects):
        name = f"subject {k}"
        header = f"The following are multiple choice questions (with answers) about {name}.\n\n"
        subjects.append(header + "".join(format_mc(mc_item(g), True) for _ in range(shots)))
    out = []
    for i in range(n):
        item = mc_item(g)
        out.append({"examples": subjects[i % num_subjects], "question": format_mc(item, False),
                    "answer": item.answer})
    return out


# ---- HellaSwag 20-shot: one 20-shot prefix for every question, 4 endings per question
def hellaswag_data(n: int, seed: int, scale: float, shots: int = 20) -> list[dict]:
    g = TextGen(seed, scale)
    prefix = "".join(f"{g.sentence(20, 40)} {g.sentence(8, 20)}\n\n" for _ in range(shots))
    out = []
    for _ in range(n):
        choices = [" " + g.sentence(8, 20) for _ in range(4)]
        out.append({"few_shot": prefix, "context": g.sentence(20, 40), "choices": choices,
                    "label": g.rng.randrange(4)})
    return out


# ---- ReAct agent: a shared instruction + trajectory example, then steps with synthetic observations
def react_data(n: int, seed: int, scale: float, steps: int = 4) -> list[dict]:
    g = TextGen(seed, scale)
    example = "".join(f"Thought {k}: {g.sentence(10, 20)}\nAction {k}: Search[{g.words(3, False)}]\n"
                      f"Observation {k}: {g.sentence(30, 60)}\n" for k in range(1, 4))
    instruction = ("Solve a question answering task with interleaving Thought, Action, Observation steps. "
                   "Action can be Search[entity], Lookup[keyword] or Finish[answer].\nHere is an example.\n"
                   f"Question: {g.sentence(10, 20)}\n{example}\n")
    return [{"instruction": instruction, "question": g.sentence(10, 25),
             "observations": [g.sentence(30, 60) for _ in range(steps)]} for _ in range(n)]


# ---- generative agents: an agent's persona and memories shared by its calls; one agent per 4 programs
def agents_data(n: int, seed: int, scale: float) -> list[dict]:
    g = TextGen(seed, scale)
    agents = []
    for k in range(max(1, -(-n // 4))):
        name = g.words(1, False).title() + f" {k}"
        memories = "".join(f"- {g.sentence(10, 25)}\n" for _ in range(12))
        agents.append(f"Name: {name}\nInnate traits: {g.words(3, False)}\n{g.sentence(60, 100)}\n"
                      f"Memories:\n{memories}")
    return [{"agent": agents[i % len(agents)], "observation": g.sentence(15, 30)} for i in range(n)]


# ---- tree-of-thought (GSM-8K-like): a question, branch plans, solutions, judgements
def tot_data(n: int, seed: int, scale: float) -> list[dict]:
    g = TextGen(seed, scale)
    header = ("Solve the math problem step by step. Propose a plan, carry it out, then check the answer.\n\n"
              + "".join(f"Question: {g.sentence(30, 50)}\nAnswer: {g.sentence(20, 40)} The answer is "
                        f"{g.rng.randint(1, 99)}.\n\n" for _ in range(2)))
    return [{"header": header, "question": g.sentence(30, 60)} for _ in range(n)]


# ---- skeleton-of-thought: a tip question, a skeleton, points expanded in parallel
def sot_data(n: int, seed: int, scale: float) -> list[dict]:
    g = TextGen(seed, scale)
    return [{"question": f"Give some tips on how to {g.words(6, False)}."} for _ in range(n)]


# ---- LLM judge (branch-solve-merge): a question, an answer, criteria judged in branches, a merged verdict
JUDGE_CRITERIA = ["relevance", "accuracy", "depth", "creativity", "clarity"]


def judge_data(n: int, seed: int, scale: float) -> list[dict]:
    g = TextGen(seed, scale)
    return [{"question": g.sentence(15, 30).rstrip(".") + "?", "answer": " ".join(g.sentence(20, 40) for _ in range(4))}
            for _ in range(n)]


# ---- JSON decoding: a description of an entity, extracted into a schema given by a regex
def json_data(n: int, seed: int, scale: float) -> list[dict]:
    g = TextGen(seed, scale)
    return [{"name": g.words(2, False).title(), "document": " ".join(g.sentence(20, 40) for _ in range(6))}
            for _ in range(n)]


# ---- multi-turn chat: 4 turns, each user message 256-512 tokens; output 4-8 (short) or 256-512 (long)
def chat_data(n: int, seed: int, scale: float, long: bool, turns: int = 4) -> list[dict]:
    g = TextGen(seed, scale)
    out = []
    for _ in range(n):
        qs = [g.words_between(256, 512) for _ in range(turns)]
        lens = [g.n(g.rng.randint(256, 512)) if long else g.rng.randint(4, 8) for _ in range(turns)]
        out.append({"questions": qs, "output_lens": lens})
    return out


# ---- DSPy-style RAG: a fixed passage corpus, a retriever, a signature with 3 demos
def rag_corpus(seed: int, scale: float, size: int = 40) -> list[str]:
    g = TextGen(seed + 1, scale)
    return [f"{g.words(3, False).title()} | {g.sentence(40, 80)}" for _ in range(size)]


def retrieve(corpus: list[str], query: str, k: int = 3) -> list[str]:
    """A deterministic toy retriever: the passages sharing the most words with the query (ties: corpus order)."""
    q = set(query.lower().split())
    scored = sorted(range(len(corpus)), key=lambda i: (-len(q & set(corpus[i].lower().split())), i))
    return [corpus[i] for i in scored[:k]]


def rag_data(n: int, seed: int, scale: float) -> list[dict]:
    g = TextGen(seed, scale)
    corpus = rag_corpus(seed, scale)
    demos = "".join(f"Question: {g.sentence(8, 15)}\nAnswer: {g.words(3, False)}\n\n" for _ in range(3))
    return [{"demos": demos, "question": g.sentence(8, 20).rstrip(".") + "?", "corpus": corpus} for _ in range(n)]


# ---- LLaVA-bench: photos of ~1 megapixel, 3 questions of 10-30 words each about one image, one system prompt
LLAVA_SIZES = ((1024, 768), (1280, 960), (768, 1024))
LLAVA_MIN_SIDE = 112


def png(rng: random.Random, size: tuple[int, int]) -> bytes:
    """An image of random pixels (no cache can tell two apart), PNG-encoded."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.frombytes("RGB", size, rng.randbytes(size[0] * size[1] * 3)).save(buf, format="PNG")
    return buf.getvalue()


def llava_data(n: int, seed: int, scale: float, questions: int = 3) -> list[dict]:
    """Image sides shrink with `scale` (to LLAVA_MIN_SIDE at least), so a CPU run encodes small images."""
    g = TextGen(seed, scale)
    system = g.sentence(30, 30)
    out = []
    for i in range(n):
        w, h = (max(LLAVA_MIN_SIDE, round(side * min(1.0, scale))) for side in LLAVA_SIZES[i % len(LLAVA_SIZES)])
        out.append({"image": png(g.rng, (w, h)), "questions": [g.sentence(10, 30) for _ in range(questions)],
                    "system": system})
    return out
