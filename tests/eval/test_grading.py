"""LLM-as-judge answer grading through the real HTTP judge path: a scripted OpenAI-compatible server on
loopback replies with letters, prose, HTTP errors; grades, counts, caching, cost and the audit are checked
against what the server actually received."""

import json

import pytest

from searchjax.eval import grading
from searchjax.judges.base import JudgeError
from searchjax.judges.openai_compat import OpenAICompatConfig, OpenAICompatJudge
from searchjax.judges.templates import load_prompt
from searchjax.judges.testing_server import ScriptedReply, dead_endpoint_url, serve_scripted

PRICE_IN, PRICE_OUT = 3.0, 15.0  # USD per million tokens


def _judge(base_url, **kw):
    fields = dict(base_url=base_url, model="scripted-grader", api_key_env="", timeout_s=5.0, max_attempts=3,
                  backoff_initial_s=0.01, backoff_max_s=0.02, temperature=0.1, guided_choice=True,
                  price_per_million_input=PRICE_IN, price_per_million_output=PRICE_OUT)
    fields.update(kw)
    return OpenAICompatJudge(OpenAICompatConfig(**fields))


def _predicted(body):
    """The predicted answer inside the grader prompt (the line after 'Predicted answer: ' in the last example)."""
    text = body["messages"][0]["content"]
    return text.rsplit("Predicted answer: ", 1)[1].split("\n", 1)[0]


def _responder(body):
    answer = _predicted(body)
    corrected = len(body["messages"]) > 1  # the correction round appends the bad reply and a correction
    if answer == "Paris":
        return "A"
    if answer == "Lyon":
        return " b. "  # a letter with spacing and a full stop: still parseable
    if answer == "no idea":
        return "NOT_ATTEMPTED"
    if answer == "fixable":
        return "A" if corrected else "Based on the gold target I would say the answer is fine"
    if answer == "prose":
        return "The predicted answer matches. Both mean the same."
    if answer == "boom":
        return ScriptedReply(status=500)
    if answer == "forbidden":
        return ScriptedReply(status=400)
    raise AssertionError(f"unscripted answer {answer!r}")


def _record(qid, answer, golds=("Paris",), question="What is the capital of France?", source="nq"):
    return {"id": f"{source}/{qid}", "data_source": source, "question": question, "golds": list(golds),
            "answer": answer, "em": float(answer == golds[0]), "f1": float(answer == golds[0])}


RECORDS = [_record(0, "Paris"), _record(1, "Lyon"), _record(2, "no idea"), _record(3, "fixable"),
           _record(4, "prose"), _record(5, "boom"), _record(6, "forbidden"), _record(7, None), _record(8, "  "),
           _record(9, "Paris")]  # 9 repeats 0's request exactly: asked once
EXPECTED = ["CORRECT", "INCORRECT", "NOT_ATTEMPTED", "CORRECT", None, None, None, "NOT_ATTEMPTED",
            "NOT_ATTEMPTED", "CORRECT"]


@pytest.mark.parametrize("text, letter", [
    ("A", "A"), ("b", "B"), (' "C" ', "C"), ("**A**", "A"), ("B.", "B"), ("CORRECT", "A"), ("incorrect", "B"),
    ("NOT_ATTEMPTED", "C"), ("Not attempted.", "C"), ("A: CORRECT", "A"), ("c) NOT_ATTEMPTED", "C"),
    ("B - incorrect", "B")])
def test_parse_grade_accepts(text, letter):
    assert grading.parse_grade(text) == letter


@pytest.mark.parametrize("text", ["", "D", "AB", "A or B", "Based on the answer: B", "A: INCORRECT",
                                  "The answer is correct", "CORRECTLY"])
def test_parse_grade_rejects(text):
    with pytest.raises(JudgeError) as info:
        grading.parse_grade(text)
    assert info.value.kind == "malformed"


