"""Cache-aware router over several radixlm workers: tree.py (approximate radix tree), policies.py,
workers.py (health, circuit breaker, load), core.py (Router), app.py (HTTP proxy), launch.py (CLI entry)."""
