"""ServerArgs validation and the command line generated from it."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from radixlm.cli import add_server_args, server_args_from
from radixlm.runtime.args import GrammarMaskMode, JumpForwardMode, SchedulePolicyName, Section, ServerArgs, Toggle


@pytest.mark.parametrize("kwargs, message", [
    ({"schedule_policy": "sjf"}, "schedule_policy"),
    ({"radix_eviction_policy": "mru"}, "radix_eviction_policy"),
    ({"page_size": 0}, "page_size"),
    ({"max_running_requests": 0}, "max_running_requests"),
    ({"max_running_requests": 65536}, "max_running_requests"),
    ({"chunked_prefill_size": 0}, "chunked_prefill_size"),
    ({"mem_fraction_static": 1.5}, "mem_fraction_static"),
    ({"load_format": "pickle"}, "load_format"),
    ({"attention_backend": "flashinfer"}, "attention_backend"),
    ({"reasoning_parser": "deepseek_r1"}, "unknown reasoning_parser 'deepseek_r1'; choose from"),
    ({"kv_cache_dtype": "fp8"}, r"unknown kv_cache_dtype 'fp8'; choose from \('auto', 'fp8_e4m3', 'fp8_e5m2'\)"),
    ({"kv_cache_dtype": "bfloat16"}, "unknown kv_cache_dtype 'bfloat16'"),
    ({"speculative_algorithm": "STANDALONE"}, "speculative-draft-model-path"),
    ({"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": "d", "tp_size": 2}, "tp_size 1"),
    ({"speculative_algorithm": "EAGLE3"}, "speculative-draft-model-path"),  # EAGLE alone: the target's MTP layer
    ({"speculative_eagle_topk": 4}, "speculative_eagle_topk"),
    ({"speculative_eagle_topk": 4, "speculative_algorithm": "STANDALONE", "speculative_draft_model_path": "d"},
     "EAGLE or EAGLE3"),
    ({"speculative_eagle_topk": 0}, "speculative_eagle_topk"),
    ({"speculative_num_steps": 0}, "speculative_num_steps"),
    ({"speculative_measure_window": -1}, "speculative_measure_window"),
    ({"enable_deterministic_inference": True, "attention_backend": "triton"}, "own attention backend"),
    ({"enable_deterministic_inference": True, "tp_size": 2}, "tp-size 1"),
    ({"enable_deterministic_inference": True, "enable_lora": True}, "no LoRA"),
    ({"enable_deterministic_inference": True, "quantization": "fp8"}, "float weights only"),
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


# ---------------------------------------------------------------------- --speculative-num-draft-tokens, SGLang's count
EAGLE_HEAD = {"speculative_algorithm": "EAGLE", "speculative_draft_model_path": "d"}


@pytest.mark.parametrize("kwargs", [
    {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 1},
    {"speculative_algorithm": "RADIX", "speculative_num_draft_tokens": 1},
    {**EAGLE_HEAD, "speculative_num_draft_tokens": 1},  # no steps: a chain of 0 tokens
    {**EAGLE_HEAD, "speculative_num_draft_tokens": 1, "speculative_num_steps": 3, "speculative_eagle_topk": 3},
    {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": "d", "speculative_num_draft_tokens": 0},
])
def test_num_draft_tokens_below_two_drafts_nothing_and_is_refused(kwargs):
    """The value counts the verified root token (SGLang's convention): 1 would draft nothing."""
    with pytest.raises(ValueError, match="speculative_num_draft_tokens must be >= 2"):
        ServerArgs(**kwargs)


@pytest.mark.parametrize("kwargs, num_draft_tokens, steps", [
    ({"speculative_algorithm": "NGRAM"}, 5, None),  # radixlm's default so far: 4 drafted tokens
    ({"speculative_algorithm": "NGRAM_RADIX", "speculative_num_draft_tokens": 2}, 2, None),
    (EAGLE_HEAD, 5, 4),
    ({**EAGLE_HEAD, "speculative_num_steps": 3}, 4, 3),  # unset: steps + 1, SGLang's default
    ({**EAGLE_HEAD, "speculative_num_draft_tokens": 4}, 4, 3),  # steps unset: a chain of N - 1
    ({**EAGLE_HEAD, "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}, 4, 3),
    ({**EAGLE_HEAD, "speculative_num_steps": 2, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}, 8, 2),
    ({**EAGLE_HEAD, "speculative_eagle_topk": 4}, 5, 4),
    ({"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": "d", "speculative_num_draft_tokens": 6},
     6, 5),
])
def test_num_draft_tokens_counts_the_root(kwargs, num_draft_tokens, steps):
    args = ServerArgs(**kwargs)
    assert args.speculative_num_draft_tokens == num_draft_tokens
    assert args.max_draft_tokens == num_draft_tokens - 1
    assert args.speculative_num_steps == steps
    if steps is not None:  # a draft model's chain / a tree's depth
        from radixlm.runtime.spec.budget import draft_steps

        assert draft_steps(args) == steps
    assert dataclasses.replace(args) == args  # resolving again changes nothing
    off = ServerArgs()
    assert off.speculative_num_draft_tokens is None and off.max_draft_tokens == 0


def test_topk_one_sets_num_draft_tokens_to_steps_plus_one_with_a_warning(caplog):
    """SGLang's rule: with --speculative-eagle-topk 1 a chain of --speculative-num-steps tokens and its root are
    verified, whatever --speculative-num-draft-tokens says (a warning when it says otherwise)."""
    with caplog.at_level("WARNING", logger="radixlm.runtime.args"):
        args = ServerArgs(**EAGLE_HEAD, speculative_num_steps=3, speculative_eagle_topk=1,
                          speculative_num_draft_tokens=8)
    assert args.speculative_num_draft_tokens == 4 and args.max_draft_tokens == 3
    assert any("adjusted to speculative_num_steps + 1" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="radixlm.runtime.args"):
        args = ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path="d",
                          speculative_num_steps=2, speculative_num_draft_tokens=1)  # replaced, as SGLang does
        assert args.speculative_num_draft_tokens == 3
        assert ServerArgs(**EAGLE_HEAD, speculative_num_steps=3, speculative_num_draft_tokens=4).max_draft_tokens == 3
    assert len(caplog.records) == 1  # the matching value: no warning
    with caplog.at_level("WARNING", logger="radixlm.runtime.args"):  # trees keep the value
        assert ServerArgs(**EAGLE_HEAD, speculative_num_steps=3, speculative_eagle_topk=2,
                          speculative_num_draft_tokens=6).speculative_num_draft_tokens == 6
    assert len(caplog.records) == 1


def test_num_draft_tokens_from_the_command_line():
    """A user's SGLang command line: 3 drafted tokens per step."""
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    ns = parser.parse_args(["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d",
                            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                            "--speculative-num-draft-tokens", "4"])
    args = ServerArgs(**server_args_from(ns))
    assert args.speculative_num_draft_tokens == 4 and args.max_draft_tokens == 3 and args.speculative_num_steps == 3
    ngram = ServerArgs(**server_args_from(parser.parse_args(["--speculative-algorithm", "NGRAM"])))
    assert ngram.speculative_num_draft_tokens == 5 and ngram.max_draft_tokens == 4


def test_kv_cache_dtype_from_the_command_line(capsys):
    """SGLang's --kv-cache-dtype spellings; any other value is refused by the parser, naming the choices."""
    from radixlm.runtime.args import KVCacheDtype

    parser = argparse.ArgumentParser()
    add_server_args(parser)
    assert ServerArgs(**server_args_from(parser.parse_args([]))).kv_cache_dtype is KVCacheDtype.AUTO
    for value in ("fp8_e4m3", "fp8_e5m2"):
        args = ServerArgs(**server_args_from(parser.parse_args(["--kv-cache-dtype", value])))
        assert args.kv_cache_dtype is KVCacheDtype(value) and args.kv_cache_dtype.is_fp8
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp8"])
    assert "--kv-cache-dtype: invalid choice: 'fp8'" in capsys.readouterr().err


def test_measure_window_from_the_command_line():
    """The draft controller measures in 8-step windows unless told otherwise; 0 turns it off."""
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    assert ServerArgs(**server_args_from(parser.parse_args([]))).speculative_measure_window == 8
    ns = parser.parse_args(["--speculative-algorithm", "NGRAM", "--speculative-measure-window", "0"])
    assert ServerArgs(**server_args_from(ns)).speculative_measure_window == 0


# ---------------------------------------------------------------------- auto|on|off flags and SGLang's spellings
@pytest.mark.parametrize("argv, overlap, mixed", [
    ([], Toggle.AUTO, Toggle.AUTO),
    (["--overlap-schedule", "on", "--mixed-chunk", "off"], Toggle.ON, Toggle.OFF),
    (["--disable-overlap-schedule"], Toggle.OFF, Toggle.AUTO),  # SGLang's spellings
    (["--enable-mixed-chunk"], Toggle.AUTO, Toggle.ON),
])
def test_toggle_flags_from_the_command_line(argv, overlap, mixed):
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    ns = parser.parse_args(argv)
    assert {f.name for f in dataclasses.fields(ServerArgs)} == set(vars(ns))
    args = ServerArgs(**server_args_from(ns))
    assert args.overlap_schedule is overlap and args.mixed_chunk is mixed
    with pytest.raises(SystemExit):
        parser.parse_args(["--overlap-schedule", "yes"])


def test_toggle_keywords_and_sglang_keywords():
    assert ServerArgs(overlap_schedule="off").overlap_schedule is Toggle.OFF
    args = ServerArgs.from_kwargs(disable_overlap_schedule=True, enable_mixed_chunk=True)
    assert args.overlap_schedule is Toggle.OFF and args.mixed_chunk is Toggle.ON
    args = ServerArgs.from_kwargs(disable_overlap_schedule=False, enable_mixed_chunk=False)
    assert args.overlap_schedule is Toggle.AUTO and args.mixed_chunk is Toggle.AUTO
    with pytest.raises(ValueError, match="overlap_schedule"):
        ServerArgs(overlap_schedule="sometimes")
    with pytest.raises(ValueError, match="enable_overlap_schedule"):  # radixlm's old spelling: gone
        ServerArgs.from_kwargs(enable_overlap_schedule=True)
    with pytest.raises(ValueError, match="not both"):
        ServerArgs.from_kwargs(disable_overlap_schedule=True, overlap_schedule="on")


def test_toggle_resolves_auto_to_the_servers_choice():
    assert [t.resolve(True) for t in Toggle] == [True, True, False]
    assert [t.resolve(False) for t in Toggle] == [False, True, False]


def test_every_field_has_a_section_and_a_help():
    for f in dataclasses.fields(ServerArgs):
        assert isinstance(f.metadata["section"], Section), f.name
        assert f.metadata["help"] and "\n" not in f.metadata["help"], f.name
