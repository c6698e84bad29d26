"""launch/evaluate.py's job on a slice of the embedded default: SmolLM2, the BM25 index, real questions."""

import importlib.util
import json
import pathlib

import pytest

from searchjax.data import qa_datasets
from searchjax.eval import suite
from searchjax.experiment import evaluation
from searchjax.eval.metrics import is_valid_answer
from searchjax.rewards.qa import exact_match, f1_score


CONFIG_FILE = pathlib.Path(__file__).resolve().parents[2] / "configs" / "evaluate.py"


def _config():
    spec = importlib.util.spec_from_file_location("configs_evaluate", CONFIG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.model.dtype = "float32"  # the config's "auto" depends on the host's CPU; the test must not
    return config


@pytest.mark.heavy
def test_evaluate_writes_predictions_and_table(tmp_path, capsys):
    config = _config()
    config.data.limit = 3
    config.batch_size = 2  # two rollout batches
    config.progress = False
    config.rollout.max_turns = 1
    config.rollout.max_new_tokens_per_turn = 16
    config.rollout.max_obs_tokens = 64
    config.rollout.max_cache_len = 352  # 256 (prompt) + 2 turns x 16 + one 64-slot observation block
    config.judge.backend = "none"  # grading is tests/eval/test_evaluate_systems.py's business
    rows = evaluation.run_from_config(config, tmp_path)

    records = [json.loads(line) for line in (tmp_path / "policy" / "predictions_default.jsonl").read_text().splitlines()]
    questions = qa_datasets.default_prompts()[:3]
    assert [(r["id"], r["question"], r["golds"]) for r in records] == [
        (p.uid, p.question, list(p.golden_answers)) for p in questions]
    for r in records:
        assert set(r) >= {"id", "question", "golds", "answer", "trajectory", "searches", "flags"}
        assert set(r["flags"]) >= {"valid_answer", "forced_termination"}
        assert r["flags"]["valid_answer"] == is_valid_answer(r["answer"])
        assert len(r["searches"]) <= 1 and r["generated_tokens"] <= 2 * 16
    # The table's numbers, recomputed from the predictions file alone.
    (row,) = rows
    assert (row["system"], row["dataset"], row["data_source"], row["n"]) == ("policy", "default", "fanoutqa", 3)
    assert row["em"] == sum(exact_match(r["answer"], r["golds"]) for r in records) / 3
    assert row["f1"] == sum(f1_score(r["answer"], r["golds"]) for r in records) / 3
    assert row["valid_answer_rate"] == sum(is_valid_answer(r["answer"]) for r in records) / 3
    assert row["mean_searches"] == sum(len(r["searches"]) for r in records) / 3
    assert row["forced_termination_rate"] == sum(r["flags"]["forced_termination"] for r in records) / 3
    table = (tmp_path / "table.md").read_text()
    assert table.strip() == suite.format_table(rows)
    assert f"| policy | default | fanoutqa | 3 | {row['em']:.3f} | {row['f1']:.3f} | - |" in table
    assert table.strip() in capsys.readouterr().out
    assert json.loads((tmp_path / "summary.json").read_text())["rows"] == rows
