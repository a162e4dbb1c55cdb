"""Server arguments: the ServerArgs dataclass (server_args.py), its modes and value sets (choices.py), its checks
(validate.py) and its command line (parser.py). Imports no torch."""
from radixlm.runtime.args.choices import (
    ATTENTION_BACKENDS, DEFAULT_DRAFT_STEPS, DTYPES, EVICTION_POLICIES, GRAMMAR_BACKENDS, GRAMMAR_MASK_MODES,
    JUMP_FORWARD_MODES, LOAD_FORMATS, MAX_RUNNING_REQUESTS, SCHEDULE_POLICIES, TOGGLES, TOOL_CALL_PARSERS,
    GrammarMaskMode, HiCachePrefetchPolicy, HiCacheStorageBackend, HiCacheWritePolicy, JumpForwardMode, KVCacheDtype,
    SchedulePolicyName, Section, SpeculativeAlgorithm, Toggle,
)
from radixlm.runtime.args.parser import add_server_args, server_args_from, server_argv
from radixlm.runtime.args.server_args import ENUM_FIELDS, SGLANG_KWARGS, ServerArgs

__all__ = [
    "ATTENTION_BACKENDS", "DEFAULT_DRAFT_STEPS", "DTYPES", "ENUM_FIELDS", "EVICTION_POLICIES", "GRAMMAR_BACKENDS",
    "GRAMMAR_MASK_MODES", "HiCachePrefetchPolicy", "HiCacheStorageBackend", "HiCacheWritePolicy", "JUMP_FORWARD_MODES", "LOAD_FORMATS", "MAX_RUNNING_REQUESTS", "SCHEDULE_POLICIES",
    "SGLANG_KWARGS", "TOGGLES", "TOOL_CALL_PARSERS", "GrammarMaskMode", "JumpForwardMode", "KVCacheDtype",
    "SchedulePolicyName", "Section", "ServerArgs", "SpeculativeAlgorithm", "Toggle", "add_server_args",
    "server_args_from", "server_argv",
]
