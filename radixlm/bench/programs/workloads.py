"""The paper's workloads as radixlm programs (`import radixlm as sgl` style), and how to build their inputs.

Every output budget is scaled with the data (`tok(x)`), so a small `scale` makes a whole run short on a CPU."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import radixlm.lang as sgl
from radixlm.bench.programs import data as D

# The JSON decoding workload's schema, as a regular expression (fixed key order and spacing, as in the paper).
JSON_STR = r'"[\w\d\s]{1,16}"'
JSON_REGEX = (r'\{\n  "name": ' + JSON_STR + r',\n  "country": ' + JSON_STR + r',\n  "population": \d{1,9},\n'
              r'  "tags": \[' + JSON_STR + ", " + JSON_STR + r'\],\n  "is_capital": (true|false)\n\}')


def tok(x: int, scale: float) -> int:
    return max(1, round(x * scale))


@sgl.function
def mmlu(s, examples, question):
    s += examples + question
    s += sgl.gen("answer", max_tokens=1, temperature=0)


@sgl.function
def hellaswag(s, few_shot, context, choices):
    s += few_shot + context
    s += sgl.select("answer", choices=choices)


@sgl.function
def react(s, instruction, question, observations, budget):
    s += instruction + "Question: " + question + "\n"
    for k, obs in enumerate(observations, 1):
        s += f"Thought {k}:" + sgl.gen(f"thought_{k}", max_tokens=budget["thought"], stop="\n")
        s += f"\nAction {k}:" + sgl.gen(f"action_{k}", max_tokens=budget["action"], stop="\n")
        s += f"\nObservation {k}: {obs}\n"


@sgl.function
def generative_agent(s, agent, observation, budget):
    """One step of a generative agent: plan, decide whether to react to an observation, then speak."""
    s += agent + f"\nCurrent observation: {observation}\n"
    s += "Plan for the next hour:" + sgl.gen("plan", max_tokens=budget["plan"], stop="\n")
    s += "\nShould the agent react to the observation? Answer:" + sgl.select("react", choices=[" yes", " no"])
    s += "\nWhat does the agent say?" + sgl.gen("utterance", max_tokens=budget["utterance"], stop="\n")


@sgl.function
def tree_of_thought(s, header, question, budget, num_plans=3, num_solutions=2):
    """Plans in branches; each plan's solutions in branches of the branch; each solution judged with select."""
    s += header + "Question: " + question + "\n"
    plans = s.fork(num_plans)
    plans += lambda i: f"Plan {i + 1}:" + sgl.gen("plan", max_tokens=budget["plan"], stop="\n\n")
    solutions = []
    for p in plans:
        sols = p.fork(num_solutions)
        sols += "\nSolution:" + sgl.gen("solution", max_tokens=budget["solution"], stop="\n\n")
        sols += "\nIs this solution correct? Answer:" + sgl.select("correct", choices=[" yes", " no"])
        solutions.append(sols)
    votes = [st["correct"] for sols in solutions for st in sols]
    s += f"\nVotes: {votes.count(' yes')} of {len(votes)} solutions judged correct.\n"


@sgl.function
def skeleton_of_thought(s, question, budget, num_points=3):
    s += ("You are an organizer. Answer with a skeleton of short points, then expand each point.\n\n"
          f"Question: {question}\nSkeleton:\n")
    for k in range(num_points):
        s += f"{k + 1}." + sgl.gen(f"point_{k}", max_tokens=budget["point"], stop="\n") + "\n"
    forks = s.fork(num_points)
    forks += lambda i: (f"\nExpand point {i + 1} in a few sentences.\nPoint {i + 1}:"
                        + sgl.gen("expansion", max_tokens=budget["expansion"]))
    forks.join()


