"""Benchmark harness (corpus, load generator, runner); importable for the smoke test."""
