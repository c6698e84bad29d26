"""Evaluation primitives: metrics.py (trajectory metrics, TTRL vote), benchmarks.py (greedy evaluation,
predictions file, summary table), stats.py (paired bootstrap, McNemar, Wilson, Fisher), grading.py (LLM-as-judge
answer grades), report.py (the papers' tables and plots, for launch/report.py), stage_a_harness.py (EviBack
Stage A traces). A whole evaluation run is orchestrated by searchjax.experiment.evaluation."""