@sgl.function
def llm_judge(s, question, answer, budget):
    """Branch-solve-merge: one branch per criterion, then a merged verdict."""
    s += ("Please act as an impartial judge and evaluate the answer to the question below.\n\n"
          f"Question: {question}\nAnswer: {answer}\n")
    forks = s.fork(len(D.JUDGE_CRITERIA))
    forks += lambda i: (f"\nJudge the answer on {D.JUDGE_CRITERIA[i]} only.\nJudgement:"
                        + sgl.gen("judgement", max_tokens=budget["judgement"], stop="\n"))
    forks.join()
    s += "\nJudgements:\n" + "".join(f"- {c}: {j.strip()}\n" for c, j in zip(D.JUDGE_CRITERIA, s["judgement"]))
    s += "Overall score from 1 to 10:" + sgl.gen("score", max_tokens=3, stop="\n")


@sgl.function
def json_decode(s, name, document):
    s += ("Extract the information about the entity from the document below into JSON with the fields name, "
          "country, population, tags and is_capital.\n\n")
    s += f"Entity: {name}\nDocument: {document}\nJSON:\n"
    s += sgl.gen("json", max_tokens=128, regex=JSON_REGEX)


@sgl.function
def multi_turn_chat(s, questions, output_lens):
    for k, (q, n) in enumerate(zip(questions, output_lens)):
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen(f"answer_{k}", max_tokens=n, ignore_eos=True))


RAG_HEADER = ("Answer questions with short factoid answers.\n\n---\n\nFollow the following format.\n\n"
              "Context: may contain relevant facts\n\nQuestion: ${question}\n\n"
              "Reasoning: Let's think step by step in order to ${produce the answer}. We ...\n\n"
              "Answer: often between 1 and 5 words\n\n---\n\n")


@sgl.function
def rag(s, demos, context, question, budget):
    """DSPy's basic RAG (retrieve, then ChainOfThought(GenerateAnswer)) written out as its prompt."""
    s += RAG_HEADER + demos + "---\n\nContext:\n"
    s += "".join(f"[{i + 1}] «{p}»\n" for i, p in enumerate(context))
    s += f"\nQuestion: {question}\n\nReasoning: Let's think step by step in order to"
    s += sgl.gen("reasoning", max_tokens=budget["reasoning"], stop="\n")
    s += "\n\nAnswer:" + sgl.gen("answer", max_tokens=budget["answer"], stop="\n")


@sgl.function
def image_qa(s, image, questions, system, max_tokens, sink=None):
    """LLaVA-bench: one image, then each question in a branch (the fork's hint prefills the image prefix once).
    sink: a dict that gets image -> [(meta_info, answer)] in question order (benchmarks/programs/llava_bench.py)."""
    s += sgl.system(system)
    s += sgl.user_begin() + sgl.image(image)
    forks = s.fork(len(questions))
    for f, q in zip(forks, questions):
        f += q + sgl.user_end()
        f += sgl.assistant(sgl.gen("answer", max_tokens=max_tokens, ignore_eos=True))
    forks.join()
    if sink is not None:
        sink[image] = [(f.get_meta_info("answer"), f["answer"]) for f in forks]


@dataclass
class Workload:
    name: str
    program: Any  # an SglFunction
    build: Callable[[int, int, float], list[dict]]  # (n, seed, scale) -> one argument dict per program instance
    description: str
    label_key: Optional[str] = None  # an argument that is the label (removed before running; used for accuracy)
    answer_var: Optional[str] = None
    needs: tuple[str, ...] = field(default_factory=tuple)  # "regex", "select", "image": what the program uses

    def instances(self, n: int, seed: int, scale: float) -> tuple[list[dict], list[Any]]:
        """The argument dicts to run, and the labels (None where the workload has none)."""
        items = self.build(n, seed, scale)
        labels = [it.pop(self.label_key) if self.label_key else None for it in items]
        return items, labels

    def correct(self, state: Any, label: Any) -> Optional[bool]:
        if self.label_key is None or label is None:
            return None
        got = state[self.answer_var]
        if self.name == "hellaswag":
            return got == state.stream_executor.arguments["choices"][label]
        return str(got).strip().upper()[:1] == label


def _mmlu(n: int, seed: int, scale: float) -> list[dict]:
    return D.mmlu_data(n, seed, scale)


