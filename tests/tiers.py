"""Which tiers a test is in (tests/conftest.py marks them): from the names its function and its fixtures' functions
call, the fixtures it uses, the `slow` marker, and a table of paths for the rest (tests/test_tiers.py checks that
each entry still names a test)."""
from __future__ import annotations

import types

import pytest

INTERPRETED_KERNEL = "interpreted_kernel"
REAL_MODEL = "real_model"
SERVER = "server"
ORDER = (INTERPRETED_KERNEL, REAL_MODEL, SERVER)  # a run's order after the fast tier

# Called by a test or one of its fixtures: it runs kernels under the interpreter / starts a server or router process.
INTERPRETER_CALLS = frozenset({"run_under_interpreter"})
SERVER_CALLS = frozenset({"start_server", "start_router", "start_worker_proc", "Runtime"})
# Fixtures (by name, anywhere under tests/) that hold a real model or a server.
FIXTURES = {
    "smol_engine": {REAL_MODEL},
    "smol_reference": {REAL_MODEL},
    "smol_references": {REAL_MODEL},
    "hf_gguf_model": {REAL_MODEL},
    "fleet": {SERVER, REAL_MODEL},
    "runtime": {SERVER, REAL_MODEL},
    "backend_and_tokenizer": {REAL_MODEL},  # SmolLM2's tokenizer (converted from its GGUF on a fresh machine)
}
# Modules, or single tests (module::function), by the end of their path: every test there is in these tiers. They start
# processes or load a real model in ways the names above do not show (a subprocess of their own, a real model's
# tokenizer).
PATHS = {
    "server/test_child_death.py": {SERVER, REAL_MODEL},
    "server/test_robustness.py": {SERVER, REAL_MODEL},
    "server/test_port.py": {SERVER},
    "server/test_tool_plan.py::test_template_that_ignores_tools_still_renders": {REAL_MODEL},
    "distributed/test_tp_server.py": {SERVER},
    "models/test_model_gguf_parity.py": {REAL_MODEL},
    "model_loader/test_model_loader.py::test_truncated_gguf_names_file": {REAL_MODEL},
}

# Modules that took 20 s or more on CI (2 cores, -n 2; setup and calls, seconds, rounded). Under xdist's loadfile a
# worker runs whole modules and takes the next one as it nears the end of its own: a long module handed out last keeps
# one worker busy while the other has nothing left. tests/conftest.py hands these out first within their tier, the
# longest first, so that the workers end together on the short ones.
SLOW_MODULES = {  # measured 2026-11-30 on a 2-core machine under -n 2 (one torch thread a worker)
    "engine/test_constrained.py": 120,  # six engines (its grammar modes)
    "engine/test_parity.py": 75,
    "router/test_e2e.py": 70,
    "kernels/attention/test_shared_prefix_attn.py": 70,
    "server/test_tool_calls.py": 65,
    "server/test_openapi_fuzz.py": 65,
    "bench/test_programs.py": 60,
    "kernels/attention/test_decode_attn_variants.py": 50,
    "server/test_watchdog.py": 50,
    "quantization/test_real_model.py": 50,
    "bench/test_speculative_bench.py": 45,
    "distributed/test_tensor_parallel.py": 40,
    "engine/test_parity_qwen.py": 40,
    "engine/test_engine_api.py": 35,
    "distributed/test_tp_server.py": 35,
    "server/test_child_death.py": 35,
    "spec/test_standalone_sampling.py": 30,
    "lang/test_multimodal_e2e.py": 30,
    "server/test_reasoning_api.py": 30,
    "router/test_e2e_pd.py": 30,
    "bench/test_llava_bench.py": 25,
    "server/test_multimodal_api.py": 25,
    "server/test_robustness.py": 25,
    "server/test_native_api.py": 25,
    "lang/backend/test_api_backends_e2e.py": 25,
    "lang/test_programs_e2e.py": 20,
    "multimodal/test_tensor_parallel.py": 20,
}


def module_seconds(path: str) -> int:
    """SLOW_MODULES' figure for a module (a path ending in one of its keys); 0 for the others."""
    return next((s for key, s in SLOW_MODULES.items() if path.endswith("/" + key)), 0)


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _code(func) -> types.CodeType | None:
    func = getattr(func, "__wrapped__", func)
    return getattr(func, "__code__", None)


def tiers_of(item: pytest.Item) -> list[str]:
    path = item.path.as_posix()
    name = getattr(item, "originalname", item.name)
    found: set[str] = set()
    for key, names in PATHS.items():
        module, _, test = key.partition("::")
        if path.endswith("/" + module) and test in ("", name):
            found |= names
    if item.get_closest_marker("slow") is not None:
        found.add(REAL_MODEL)
    funcs = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        found |= FIXTURES.get(name, set())
        if info is not None:
            funcs += [fd.func for fd in info.name2fixturedefs.get(name, ())]
    for func in funcs:
        code = _code(func) if func is not None else None
        if code is None:
            continue
        names = _names(code)
        if names & INTERPRETER_CALLS:
            found.add(INTERPRETED_KERNEL)
        if names & SERVER_CALLS:
            found.add(SERVER)
    return sorted(found, key=ORDER.index)
