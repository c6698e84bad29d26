"""Distributed evaluation: two CPU processes (jax.distributed) each run their share of the batches, process 0
gathers, grades and writes; every file equals a one-process run's, byte for byte."""

import json
import pathlib

import pytest

from searchjax.eval import suite
from worker_processes import run_two

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "two_process_eval_worker.py"


def test_batch_shards_are_whole_batches_in_order():
    # 7 questions in batches of 2 -> batches [0,1] [2,3] [4,5] [6]; two processes: 2 batches each.
    assert [suite.batch_shard(7, 2, i, 2) for i in range(2)] == [(0, 4, 0), (4, 7, 2)]
    assert [suite.batch_shard(6, 2, i, 2) for i in range(2)] == [(0, 4, 0), (4, 6, 2)]  # 3 batches: 2 + 1
    # More processes than batches: process_shard's cut gives the one batch to process 1, empty shares elsewhere.
    assert [suite.batch_shard(2, 2, i, 3) for i in range(3)] == [(2, 2, 1), (0, 2, 0), (2, 2, 1)]
    assert suite.batch_shard(5, 8) == (0, 5, 0)  # one process: everything


@pytest.mark.heavy
def test_two_processes_evaluate_like_one(tiny_dir, tmp_path):
    from two_process_eval_worker import QUESTIONS, evaluate_tiny
    one, two = tmp_path / "one", tmp_path / "two"
    run_two(WORKER, tiny_dir, two, timeout=240)
    rows = evaluate_tiny(tiny_dir, one, process=(0, 1))
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file() and p.name != "summary.json")
    assert [str(f) for f in files] == ["grader.v1.txt", "judge_cache.jsonl", "policy/judge_audit_tiny.jsonl",
                                       "policy/predictions_tiny.jsonl", "rag/judge_audit_tiny.jsonl",
                                       "rag/predictions_tiny.jsonl", "table.md"]
    for f in files:
        if "audit" in f.name:  # the audit carries wall-clock times: compare it without them
            strip = [{k: v for k, v in json.loads(line).items() if k not in ("time", "latency_s")}
                     for line in (one / f).read_text().splitlines()]
            assert strip == [{k: v for k, v in json.loads(line).items() if k not in ("time", "latency_s")}
                             for line in (two / f).read_text().splitlines()], f
        else:
            assert (one / f).read_text() == (two / f).read_text(), f
    summary_one, summary_two = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert summary_two["processes"] == 2 and summary_one["processes"] == 1
    assert summary_one["rows"] == summary_two["rows"] == json.loads(json.dumps(rows))
    records = [json.loads(line) for line in (two / "rag" / "predictions_tiny.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == [f"{s}/{i}" for i, (s, _, _) in enumerate(QUESTIONS)]  # question order
    assert all(r["system"] == "rag" and "judge_grade" in r for r in records)
    # The random model does answer, so the judge was really asked (not only NOT_ATTEMPTED by rule).
    assert any(json.loads(line).get("cached") is False for line in (one / "rag" / "judge_audit_tiny.jsonl").open())
