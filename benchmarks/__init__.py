"""Benchmarks (scripts, not tests): run with ``python -m benchmarks.<name>``."""
