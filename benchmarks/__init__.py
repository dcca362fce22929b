"""Benchmark scripts (run as `python -m benchmarks.<name>`); they print tables and write JSON."""
