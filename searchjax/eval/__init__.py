"""Evaluation: metrics.py (trajectory metrics, TTRL vote), benchmarks.py, pipelines.py, stats.py, report.py."""
