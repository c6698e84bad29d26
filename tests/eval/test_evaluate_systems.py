"""launch/evaluate.py's job with several systems on a TFDS dataset, graded by a local judge, then launch/report.py's
tables and plots from its directory; the summary is recomputed from the predictions files alone."""

import importlib.util
import json
import pathlib

import pytest

from searchjax.data import qa_datasets
from searchjax.eval import grading, report
from searchjax.experiment import evaluation
from searchjax.rewards.qa import exact_match, f1_score

CONFIG_FILE = pathlib.Path(__file__).resolve().parents[2] / "configs" / "evaluate.py"


def _config(tiny_dir):
    spec = importlib.util.spec_from_file_location("configs_evaluate_systems", CONFIG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.model.path = str(tiny_dir)
    config.model.dtype = "float32"  # the config's "auto" depends on the host's CPU; the test must not
    config.data.path = "tfds:fanoutqa/dev"
    config.data.limit = 3
    config.batch_size = 2
    config.progress = False
    config.systems = "closed_book,direct"
    config.baselines.direct.max_new_tokens = 6
    config.rollout.max_new_tokens_per_turn = 6
    config.judge.local_checkpoint = "policy"  # the tiny weights grade
    config.judge.max_prompt_tokens = 8192  # the grader prompt is ~2,500 tokens of the tiny tokenizer
    return config


def test_systems_on_a_tfds_dataset_with_judge_grades_and_the_report(tiny_dir, tmp_path):
    config = _config(tiny_dir)
    rows = evaluation.run_from_config(config, tmp_path)
    questions = qa_datasets.default_prompts()[:3]
    for system in ("closed_book", "direct"):
        records = [json.loads(line) for line in (tmp_path / system / "predictions_fanoutqa-dev.jsonl").open()]
        assert [(r["system"], r["id"], r["golds"]) for r in records] == [
            (system, p.uid, list(p.golden_answers)) for p in questions]
        assert all(r["judge_grade"] in grading.GRADES for r in records)  # every answer graded (or by rule)
        (row,) = [r for r in rows if r["system"] == system]
        assert (row["dataset"], row["data_source"], row["n"]) == ("fanoutqa-dev", "fanoutqa", 3)
        assert row["em"] == sum(exact_match(r["answer"], r["golds"]) for r in records) / 3
        assert row["f1"] == sum(f1_score(r["answer"], r["golds"]) for r in records) / 3
        assert row["judge_accuracy"] == sum(r["judge_grade"] == "CORRECT" for r in records) / 3
        assert (row["judge_graded"], row["judge_ungraded"]) == (3, 0)
    direct = [json.loads(line) for line in (tmp_path / "direct" / "predictions_fanoutqa-dev.jsonl").open()]
    assert any(r["answer"] for r in direct)  # the random model writes text: the judge was asked
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rows"] == rows and set(summary["grading"]) == {"closed_book", "direct"}
    assert summary["systems"]["closed_book"]["search"] is False
    assert "| closed_book | fanoutqa-dev | fanoutqa | 3 |" in (tmp_path / "table.md").read_text()

    import matplotlib
    matplotlib.use("Agg")
    written = report.write_report([str(tmp_path)], tmp_path / "report", baseline="direct", resamples=200)
    text = written["markdown"].read_text()
    assert "Judge accuracy" in text and "closed_book" in text and "FanOutQA" in text
    assert all(path.exists() for path in written.values())
    assert any(str(p).endswith(".png") for p in written.values())


def test_bad_systems_and_fields_end_with_one_clear_line(tiny_dir, tmp_path):
    config = _config(tiny_dir)
    config.systems = "direct,fancy"
    with pytest.raises(ValueError, match="config.systems: unknown system 'fancy'; known: policy, closed_book"):
        evaluation.check_inputs(config)
    config.systems = "rag"
    config.baselines.rag.top_k = 3  # a typo of topk
    with pytest.raises(ValueError, match=r"config.baselines.rag: .*top_k"):
        evaluation.check_inputs(config)
    assert not any(tmp_path.iterdir())  # nothing was written
