"""Benchmark suites run by launch/benchmark.py; each module exposes `run(args) -> list[dict]`."""
