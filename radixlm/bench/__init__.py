"""Serving benchmarks: `python -m radixlm.bench.serving`."""
