"""The constraints each family writes as xgrammar structural tags: what they accept is what the parser reads."""
from __future__ import annotations

import json

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string as accepts

from radixlm.runtime.parsers.tool_calls import TOOL_CALL_FORMATS, ToolSpec, get_format
from tests.runtime.parsers.tool_calls.helpers import WEATHER, calls

JSON_ARGS = ('{"city": "Paris", "days": 3}', "{}")
ARGS = {  # get_weather's and get_time's arguments as each family writes them
    "qwen3_coder": ("<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>", ""),
    "glm45": ("<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value>", ""),
}
ARGS["glm"] = ARGS["glm47"] = ARGS["glm45"]
ARGS["deepseekv32"] = ('<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
                       '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n', "")
WANT = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]
CONSTRAINED = sorted(n for n, f in TOOL_CALL_FORMATS.items() if f.call_tags([ToolSpec("f", None)]) is not None)


def grammar(fmt_tag: dict) -> xgr.Grammar:
    return xgr.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": fmt_tag}))


def test_every_family_but_pythonic_is_constrained_in_its_own_format():
    assert set(TOOL_CALL_FORMATS) - set(CONSTRAINED) == {"pythonic"}


@pytest.mark.parametrize("fmt", CONSTRAINED)
def test_forced_calls_are_what_the_parser_reads(fmt):
    tags = get_format(fmt).call_tags([ToolSpec("get_weather", WEATHER), ToolSpec("get_time", None)])
    one = [t["begin"] + a + t["end"] for t, a in zip(tags.tags, ARGS.get(fmt, JSON_ARGS))]
    two = tags.prefix + tags.separator.join(one) + tags.suffix
    single = tags.prefix + one[0] + tags.suffix
    parallel, only_one = grammar(tags.forced(parallel=True)), grammar(tags.forced(parallel=False))
    assert accepts(parallel, two) and accepts(parallel, single) and accepts(only_one, single)
    assert not accepts(only_one, two)  # parallel_tool_calls=false
    assert not accepts(parallel, "Hello.") and not accepts(parallel, "")  # required: a call, not text
    bad = single.replace('"Paris"', "7") if fmt not in ARGS else single.replace("get_weather", "get_wether")
    assert not accepts(parallel, bad)
    assert calls(two, fmt) == WANT and calls(single, fmt) == WANT[:1]


@pytest.mark.parametrize("fmt", ["hermes", "deepseekv31", "mistral", "qwen3_coder"])
def test_optional_single_call_after_text(fmt):
    tags = get_format(fmt).call_tags([ToolSpec("get_weather", WEATHER), ToolSpec("get_time", None)])
    one = [t["begin"] + a + t["end"] for t, a in zip(tags.tags, ARGS.get(fmt, JSON_ARGS))]
    g = grammar(tags.optional_single())
    assert accepts(g, "Just text.") and accepts(g, "Checking. " + tags.prefix + one[1] + tags.suffix)
    assert not accepts(g, tags.prefix + tags.separator.join(one) + tags.suffix)