def _hellaswag(n: int, seed: int, scale: float) -> list[dict]:
    return D.hellaswag_data(n, seed, scale)


def _react(n: int, seed: int, scale: float) -> list[dict]:
    budget = {"thought": tok(32, scale), "action": tok(12, scale)}
    return [{**d, "budget": budget} for d in D.react_data(n, seed, scale)]


def _agents(n: int, seed: int, scale: float) -> list[dict]:
    budget = {"plan": tok(32, scale), "utterance": tok(32, scale)}
    return [{**d, "budget": budget} for d in D.agents_data(n, seed, scale)]


def _tot(n: int, seed: int, scale: float) -> list[dict]:
    return [{**d, "budget": {"plan": tok(48, scale), "solution": tok(96, scale)}} for d in D.tot_data(n, seed, scale)]


def _sot(n: int, seed: int, scale: float) -> list[dict]:
    budget = {"point": tok(16, scale), "expansion": tok(128, scale)}
    return [{**d, "budget": budget} for d in D.sot_data(n, seed, scale)]


def _judge(n: int, seed: int, scale: float) -> list[dict]:
    return [{**d, "budget": {"judgement": tok(64, scale)}} for d in D.judge_data(n, seed, scale)]


def _json(n: int, seed: int, scale: float) -> list[dict]:
    return D.json_data(n, seed, scale)


def _chat(long: bool) -> Callable[[int, int, float], list[dict]]:
    return lambda n, seed, scale: D.chat_data(n, seed, scale, long)


def _rag(n: int, seed: int, scale: float) -> list[dict]:
    out = []
    for d in D.rag_data(n, seed, scale):
        corpus = d.pop("corpus")
        out.append({**d, "context": D.retrieve(corpus, d["question"]),
                    "budget": {"reasoning": tok(48, scale), "answer": tok(8, scale)}})
    return out


def _llava(n: int, seed: int, scale: float) -> list[dict]:
    return [{**d, "max_tokens": tok(256, scale)} for d in D.llava_data(n, seed, scale)]


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("mmlu", mmlu, _mmlu, "5-shot multiple choice; one answer token after a subject's shared 5-shot prefix",
             label_key="answer", answer_var="answer"),
    Workload("hellaswag", hellaswag, _hellaswag, "20-shot; select among 4 endings (shared 20-shot prefix, then a "
             "context shared by the 4 choices)", label_key="label", answer_var="answer", needs=("select",)),
    Workload("react", react, _react, "ReAct agent: shared instruction + example trajectory, 4 Thought/Action steps "
             "with replayed observations"),
    Workload("generative_agents", generative_agent, _agents, "an agent's persona and 12 memories shared by 4 "
             "programs; plan (gen 32), react? (select), utterance (gen 32)", needs=("select",)),
    Workload("tree_of_thought", tree_of_thought, _tot, "3 plans in branches, 2 solutions per plan in sub-branches, "
             "each judged with select", needs=("select",)),
    Workload("skeleton_of_thought", skeleton_of_thought, _sot, "a 3-point skeleton, points expanded in 3 branches"),
    Workload("llm_judge", llm_judge, _judge, "branch-solve-merge: 5 criteria judged in branches, merged score"),
    Workload("json_decode", json_decode, _json, "entity document -> JSON of a schema given as a regex",
             needs=("regex",)),
    Workload("chat_short", multi_turn_chat, _chat(False), "4 turns, user inputs 256-512 tokens, outputs 4-8 tokens"),
    Workload("chat_long", multi_turn_chat, _chat(True), "4 turns, user inputs 256-512 tokens, outputs 256-512 tokens"),
    Workload("rag", rag, _rag, "DSPy-style RAG: retrieve 3 passages, chain-of-thought reasoning, short answer"),
    Workload("llava_bench", image_qa, _llava, "an image of ~1 megapixel (sides x scale), 3 questions in branches, "
             "256 tokens each; runs where the server's model takes images", needs=("image",)),
]}
