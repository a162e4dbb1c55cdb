"""Constrained decoding: grammar specs from sampling params, a compiling backend (xgrammar) with a shared cache,
per-request matchers, and jump-forward decoding."""