def test_grade_predictions_through_scripted_server(tmp_path):
    audit = tmp_path / "audit.jsonl"
    cfg = grading.GradingConfig(audit_path=str(audit))
    with serve_scripted(_responder) as server:
        judge = _judge(server.base_url)
        grades, summary = grading.grade_predictions(RECORDS, judge, cfg)
        bodies = server.request_bodies()

    assert grades == EXPECTED
    # Requests the server saw: 6 distinct answers asked once (Paris shared by records 0 and 9) + the correction
    # rounds of "fixable" and "prose" + 2 retries of the HTTP 500; the 400 is not retried; no call for no answer.
    asked = [_predicted(b) for b in bodies]
    assert sorted(asked) == sorted(["Paris", "Lyon", "no idea", "fixable", "fixable", "prose", "prose",
                                    "boom", "boom", "boom", "forbidden"])
    assert all(b["temperature"] == 0.1 and b["guided_choice"] == ["A", "B", "C"] for b in bodies)
    assert bodies[0]["messages"][0]["content"].count("Gold target: Paris\n") == 1

    assert summary["n"] == 10 and summary["graded"] == 7 and summary["ungraded"] == 3
    assert (summary["correct"], summary["incorrect"], summary["not_attempted"]) == (3, 1, 3)
    assert summary["accuracy"] == 3 / 7 and summary["accuracy_given_attempted"] == 3 / 4
    assert summary["not_attempted_by_rule"] == 2 and summary["deduplicated"] == 1 and summary["requests"] == 7
    assert summary["failures/malformed"] == 1 and summary["failures/http"] == 2
    # Cost accounting: the scripted server counts whitespace-separated words as tokens.
    prompt_words = sum(sum(len(m["content"].split()) for m in b["messages"]) for b in bodies
                       if _predicted(b) not in ("boom", "forbidden"))
    assert summary["usage/prompt_tokens"] == prompt_words
    assert summary["usage/cost_usd"] == pytest.approx(
        prompt_words * PRICE_IN / 1e6 + summary["usage/completion_tokens"] * PRICE_OUT / 1e6)
    assert summary["usage/retries"] == 2 and summary["usage/failures"] == 2
    assert summary["prompt_sha256"] == load_prompt("answer_grader.v1").sha256

    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert sorted(r["id"] for r in lines) == sorted(r["id"] for r in RECORDS)
    by_id = {r["id"]: r for r in lines}
    assert by_id["nq/4"]["grade"] is None and by_id["nq/4"]["error_kind"] == "malformed"
    assert len(by_id["nq/4"]["replies"]) == 2
    assert by_id["nq/5"]["error_kind"] == "http" and by_id["nq/7"]["rule"] == "no answer"
    assert by_id["nq/3"]["replies"][-1] == "A" and by_id["nq/3"]["grade"] == "CORRECT"
    assert all(r["judge"]["model"] == "scripted-grader" for r in lines)


def test_cache_in_memory_and_on_disk(tmp_path):
    cache_file = tmp_path / "grades_cache.jsonl"
    cfg = grading.GradingConfig(cache_path=str(cache_file))
    with serve_scripted(_responder) as server:
        cache = {}
        first, _ = grading.grade_predictions(RECORDS, _judge(server.base_url), cfg, cache=cache)
        sent = len(server.requests)
        # Same judge description, new judge object, empty in-memory cache: the file answers the successes;
        # the failures (prose, boom, forbidden) are asked again.
        second, summary = grading.grade_predictions(RECORDS, _judge(server.base_url), cfg)
        again = [_predicted(b) for b in server.request_bodies()[sent:]]
    assert second == first == EXPECTED
    assert summary["cache_hits"] == 5  # Paris x2, Lyon, no idea, fixable
    assert sorted(set(again)) == ["boom", "forbidden", "prose"]
    assert len(cache) == 4 and len(cache_file.read_text().splitlines()) == 4
    # Only the failures are asked again: prose twice (reply + correction round), boom and forbidden once each.
    assert summary["usage/calls"] == 4


