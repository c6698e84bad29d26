"""Benchmark readers (Search-R1 parquet, FlashRAG jsonl, the embedded default) and the summary table."""

import json

import pytest

from searchjax.agent.protocol import build_user_prompt
from searchjax.data import qa_datasets
from searchjax.eval import benchmarks


def _write_search_r1_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(rows), path)


def _search_r1_row(question, golds, source, index):
    """A row as Search-R1's scripts/data_process/nq_search.py writes it."""
    return {"data_source": source, "prompt": [{"role": "user", "content": build_user_prompt(question)}],
            "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
            "extra_info": {"split": "test", "index": index}}


def test_search_r1_parquet_reader(tmp_path):
    path = tmp_path / "test.parquet"
    # Two data sources reuse index 0 (as Search-R1's merged test files do): the uids must still differ.
    _write_search_r1_parquet(path, [_search_r1_row("who wrote hamlet", ["Shakespeare", "William Shakespeare"], "nq", 0),
                                    _search_r1_row("Where is the Louvre?", ["Paris"], "hotpotqa", 0),
                                    _search_r1_row("what is 6 x 7", ["42"], "nq", 1)])
    prompts = qa_datasets.load_benchmark(str(path))
    assert [(p.uid, p.question, p.golden_answers, p.data_source) for p in prompts] == [
        ("nq/0", "who wrote hamlet?", ("Shakespeare", "William Shakespeare"), "nq"),
        ("hotpotqa/0", "Where is the Louvre?", ("Paris",), "hotpotqa"),
        ("nq/1", "what is 6 x 7?", ("42",), "nq")]

    bad = tmp_path / "bad.parquet"
    row = _search_r1_row("q", ["a"], "nq", 0)
    row["reward_model"] = {"style": "rule", "ground_truth": {"other": ["a"]}}
    _write_search_r1_parquet(bad, [row])
    with pytest.raises(ValueError, match=r"bad\.parquet row 0: missing field 'reward_model\.ground_truth\.target'"):
        qa_datasets.read_search_r1_parquet(bad)
    dup = tmp_path / "dup.parquet"
    _write_search_r1_parquet(dup, [_search_r1_row("q", ["a"], "nq", 3), _search_r1_row("r", ["b"], "nq", 3)])
    with pytest.raises(ValueError, match=r"dup\.parquet: rows 0 and 1 .*'nq/3'"):
        qa_datasets.read_search_r1_parquet(dup)


def test_flashrag_jsonl_reader(tmp_path):
    (tmp_path / "triviaqa").mkdir()
    path = tmp_path / "triviaqa" / "test.jsonl"
    path.write_text(json.dumps({"id": "test_0", "question": "Who painted the Mona Lisa?",
                                "golden_answers": ["Leonardo da Vinci", "Leonardo"]}) + "\n\n"
                    + json.dumps({"id": "test_1", "question": " Year of the moon landing ", "golden_answers": [1969]})
                    + "\n")
    prompts = qa_datasets.load_benchmark(str(path))
    assert [(p.uid, p.question, p.golden_answers, p.data_source) for p in prompts] == [
        ("triviaqa/test_0", "Who painted the Mona Lisa?", ("Leonardo da Vinci", "Leonardo"), "triviaqa"),
        ("triviaqa/test_1", "Year of the moon landing", ("1969",), "triviaqa")]
    assert qa_datasets.load_benchmark(str(path), data_source="tqa")[0].uid == "tqa/test_0"

    bad = tmp_path / "popqa.jsonl"
    bad.write_text(json.dumps({"id": "1", "question": "q", "golden_answers": ["a"]}) + "\n"
                   + json.dumps({"id": "2", "question": "r"}) + "\n")
    with pytest.raises(ValueError, match=r"popqa\.jsonl:2: missing field 'golden_answers'"):
        qa_datasets.read_flashrag_jsonl(bad)
    with pytest.raises(ValueError, match="expected 'default'"):
        qa_datasets.load_benchmark(str(tmp_path / "data.csv"))


def test_default_benchmark():
    prompts = qa_datasets.load_benchmark("default")
    assert len(prompts) == 75 and len({p.uid for p in prompts}) == 75
    assert all(p.uid.startswith("fanoutqa/") and p.data_source == "fanoutqa" and p.golden_answers for p in prompts)


def _record(source, answer, golds, queries=(), forced=False):
    return {"data_source": source, "answer": answer, "golds": list(golds), "searches": list(queries),
            "flags": {"forced_termination": forced, "retrieval_errors": 0}}


def test_summary_rows_by_hand():
    records = [
        _record("nq", "Paris", ["paris"], ["capital of france", "Capital of France."]),  # EM 1, F1 1, 1 dup
        _record("nq", "the big apple city", ["Big Apple"], ["nyc"], forced=True),          # EM 0, F1 2/3
        _record("nq", None, ["x"], ["a", "b", "c"], forced=True),                          # no answer
        _record("hotpotqa", " ", ["y"]),                                                   # empty answer
    ]
    rows = {r["data_source"]: r for r in benchmarks.summary_rows(records)}
    assert list(rows) == ["hotpotqa", "nq", "all"]
    nq, hp, everything = rows["nq"], rows["hotpotqa"], rows["all"]
    # F1 of "the big apple city" vs "Big Apple": tokens [big, apple, city] vs [big, apple]: P 2/3, R 1 -> 0.8.
    assert (nq["n"], nq["em"], nq["f1"]) == (3, pytest.approx(1 / 3), pytest.approx((1 + 0.8) / 3))
    assert nq["valid_answer_rate"] == pytest.approx(2 / 3) and nq["mean_searches"] == 2.0
    assert nq["duplicate_query_rate"] == pytest.approx(1 / 6) and nq["forced_termination_rate"] == pytest.approx(2 / 3)
    assert (hp["n"], hp["em"], hp["valid_answer_rate"], hp["mean_searches"], hp["duplicate_query_rate"]) == (
        1, 0.0, 0.0, 0.0, 0.0)
    assert everything["n"] == 4 and everything["em"] == 0.25 and everything["mean_searches"] == 1.5
    table = benchmarks.format_table(benchmarks.summary_rows(records)).splitlines()
    assert table[0] == ("| data source | n | EM | F1 | valid answer | mean searches | duplicate queries | "
                        "forced termination |")
    assert table[3] == "| nq | 3 | 0.333 | 0.600 | 0.667 | 2.000 | 0.167 | 0.667 |"
