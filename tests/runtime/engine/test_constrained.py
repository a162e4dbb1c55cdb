"""Constrained decoding on SmolLM2 through the offline Engine: every output satisfies its JSON schema, regex or
EBNF grammar; `exact` jump-forward reproduces `off` token for token (greedy) while `fast` only satisfies the
constraint; constrained and unconstrained requests share batches without affecting each other."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixlm.runtime.executor.cuda_graph_runner import CudaGraphRunner
from tests.runtime.engine.conftest import make_engine
from tests.runtime.grammar.cases import EBNF, REGEXES, SCHEMAS

pytestmark = pytest.mark.slow

MAX_JSON_TOKENS = 160


@pytest.fixture(scope="module", params=["off", "exact", "fast", "exact-rows", "fast-rows", "exact-always"])
def run(request):
    """Each mode's outputs for all cases (one engine per mode, all cases in two batches). The -rows modes run
    decode passes through the CUDA-graph runner's batching (eagerly on CPU), where a pass carrying jump-forward
    tokens is a decode batch with one row per token. -always fills every grammar mask (the others fill a greedy
    row's mask only when the grammar refuses the model's argmax)."""
    mode = request.param.removesuffix("-rows").removesuffix("-always")
    # exact-rows admits 8 at a time: later prompts are prefilled as rows, mixed with running drafts.
    engine = make_engine("default", jump_forward=mode,
                         grammar_mask="always" if request.param.endswith("-always") else "on_demand",
                         max_running_requests=8 if request.param == "exact-rows" else None)
    if request.param.endswith("-rows"):
        engine.runner.graph_runner = CudaGraphRunner(engine.runner, 128, use_graphs=False)
    try:
        tok = engine.tokenizer
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"Reply with a JSON object describing {task}."}],
                                           tokenize=False, add_generation_prompt=True) for task, _ in SCHEMAS]
        json_outs = engine.generate(prompts, [{"temperature": 0, "max_new_tokens": MAX_JSON_TOKENS, "json_schema": json.dumps(s)}
                                              for _, s in SCHEMAS])
        regex_outs = engine.generate([p for p, _ in REGEXES], [{"temperature": 0, "max_new_tokens": 40, "regex": r}
                                                               for _, r in REGEXES])
        yield mode, engine, json_outs, regex_outs
    finally:
        engine.shutdown()


_off: dict[str, list] = {}


def test_every_json_output_validates(run):
    mode, _engine, json_outs, _ = run
    assert len(SCHEMAS) >= 30
    for (task, schema), out in zip(SCHEMAS, json_outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (mode, task, out["text"])
        jsonschema.validate(json.loads(out["text"]), schema)


def test_every_regex_output_full_matches(run):
    mode, _engine, _, regex_outs = run
    for (prompt, pattern), out in zip(REGEXES, regex_outs):
        assert re.fullmatch(pattern, out["text"]), (mode, prompt, out["text"])
        assert out["meta_info"]["finish_reason"]["type"] == "stop"


def test_exact_jump_forward_equals_off_token_for_token(run):
    mode, engine, json_outs, regex_outs = run
    ids = [o["output_ids"] for o in json_outs + regex_outs]
    stats = engine.scheduler.grammar_stats
    if mode == "off":
        _off["ids"] = ids
        assert not stats["exact_jumps"] and not stats["fast_jumps"] and not stats["stop_jumps"]
        # Masks on demand: most greedy rows were decided by the model's own (allowed) argmax.
        assert stats["masks_filled"] < sum(map(len, ids)) / 4
        return
    assert "ids" in _off, "the off run comes first"
    assert len(ids) >= 20
    # The -rows modes ran their jump-forward passes as decode batches; the others as extend batches.
    assert (engine.scheduler.stats["jump_row_batches"] > 0) == (engine.runner.graph_runner is not None)
    if engine.runner.max_running_requests == 8:
        assert engine.scheduler.stats["mixed_batches"] > 0
    # Complete outputs take their stop token without a pass (included in the comparisons with off).
    assert stats["stop_jumps"] > 0
    if mode == "exact":
        # off decides greedy rows with masks on demand: exact-always (every mask filled) checks that against masks.
        assert ids == _off["ids"]
        assert stats["exact_jumps"] > 0 and 0 < stats["accepted_draft_tokens"] <= stats["draft_tokens"]
        assert stats["first_jumps"] > 0  # drafts verified by the prefill (the regexes' forced openings)
    else:
        assert stats["fast_jumps"] > 0 and stats["forced_tokens"] > 0


def test_ebnf_grammar(run):
    _mode, engine, _, _ = run
    out = engine.generate("Tell me about an animal. ", {"temperature": 0, "max_new_tokens": 30, "ebnf": EBNF})
    assert re.fullmatch(r"The (cat|dog|cow) says (meow|woof|moo)\.", out["text"]), out["text"]


def test_mixed_batch_leaves_unconstrained_outputs_unchanged(run):
    _mode, engine, _, _ = run
    free = ["Once upon a time", "The best way to learn is"]
    alone = engine.generate(free, {"temperature": 0, "max_new_tokens": 16})
    mixed = engine.generate(
        [free[0], "The phone number is ", free[1], "Reply in JSON: "],
        [{"temperature": 0, "max_new_tokens": 16}, {"temperature": 0, "max_new_tokens": 20, "regex": REGEXES[0][1]},
         {"temperature": 0, "max_new_tokens": 16}, {"temperature": 0, "max_new_tokens": 40, "json_schema": SCHEMAS[0][1]}],
    )
    assert [mixed[0]["output_ids"], mixed[2]["output_ids"]] == [a["output_ids"] for a in alone]
    assert re.fullmatch(REGEXES[0][1], mixed[1]["text"])
    jsonschema.validate(json.loads(mixed[3]["text"]), SCHEMAS[0][1])


def test_sampled_outputs_satisfy_the_constraint(run):
    _mode, engine, _, _ = run
    schema = SCHEMAS[16][1]  # nested array of objects
    outs = engine.generate(["Reply in JSON: "] * 4, {"temperature": 1.0, "max_new_tokens": MAX_JSON_TOKENS,
                                                     "json_schema": schema, "seed": 11, "n": 1})
    for o in outs:
        jsonschema.validate(json.loads(o["text"]), schema)


def test_conflicting_constraints_abort_without_crashing(run):
    _mode, engine, _, _ = run
    # The grammar allows only "a" then the end of text; min_new_tokens forbids ending: no token is allowed.
    out = engine.generate("Say a: ", {"temperature": 0, "max_new_tokens": 8, "min_new_tokens": 4, "regex": "a"})
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert engine.generate("Hi", {"temperature": 0, "max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


def test_invalid_spec_is_rejected_before_the_scheduler(run):
    _mode, engine, _, _ = run
    with pytest.raises(ValueError, match="invalid regex"):
        engine.generate("x", {"regex": "(unclosed"})
    with pytest.raises(ValueError, match="json_schema"):
        engine.generate("x", {"json_schema": "{nope"})