def test_dead_endpoint_marks_everything_ungraded():
    judge = _judge(dead_endpoint_url(), max_attempts=2)
    records = [_record(0, "Paris"), _record(1, "Lyon"), _record(2, None)]
    grades, summary = grading.grade_predictions(records, judge)
    assert grades == [None, None, "NOT_ATTEMPTED"]
    assert summary["ungraded"] == 2 and summary["failures/connection"] == 2 and summary["accuracy"] == 0.0


def test_temperature_and_record_errors():
    with serve_scripted(_responder) as server:
        with pytest.raises(ValueError, match="temperature"):
            grading.grade_predictions(RECORDS, _judge(server.base_url, temperature=0.0))
        judge = _judge(server.base_url)
        bad = dict(_record(0, "Paris"), golds=[])
        with pytest.raises(ValueError, match=r"predictions\[1\] \(id 'nq/0'\): field 'golds'"):
            grading.grade_predictions([_record(0, "Paris"), bad], judge)
        with pytest.raises(ValueError, match="missing field 'question'"):
            grading.grade_predictions([{"id": 1, "golds": ["x"], "answer": "x"}], judge)
        assert not server.requests  # nothing is sent before every record is checked


def test_summary_by_source_puts_accuracy_beside_em_and_f1():
    records = grading.attach_grades(
        [_record(0, "Paris"), _record(1, "Lyon"), _record(2, "x", source="hotpotqa"),
         _record(3, "Paris", source="hotpotqa")],
        ["CORRECT", None, "INCORRECT", "CORRECT"])
    rows = grading.summary_by_source(records)
    assert [r["data_source"] for r in rows] == ["hotpotqa", "nq", "all"]
    hotpot, nq, overall = rows
    assert (nq["n"], nq["em"], nq["f1"], nq["graded"], nq["ungraded"], nq["accuracy"]) == (2, 0.5, 0.5, 1, 1, 1.0)
    assert (hotpot["em"], hotpot["accuracy"]) == (0.5, 0.5)
    assert overall["accuracy"] == 2 / 3 and overall["ungraded"] == 1 and overall["em"] == 0.5
    with pytest.raises(ValueError):
        grading.attach_grades(records, ["CORRECT"])
    with pytest.raises(ValueError, match="not one of"):
        grading.grade_summary(["RIGHT"])


def test_local_judge_grades_by_letter_likelihood(smollm2, tmp_path):
    """The embedded SmolLM2 as the grader: it scores the three letters (closed choice), so every answer is
    graded, and each grade is the letter with the highest log-likelihood in the audit. A short prompt file
    with the same fields keeps this under a minute on CPU (the full v1 prompt is ~1,000 tokens per row)."""
    from searchjax.judges.local import LocalJudge, LocalJudgeConfig
    model, params, tokenizer = smollm2
    judge = LocalJudge(model, params, tokenizer, LocalJudgeConfig())
    prompt = tmp_path / "answer_grader_short.v1.txt"
    prompt.write_text("[user]\nQuestion: {question}\nGold target: {target}\nPredicted answer: {predicted_answer}\n"
                      "Grade the predicted answer: A: CORRECT, B: INCORRECT, C: NOT_ATTEMPTED. "
                      "Reply with one letter.\n")
    audit = tmp_path / "audit.jsonl"
    records = [_record(0, "Paris"), _record(1, "Berlin"), _record(2, None)]
    cfg = grading.GradingConfig(prompt=str(prompt), audit_path=str(audit))
    grades, summary = grading.grade_predictions(records, judge, cfg)
    assert summary["graded"] == 3 and summary["ungraded"] == 0 and summary["requests"] == 2
    lines = {r["id"]: r for r in map(json.loads, audit.read_text().splitlines())}
    for record, grade in zip(records[:2], grades[:2]):
        (scores,) = lines[record["id"]]["choice_scores"]
        assert grade == grading.GRADES[max(range(3), key=scores.__getitem__)]
    assert grades[2] == "NOT_ATTEMPTED" and summary["usage/prompt_tokens"] > 0 and summary["usage/cost_usd"] == 0
