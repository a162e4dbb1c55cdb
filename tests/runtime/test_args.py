"""ServerArgs validation and the command line generated from it."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from radixlm.cli import add_server_args, server_args_from
from radixlm.runtime.args import GrammarMaskMode, JumpForwardMode, SchedulePolicyName, ServerArgs


@pytest.mark.parametrize("kwargs, message", [
    ({"schedule_policy": "sjf"}, "schedule_policy"),
    ({"radix_eviction_policy": "mru"}, "radix_eviction_policy"),
    ({"page_size": 0}, "page_size"),
    ({"chunked_prefill_size": 0}, "chunked_prefill_size"),
    ({"mem_fraction_static": 1.5}, "mem_fraction_static"),
    ({"load_format": "pickle"}, "load_format"),
    ({"attention_backend": "flashinfer"}, "attention_backend"),
    ({"speculative_algorithm": "STANDALONE"}, "speculative-draft-model-path"),
    ({"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": "d", "tp_size": 2}, "tp_size 1"),
    ({"speculative_algorithm": "EAGLE"}, "speculative-draft-model-path"),
    ({"speculative_eagle_topk": 4}, "speculative_eagle_topk"),
    ({"speculative_eagle_topk": 4, "speculative_algorithm": "STANDALONE", "speculative_draft_model_path": "d"},
     "EAGLE or EAGLE3"),
    ({"speculative_eagle_topk": 0}, "speculative_eagle_topk"),
    ({"speculative_num_steps": 0}, "speculative_num_steps"),
])
def test_invalid_server_args_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServerArgs(**kwargs)


def test_unknown_server_argument_is_named():
    with pytest.raises(ValueError, match="max_tokens_total"):
        ServerArgs.from_kwargs(max_tokens_total=5)


def test_cli_flags_cover_every_field_with_types():
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    ns = parser.parse_args(["--model-path", "qwen2.5-0.5b", "--max-total-tokens", "1000", "--disable-radix-cache",
                            "--schedule-policy", "fcfs", "--chunked-prefill-size", "-1"])
    args = ServerArgs(**server_args_from(ns))
    assert args.model_path == "qwen2.5-0.5b" and args.max_total_tokens == 1000
    assert args.disable_radix_cache is True and args.schedule_policy == "fcfs" and args.chunked_prefill_size == -1
    defaults = ServerArgs(**server_args_from(parser.parse_args([])))
    assert defaults == ServerArgs()
    assert defaults.schedule_policy is SchedulePolicyName.LPM and defaults.jump_forward is JumpForwardMode.OFF
    assert defaults.grammar_mask is GrammarMaskMode.ON_DEMAND
    assert ServerArgs(**server_args_from(parser.parse_args(["--jump-forward", "exact"]))).jump_forward is (
        JumpForwardMode.EXACT)
    assert {f.name for f in dataclasses.fields(ServerArgs)} == set(vars(ns))
    with pytest.raises(SystemExit):
        parser.parse_args(["--schedule-policy", "sjf"])
